"""Re-processing cost: time and peak memory to turn a raw file into a Result.

    python3 bench/bench_reprocess.py [--quick]

Scenarios: 640 requests x 1024 chunks (the seeds' 128K C90 run shape) and 1M requests x 4 chunks.
Each measurement runs in a fresh child process so ru_maxrss is the processor's own peak, not the
generator's. "s" columns are wall-clock, "CPU s" is process CPU time (the fair figure on a shared,
loaded machine). Prints a small table; asserts nothing.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

SCENARIOS = {"640x1024": (640, 1024, 64), "1Mx4": (1_000_000, 4, 512)}
QUICK = {"640x1024": (640, 1024, 64), "100kx4": (100_000, 4, 512)}
T0 = 5_000_000_000_000


def generate(path: Path, n: int, chunks: int, concurrency: int) -> None:
    """Closed-loop-like synthetic records: exact shapes matter, values only need to be plausible."""
    step = 2_000_000  # 2 ms between chunks
    with path.open("wb") as f:
        buf: list[bytes] = []
        for i in range(n):
            send = T0 + (i // concurrency) * (chunks + 50) * step + (i % concurrency) * 1000
            first = send + 50 * step
            cns = [first + k * step for k in range(chunks)]
            buf.append(
                orjson.dumps(
                    {
                        "i": i,
                        "entry": i,
                        "route": 0,
                        "send_ns": send,
                        "chunk_ns": cns,
                        "chunk_tokens": [1] * chunks,
                        "end_ns": cns[-1] + 1000,
                        "status": 200,
                        "ok": i % 997 != 5,
                        "error": None,
                        "error_class": None,
                        "prompt_tokens": 131076,
                        "completion_tokens": chunks,
                        "cached_tokens": 118784,
                        "finish_reason": "length",
                        "input_tokens_body": 131072,
                        "input_tokens_chat": 131076,
                    }
                )
                + b"\n"
            )
            if len(buf) >= 10_000:
                f.write(b"".join(buf))
                buf.clear()
        f.write(b"".join(buf))


def child(path: Path, concurrency: int) -> None:
    t_import = time.perf_counter()
    from caseledger.case.model import Case
    from caseledger.metrics import compute_result, read_raw

    case = Case.model_validate(
        {
            "scenario": "bench",
            "target": {"endpoints": [{"base_url": "http://127.0.0.1:9/v1", "model": "m"}], "cards": 16},
            "load": {"requests": 1, "concurrency": concurrency},
            "cache": {"min_hit_ratio": 0.9},
        }
    )
    t0, c0 = time.perf_counter(), time.process_time()
    cols, src = read_raw(path)
    t1, c1 = time.perf_counter(), time.process_time()
    result = compute_result(case, cols, source=src)
    t2, c2 = time.perf_counter(), time.process_time()
    data = result.model_dump_json()
    t3, c3 = time.perf_counter(), time.process_time()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    sys.stdout.write(
        orjson.dumps(
            {
                "import_s": t0 - t_import,
                "read_s": t1 - t0,
                "compute_s": t2 - t1,
                "dump_s": t3 - t2,
                "read_cpu": c1 - c0,
                "compute_cpu": c2 - c1,
                "total_cpu": c3 - c0,
                "peak_mb": peak_mb,
                "requests": result.requests,
                "chunks": int(cols.chunk_ns.size),
                "json_kb": len(data) / 1024,
            }
        ).decode()
        + "\n"
    )


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="100k instead of 1M requests")
    p.add_argument("--child", nargs=2, metavar=("RAW", "CONCURRENCY"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(Path(args.child[0]), int(args.child[1]))
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (n, chunks, conc) in (QUICK if args.quick else SCENARIOS).items():
            raw = Path(tmp) / f"{name}.jsonl"
            generate(raw, n, chunks, conc)
            size_mb = raw.stat().st_size / 2**20
            start = time.perf_counter()
            out = subprocess.run(
                [sys.executable, __file__, "--child", str(raw), str(conc)], capture_output=True, text=True, check=True
            )
            wall = time.perf_counter() - start
            m = orjson.loads(out.stdout)
            rows.append(
                (
                    name,
                    m["requests"],
                    m["chunks"],
                    size_mb,
                    m["read_s"],
                    m["compute_s"],
                    m["dump_s"],
                    m["read_s"] + m["compute_s"] + m["dump_s"],
                    m["total_cpu"],
                    wall,
                    m["peak_mb"],
                )
            )
            raw.unlink()
    head = (
        "scenario",
        "requests",
        "chunks",
        "raw MB",
        "read s",
        "compute s",
        "dump s",
        "total s",
        "total CPU s",
        "process s",
        "peak RSS MB",
    )
    print(" | ".join(head))
    for r in rows:
        print(" | ".join([r[0], str(r[1]), str(r[2]), *(f"{x:.2f}" for x in r[3:])]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
