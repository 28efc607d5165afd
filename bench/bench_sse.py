"""SSE parsing cost of one long event: CPU time per MB must not grow with the event's length.

    python bench/bench_sse.py [--sizes 1 10 50] [--read-kib 64] [--repeats 3]

One event `data: {"choices":[{"delta":{"content":"xxx..."}}]}` of each size (MB, 10**6 bytes) is fed to
SSEParser in reads of --read-kib, with load.max_event_bytes raised to 64 MiB so the 50 MB event fits.
Each measurement runs in a fresh child process that allocates nothing large before the clock starts (its
reads repeat one buffer), so every size pays the same first touch of the memory it holds: in one process,
a smaller event reuses pages a larger one already faulted in and looks cheaper per MB than it is. "CPU s"
is process CPU time of the feeds (user + system: page faults are the parser's cost too), the best of
--repeats; "ms/MB" divides it by the size; the ratio line compares the largest size's ms/MB with the
smallest's (about 1: linear). Then the largest event is sent through request_one (httpx2.MockTransport,
the same reads): with the raised maximum it is one whole content chunk; with the default maximum (8 MiB)
the request fails as a broken stream naming the size, and the parser never held more than the maximum.
Prints a small table; asserts the outcomes only.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import anyio
import httpx2
import orjson

from caseledger.case.model import DEFAULT_MAX_EVENT_BYTES
from caseledger.load.client import request_one
from caseledger.load.schedule import RequestSpec
from caseledger.load.sse import EventTooLarge, SSEParser
from caseledger.load.transport import HttpxStreamer
from caseledger.records import RawRecord

RAISED = 64 * 2**20  # above the largest event of the bench
MB = 10**6
HEAD, END = b'data: {"choices":[{"index":0,"delta":{"content":"', b'"},"finish_reason":"stop"}]}\n\n'


def event_reads(size: int, read: int) -> list[bytes]:
    """One SSE event of exactly `size` bytes (a content chunk whose text fills it, then a blank line) cut
    into reads of `read` bytes; the reads that are all text are one shared object."""
    xs, body_end = b"x" * read, size - len(END)

    def piece(a: int, b: int) -> bytes:
        if len(HEAD) <= a and b <= body_end:
            return xs[: b - a]
        head = HEAD[a:b] if a < len(HEAD) else b""
        text = b"x" * max(0, min(b, body_end) - max(a, len(HEAD)))
        end = END[max(a - body_end, 0) : b - body_end] if b > body_end else b""
        return head + text + end

    return [piece(a, min(a + read, size)) for a in range(0, size, read)]


def child(size: int, read: int, max_event_bytes: int) -> None:
    """One measurement (in its own process): CPU seconds of the feeds, minor page faults, most bytes held."""
    parts = event_reads(size * MB, read)
    p = SSEParser(max_event_bytes)
    got: list[bytes] = []
    held = 0
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t0 = time.process_time()
    for part in parts:
        got += p.feed(part)
        held = max(held, p.held_bytes)  # one property read per read: noise next to the feed
    cpu = time.process_time() - t0
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    assert len(got) == 1 and len(got[0]) == size * MB - len(b"data: \n\n"), len(got)
    print(orjson.dumps({"cpu_s": cpu, "reads": len(parts), "faults": faults, "held": held}).decode())


def measure(size: int, read: int, max_event_bytes: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(size), str(read), str(max_event_bytes)],
        capture_output=True,
        check=True,
        text=True,
    )
    row: dict[str, float] = orjson.loads(out.stdout)
    return row


def through_request(parts: list[bytes], max_event_bytes: int) -> RawRecord:
    async def body() -> AsyncIterator[bytes]:
        for part in [*parts, b"data: [DONE]\n\n"]:
            yield part

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body())

    spec = RequestSpec(i=0, entry=0, route=0, offset_s=0.0, url="http://bench.test/v1/chat/completions", body=b"{}")

    async def go() -> RawRecord:
        streamer = HttpxStreamer(1, httpx2.MockTransport(handler))
        try:
            return await request_one(spec, streamer, {}, 600.0, max_event_bytes=max_event_bytes)
        finally:
            await streamer.aclose()

    return anyio.run(go)


def held_at_failure(parts: list[bytes], max_event_bytes: int) -> tuple[int, int]:
    """(bytes fed when the parser gave up, the most it held after any read before that)."""
    p, fed, held = SSEParser(max_event_bytes), 0, 0
    for part in parts:
        fed += len(part)
        try:
            p.feed(part)
        except EventTooLarge:
            return fed, held
        held = max(held, p.held_bytes)
    raise AssertionError("the event did not fail")


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        child(*(int(x) for x in sys.argv[2:5]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 10, 50], help="event sizes in MB")
    ap.add_argument("--read-kib", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    read = a.read_kib * 1024
    print(
        f"one SSE event per size, fed in {a.read_kib} KiB reads; max_event_bytes {RAISED:,}; "
        f"best of {a.repeats}, each in a fresh process"
    )
    print(f"{'size MB':>8} {'reads':>6} {'CPU s':>8} {'ms/MB':>7} {'faults/MB':>9} {'held max':>12}")
    per_mb: list[float] = []
    for size in a.sizes:
        rows = [measure(size, read, RAISED) for _ in range(a.repeats)]
        best = min(rows, key=lambda r: r["cpu_s"])
        per_mb.append(best["cpu_s"] * 1000 / size)
        print(
            f"{size:8} {best['reads']:6.0f} {best['cpu_s']:8.3f} {per_mb[-1]:7.2f} {best['faults'] / size:9.0f} "
            f"{best['held']:12,.0f}"
        )
    print(f"ms/MB at {a.sizes[-1]} MB / at {a.sizes[0]} MB: {per_mb[-1] / per_mb[0]:.2f}")

    size = a.sizes[-1]
    parts = event_reads(size * MB, read)
    ok = through_request(parts, RAISED)
    assert ok["ok"] and len(ok["chunk_ns"]) == 1, ok
    print(f"{size} MB event, max_event_bytes {RAISED:,}: ok={ok['ok']}, {len(ok['chunk_ns'])} content chunk")
    bad = through_request(parts, DEFAULT_MAX_EVENT_BYTES)
    assert bad["error_class"] == "stream" and f"{DEFAULT_MAX_EVENT_BYTES:,}" in (bad["error"] or ""), bad
    fed, held = held_at_failure(parts, DEFAULT_MAX_EVENT_BYTES)
    print(
        f"{size} MB event, max_event_bytes {DEFAULT_MAX_EVENT_BYTES:,} (default): ok={bad['ok']}, "
        f"error_class={bad['error_class']}, error={bad['error']!r}"
    )
    print(f"  the parser gave up after {fed:,} bytes fed, holding at most {held:,} bytes after a read")
    return 0


if __name__ == "__main__":
    sys.exit(main())
