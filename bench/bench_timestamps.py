"""Client timing precision under load: the launch spread of the first wave, and how late a chunk would be
stamped if the time point were taken when the reader runs instead of when the bytes arrive.

    python bench/bench_timestamps.py [--concurrency 64] [--tokens 64] [--step-ms 10] [--repeats 3]

The reference target (pinned to CPU 0) decodes one token per step of --step-ms for every sequence at once;
the client (this process, CPU 1) sends C requests at once. Per run, in the same process and against the
same server, two settings are measured back to back, interleaved:
  connect: one TCP connect per request inside the first wave (FastStreamer.preconnect disabled: the old
           client) vs the first wave's connections pre-opened before its first send and its requests
           written on them in one pass, their tasks started after (the client now);
  launch spread   max - min send time of the first wave of C requests (ms)
  pool fill       how long preconnect took before the first send (ms; off the measured timeline)
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
from collections.abc import AsyncIterator, Iterable
from typing import Any

import anyio
import httpx2
import orjson

from caseledger.load import client as client_mod
from caseledger.load import fast
from caseledger.load.schedule import RequestSpec


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def _run(url: str, c: int, tokens: int, preopen: bool, lags: list[int], fills: list[float]) -> float:
    body = orjson.dumps(
        {
            "model": "ref-model",
            "messages": [{"role": "user", "content": "hi " * 32}],
            "max_tokens": tokens,
            "stream": True,
            "ignore_eos": True,
        }
    )
    specs = [RequestSpec(i=i, entry=0, route=0, offset_s=0.0, url=url, body=body) for i in range(c)]
    original = fast._Exchange.aiter_timed

    async def timed(self: Any) -> AsyncIterator[tuple[int, bytes]]:
        async for t, data in original(self):
            lags.append(time.monotonic_ns() - t)
            yield t, data

    real_preconnect = fast.FastStreamer.preconnect

    async def preconnect(self: fast.FastStreamer, urls: Iterable[str]) -> None:
        t = time.monotonic_ns()
        if preopen:
            await real_preconnect(self, urls)
        fills.append((time.monotonic_ns() - t) / 1e6)

    fast._Exchange.aiter_timed = timed  # type: ignore[method-assign]
    fast.FastStreamer.preconnect = preconnect  # type: ignore[method-assign]
    try:
        recs = await client_mod.run_requests(specs, c, "load", timeout_s=120)
    finally:
        fast._Exchange.aiter_timed = original  # type: ignore[method-assign]
        fast.FastStreamer.preconnect = real_preconnect  # type: ignore[method-assign]
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
    cfg = {
        "prefill_tokens_per_s": 1e9,
        "decode_step_s": a.step_ms / 1000,
        "decode_step_per_seq_s": 0.0,
        "slots": a.concurrency,
    }
    srv = subprocess.Popen(
        [
            "taskset",
            "-c",
            "0",
            sys.executable,
            "-m",
            "caseledger.target",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--model",
            "ref-model",
            "--config-json",
            orjson.dumps(cfg).decode(),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
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
        rows: dict[bool, tuple[list[float], list[int], list[float]]] = {False: ([], [], []), True: ([], [], [])}
        for _ in range(a.repeats):
            for preopen in (False, True):
                spread = anyio.run(_run, url, a.concurrency, a.tokens, preopen, rows[preopen][1], rows[preopen][2])
                rows[preopen][0].append(spread)
        for preopen, (spreads, lags, fills) in rows.items():
            us = [x / 1000 for x in lags]
            name = "pre-opened" if preopen else "connect per request"
            print(
                f"{name:<20}: launch spread median {statistics.median(spreads):.2f} ms "
                f"(min {min(spreads):.2f}, max {max(spreads):.2f}); pool fill median "
                f"{statistics.median(fills):.2f} ms; stamp lag p50 {_pct(us, 0.5):.0f} us, "
                f"p99 {_pct(us, 0.99):.0f} us, max {max(us):.0f} us over {len(us)} chunks"
            )
    finally:
        srv.terminate()
        srv.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
