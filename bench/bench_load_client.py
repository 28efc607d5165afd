"""Load client cost per chunk: the formal load process against the reference target with each transport
(httpx2, and fast: asyncio + httptools), and a raw-asyncio baseline client measured in the same run,
against the same server.

    python bench/bench_load_client.py [--requests 64] [--tokens 256] [--concurrency 32] [--repeats 3]

The reference target runs with zero delays (prefill_tokens_per_s huge, decode steps 0 s, slots >= C)
pinned to CPU 0; every client is pinned to CPU 1. Figures per client run:
  chunks/s        content chunks / (last end - first send)
  us/chunk        client CPU (user + sys) over the load window / content chunks: the client's own cost
  chunks/read     content chunks per network read (the target coalesces emissions buffered since its
                  last write, so a slow reader sees several SSE events per read and pays less per event)
  server CPU %    of its core during the window (near 100%: the server, not the client, set chunks/s)
The formal client's CPU comes from end.json (cpu_load_*: anchor to end, without start-up and plan).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.helpers

import httpx2
import orjson

from caseledger.records import read_records
from caseledger.workspace import RunPaths, Workspace, read_json
from tests.helpers import make_run_dir

SERVER_CPU, CLIENT_CPU = 0, 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pinned(cpu: int) -> Any:
    return lambda: os.sched_setaffinity(0, {cpu})


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_target(port: int, slots: int, log: Path) -> subprocess.Popen[bytes]:
    config = {"prefill_tokens_per_s": 1e12, "decode_step_s": 0.0, "decode_step_per_seq_s": 0.0, "slots": slots}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "caseledger.target",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--model",
            "bench",
            "--config-json",
            orjson.dumps(config).decode(),
            "--log-level",
            "warning",
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        preexec_fn=pinned(SERVER_CPU),
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx2.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx2.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"reference target did not start; see {log}")
        time.sleep(0.05)


def make_run(ws: Workspace, run_id: str, port: int, n: int, tokens: int, c: int) -> RunPaths:
    draft = {
        "scenario": "bench-load-client",
        "target": {"endpoints": [{"base_url": f"http://127.0.0.1:{port}/v1", "model": "bench"}]},
        "dataset": {"source": "synthetic", "input_tokens": 32, "output_tokens": tokens},
        "load": {"requests": n, "concurrency": c, "timeout_s": 120},
    }
    return make_run_dir(ws, draft, run_id)  # the run directory as the controller writes it, as the tests build it


def row(name: str, chunks: int, reads: int, wall_s: float, cpu_s: float, server_s: float, ok: int) -> dict[str, Any]:
    return {
        "client": name,
        "ok": ok,
        "chunks": chunks,
        "chunks_per_s": chunks / wall_s,
        "us_per_chunk": cpu_s / chunks * 1e6,
        "chunks_per_read": chunks / max(reads, 1),
        "server_cpu_pct": 100 * server_s / wall_s,
    }


TRANSPORT_ROWS = {"httpx": "caseledger.load (httpx2 aiter_raw)", "fast": "caseledger.load (fast: httptools)"}


def run_formal(paths: RunPaths, server_pid: int, transport: str) -> dict[str, Any]:
    s0 = proc_cpu_s(server_pid)
    env = {**os.environ, "CASELEDGER_LOAD_TRANSPORT": transport}
    out = subprocess.run(
        [sys.executable, "-m", "caseledger.load", str(paths.root)],
        capture_output=True,
        text=True,
        preexec_fn=pinned(CLIENT_CPU),
        timeout=600,
        env=env,
    )
    s1 = proc_cpu_s(server_pid)
    if out.returncode != 0:
        raise SystemExit(f"load client failed ({out.returncode}): {out.stderr}")
    end = read_json(paths.load_end)
    if end.get("transport", transport) != transport:
        raise SystemExit(f"asked for transport {transport}, the load used {end['transport']}")
    recs = read_records(paths.raw).records
    reads = sum(len(set(r["chunk_ns"])) for r in recs)  # chunks sharing a timestamp came in one read
    wall = (end["last_end_ns"] - end["first_send_ns"]) / 1e9
    cpu = end["cpu_load_user_s"] + end["cpu_load_sys_s"]
    return row(TRANSPORT_ROWS[transport], end["chunks"], reads, wall, cpu, s1 - s0, end["ok"])


# ---- the raw asyncio baseline: hand-written HTTP/1.1 + chunked + SSE, one connection per stream ----------


async def _baseline_one(host: str, port: int, path: str, body: bytes, counts: list[int]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        b"POST %s HTTP/1.1\r\nhost: %s:%d\r\ncontent-type: application/json\r\n"
        b"x-caseledger-phase: bench-baseline\r\ncontent-length: %d\r\n\r\n"
        % (path.encode(), host.encode(), port, len(body))
        + body
    )
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head[:80]
    assert b"chunked" in head.lower()
    buf, done = b"", False
    while not done:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        data = await reader.readexactly(size + 2)
        counts[1] += 1
        if size == 0:
            break
        buf += data[:-2]
        *events, buf = buf.split(b"\n\n")
        for ev in events:
            payload = ev[6:]
            if payload == b"[DONE]":
                done = True
                continue
            obj = orjson.loads(payload)
            ch = obj.get("choices")
            if ch and (ch[0].get("delta") or {}).get("content"):
                counts[0] += 1
    writer.close()


async def _baseline(run_dir: str, c: int) -> dict[str, Any]:
    from caseledger.load.schedule import schedule_from_run_dir

    plan = schedule_from_run_dir(Path(run_dir))
    url = urlsplit(plan.specs[0].url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    counts = [0, 0]
    sem = asyncio.Semaphore(c)

    async def one(body: bytes) -> None:
        async with sem:
            await _baseline_one(host, port, url.path, body, counts)

    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    await asyncio.gather(*(one(s.body) for s in plan.specs))
    wall = time.monotonic() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
    return {"chunks": counts[0], "reads": counts[1], "wall_s": wall, "cpu_s": cpu, "ok": len(plan.specs)}


def run_baseline(paths: RunPaths, c: int, server_pid: int) -> dict[str, Any]:
    s0 = proc_cpu_s(server_pid)
    out = subprocess.run(
        [sys.executable, __file__, "--baseline-run", str(paths.root), "--concurrency", str(c)],
        capture_output=True,
        text=True,
        preexec_fn=pinned(CLIENT_CPU),
        timeout=600,
    )
    s1 = proc_cpu_s(server_pid)
    if out.returncode != 0:
        raise SystemExit(f"baseline failed: {out.stderr}")
    m = orjson.loads(out.stdout.strip().splitlines()[-1])
    return row("raw asyncio streams (baseline)", m["chunks"], m["reads"], m["wall_s"], m["cpu_s"], s1 - s0, m["ok"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--baseline-run", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.baseline_run:
        print(orjson.dumps(asyncio.run(_baseline(args.baseline_run, args.concurrency))).decode())
        return 0
    if (os.cpu_count() or 1) < 2:
        print("needs 2 CPUs (server on CPU 0, client on CPU 1)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        ws = Workspace(Path(tmp) / "ws")
        port = free_port()
        server = start_target(port, max(args.concurrency, 1), Path(tmp) / "target.log")
        try:
            rows: dict[str, list[dict[str, Any]]] = {}
            for k in range(args.repeats):
                runs = {
                    t: make_run(ws, f"r-{k:06x}{n:06x}", port, args.requests, args.tokens, args.concurrency)
                    for n, t in enumerate(TRANSPORT_ROWS)
                }  # a run's formal load is sent once: one each
                for r in (
                    *(run_formal(p, server.pid, t) for t, p in runs.items()),
                    run_baseline(runs["httpx"], args.concurrency, server.pid),
                ):
                    rows.setdefault(r["client"], []).append(r)
        finally:
            server.terminate()
            server.wait(10)
    print(
        f"{args.requests} requests x {args.tokens} tokens, C={args.concurrency}, server on CPU {SERVER_CPU}, "
        f"client on CPU {CLIENT_CPU}; median of {args.repeats}"
    )
    head = f"{'client':<36} {'chunks/s':>9} {'us/chunk':>9} {'chunks/read':>12} {'server CPU':>11} {'ok':>4}"
    print(head)
    print("-" * len(head))
    for name, rs in rows.items():

        def med(key: str, rs: list[dict[str, Any]] = rs) -> float:
            return float(statistics.median(r[key] for r in rs))

        print(
            f"{name:<36} {med('chunks_per_s'):>9,.0f} {med('us_per_chunk'):>9.1f} {med('chunks_per_read'):>12.2f} "
            f"{med('server_cpu_pct'):>10.0f}% {int(med('ok')):>4}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
