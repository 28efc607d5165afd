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
        from bench_summarize_first import summarize_after_run

        summarize_after_run(args.n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
