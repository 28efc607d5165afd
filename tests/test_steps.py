"""A freeze that takes longer than a few seconds says what it is doing: a step past its threshold is said once
(the CLI: a line on stderr), and the MCP heartbeat names the step running. Thresholds are parameters here;
nothing asserts how long anything took."""

from __future__ import annotations

import importlib
import threading
from typing import Any

import anyio
import pytest
from mcp import Client

from caseledger.cli import main
from caseledger.server import build_server, toolset
from caseledger.tools import freeze_case
from caseledger.workspace import Workspace
from caseledger.workspace import steps as steps_mod
from caseledger.workspace.steps import Steps, step
from tests.conftest import ref_draft, write_draft

freeze_module = importlib.import_module("caseledger.tools.freeze_case")  # the module (the package exports the function)
WAIT_S = 60.0  # how long a test waits for what it expects; never a bound on the code's speed


def test_a_step_past_its_threshold_says_what_it_does_while_it_runs() -> None:
    heard: list[str] = []
    said = threading.Event()
    told = Steps(say=lambda what: (heard.append(what), said.set()), after_s=0.01)
    with told.active(), step("converting the tokenizer of m.gguf"):
        assert told.current() == "converting the tokenizer of m.gguf"
        assert said.wait(WAIT_S), "the step was not said while it ran"
    assert heard == ["converting the tokenizer of m.gguf"]  # said once: not again when it ends
    assert told.current() is None


def test_a_step_that_ended_past_its_threshold_before_the_timer_fired_is_said_at_its_end() -> None:
    heard: list[str] = []
    ticks = iter([0.0, 90.0])  # the step's start and end: 90 s long by this clock, 0 by the timer's
    told = Steps(say=heard.append, after_s=60, clock=lambda: next(ticks))
    with told.active(), step("hashing m.gguf"):
        pass
    assert heard == ["hashing m.gguf"]


def test_a_quick_step_and_a_step_without_steps_say_nothing() -> None:
    heard: list[str] = []
    with Steps(say=heard.append, after_s=3600).active(), step("hashing"):
        pass
    with step("outside any call"):  # no Steps installed: a no-op
        pass
    assert heard == []


def test_freeze_says_its_slow_steps_and_a_reused_dataset_has_none(ws: Workspace) -> None:
    heard: list[str] = []
    first = freeze_case(ws, draft=ref_draft(18001), steps=Steps(say=heard.append, after_s=0))
    assert [h for h in heard if h.startswith(f"generating dataset {first.dataset_id}: 8 entries")], heard
    again: list[str] = []
    freeze_case(ws, draft=ref_draft(18001), steps=Steps(say=again.append, after_s=0))
    assert again == []  # the dataset is reused: nothing slow to say
    quiet: list[str] = []
    freeze_case(ws, draft=ref_draft(18001, load={"requests": 9}), steps=Steps(say=quiet.append, after_s=3600))
    assert quiet == []


def test_cli_freeze_says_a_slow_step_on_stderr(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(steps_mod, "SLOW_S", 0.0)  # every step is slow
    path = write_draft(ws, "a.json", ref_draft(18001))
    assert main(["freeze", str(path), "-w", str(ws.root)]) == 0
    out = capsys.readouterr()
    assert "freeze: generating dataset d-" in out.err and "freeze:" not in out.out
    assert out.out.startswith("case c-")


def test_mcp_freeze_progress_names_the_step_running(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(toolset, "HEARTBEAT_S", 0.05)
    named = threading.Event()
    real = freeze_module._materialize

    def slow(w: Workspace, case: Any) -> str:
        with step("converting the tokenizer of m.gguf"):  # runs until a notification has named it
            assert named.wait(WAIT_S), "no progress notification named the step"
        return real(w, case)

    monkeypatch.setattr(freeze_module, "_materialize", slow)
    messages: list[str] = []

    async def progress(p: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")
        if "converting the tokenizer of m.gguf" in (message or ""):
            named.set()

    async def go() -> Any:
        async with Client(build_server(ws)) as c:
            return await c.call_tool("freeze_case", {"draft": ref_draft(18001)}, progress_callback=progress)

    answer = anyio.run(go)
    assert not answer.is_error, answer
    assert any(m.startswith("freezing the case: converting the tokenizer of m.gguf, ") for m in messages), messages
