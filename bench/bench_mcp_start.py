"""MCP session start over stdio: spawn to the `initialize` answer, and on to the `tools/list` answer, for the SDK's
own minimal server (`MCPServer("minimal")`, one tool: the floor with mcp 2.x) and `caseledger mcp`, tries
alternated in one run so both see the same machine. Medians and the spread of N tries each.

    flock /tmp/caseledger-cpu.lock .venv/bin/python bench/bench_mcp_start.py [N] [--tree LABEL=DIR ...]
        [--workspace DIR] [--summarize]

--tree adds `caseledger mcp` from another checkout (e.g. a `git archive` of main) beside this one: its code runs
from DIR with this interpreter's packages. --workspace serves an existing workspace (default: a new empty one).
--summarize also times the first MCP `summarize` of a scenario right after a fresh run (see summarize_after_run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

MINIMAL = """
from mcp.server import MCPServer
mcp = MCPServer("minimal")
@mcp.tool()
def ping() -> str:
    \"\"\"Answer pong.\"\"\"
    return "pong"
mcp.run()
"""

CASELEDGER = "import sys; sys.path.insert(0, sys.argv.pop(1)); from caseledger.cli import main; sys.exit(main())"

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}},
}
LIST = [
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
]


def _send(p: subprocess.Popen[bytes], *messages: dict[str, Any]) -> None:
    assert p.stdin is not None
    p.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in messages))
    p.stdin.flush()


def _answer(p: subprocess.Popen[bytes], rid: int) -> dict[str, Any]:
    assert p.stdout is not None
    while True:
        line = p.stdout.readline()
        if not line:
            raise RuntimeError("the server closed stdout before answering")
        msg: dict[str, Any] = json.loads(line)
        if msg.get("id") == rid:
            if "result" not in msg:
                raise RuntimeError(f"error answer: {msg}")
            return msg


def one_try(argv: list[str]) -> tuple[float, float, int]:
    """(s to the initialize answer, s to the tools/list answer, tools/list bytes) of one fresh server."""
    t = time.perf_counter()
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        _send(p, INIT)
        _answer(p, 1)
        ready = time.perf_counter() - t
        _send(p, *LIST)
        listed = _answer(p, 2)
        return ready, time.perf_counter() - t, len(json.dumps(listed["result"], separators=(",", ":")))
    finally:
        assert p.stdin is not None
        p.stdin.close()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _row(label: str, tries: list[tuple[float, float, int]]) -> str:
    init = [x[0] for x in tries]
    listed = [x[1] for x in tries]
    return (
        f"{label:<28} initialize median {statistics.median(init):.3f} s (min {min(init):.3f}, max {max(init):.3f})"
        f"  tools/list median {statistics.median(listed):.3f} s  ({tries[0][2]} B listed)"
    )


def summarize_call(argv: list[str], scenario: str) -> tuple[float, bool]:
    """(s from the tools/call request to its answer, whether it attached a PNG) of a fresh server's first call."""
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        _send(p, INIT)
        _answer(p, 1)
        call = {"name": "summarize", "arguments": {"scenario": scenario}}
        t = time.perf_counter()
        _send(p, LIST[0], {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": call})
        got = _answer(p, 3)["result"]
        took = time.perf_counter() - t
        return took, any(c.get("type") == "image" for c in got.get("content", []))
    finally:
        assert p.stdin is not None
        p.stdin.close()
        p.wait(30)


def summarize_after_run(servers: dict[str, list[str]], n: int) -> None:
    """The first MCP summarize of a scenario right after a fresh run (reference target, 8 requests), n runs: by
    this tree's server as this tree's controller leaves the workspace (the chart drawn at the end of the run), then
    with the chart deleted, as a controller that does not draw leaves it, by every caseledger server."""
    sys.path.insert(0, str(ROOT))
    from caseledger import procs, services
    from caseledger.ledger import authorization
    from caseledger.tools import freeze_case, start_run
    from caseledger.workspace import Workspace, read_json_or_none
    from tests.conftest import free_port, ref_draft

    ws = Workspace(Path(tempfile.mkdtemp(prefix="bench-summarize-")))
    (ws.root / "cases").mkdir()
    authorization.set_mode(ws, "auto")
    mine = next(k for k in servers if "this tree" in k)
    times: dict[str, list[float]] = {}
    port = free_port()
    try:
        for i in range(n):
            case = ref_draft(port, scenario="bench-first", load={"requests": 8, "concurrency": i + 1})
            r = start_run(ws, freeze_case(ws, draft=case).case_id, wait=True)
            ctl = read_json_or_none(ws.run(str(r.run_id)).controller_pid)
            while procs.alive(ctl):  # this tree's controller draws after the run's outcome
                time.sleep(0.05)
            runs = [(f"{mine}, chart drawn by the controller", servers[mine])]
            runs += [(f"{k}, chart not on disk", v) for k, v in servers.items() if k.startswith("caseledger")]
            for label, argv in runs:
                if "not on disk" in label:
                    for f in ws.reports_dir.glob("scenario-bench-first-*.png"):
                        f.unlink()
                took, png = summarize_call([*argv[:-1], str(ws.root)], "bench-first")
                times.setdefault(label + ("" if png else " (no PNG!)"), []).append(took)
    finally:
        services.stop_all(ws)
    print(f"first MCP summarize of a scenario after a fresh run ({n} runs; tools/call to answer):")
    for label, xs in times.items():
        print(f"  {label:<64} median {statistics.median(xs):.3f} s  ({', '.join(f'{x:.3f}' for x in xs)})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", nargs="?", type=int, default=7, help="tries per server")
    ap.add_argument("--tree", action="append", default=[], help="LABEL=DIR: caseledger mcp from another checkout")
    ap.add_argument("--workspace", type=Path, help="serve this workspace (default: a new empty one)")
    ap.add_argument("--summarize", action="store_true", help="also time the first summarize after a fresh run")
    args = ap.parse_args()
    ws = args.workspace or Path(tempfile.mkdtemp(prefix="bench-mcp-"))
    (ws / "cases").mkdir(parents=True, exist_ok=True)
    servers = {"SDK minimal (floor)": [sys.executable, "-c", MINIMAL]}
    for label, tree in [("this tree", str(ROOT)), *(t.split("=", 1) for t in args.tree)]:
        servers[f"caseledger mcp ({label})"] = [sys.executable, "-c", CASELEDGER, tree, "mcp", "--workspace", str(ws)]
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}; {args.n} alternated tries each")
    for argv in servers.values():  # warm the .pyc files and the page cache: not counted
        one_try(argv)
    tries: dict[str, list[tuple[float, float, int]]] = {k: [] for k in servers}
    for _ in range(args.n):
        for label, argv in servers.items():
            tries[label].append(one_try(argv))
    floor = statistics.median(x[0] for x in tries["SDK minimal (floor)"])
    for label, got in tries.items():
        print(
            _row(label, got) + ("" if "floor" in label else f"  (+{statistics.median(x[0] for x in got) - floor:.3f})")
        )
    if args.summarize:
        summarize_after_run(servers, max(1, args.n // 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
