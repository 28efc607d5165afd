"""A question and a budget on a real llama-server, as an agent asks it over MCP: the best -np x -b x -ub x C
under a TTFT p99 limit, given to one campaign with a budget of 25 measurements (the search kind left to the tool,
`auto`, unless --kind says otherwise). Prints the tool calls it took, the runs, service starts and minutes spent,
the answer, and whether the budget held.

Needs a llama-server and its model: `set -a; . ~/.cache/caseledger/llama.env; set +a`, then
`flock /tmp/caseledger-cpu.lock .venv/bin/python bench/bench_engine_budget.py [--kind auto] [--budget 25]`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from caseledger import services
from caseledger.ledger import authorization
from caseledger.ledger.runs import scan_runs
from caseledger.workspace import Workspace
from tests.conftest import free_port
from tests.engine import llama_draft

AXES = [
    {"path": "service.argv[-np]", "values": [2, 4, 8]},
    {"path": "service.argv[-b]", "values": [512, 1024, 2048]},
    {"path": "service.argv[-ub]", "values": [128, 256, 512]},
    {"path": "load.concurrency", "values": [1, 2, 4, 8]},
]


def draft(kind: str, budget: int) -> dict[str, Any]:
    server, model = os.environ["CASELEDGER_LLAMA_SERVER"], os.environ["CASELEDGER_LLAMA_MODEL"]
    base = llama_draft(free_port(), server, model, scenario="bench-budget", load={"requests": 16, "concurrency": 4})
    base["service"]["argv"] += ["-b", "2048", "-ub", "512"]  # -np 4 is in the argv already
    search: dict[str, Any] = {"kind": kind}
    if kind in ("knee", "tpe"):
        search.update(axis="load.concurrency", monotone=True)
    if kind == "tpe":
        search.update(max_points=budget)
    return {
        "campaign": {
            "name": f"np-b-ub-c-{kind}",
            "base": base,
            "axes": AXES,
            "search": search,
            "decision": {"primary_metric": "output_throughput", "limits": {"ttft_p99_ms": 4000}},
            "budget": {"measurements": budget},
        }
    }


async def agent(ws: Workspace, d: dict[str, Any], calls: list[str], said: dict[str, str]) -> None:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "caseledger", "mcp", "--workspace", str(ws.root)], env=dict(os.environ)
    )
    async with Client(params) as c:

        async def call(tool: str, args: dict[str, Any]) -> Any:
            calls.append(tool)
            return await c.call_tool(tool, args)

        frozen = await call("freeze_case", {"draft": d})
        said["freeze"] = "\n".join(getattr(x, "text", "") for x in frozen.content)
        gid = (frozen.structured_content or {})["campaign_id"]
        await call("start_run", {"case_id": gid})
        for _ in range(6):
            st = await call("phase_status", {"run_id": gid, "wait_s": 600})
            if (st.structured_content or {}).get("complete"):
                break
        s = await call("summarize", {"run_ids": [gid]})
        said["answer"] = "\n".join(getattr(x, "text", "") for x in s.content)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", default="auto")
    ap.add_argument("--budget", type=int, default=25)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-budget-"))
    ws = Workspace(root / "ws")
    (ws.root / "cases").mkdir(parents=True)
    authorization.set_mode(ws, "auto")
    calls: list[str] = []
    said: dict[str, str] = {}
    t0 = time.monotonic()
    try:
        anyio.run(agent, ws, draft(a.kind, a.budget), calls, said)
    finally:
        services.stop_all(ws)
    took = time.monotonic() - t0
    runs = len(scan_runs(ws).metas)
    print(said.get("freeze", ""), said.get("answer", ""), sep="\n")
    print(
        f"\nspace {3 * 3 * 3 * 4} points; kind {a.kind}; budget {a.budget} measurements: {runs} runs "
        f"({'within' if runs <= a.budget else 'PAST'} the budget); {len(calls)} tool calls ({', '.join(calls)}); "
        f"{took / 60:.1f} min; workspace {ws.root}"
    )


if __name__ == "__main__":
    main()
