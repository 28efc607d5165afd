"""One path in production: a run's parts start through procs.launcher(), and no module of caseledger/ asks
whether it runs under a test. The two launchers: Detached (production) and InProcess (tests of what a run
computes, selected for a block with procs.in_process())."""

from __future__ import annotations

import ast
import os
import signal
from pathlib import Path

import pytest

from caseledger import faults, procs

ROOT = Path(__file__).resolve().parent.parent / "caseledger"

# The launcher's selection: only procs.py itself (where it lives) names it. Production code calls the current
# launcher's methods (procs.launcher().start(...)) and never asks which one it is.
SWITCH = {"inline", "inline_runs", "in_process", "using", "InProcess", "IN_PROCESS", "Detached", "DETACHED", "_Current"}
TEST_WORDS = ("pytest", "caseledger_test")  # in a string: an environment or sys.modules probe
TEST_MODULES = {"pytest", "_pytest", "unittest"}


def _test_mode_checks(root: Path) -> list[str]:
    """Where a module under `root` (procs.py aside) chooses a path for the tests: names the launcher's selection,
    inspects the current launcher instead of calling one of its methods, imports a test framework, or reads a
    string that probes for one (PYTEST_CURRENT_TEST, CASELEDGER_TEST...)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        if path == root / "procs.py":
            continue
        rel = path.relative_to(root.parent)
        tree = ast.parse(path.read_text(), str(path))
        calls_on = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}  # x in x.method()
        for node in ast.walk(tree):
            what = None
            if isinstance(node, ast.Attribute) and node.attr in SWITCH and ast.unparse(node.value).endswith("procs"):
                what = f"procs.{node.attr}"
            elif isinstance(node, ast.ImportFrom) and (node.module or "").endswith("procs"):
                what = next((f"procs.{a.name}" for a in node.names if a.name in SWITCH), None)
            elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("procs.launcher"):
                what = None if id(node) in calls_on else "the launcher itself (call one of its methods)"
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                what = next((f"import {n}" for n in names if n.split(".")[0] in TEST_MODULES), None)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                what = next((repr(node.value) for w in TEST_WORDS if w in node.value.lower()), None)
            if what:
                out.append(f"{rel}:{node.lineno} {what}")
    return out


def test_no_module_of_caseledger_chooses_a_path_for_the_tests() -> None:
    bad = _test_mode_checks(ROOT)
    assert bad == [], (
        "start the part through procs.launcher() (a method of the Launcher protocol), never by asking which "
        "launcher runs:\n" + "\n".join(bad)
    )


def test_the_test_mode_finder_names_each_kind_of_check(tmp_path: Path) -> None:
    pkg = tmp_path / "caseledger"
    (pkg / "run").mkdir(parents=True)
    (pkg / "procs.py").write_text("def inline() -> bool:\n    return True\n")  # its home: never named
    (pkg / "run" / "a.py").write_text(
        "import os\n"
        "from caseledger import procs\n"
        "from caseledger.procs import InProcess\n"
        "import pytest\n"
        "if procs.inline():\n"
        "    pass\n"
        "if isinstance(procs.launcher(), InProcess) or os.environ.get('PYTEST_CURRENT_TEST'):\n"
        "    pass\n"
        "procs.launcher().niced(print)\n"  # the one way: a method of the launcher
    )
    assert _test_mode_checks(pkg) == [
        "caseledger/run/a.py:3 procs.InProcess",
        "caseledger/run/a.py:4 import pytest",
        "caseledger/run/a.py:5 procs.inline",
        "caseledger/run/a.py:7 the launcher itself (call one of its methods)",
        "caseledger/run/a.py:7 'PYTEST_CURRENT_TEST'",
    ]


def test_a_part_started_in_the_callers_process_runs_its_entry_and_reads_as_gone(tmp_path: Path) -> None:
    ran: list[str] = []
    recorded: list[procs.LoadRef] = []
    part = procs.Part(
        "caseledger.nothing", [], tmp_path / "x.log", here=lambda: ran.append("here"), record=recorded.append
    )
    with procs.in_process():
        ref = procs.launcher().start(part)
        answer = procs.launcher().answer(lambda: "fresh", lambda: "here")
        ahead = procs.launcher().ahead(lambda: ran.append("ahead"))
    assert ran == ["here"] and answer == "here" and ahead is None
    assert ref["pid"] == os.getpid() and "gone_utc" in ref and not procs.alive(ref)
    assert recorded == []  # the entry writes its own reference (as gone); no live pid of the caller's is recorded
    assert not (tmp_path / "x.log").exists()


def test_in_the_callers_process_its_signals_env_and_exit_are_left_alone(tmp_path: Path) -> None:
    before, outer = signal.getsignal(signal.SIGTERM), procs.launcher()
    with procs.using(procs.DETACHED), procs.in_process():
        procs.launcher().adopt(sigterm=lambda s, f: None, env={"CASELEDGER_LAUNCHER_PROBE": "1"})
        procs.launcher().niced(lambda: pytest.fail("niced work ran in the caller's process"))
        with pytest.raises(RuntimeError, match="inside an inline run: the test needs real processes"):
            faults.die()  # os._exit here would end pytest
        with pytest.raises(RuntimeError, match="wait for ever"):
            procs.launcher().own_process("it would wait for ever")
    assert signal.getsignal(signal.SIGTERM) is before
    assert "CASELEDGER_LAUNCHER_PROBE" not in os.environ
    assert procs.launcher() is outer  # the block ends: the launcher before it again


def test_the_detached_launcher_answers_fresh_and_spawns_ahead() -> None:
    """Production's launcher (Detached.start is what every `processes` test runs: real detached parts)."""
    with procs.using(procs.DETACHED):
        assert procs.launcher().answer(lambda: "fresh", lambda: "here") == "fresh"
        assert procs.launcher().ahead(lambda: "spawned") == "spawned"
        procs.launcher().own_process("never raised for a process of its own")
