"""Progress notifications over MCP: a client that sends a progress token with a bounded phase_status wait
receives notifications read from the run's state (phases finished, formal requests done), over a real stdio
session with the SDK's client."""

from __future__ import annotations

import os
import sys

import anyio
import pytest
from mcp import Client, StdioServerParameters

from caseledger.workspace import Workspace
from tests.helpers import progress_case

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


async def test_a_bounded_wait_with_a_progress_token_notifies_phases_and_requests_done(
    ws: Workspace, stop_services: None
) -> None:
    cid = progress_case(ws)
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "caseledger", "mcp", "--workspace", str(ws.root)], env=dict(os.environ)
    )
    calls: list[list[tuple[float, float | None, str | None]]] = []
    async with Client(params) as c:
        started = await c.call_tool("start_run", {"case_id": cid})
        assert not started.is_error and started.structured_content, started
        run_id = started.structured_content["run_id"]
        plain = await c.call_tool("phase_status", {"run_id": run_id, "wait_s": 0})  # no wait: nothing to notify
        assert not plain.is_error
        with anyio.fail_after(200):
            state = "running"
            while state in ("running", "created"):
                seen: list[tuple[float, float | None, str | None]] = []

                async def progress(
                    p: float,
                    total: float | None,
                    message: str | None,
                    seen: list[tuple[float, float | None, str | None]] = seen,
                ) -> None:
                    seen.append((p, total, message))

                r = await c.call_tool("phase_status", {"run_id": run_id, "wait_s": 60}, progress_callback=progress)
                assert not r.is_error and r.structured_content
                state = r.structured_content["state"]
                calls.append(seen)
    assert state == "succeeded"
    notes = [n for seen in calls for n in seen]
    assert notes, "no progress notification during any wait"
    for seen in calls:  # within one request the value only grows, against the run's phases
        values = [p for p, _, _ in seen]
        assert values == sorted(values) and len(set(values)) == len(values), seen
        assert all(total == 9 for _, total, _ in seen), seen
    assert all(m and m.startswith(run_id) and "formal sent" in m for _, _, m in notes), notes
    loading = [(p, m) for p, _, m in notes if m and " load running:" in m]
    # the load's requests moved the value between two phases: counts, not a clock
    assert any(not float(p).is_integer() for p, _ in loading), loading
    assert any("done 64" in (m or "") for _, _, m in notes) or any(p >= 6 for p, _, _ in notes), notes
