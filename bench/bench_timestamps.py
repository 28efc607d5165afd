"""Client timing precision under load: the launch spread of the first wave, and how late a chunk would be
stamped if the time point were taken when the reader runs instead of when the bytes arrive.

    python bench/bench_timestamps.py [--concurrency 64] [--tokens 64] [--step-ms 10] [--repeats 3]

The reference target (pinned to CPU 0) decodes one token per step of --step-ms for every sequence at once;
the client (this process, CPU 1) sends C requests at once. Per run, in the same process and against the
same server, two settings are measured back to back:
  slots: anyio.Semaphore(C) with fast_acquire=False (one loop yield per acquire: the old client) vs True;
  launch spread   max - min send time of the first wave of C requests (ms)
  stamp lag       (time the reader sees the bytes) - (time data_received got them), per chunk (µs):
                  what the old time point (taken after the reader resumed) added to every chunk time.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx2
import orjson

from caseledger.load import client as client_mod
from caseledger.load import fast
from caseledger.load.plan import RequestSpec


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def _run(url: str, c: int, tokens: int, fast_acquire: bool, lags: list[int]) -> float:
    body = orjson.dumps({"model": "ref-model", "messages": [{"role": "user", "content": "hi " * 32}],
                         "max_tokens": tokens, "stream": True, "ignore_eos": True})
    specs = [RequestSpec(i=i, entry=0, route=0, offset_s=0.0, url=url, body=body) for i in range(c)]
    original = fast._Exchange.aiter_timed

    async def timed(self: Any) -> AsyncIterator[tuple[int, bytes]]:
        async for t, data in original(self):
            lags.append(time.monotonic_ns() - t)
            yield t, data

    real_sem = anyio.Semaphore

    def sem(n: int, **kw: Any) -> anyio.Semaphore:
        return real_sem(n, fast_acquire=fast_acquire)

    fast._Exchange.aiter_timed = timed  # type: ignore[method-assign]
    client_mod.anyio.Semaphore = sem  # type: ignore[misc]
    try:
        recs = await client_mod.run_requests(specs, c, "load", timeout_s=120)
    finally:
        fast._Exchange.aiter_timed = original  # type: ignore[method-assign]
        client_mod.anyio.Semaphore = real_sem  # type: ignore[misc]
    assert all(r["ok"] for r in recs), [r["error"] for r in recs if not r["ok"]][:2]
    sends = [r["send_ns"] for r in recs]
    return (max(sends) - min(sends)) / 1e6


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--step-ms", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    port = _port()
    cfg = {"prefill_tokens_per_s": 1e9, "decode_step_s": a.step_ms / 1000, "decode_step_per_seq_s": 0.0,
           "slots": a.concurrency}
    srv = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-m", "caseledger.target", "serve", "--host",
                            "127.0.0.1", "--port", str(port), "--model", "ref-model", "--config-json",
                            orjson.dumps(cfg).decode()], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                if httpx2.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx2.HTTPError:
                time.sleep(0.1)
        os.sched_setaffinity(0, {1})
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        print(f"C={a.concurrency}, {a.tokens} tokens, one step per {a.step_ms} ms, {a.repeats} interleaved repeats")
        rows: dict[bool, tuple[list[float], list[int]]] = {False: ([], []), True: ([], [])}
        for _ in range(a.repeats):
            for fa in (False, True):
                spread = anyio.run(_run, url, a.concurrency, a.tokens, fa, rows[fa][1])
                rows[fa][0].append(spread)
        for fa, (spreads, lags) in rows.items():
            us = [x / 1000 for x in lags]
            print(f"fast_acquire={fa!s:5}: launch spread median {statistics.median(spreads):.2f} ms "
                  f"(max {max(spreads):.2f}); stamp lag p50 {_pct(us, .5):.0f} us, p99 {_pct(us, .99):.0f} us, "
                  f"max {max(us):.0f} us over {len(us)} chunks")
    finally:
        srv.terminate()
        srv.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
