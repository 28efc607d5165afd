"""The package's public surface and static checks (ruff, mypy --strict) as part of the suite."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import caseledger

ROOT = Path(__file__).resolve().parent.parent


def test_public_all_is_sorted_and_complete() -> None:
    assert caseledger.__all__ == sorted(caseledger.__all__)
    for name in caseledger.__all__:
        assert getattr(caseledger, name) is not None
    import caseledger.tools as tools

    assert tools.__all__ == sorted(tools.__all__)
    assert {"freeze_case", "start_run", "phase_status", "resume", "reprocess_raw", "summarize"} <= set(tools.__all__)


def test_cli_help_does_not_import_heavy_modules() -> None:
    code = ("import sys, caseledger.cli as c\n"
            "try:\n    c.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "bad = [m for m in ('transformers', 'mcp', 'numpy', 'httpx2') if m in sys.modules]\n"
            "print('HEAVY:' + ','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "HEAVY:"


@pytest.mark.slow
def test_ruff_is_clean() -> None:
    exe = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    r = subprocess.run([exe, "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:]


@pytest.mark.slow
def test_mypy_strict_is_clean() -> None:
    r = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:]
