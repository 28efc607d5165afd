"""README.md and docs/: a README of one screen; every path they name is in a fresh clone (or made by a command
shown before it), every `caseledger` command they show parses; nothing in them needs material outside the
repository; docs/architecture.md is what tests/architecture.py renders now."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from caseledger import cli
from tests.architecture import DOC as ARCHITECTURE
from tests.architecture import render

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
NAMES = [p.relative_to(ROOT).as_posix() for p in DOCS]

# what .gitignore keeps out of a fresh clone (a path under one of these is not "in the clone")
IGNORED = re.compile(
    r"(^|/)(__pycache__|[^/]*\.egg-info|\.venv|\.pytest_cache|\.mypy_cache|\.ruff_cache)(/|$)|^ledger/"
)

# a path of the repository: under one of its top folders, or one of its top files
REPO_PATH = re.compile(
    r"(?<![\w./~$:-])((?:\.ci|bench|caseledger|cases|docs|schemas|tests)/[\w.\-/*]*[\w*/]|"
    r"(?:pyproject\.toml|README\.md|HANDOFF\.md)(?![\w.]))"
)
# paths a clone does not hold, each made by a command: the command must be shown before the path is named (in the
# same file, or in README.md, which a reader of docs/ has read)
CREATED = {
    ".mcp.json": "caseledger init",
    "~/bench": "caseledger init ~/bench",
    ".venv/": "python3 -m venv .venv",
    "ledger/": "caseledger freeze",
    "cases/reference.json": "caseledger init DIR --engine reference",
    "cases/sweep.json": "caseledger init",
}
OUTSIDE = ("../shared", "DESIGN.md", "the seeds", "this machine", "seeds/")

DEMO = "python3 -m venv .venv && .venv/bin/pip install -q --no-compile -e . && .venv/bin/caseledger demo"
TESTS = (
    "python3 -m venv .venv && .venv/bin/pip install -q --no-compile -e '.[test]' && "
    ".venv/bin/python -m pytest -q -n 4 -m 'not quiet' && .venv/bin/python -m pytest -q -m quiet"
)


def code_spans(text: str) -> list[tuple[int, str]]:
    """(offset, text) of every inline code span and every line of a fenced block."""
    out: list[tuple[int, str]] = []
    for m in re.finditer(r"^ *```[^\n]*\n(.*?)^ *```", text, re.MULTILINE | re.DOTALL):
        at = m.start(1)
        for line in m.group(1).splitlines(keepends=True):
            out.append((at, line.rstrip("\n").strip()))
            at += len(line)
    fenced = [(m.start(), m.end()) for m in re.finditer(r"^ *```.*?^ *```", text, re.MULTILINE | re.DOTALL)]
    for m in re.finditer(r"`([^`\n]+)`", text):
        if not any(a <= m.start() < b for a, b in fenced):
            out.append((m.start(1), m.group(1)))
    return out


def in_clone(rel: str) -> bool:
    rel = rel.rstrip("/")
    if IGNORED.search(rel):
        return False
    if any(c in rel for c in "*?["):
        return any(not IGNORED.search(p.relative_to(ROOT).as_posix()) for p in ROOT.glob(rel))
    return (ROOT / rel).exists()


def test_readme_is_one_screen() -> None:
    words = len(README.read_text().split())
    assert words <= 1200, f"README.md has {words} words: move the detail into docs/"


def test_readme_first_block_is_the_two_commands_ci_runs() -> None:
    text = README.read_text()
    block = text[text.index("```bash\n") : text.index("\n```", text.index("```bash\n"))]
    commands = [line for line in block.splitlines()[1:] if line and not line.startswith("#")]
    assert commands == [DEMO, TESTS]
    assert text.index("# 1. the demo") < text.index("# 2. the tests")  # .ci/run reads the line after this one


def test_architecture_doc_is_current() -> None:
    assert ARCHITECTURE.read_text() == render(), "docs/architecture.md is stale: .venv/bin/python -m tests.architecture"


@pytest.mark.parametrize("name", NAMES)
def test_docs_need_nothing_outside_the_repository(name: str) -> None:
    text = (ROOT / name).read_text()
    found = [w for w in OUTSIDE if w in text]
    assert not found, f"{name} names {found}: say it from the repository's own material"


def _repo_paths(name: str, text: str | None = None) -> list[tuple[int, str]]:
    text = (ROOT / name).read_text() if text is None else text
    out = [(m.start(1), m.group(1)) for at, span in code_spans(text) for m in REPO_PATH.finditer(span)]
    out = [(at, p) for at, p in out if not re.search(r"[<{]|NAME|DIGEST|XXX", p)]  # placeholders
    for m in re.finditer(r"\]\(([^)#\s]+)\)", text):  # markdown links, relative to the file
        if not m.group(1).startswith(("http://", "https://")):
            out.append((m.start(1), ((ROOT / name).parent / m.group(1)).resolve().relative_to(ROOT).as_posix()))
    return out


@pytest.mark.parametrize("name", NAMES)
def test_every_path_named_is_in_a_fresh_clone_or_made_by_a_command_shown_before(name: str) -> None:
    text = (ROOT / name).read_text()
    missing = sorted({p for _, p in _repo_paths(name) if not in_clone(p) and p not in CREATED})
    assert not missing, f"{name} names paths a fresh clone does not hold: {missing}"
    readme = README.read_text()
    late = []
    for made, command in CREATED.items():
        for m in re.finditer(re.escape(made), text):
            shown_before = command in text[: m.end()] or (name != "README.md" and command in readme)
            if not shown_before:
                late.append(f"{made} at offset {m.start()} (made by `{command}`)")
    assert not late, f"{name}: {late}"


def _commands(name: str, text: str | None = None) -> list[list[str]]:
    """Every `caseledger ...` command the file shows, as argv (placeholders such as a|b|c take their first)."""
    out = []
    for _, span in code_spans((ROOT / name).read_text() if text is None else text):
        for part in re.split(r"\s*(?:&&|;)\s*", span.split("  #")[0]):
            words = part.strip().split(maxsplit=1)
            if words and re.fullmatch(r"(?:\S*/)?caseledger", words[0]) and len(words) > 1:
                argv = shlex.split(words[1].replace("…", "x"))
                out.append([a.split("|")[0] if "|" in a and not a.startswith("-") else a for a in argv])
    return out


@pytest.mark.parametrize("name", NAMES)
def test_every_caseledger_command_shown_parses(name: str) -> None:
    parser = cli._parser()
    names = {a for action in parser._subparsers._group_actions for a in action.choices} if parser._subparsers else set()
    bad = []
    for argv in _commands(name):
        if argv[0] not in names:
            bad.append(" ".join(argv))
            continue
        if len(argv) == 1:  # a command named in prose (`caseledger freeze refuses ...`): the name is enough
            continue
        try:
            parser.parse_args(argv)
        except SystemExit:
            bad.append(" ".join(argv))
    assert not bad, f"{name} shows commands caseledger does not take: {bad}"


def test_the_checks_find_what_they_look_for() -> None:
    """The finders themselves: spans (an indented block too), paths, links, commands."""
    text = (
        "run `caseledger status r-1|r-2` then `cases/none.json` [x](y.md)\n"
        "1. a\n   ```bash\n   caseledger demo && .venv/bin/caseledger run c-1 --wait  # go\n   ```\n"
    )
    spans = [s for _, s in code_spans(text)]
    assert spans == [
        "caseledger demo && .venv/bin/caseledger run c-1 --wait  # go",
        "caseledger status r-1|r-2",
        "cases/none.json",
    ]
    assert sorted(p for _, p in _repo_paths("docs/x.md", text)) == ["cases/none.json", "docs/y.md"]
    assert _commands("docs/x.md", text) == [["demo"], ["run", "c-1", "--wait"], ["status", "r-1"]]
    assert not in_clone("cases/none.json") and in_clone("cases/vllm.json") and not in_clone(".venv/bin/caseledger")
