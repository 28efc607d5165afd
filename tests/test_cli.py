"""The CLI: --workspace/-w and --json in any position on every command; nothing silently means the
current directory."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from caseledger import cli
from caseledger.workspace import Workspace
from tests.conftest import ref_draft, write_draft
from tests.helpers import make_perf_dir

POSITIONS = ("before", "after", "end")


def place(command: list[str], option: list[str], where: str) -> list[str]:
    if where == "before":
        return [*option, *command]
    if where == "after":
        return [command[0], *option, *command[1:]]
    return [*command, *option]


def call(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = cli.main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def setup(ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Workspace, Path]:
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # a command that ignored -w would act here
    write_draft(ws, "a.json", ref_draft(1))
    return ws, elsewhere


def _freeze(ws: Workspace, capsys: pytest.CaptureFixture[str]) -> str:
    rc, out, _ = call(["-w", str(ws.root), "--json", "freeze", "cases/a.json"], capsys)
    assert rc == 0
    return str(json.loads(out)["case_id"])


Setup = Callable[[Workspace, pytest.CaptureFixture[str], Path], tuple[list[str], Callable[[dict], bool]]]
COMMANDS: dict[str, Setup] = {
    "freeze": lambda ws, c, t: (["freeze", "cases/a.json"], lambda j: j["case_id"].startswith("c-")),
    "run": lambda ws, c, t: (["run", _freeze(ws, c), "--preflight-only"], lambda j: j["preflight"] == "passed"),
    "status": lambda ws, c, t: (["status", "r-00000001"], lambda j: False),  # unknown run: refused (exit 2)
    "summarize": lambda ws, c, t: (["summarize"], lambda j: False),  # no runs yet: refused, naming W
    "reprocess": lambda ws, c, t: (["reprocess", "r-00000001"], lambda j: False),
    "resume": lambda ws, c, t: (["resume", "r-00000001"], lambda j: False),
    "authorize": lambda ws, c, t: (["authorize", "paused"], lambda j: j["authorization"] == "paused"),
    "handoff": lambda ws, c, t: (["handoff"], lambda j: j["path"] == str(ws.handoff)),
    "target stop": lambda ws, c, t: (["target", "stop"], lambda j: j["workspace"] == str(ws.root)),
    "import": lambda ws, c, t: (["import", "aisbench", str(make_perf_dir(t))], lambda j: j["run_id"].startswith("r-")),
}


@pytest.mark.parametrize("where", POSITIONS)
@pytest.mark.parametrize("name", list(COMMANDS))
def test_workspace_and_json_work_in_any_position(
    setup: tuple[Workspace, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, where: str
) -> None:
    ws, elsewhere = setup
    command, check = COMMANDS[name](ws, capsys, tmp_path)
    argv = place(place(command, ["-w", str(ws.root)], where), ["--json"], "end" if where != "end" else "before")
    rc, out, err = call(argv, capsys)
    if rc == 2:  # a refusal: it must concern the workspace given, not the current directory
        assert "fix:" in err and str(elsewhere) not in err, err
    else:
        assert rc == 0, err
        assert check(json.loads(out)), out
    assert list(elsewhere.iterdir()) == [], "the command wrote into the current directory"


@pytest.mark.integration
def test_mcp_and_inspect_take_the_workspace_after_the_command(
    setup: tuple[Workspace, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    ws, elsewhere = setup
    rc, out, err = call(
        ["inspect", "call", "freeze_case", "path=cases/a.json", "--workspace", str(ws.root), "--json"], capsys
    )
    assert rc == 0, err
    assert "case_id" in out
    assert any(ws.frozen_dir.iterdir()) and list(elsewhere.iterdir()) == []


def test_a_workspace_option_without_a_value_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = call(["status", "-w"], capsys)
    assert rc == 2 and "-w needs a directory" in err and "fix:" in err
