"""phase_status can wait for a change (bounded) instead of being polled with sleep."""

from __future__ import annotations

import os
import signal
import time

import pytest

from caseledger.errors import CaseInvalid
from caseledger.tools import freeze_case, phase_status, start_run
from caseledger.workspace import Workspace, read_json
from tests.conftest import free_port, ref_draft
from tests.helpers import slow_draft, wait_state

pytestmark = pytest.mark.integration


@pytest.mark.processes
def test_a_wait_phase_by_phase_answers_at_the_next_change_and_a_settled_run_at_once(
    ws: Workspace, stop_services: None
) -> None:
    case = freeze_case(ws, draft=ref_draft(free_port()))
    r = start_run(ws, case.case_id)  # returns after preflight; the run goes on
    assert r.run_id is not None
    before = phase_status(ws, r.run_id)
    seen = [before]
    t0 = time.monotonic()
    while seen[-1].state in ("running", "created") and time.monotonic() - t0 < 120:
        seen.append(phase_status(ws, r.run_id, wait_s=60, until="change"))
        # each answer came because something changed: never the same phases twice in a row
        assert (
            (seen[-1].phases, seen[-1].state) != (seen[-2].phases, seen[-2].state)
            or seen[-1].load_ended != seen[-2].load_ended
            or seen[-1].owner_alive != seen[-2].owner_alive
        ), seen[-1].text()
    assert seen[-1].state == "succeeded", seen[-1].text()
    assert len(seen) >= 3  # several phase changes were each answered on their own
    t1 = time.monotonic()
    settled = phase_status(ws, r.run_id, wait_s=60)
    assert settled.state == "succeeded" and time.monotonic() - t1 < 30  # nothing to wait for: at once


def test_a_wait_outside_its_bounds_is_refused_naming_the_range(ws: Workspace) -> None:
    with pytest.raises(CaseInvalid, match="between 0"):
        phase_status(ws, None, wait_s=601)


@pytest.mark.processes
def test_a_default_wait_answers_once_when_the_run_ends_and_early_when_a_process_needs_the_caller(
    ws: Workspace, stop_services: None
) -> None:
    """One call from preflight to the end (the phases pass as progress, not answers); a stopped load client is
    answered at once, with its pid and the fix, long before wait_s."""
    case = freeze_case(ws, draft=ref_draft(free_port()))
    r = start_run(ws, case.case_id)
    assert r.run_id is not None and "wait_s=600" in r.next_call, r.next_call
    seen: list[str] = []
    end = phase_status(ws, r.run_id, wait_s=120, progress=lambda s: seen.append(s.phase or ""))
    assert end.state == "succeeded", end.text()
    assert len(set(seen)) >= 3, seen  # warmup, load, postprocess ... went by inside the one wait

    slow = freeze_case(ws, draft=slow_draft(free_port(), load={"requests": 40, "concurrency": 2}))
    r2 = start_run(ws, slow.case_id)
    assert r2.run_id is not None
    wait_state(ws, r2.run_id, lambda s: s.sent > 0)
    client = int(read_json(ws.run(r2.run_id).load_pid)["pid"])
    os.kill(client, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        stuck = phase_status(ws, r2.run_id, wait_s=120)
        assert time.monotonic() - t0 < 60 and stuck.blocker and "kill -CONT" in stuck.next_call, stuck.text()
    finally:
        os.kill(client, signal.SIGCONT)
    assert phase_status(ws, r2.run_id, wait_s=120).state == "succeeded"
