"""caseledger.ledger.calls: every tool call an answer names, and the same call as a command at a shell (as_cli)."""

from __future__ import annotations

import inspect
import re

import pytest

from caseledger.ledger import calls

# each form with values -> the command the CLI prints for it
FORMS = [
    (calls.freeze_case("cases/x.json"), "caseledger freeze cases/x.json"),
    (calls.freeze_case("cases/x.json", parent="c-1"), "caseledger freeze cases/x.json --parent c-1"),
    (calls.start_run("c-1"), "caseledger run c-1 --wait"),
    (calls.start_run("c-1", preflight_only=True), "caseledger run c-1 --preflight-only"),
    (calls.phase_status(), "caseledger status"),
    (calls.phase_status("r-1"), "caseledger status r-1"),
    (calls.phase_status("r-1", calls.MAX_WAIT_S), "caseledger status r-1 --wait 600"),
    (calls.resume("r-1"), "caseledger resume r-1 --wait"),
    (calls.reprocess_raw("r-1"), "caseledger reprocess r-1"),
    (calls.summarize(), "caseledger summarize"),
    (calls.summarize(["r-1", "r-2"]), "caseledger summarize r-1 r-2"),
    (calls.summarize(scenario="s-1"), "caseledger summarize --scenario s-1"),
]
TOOLS = ("freeze_case", "start_run", "phase_status", "resume", "reprocess_raw", "summarize")
CALL_SHAPED = re.compile(rf"\b({'|'.join(TOOLS)})\((run_id|case_id|path|scenario|run_ids|wait_s)=")
SAMPLE = {  # a value per parameter name of the module's functions
    "run_id": "r-1",
    "case_id": "c-1",
    "campaign_id": "g-1",
    "parent": "c-0",
    "path": "cases/x.json",
    "what": "next candidate",
    "why": "a reason",
    "run_ids": ["r-1"],
    "scenario": "s-1",
    "wait_s": 600.0,
    "preflight_only": True,
}


@pytest.mark.parametrize(("call", "command"), FORMS, ids=[c for c, _ in FORMS])
def test_every_form_is_a_command_at_a_shell(call: str, command: str) -> None:
    assert calls.as_cli(f"next: {call}; then") == f"next: {command}; then"


def _said() -> list[tuple[str, str]]:
    """Every public function of the module (but as_cli) with its parameters given, each optional one left
    out and given: (how it was called, what it wrote)."""
    out = []
    for name, fn in inspect.getmembers(calls, inspect.isfunction):
        if name.startswith("_") or name == "as_cli" or fn.__module__ != calls.__name__:
            continue
        params = inspect.signature(fn).parameters
        required = {p: SAMPLE[p] for p, v in params.items() if v.default is inspect.Parameter.empty}
        for given in (required, {p: SAMPLE[p] for p in params}):
            out.append((f"{name}({given})", fn(**given)))
    return out


def test_every_call_the_module_writes_has_its_command() -> None:
    """Each form and situation, with values, leaves no tool call behind once the CLI says it: the table of
    as_cli knows every form the module writes (a form added without its command fails here)."""
    said = _said()
    assert {s.split("(")[0] for s, _ in said} >= set(TOOLS)  # the six forms are among them
    left = [(how, calls.as_cli(text)) for how, text in said if CALL_SHAPED.search(calls.as_cli(text))]
    assert not left, left


def test_a_placeholder_is_written_for_the_caller_to_fill_in() -> None:
    assert calls.start_run(...) == "start_run(case_id=...)"
    assert calls.freeze_case() == "freeze_case(path=...)"
    assert calls.summarize(...) == "summarize(run_ids=[...])"
    assert calls.next_candidate(None) == "freeze_case(next candidate, parent=<the scenario's baseline>)"
    assert calls.wait("g-1") == "phase_status(run_id='g-1', wait_s=600): answers when it ends or needs you"


def test_a_placeholder_at_a_shell_is_named_in_angle_brackets() -> None:
    said = calls.as_cli(f"{calls.first_case()}; {calls.summarize(...)}; {calls.freeze_case(..., parent='c-1')}")
    assert said == (
        "caseledger freeze cases/x.json then caseledger run <case_id> --wait; caseledger summarize <run_id> ...; "
        "caseledger freeze <path> --parent c-1"
    )
