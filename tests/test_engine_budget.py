"""A question and a budget on a real llama-server, as an agent asks it over MCP: a -np x C space under a TTFT p99
limit given to one campaign with a budget of measurements, answered in at most five tool calls (freeze, start, a
wait, summarize, and one spare wait), within the budget, naming its best or tie and what it did not test."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from caseledger import services
from caseledger.ledger import authorization
from caseledger.ledger.runs import scan_runs
from caseledger.workspace import Workspace
from tests.conftest import free_port
from tests.engine import llama_draft, llama_paths

pytestmark = [pytest.mark.engine, pytest.mark.integration]

BUDGET = 5


def _draft(port: int, server: str, model: str) -> dict[str, Any]:
    base = llama_draft(port, server, model, scenario="llama-budget", load={"requests": 8, "concurrency": 1})
    return {
        "campaign": {
            "name": "np-by-c-budget",
            "base": base,
            "axes": [
                {"path": "service.argv[-np]", "values": [2, 4]},
                {"path": "load.concurrency", "values": [1, 2, 4, 8]},
            ],
            "search": {"kind": "knee", "axis": "load.concurrency", "monotone": True},
            "decision": {"primary_metric": "output_throughput", "limits": {"ttft_p99_ms": 20000}},
            "repeats": {"runs": 1, "settle_runs": 2, "budget": 2},
            "budget": {"measurements": BUDGET},
        }
    }


def test_a_space_larger_than_its_budget_is_answered_in_five_calls_within_the_budget(tmp_path: Path) -> None:
    server, model = llama_paths()
    ws = Workspace(tmp_path / "ws")
    (ws.root / "cases").mkdir(parents=True)
    authorization.set_mode(ws, "auto")
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "caseledger", "mcp", "--workspace", str(ws.root)], env=dict(os.environ)
    )
    calls: list[str] = []
    said: dict[str, Any] = {}

    async def agent() -> None:
        async with Client(params) as c:

            async def call(tool: str, args: dict[str, Any]) -> Any:
                calls.append(tool)
                r = await c.call_tool(tool, args)
                assert not r.is_error, r
                return r

            frozen = await call("freeze_case", {"draft": _draft(free_port(), server, model)})
            said["freeze"] = "\n".join(getattr(x, "text", "") for x in frozen.content)
            assert frozen.structured_content is not None
            gid = frozen.structured_content["campaign_id"]
            await call("start_run", {"case_id": gid})
            for _ in range(2):  # the wait answers when the campaign ends: once, or twice on a slow host
                st = await call("phase_status", {"run_id": gid, "wait_s": 600})
                if (st.structured_content or {}).get("complete"):
                    break
            s = await call("summarize", {"run_ids": [gid]})
            said["answer"] = "\n".join(getattr(x, "text", "") for x in s.content)

    try:
        anyio.run(agent)
    finally:
        services.stop_all(ws)
    text = said["answer"]
    print(said["freeze"], text, sep="\n")  # the figures for the issue note (pytest -s)
    assert len(calls) <= 5, calls
    assert "estimate:" in said["freeze"] and f"budget {BUDGET} measurements" in said["freeze"], said["freeze"]
    assert len(scan_runs(ws).metas) <= BUDGET, text  # the budget holds: no run past it was started
    assert "campaign complete" in text, text
    assert any(w in text for w in ("winner ", "tie within noise", "leading ")), text
    assert "untested:" in text or "budget:" in text, text  # what the budget left out is named
