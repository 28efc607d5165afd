"""The package's public surface and static checks (ruff, mypy --strict) as part of the suite."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import caseledger

ROOT = Path(__file__).resolve().parent.parent


def test_public_all_is_sorted_complete_and_resolves() -> None:
    import importlib

    assert caseledger.__all__ == sorted(caseledger.__all__)
    lazy = caseledger._LAZY  # the names the package resolves on first use
    assert set(caseledger.__all__) == set(lazy) | {"__version__"}, set(caseledger.__all__) ^ (
        set(lazy) | {"__version__"}
    )
    for name, home in lazy.items():  # each is the very object of the module it names
        assert getattr(caseledger, name) is getattr(importlib.import_module(home), name), name
    assert isinstance(caseledger.__version__, str) and caseledger.__version__
    import caseledger.tools as tools

    assert tools.__all__ == sorted(tools.__all__)
    assert {"freeze_case", "start_run", "phase_status", "resume", "reprocess_raw", "summarize"} <= set(tools.__all__)


def test_cli_help_does_not_import_heavy_modules() -> None:
    code = (
        "import sys, caseledger.cli as c\n"
        "try:\n    c.main(['--help'])\nexcept SystemExit:\n    pass\n"
        "bad = [m for m in ('transformers', 'mcp', 'numpy', 'httpx2') if m in sys.modules]\n"
        "print('HEAVY:' + ','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "HEAVY:"


@pytest.mark.slow
def test_ruff_is_clean() -> None:
    exe = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    r = subprocess.run([exe, "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:]
    fmt = subprocess.run([exe, "format", "--check", "."], cwd=ROOT, capture_output=True, text=True)
    assert fmt.returncode == 0, "run `ruff format .`:\n" + fmt.stdout[-3000:]


@pytest.mark.slow
def test_mypy_strict_is_clean() -> None:
    r = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:]


def test_every_environment_variable_the_code_reads_is_in_readme() -> None:
    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text()
    used = {m for p in (root / "caseledger").rglob("*.py") for m in re.findall(r"CASELEDGER_[A-Z_]+", p.read_text())}
    # and what the test harness reads to find the engine and sshd (the tests' own names are fixtures)
    used |= {
        m
        for name in ("conftest.py", "engine.py", "sshd.py")
        for m in re.findall(r"CASELEDGER_[A-Z_]+", (root / "tests" / name).read_text())
    }
    assert used and not {v for v in used if f"`{v}`" not in readme}, sorted(v for v in used if f"`{v}`" not in readme)
