"""The package's public surface and static checks (ruff, mypy --strict) as part of the suite."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import caseledger

ROOT = Path(__file__).resolve().parent.parent
SIX_TOOLS = {"freeze_case", "start_run", "phase_status", "resume", "reprocess_raw", "summarize"}


def test_public_all_is_sorted_complete_and_resolves() -> None:
    import importlib

    assert caseledger.__all__ == sorted(caseledger.__all__)
    # complete: the surface the package's docstring promises (the six tools and the case model), not only
    # whatever the lazy table below happens to hold
    promised = SIX_TOOLS | {"Case"}
    assert promised <= set(caseledger.__all__), sorted(promised - set(caseledger.__all__))
    lazy = caseledger._LAZY  # the names the package resolves on first use
    assert set(caseledger.__all__) == set(lazy) | {"__version__"}, set(caseledger.__all__) ^ (
        set(lazy) | {"__version__"}
    )
    for name, home in lazy.items():  # each is the very object of the module it names
        assert getattr(caseledger, name) is getattr(importlib.import_module(home), name), name
    assert isinstance(caseledger.__version__, str) and caseledger.__version__
    import caseledger.tools as tools

    assert tools.__all__ == sorted(tools.__all__)
    assert set(tools.__all__) >= SIX_TOOLS, sorted(SIX_TOOLS - set(tools.__all__))


@pytest.mark.integration
def test_cli_help_does_not_import_heavy_modules() -> None:
    code = (
        "import sys, caseledger.cli as c\n"
        "try:\n    c.main(['--help'])\nexcept SystemExit:\n    pass\n"
        "bad = [m for m in ('transformers', 'mcp', 'numpy', 'httpx2') if m in sys.modules]\n"
        "print('HEAVY:' + ','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "HEAVY:"


# CI runs ruff and mypy as a step of their own before the suite (.ci/run), then sets this: not twice
static_checked = pytest.mark.skipif(
    os.environ.get("CASELEDGER_STATIC_CHECKED") == "1", reason="run by .ci/run's static step before the suite"
)


@pytest.mark.integration
@static_checked
def test_ruff_is_clean() -> None:
    exe = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    r = subprocess.run([exe, "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:]
    fmt = subprocess.run([exe, "format", "--check", "."], cwd=ROOT, capture_output=True, text=True)
    assert fmt.returncode == 0, "run `ruff format .`:\n" + fmt.stdout[-3000:]


@pytest.mark.integration
@static_checked
def test_mypy_strict_is_clean() -> None:
    r = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:]


def test_every_environment_variable_the_code_reads_is_in_the_environment_doc() -> None:
    root = Path(__file__).resolve().parent.parent
    readme = (root / "docs" / "environment.md").read_text()  # the table of every variable
    used = {m for p in (root / "caseledger").rglob("*.py") for m in re.findall(r"CASELEDGER_[A-Z_]+", p.read_text())}
    # and what the test harness reads to find the engine and sshd (the tests' own names are fixtures)
    used |= {
        m
        for name in ("conftest.py", "engine.py", "sshd.py")
        for m in re.findall(r"CASELEDGER_[A-Z_]+", (root / "tests" / name).read_text())
    }
    assert used and not {v for v in used if f"`{v}`" not in readme}, sorted(v for v in used if f"`{v}`" not in readme)


ANY_DICT = "dict[str, Any]"
JSON_REASON = re.compile(r"# JSON: \S.{3,}")  # which JSON this is


def _statement_starts(source: str) -> dict[int, int]:
    """Line (0-based) -> the first line of the def whose signature it is part of (a signature ruff wraps)."""
    starts: dict[int, int] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for no in range(node.lineno - 1, node.body[0].lineno - 1):
                starts[no] = node.lineno - 1
    return starts


def test_every_any_dict_is_a_json_boundary_that_says_which_json() -> None:
    """Run data crosses modules as models and TypedDicts; a dict[str, Any] is decoded or encoded JSON only, and
    says which (a file, a tool's answer, a schema): '# JSON: <which>' on its line, or on the comment line above
    it or above its def."""
    unexplained = []
    for path in sorted((ROOT / "caseledger").rglob("*.py")):
        source = path.read_text()
        lines, starts = source.splitlines(), _statement_starts(source)
        for no, line in enumerate(lines):
            if ANY_DICT not in line or JSON_REASON.search(line):
                continue
            above = [lines[k - 1].strip() for k in {no, starts.get(no, no)} if k]
            if not any(a.startswith("#") and JSON_REASON.search(a) for a in above):
                unexplained.append(f"{path.relative_to(ROOT)}:{no + 1}: {line.strip()}")
    assert not unexplained, "\n".join(unexplained)


# a tool call with an argument, as an answer names it: "resume(run_id='r-1')", "start_run(case_id=...)"
TOOL_OPEN = re.compile(r"\b(freeze_case|start_run|phase_status|resume|reprocess_raw|summarize)\(")
CALL_SHAPED = re.compile(TOOL_OPEN.pattern + r"(run_id|case_id|path|scenario|run_ids|campaign|wait_s)=")


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of a module, its classes and functions."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _hand_written_calls(root: Path) -> list[str]:
    """Every str constant or f-string under root (an f-string with '{}' for each value) that writes a tool call,
    outside caseledger/ledger/calls.py. Documentation is exempt, and only it: docstrings (a tool's description in
    server/toolset.py is its function's docstring) and the value of a `description=` keyword (a field's or a
    tool's description, as server/published.py and the published JSON carry them)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).as_posix() == "ledger/calls.py":
            continue
        source = path.read_text()
        if not TOOL_OPEN.search(source):  # no tool's name and paren: nothing to read
            continue
        tree = ast.parse(source)
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg == "description":
                skip |= {id(n) for n in ast.walk(node.value)}
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.JoinedStr):
                skip |= {id(v) for v in node.values}  # its parts are read as the whole
                text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            else:
                continue
            if CALL_SHAPED.search(str(text)):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {str(text)[:90]!r}")
    return found


def test_every_tool_call_an_answer_names_is_written_by_the_calls_module() -> None:
    """A next call is written once (caseledger/ledger/calls.py: a form per tool call, a function per situation), so
    every view says a situation in the same words and the CLI turns every call into its command."""
    found = _hand_written_calls(ROOT / "caseledger")
    assert not found, "write these with caseledger.ledger.calls:\n" + "\n".join(found)


def test_the_call_finder_names_constants_and_f_strings_but_not_documentation(tmp_path: Path) -> None:
    pkg = tmp_path / "caseledger"
    (pkg / "ledger").mkdir(parents=True)
    (pkg / "ledger" / "calls.py").write_text("X = \"resume(run_id='r-1')\"\n")  # the one module that writes them
    (pkg / "m.py").write_text(
        '"""A module: resume(run_id=\'r-1\') in its docstring."""\n'
        "from pydantic import Field\n"
        "A = \"start_run(case_id='c-1')\"\n"
        "def f(rid: str) -> str:\n"
        '    """resume(run_id=...) in a docstring."""\n'
        "    return f\"resume(run_id='{rid}') goes on\"\n"
        "B = Field(description=\"phase_status(run_id='r-1') in a description\")\n"
        'C = "resume(run_id) names no value; summarize() has no argument"\n'
    )
    found = _hand_written_calls(pkg)
    assert [f.split(": ", 1)[0] for f in found] == ["caseledger/m.py:3", "caseledger/m.py:6"], found


def _caseledger_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of each `from caseledger... import name` in a file, in functions too."""
    tree = ast.parse(path.read_text())
    return [
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("caseledger")
        for alias in node.names
    ]


@pytest.mark.parametrize("bench", sorted(p.name for p in (ROOT / "bench").glob("*.py")))
def test_every_bench_imports_names_that_exist(bench: str) -> None:
    """A bench is run by hand, not by the suite: a name it imports that was renamed fails here, not at its next run."""
    import importlib

    missing = []
    for module, name in _caseledger_imports(ROOT / "bench" / bench):
        mod = importlib.import_module(module)
        if not hasattr(mod, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ModuleNotFoundError:
                missing.append(f"{module}.{name}")
    assert missing == [], f"bench/{bench} imports names caseledger no longer has: {missing}"
