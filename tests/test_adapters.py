"""The adapter registry: every service kind the case model allows has one adapter, and what differs between
kinds (argv, identity argv, child environment, model files, launched or probed) comes from it."""

from __future__ import annotations

import ast
import sys
import typing
from pathlib import Path

import pytest

from caseledger.case.model import Case, Service
from caseledger.services import identity_of, intended_argv
from caseledger.services.identity import model_files, resolve_env
from caseledger.services.kinds import ADAPTERS, adapter_of
from caseledger.workspace import Workspace
from tests.conftest import external_draft, ref_draft

ROOT = Path(__file__).resolve().parents[1] / "caseledger"


def test_every_kind_the_case_allows_is_registered() -> None:
    allowed = set(typing.get_args(Service.model_fields["adapter"].annotation))
    assert set(ADAPTERS) == allowed
    assert all(a.kind == k for k, a in ADAPTERS.items())


def test_reference_argv_runs_this_target_and_its_identity_ignores_the_interpreter() -> None:
    case = Case.model_validate(ref_draft(18123)).filled()
    argv = intended_argv(case)
    assert argv[:4] == [sys.executable, "-m", "caseledger.target", "serve"]
    assert argv[argv.index("--port") + 1] == "18123"
    assert adapter_of(case).identity_argv(argv) == argv[1:]
    env, _ = resolve_env(case)
    assert "PYTHONPATH" in env
    assert adapter_of(case).launched


def test_command_argv_fills_route_placeholders(ws: Workspace) -> None:
    draft = ref_draft(18124)
    draft["service"] = {"adapter": "command", "argv": ["srv", "--host", "{host}", "--port", "{port}", "-a", "{model}"]}
    case = Case.model_validate(draft).filled()
    assert intended_argv(case) == ["srv", "--host", "127.0.0.1", "--port", "18124", "-a", "ref-model"]
    (ws.root / "w.gguf").write_bytes(b"weights")
    draft["service"]["argv"] = ["srv", "-m", "w.gguf"]
    files = model_files(ws, Case.model_validate(draft).filled())
    assert [f["path"] for f in files] == ["w.gguf"]


def test_external_is_probed_not_launched(ws: Workspace) -> None:
    case = Case.model_validate(external_draft(18125)).filled()
    assert not adapter_of(case).launched
    assert intended_argv(case) == []
    assert model_files(ws, case) == []
    assert identity_of(case).startswith("s-")


@pytest.mark.parametrize("pkg", ["services", "server"])
def test_adapter_kind_is_compared_only_in_the_registry(pkg: str) -> None:
    """No `….adapter == "…"` outside services.kinds: a new kind is one module and one registry line."""
    found = []
    for path in sorted((ROOT / pkg).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) and node.left.attr == "adapter":
                found.append(f"{path.name}:{node.lineno}")
    assert found == []
