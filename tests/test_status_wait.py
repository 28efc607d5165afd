"""phase_status can wait for a change (bounded) instead of being polled with sleep."""

from __future__ import annotations

import time

import pytest

from caseledger.errors import CaseInvalid
from caseledger.tools import freeze_case, phase_status, start_run
from caseledger.workspace import Workspace
from tests.conftest import free_port, ref_draft

pytestmark = pytest.mark.integration


@pytest.mark.processes
def test_a_bounded_wait_answers_at_the_next_change_and_a_settled_run_at_once(
    ws: Workspace, stop_services: None
) -> None:
    case = freeze_case(ws, draft=ref_draft(free_port()))
    r = start_run(ws, case.case_id)  # returns after preflight; the run goes on
    assert r.run_id is not None
    before = phase_status(ws, r.run_id)
    seen = [before]
    t0 = time.monotonic()
    while seen[-1].state in ("running", "created") and time.monotonic() - t0 < 120:
        seen.append(phase_status(ws, r.run_id, wait_s=60))
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
