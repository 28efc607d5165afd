"""What the formal load writes while it runs (load/__main__.py): raw records (`RawWriter`), the counts and
progress.json (`Tally`, `progress_loop`), event-loop stalls (`stall_loop`) and the clock anchor.

The writes on the event loop are one write(2) each; fsync runs in a thread or off the loop (anyio.to_thread).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio
import orjson

from caseledger.load.parts import boot_id
from caseledger.load.schedule import RequestSpec
from caseledger.records import RawRecord
from caseledger.workspace import RunPaths, is_disk_full, write_json
from caseledger.workspace import utc_now as ledger_utc_now

PROGRESS_INTERVAL_S = 0.5
FSYNC_INTERVAL_S = 0.02  # group fsync off the event loop: an OS crash loses at most ~20 ms of records


def utc_now() -> str:
    return ledger_utc_now("microseconds")  # the anchor of every monotonic timestamp: keep microseconds


class RawWriter:
    """Append-only raw.jsonl: each record is written to the kernel at once (survives a kill of this
    process); fsync (survives an OS crash) runs in a thread, grouped, so the event loop never blocks
    on the disk (~0.75 ms per fsync measured here, vs ~5 µs per write)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._dirty = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._sync_loop, name="raw-fsync", daemon=True)
        self._thread.start()

    def write(self, rec: RawRecord) -> None:
        data = memoryview(orjson.dumps(rec) + b"\n")
        while data:
            data = data[os.write(self.fd, data) :]
        self._dirty.set()

    def _sync_loop(self) -> None:
        while True:
            self._dirty.wait()
            if self._stop:
                return
            self._dirty.clear()
            os.fsync(self.fd)
            time.sleep(FSYNC_INTERVAL_S)

    def close(self) -> None:
        self._stop = True
        self._dirty.set()
        self._thread.join()
        os.fsync(self.fd)
        os.close(self.fd)


@dataclass
class Tally:
    planned: int
    sent: int = 0
    done: int = 0
    ok: int = 0
    failed: int = 0
    chunks: int = 0
    first_send_ns: int | None = None
    last_end_ns: int | None = None
    version: int = 0  # bumped on every change; the progress writer skips unchanged states

    sent_fd: int | None = None  # load/sent.log, appended before each request's first byte leaves
    disk_full: str | None = None  # why the load stopped early: the disk filled up

    def on_send(self, spec: RequestSpec) -> None:
        if self.sent_fd is not None:
            # a write(2), not fsync: a killed process loses nothing the kernel holds; fsync goes in groups
            os.write(self.sent_fd, b"%d\n" % spec.i)
        self.sent += 1
        self.version += 1

    def on_record(self, rec: RawRecord) -> None:
        self.done += 1
        if rec["ok"]:
            self.ok += 1
        else:
            self.failed += 1
        self.chunks += len(rec["chunk_ns"])
        if self.first_send_ns is None or rec["send_ns"] < self.first_send_ns:
            self.first_send_ns = rec["send_ns"]
        if self.last_end_ns is None or rec["end_ns"] > self.last_end_ns:
            self.last_end_ns = rec["end_ns"]
        self.version += 1

    def progress(self) -> dict[str, Any]:  # JSON: progress.json
        return {**self.counts(), "updated_utc": utc_now()}

    def counts(self) -> dict[str, Any]:  # JSON: progress.json and end.json
        return {
            "planned": self.planned,
            "sent": self.sent,
            "done": self.done,
            "ok": self.ok,
            "failed": self.failed,
        }


async def progress_loop(paths: RunPaths, tally: Tally) -> None:
    seen = -1
    while True:
        await anyio.sleep(PROGRESS_INTERVAL_S)
        if tally.version != seen:
            seen = tally.version
            try:
                if tally.sent_fd is not None:
                    await anyio.to_thread.run_sync(os.fsync, tally.sent_fd)
                await anyio.to_thread.run_sync(write_json, paths.load_progress, tally.progress())
            except OSError as e:  # progress is a convenience: a full disk must not stop the load here
                if not is_disk_full(e):
                    raise


STALL_TICK_S = 0.05  # the event loop's own ticker; a tick this much late or more is a stall
STALL_MIN_S = 0.2


async def stall_loop(paths: RunPaths) -> None:
    """Record every span the client's event loop did not run (SIGSTOP, a starved CPU, a blocking call) to
    load/stalls.jsonl as {start_ns, end_ns} on the raw records' clock: requests in flight then got late
    timestamps, which the processor flags as a distorted window."""
    fd = os.open(paths.load_stalls, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    tick = int(STALL_TICK_S * 1e9)
    try:
        last = time.monotonic_ns()
        while True:
            await anyio.sleep(STALL_TICK_S)
            now = time.monotonic_ns()
            if now - last - tick >= STALL_MIN_S * 1e9:
                with contextlib.suppress(OSError):  # evidence of a stall must never stop the load
                    os.write(fd, orjson.dumps({"start_ns": last + tick, "end_ns": now}) + b"\n")
            last = now
    finally:
        os.close(fd)


ANCHOR_READS = 7


def clock_anchor() -> dict[str, Any]:  # JSON: load/anchor.json
    """The wall time of a monotonic instant: a wall read bracketed by two monotonic reads, the tightest of
    several tries; in integer ns, with its uncertainty (half the bracket). Raw times are monotonic ns; this
    maps them onto the wall clock (the old form read wall then monotonic: off by their gap, in µs)."""
    best: tuple[int, int, int] | None = None
    for _ in range(ANCHOR_READS):
        m1 = time.monotonic_ns()
        wall = time.time_ns()
        m2 = time.monotonic_ns()
        if best is None or m2 - m1 < best[2] - best[0]:
            best = (m1, wall, m2)
    assert best is not None
    m1, wall, m2 = best
    mono = (m1 + m2) // 2
    return {
        "wall_utc": datetime.fromtimestamp(wall / 1e9, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
        "wall_ns": wall,
        "mono_ns": mono,
        "uncertainty_ns": (m2 - m1 + 1) // 2,
        "boot_id": boot_id(),  # same boot, same monotonic clock: several processes merge without a shift
    }
