"""One against two load client processes (load.processes) on this machine, against bench/peers' servers.

    python bench/bench_load_processes.py [--repeats 3] [--processes 2]

Four scenarios, each run with load.processes 1 and P (interleaved, the order rotating each repeat):
  zero-delay C=32, 256 requests x 256 tokens: the server writes the next chunk of every open stream on every
      loop pass, so the clients set the pace; aggregate chunks/s = content chunks / (last end - first send) of
      the merged stream (the end file's span), and the clients' CPU per chunk (end files, summed)
  zero-delay burst 16 C=32: the same, the server writing 16 chunks of a stream per write, so its CPU per chunk
      falls well below the clients' and, on two cores it shares with them, it stops being what limits two
      clients (the server's own CPU per chunk and its share of a core are in the table for every scenario)
  zero-delay prerender C=32: the server writes each whole response in one write from a pre-rendered template
      (server.py --prerender), the cheapest server per chunk (~1.5 µs); the clients then read many events per
      socket read, so their CPU per chunk is that of coalesced reads, not of one chunk per read
  paced C=64, 128 requests x 128 tokens, one chunk per stream every 10 ms: the timestamp error of the merged
      stream, per content chunk client receive time - server send time (same host, same CLOCK_MONOTONIC;
      the server logs each send right before its write), p50 / p99
Per zero-delay scenario it prints three ratios, P processes / 1: chunks/s over the merged window; chunks/s over the
span all P clients were loading (latest first send to earliest last end, so start skew and the tail of the
last client are left out); and a CPU-derived one, P x (one process's µs/chunk) / (P processes' µs/chunk), the
ratio if every client had a core of its own and the server none. Client and server cores are CPU seconds over
the merged window, with their system (kernel) share.
Default: nothing is pinned, the server and the P clients share the two cores as the scheduler places them, and
the server runs at the load client's nice (LOAD_NICE, -5 where allowed), so two clients do not starve it; --pin:
the server on CPU 0, client k on CPU (1 + k) mod 2 (one client: CPU 1; two: one of them beside the server).
The P clients are started as the controller starts them: armed, each with its share, one go naming the common
start (caseledger/run/load/parts.py), then merged by caseledger.load.parts.merge, the controller's own merge.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from caseledger import datasets
from caseledger.case.model import Case
from caseledger.case.store import case_id_of
from caseledger.load.__main__ import LOAD_NICE
from caseledger.load.parts import go_record, merge
from caseledger.load.schedule import schedule_from_run_dir
from caseledger.records import read_records
from caseledger.workspace import RunPaths, Workspace, atomic_write, canonical_json, read_json, write_json

HERE = Path(__file__).resolve().parent
# step ms, C, requests, tokens, chunks per server write (0: the whole response pre-rendered, --prerender)
SCENARIOS = {
    "zero-delay C=32": (0.0, 32, 256, 256, 1),
    "zero-delay burst 16 C=32": (0.0, 32, 256, 256, 16),
    "zero-delay prerender C=32": (0.0, 32, 256, 256, 0),
    "paced C=64": (10.0, 64, 128, 128, 1),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.load(r)


def placed(cpu: int | None) -> Any:
    """A child's start: at the load client's nice (where allowed), on one CPU when given."""

    def setup() -> None:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, LOAD_NICE)
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})

    return setup


def start_server(port: int, step_ms: float, burst: int, log: Path, pin: bool) -> subprocess.Popen[bytes]:
    argv = [sys.executable, str(HERE / "peers" / "server.py"), "--port", str(port), "--step-ms", str(step_ms)]
    argv += ["--burst", str(burst)] if burst > 0 else ["--prerender"]
    proc = subprocess.Popen(
        argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, preexec_fn=placed(0 if pin else None)
    )
    for _ in range(200):
        try:
            get_json(f"http://127.0.0.1:{port}/health")
            return proc
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
    raise SystemExit(f"peer server on port {port} did not start; see {log}")


def make_run(ws: Workspace, port: int, n: int, tokens: int, c: int, processes: int) -> RunPaths:
    case = Case.model_validate(
        {
            "scenario": "bench-load-processes",
            "target": {"endpoints": [{"base_url": f"http://127.0.0.1:{port}/v1", "model": "peer-model"}]},
            "dataset": {"source": "synthetic", "input_tokens": 32, "output_tokens": tokens},
            "load": {"requests": n, "concurrency": c, "timeout_s": 120, "processes": processes},
        }
    ).filled()
    ident = datasets.materialize(ws, case)
    run_id = f"r-{time.monotonic_ns() & 0xFFFFFFFF:08x}"
    paths = ws.run(run_id)
    paths.root.mkdir(parents=True)
    atomic_write(paths.case, canonical_json(case.canonical()) + b"\n")
    meta = {"run_id": run_id, "case_id": case_id_of(case), "workspace": str(ws.root)}
    write_json(paths.run_json, {**meta, "dataset_id": ident.dataset_id, "salt": run_id, "planned": n})
    return paths


def run_load(paths: RunPaths, processes: int, pin: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The formal load with `processes` clients, as the controller runs it; the merged end file and each
    client's own."""
    if processes == 1:
        argv = [sys.executable, "-m", "caseledger.load", str(paths.root)]
        out = subprocess.run(argv, capture_output=True, timeout=600, preexec_fn=placed(1 if pin else None))
        if out.returncode != 0:
            raise SystemExit(f"load client failed ({out.returncode}): {out.stderr.decode()[-400:]}")
        end: dict[str, Any] = read_json(paths.load_end)
        return end, [end]
    parts = [paths.load_part(k) for k in range(processes)]
    env = {**os.environ, "CASELEDGER_LOAD_ARMED": "1"}
    procs = []
    for k, part in enumerate(parts):
        part.load_dir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "caseledger.load", str(paths.root), str(k)]
        log = part.load_log.open("wb")
        cpu = (1 + k) % 2 if pin else None
        procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=placed(cpu)))
    while not all(p.load_ready.exists() for p in parts):
        if any(p.poll() is not None for p in procs):
            raise SystemExit(f"a load client exited before the go; see {paths.load_dir}/p*/client.log")
        time.sleep(0.01)
    write_json(paths.load_go, go_record())
    for p in procs:
        if p.wait(600) != 0:
            raise SystemExit(f"a load client failed ({p.returncode}); see {paths.load_dir}/p*/client.log")
    merged = merge(paths, parts, schedule_from_run_dir(paths.root).digest())
    ends = []  # each client's window on process 0's clock, as the merged records are
    for e, info in zip(merged.ends, merged.per_part, strict=True):
        assert e is not None
        ns = info["shift_ns"]
        ends.append({**e, "first_send_ns": e["first_send_ns"] + ns, "last_end_ns": e["last_end_ns"] + ns})
    return read_json(paths.load_end), ends


def cpu_s(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of a live process (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def overlap(records: list[Any], ends: list[dict[str, Any]]) -> tuple[float, float, float]:
    """Start skew and end skew of the clients (ms), and chunks/s over the span all of them were loading
    (latest first send to earliest last end; the whole window for one client)."""
    firsts = [e["first_send_ns"] for e in ends]
    lasts = [e["last_end_ns"] for e in ends]
    lo, hi = max(firsts), min(lasts)
    inside = sum(1 for r in records if r["ok"] for t in r["chunk_ns"] if lo <= t <= hi)
    return (max(firsts) - min(firsts)) / 1e6, (max(lasts) - min(lasts)) / 1e6, inside / max(hi - lo, 1) * 1e9


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))]


def one(work: Path, scenario: str, processes: int, pin: bool) -> dict[str, Any]:
    step_ms, c, n, tokens, burst = SCENARIOS[scenario]
    port = free_port()
    server = start_server(port, step_ms, burst, work / f"server-{port}.log", pin)
    try:
        paths = make_run(Workspace(work / "ws"), port, n, tokens, c, processes)
        cpu0 = cpu_s(server.pid)
        end, ends = run_load(paths, processes, pin)
        server_user, server_sys = (b - a for a, b in zip(cpu0, cpu_s(server.pid), strict=True))
        log = get_json(f"http://127.0.0.1:{port}/_log")
    finally:
        server.terminate()
        server.wait(10)
    streams = {int(k): v for k, v in log["streams"].items()}
    records = read_records(paths.raw).records
    errors: list[float] = []
    for rec in records:
        srv = streams.get(int(rec["prompt_tokens"] or -1))
        if srv is not None and rec["ok"]:
            errors += [(t - s) / 1e3 for t, s in zip(rec["chunk_ns"], srv["sent_ns"], strict=False)]
    wall = (end["last_end_ns"] - end["first_send_ns"]) / 1e9
    start_skew, end_skew, overlap_rate = overlap(records, ends)
    client_cpu = end["cpu_load_user_s"] + end["cpu_load_sys_s"]
    return {
        "ok": end["ok"],
        "chunks_per_s": end["chunks"] / wall,
        "overlap_chunks_per_s": overlap_rate,
        "start_skew_ms": start_skew,
        "end_skew_ms": end_skew,
        "us_per_chunk": client_cpu / end["chunks"] * 1e6,
        # the clients' CPU over their load windows, as cores of the merged window, and its system share
        "client_cores": client_cpu / wall,
        "client_sys_share": end["cpu_load_sys_s"] / client_cpu,
        # the server's CPU over the whole load (its start-up excluded), per chunk and as a share of one core
        "server_us_per_chunk": (server_user + server_sys) / end["chunks"] * 1e6,
        "server_core_share": (server_user + server_sys) / wall,
        "server_sys_share": server_sys / max(server_user + server_sys, 1e-9),
        "err_p50_us": pct(errors, 50),
        "err_p99_us": pct(errors, 99),
        "matched_chunks": len(errors),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--pin", action="store_true", help="server on CPU 0, client k on CPU (1 + k) mod 2")
    ap.add_argument("--scenarios", nargs="*", default=list(SCENARIOS), choices=list(SCENARIOS))
    args = ap.parse_args()
    counts = [1, args.processes]
    rows: dict[tuple[str, int], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-procs-") as tmp:
        for rep in range(args.repeats):
            order = counts if rep % 2 == 0 else counts[::-1]
            for scenario in args.scenarios:
                for p in order:
                    work = Path(tmp) / f"{rep}-{p}-{list(SCENARIOS).index(scenario)}"
                    work.mkdir()
                    got = one(work, scenario, p, args.pin)
                    rows.setdefault((scenario, p), []).append(got)
                    print(f"repeat {rep} {scenario} processes={p}: {got}", file=sys.stderr, flush=True)
    report(rows, args.scenarios, args.processes, args.repeats)
    return 0


def report(rows: dict[tuple[str, int], list[dict[str, Any]]], scenarios: list[str], procs: int, repeats: int) -> None:
    """The table of medians (stdout), then per zero-delay scenario the measured and CPU-derived ratios."""
    print(
        "| scenario | load.processes | chunks/s | overlap chunks/s | start / end skew ms | client µs/chunk | "
        "client cores (sys) | server µs/chunk | server cores (sys) | ts error p50 µs | ts error p99 µs | ok |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    med: dict[tuple[str, int], dict[str, float]] = {}
    for (scenario, p), rs in rows.items():
        med[(scenario, p)] = m = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(
            f"| {scenario} | {p} | {m['chunks_per_s']:,.0f} | {m['overlap_chunks_per_s']:,.0f} | "
            f"{m['start_skew_ms']:.1f} / {m['end_skew_ms']:.0f} | {m['us_per_chunk']:.2f} | "
            f"{m['client_cores']:.2f} ({m['client_sys_share']:.0%}) | {m['server_us_per_chunk']:.2f} | "
            f"{m['server_core_share']:.2f} ({m['server_sys_share']:.0%}) | {m['err_p50_us']:.0f} | "
            f"{m['err_p99_us']:.0f} | {min(r['ok'] for r in rs)} |"
        )
    for z in (k for k in scenarios if k.startswith("zero-delay")):
        one_p, many = med[(z, 1)], med[(z, procs)]
        print(
            f"{z}, {procs} processes / 1 (median of {repeats}): "
            f"chunks/s {many['chunks_per_s'] / one_p['chunks_per_s']:.2f}x, "
            f"overlap chunks/s {many['overlap_chunks_per_s'] / one_p['overlap_chunks_per_s']:.2f}x, "
            f"CPU-derived (each client a core of its own: {procs} x µs/chunk ratio) "
            f"{procs * one_p['us_per_chunk'] / many['us_per_chunk']:.2f}x"
        )


if __name__ == "__main__":
    sys.exit(main())
