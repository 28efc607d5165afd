"""The adapter registry: every service kind the case model allows has one adapter, and what differs between
kinds (argv, identity argv, child environment, model files, launched or probed) comes from it."""

from __future__ import annotations

import ast
import sys
import typing
from pathlib import Path

import pytest

from caseledger.case.model import Case, Service
from caseledger.case.service import KIND_TRAITS, AdapterKind
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


def test_every_kind_has_its_traits_and_the_adapters_read_them() -> None:
    allowed = set(typing.get_args(Service.model_fields["adapter"].annotation))
    assert set(KIND_TRAITS) == allowed
    assert all(a.launched is KIND_TRAITS[k].launched for k, a in ADAPTERS.items())
    traits = {
        k: Service.model_validate({"adapter": k, "argv": ["srv"]} if k == "command" else {"adapter": k}).traits
        for k in allowed
    }
    # what the case layer and the adapters ask: launched, the case's argv, service.reference, timings_per_token
    assert {k for k, tr in traits.items() if tr.launched} == {"reference", "command"}
    assert {k for k, tr in traits.items() if tr.runs_case_argv} == {"command"}
    assert {k for k, tr in traits.items() if tr.reference_config} == {"reference"}
    assert {k for k, tr in traits.items() if tr.timings_per_token} == {"reference"}


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


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["python", "-m", "sglang.launch_server", "--model-path", "w", "--speculative-draft-model-path", "d"], "w d"),
        (["llama-server", "--model=w", "-md", "d"], "w d"),
        (["vllm", "serve", "w", "--port", "{port}"], "w"),
        (["trtllm-serve", "w"], "w"),
        (["text-generation-launcher", "--model-id=w"], "w"),
    ],
)
def test_weights_join_the_identity_in_every_spelling(ws: Workspace, argv: list[str], named: str) -> None:
    """The weights an engine is given -- `--opt v`, `--opt=v`, a positional after serve, SGLang's --model-path and
    its draft -- are hashed into the service identity: swapped weights at the same path are another service."""
    (ws.root / "w").mkdir()
    (ws.root / "w" / "model.safetensors").write_bytes(b"weights")
    (ws.root / "d").write_bytes(b"draft")
    draft = ref_draft(18126)
    draft["service"] = {"adapter": "command", "argv": argv}
    case = Case.model_validate(draft).filled()
    files = model_files(ws, case)
    assert sorted({f["path"].split("/")[0] for f in files}) == sorted(named.split()), files
    before = identity_of(case, files)
    (ws.root / "w" / "model.safetensors").write_bytes(b"other weights")  # swapped in place
    assert identity_of(case, model_files(ws, case)) != before


def test_external_is_probed_not_launched(ws: Workspace) -> None:
    case = Case.model_validate(external_draft(18125)).filled()
    assert not adapter_of(case).launched
    assert intended_argv(case) == []
    assert model_files(ws, case) == []
    assert identity_of(case).startswith("s-")


KIND_NAMES = frozenset(typing.get_args(AdapterKind))


def _kind_comparisons(source: str) -> list[int]:
    """Lines that compare a service kind by name: anything compared with an `.adapter` attribute, or an
    attribute or name compared with a kind's name ('reference', 'external', 'command', alone or in a tuple, list
    or set)."""

    def names(n: ast.expr) -> set[str]:
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            return {n.value}
        if isinstance(n, ast.Tuple | ast.List | ast.Set):
            return {x.value for x in n.elts if isinstance(x, ast.Constant) and isinstance(x.value, str)}
        return set()

    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        adapter = any(isinstance(s, ast.Attribute) and s.attr == "adapter" for s in sides)
        named = any(names(s) & KIND_NAMES for s in sides) and any(
            isinstance(s, ast.Attribute | ast.Name) for s in sides
        )
        if adapter or named:
            out.append(node.lineno)
    return out


def test_the_kind_comparison_finder_finds_each_spelling() -> None:
    src = (
        'if case.service.adapter == "command":\n    pass\n'
        'if "reference" != sv.adapter:\n    pass\n'
        'if kind in ("external", "command"):\n    pass\n'
        'if adapter_of(case).kind == "reference":\n    pass\n'
        'if case.service.traits.runs_case_argv and args.command == "serve":\n    pass\n'
        'TRAITS = {"command": 1}\n'
    )
    assert _kind_comparisons(src) == [1, 3, 5, 7]


PACKAGES = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file())


@pytest.mark.parametrize("pkg", [*PACKAGES, "top-level modules"])
def test_adapter_kind_is_compared_only_in_the_registry(pkg: str) -> None:
    """No `….adapter == "…"` anywhere in caseledger/: a kind's name is looked up only in the registry
    (services.kinds) and its traits only in case.service.KIND_TRAITS, whose keys are no comparison; code asks
    `case.service.traits`. A new kind is one module, one registry line and one row of traits."""
    paths = sorted(ROOT.glob("*.py")) if pkg == "top-level modules" else sorted((ROOT / pkg).rglob("*.py"))
    assert paths
    found = [f"{path.relative_to(ROOT)}:{line}" for path in paths for line in _kind_comparisons(path.read_text())]
    assert found == []
