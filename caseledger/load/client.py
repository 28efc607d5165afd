"""The async load engine: send request specs with concurrency C and scheduled arrivals, record raw data.

`run_requests` is used by the formal load (`python -m caseledger.load`) and by the controller's warmup,
route_verify and cache_prepare phases; only the phase header differs. Every request ends as exactly one
`RawRecord` (success or failure), handed to `on_record` the moment it ends.

The HTTP transport sits behind one seam, `Streamer` (POST a body, get the status and the raw response
bytes as they arrive). Two implement it: `FastStreamer` (caseledger.load.fast: an asyncio Protocol with
httptools, for http:// URLs; the default) and `HttpxStreamer` (httpx2, HTTP/1.1, `aiter_raw`; https, and
everything when CASELEDGER_LOAD_TRANSPORT=httpx). SSE splitting (load/sse.py), chunk parsing and the record
(load/chunks.py), timing and error classes (here) live above the seam, so both give the same records. Chunk
times are taken when the raw bytes arrive, before parsing. The headers and credentials are load/auth.py's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

import anyio
import orjson
from typing_extensions import TypeIs

from caseledger.case.bounds import DEFAULT_MAX_EVENT_BYTES
from caseledger.load.auth import request_headers
from caseledger.load.chunks import ChunkState, ServerStreamError, error_line, make_record
from caseledger.load.fast import FastStreamer, fast_target
from caseledger.load.schedule import RequestSpec
from caseledger.load.sse import EventTooLarge, SSEParser
from caseledger.load.transport import (
    ConnectFailed,
    HttpxStreamer,
    StreamBroken,
    Streamer,
    StreamResponse,
    transport_choice,
)
from caseledger.records import ErrorClass, RawRecord

if TYPE_CHECKING:
    import httpx2

# a request written ahead of its task (FastStreamer.launch): its send time and the sent request (None: not
# written, its task posts it); None: nothing done ahead
Launched = tuple[int, AbstractAsyncContextManager[StreamResponse] | None] | None


async def request_one(
    spec: RequestSpec,
    streamer: Streamer,
    headers: Mapping[str, str],
    timeout_s: float,
    on_cancel: Callable[[RawRecord], None] | None = None,
    launched: Launched = None,
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    sched_ns: int | None = None,
    keep_text: bool = False,
) -> RawRecord:
    """Send one request and read its stream to the end; never raises except on cancellation.

    When cancelled, the request was sent (the server saw it), so `on_cancel` gets its record (what
    arrived so far, error_class 'client') before the cancellation propagates. `launched`: (its send time,
    the request already written by FastStreamer.launch, or None to post it now). An SSE event larger than
    `max_event_bytes` ends the request as a broken stream (class 'stream'). keep_text: the record carries the
    reply's content as `reply` (a conversation's turn: the next turn sends it back).
    """
    state = ChunkState(keep_text)
    status: int | None = None
    error: str | None = None
    error_class: ErrorClass | None = None
    end_ns = 0
    send_ns, sent = launched if launched is not None else (time.monotonic_ns(), None)
    try:
        with anyio.fail_after(timeout_s):
            async with sent if sent is not None else streamer.post(spec.url, spec.body, headers) as resp:
                status = resp.status
                if not 200 <= status < 300:
                    text = (await resp.aread()).decode("utf-8", "replace")
                    error, error_class = f"HTTP {status}: {error_line(text)}", "http"
                else:
                    parser = SSEParser(max_event_bytes)
                    async for now, raw in resp.aiter_timed():  # now: when the bytes arrived
                        try:
                            payloads = parser.feed(raw)
                        except EventTooLarge as e:  # the events ahead of it in this read still count
                            for payload in e.events:
                                state.feed(payload, now)
                            raise
                        for payload in payloads:
                            state.feed(payload, now)
                        if state.done and not end_ns:
                            end_ns = now  # the rest is the connection's terminating chunk
                    for payload in parser.close():
                        state.feed(payload, time.monotonic_ns())
    except TimeoutError:
        if not state.done:  # after [DONE] only the connection's tail was missing: the response is whole
            error, error_class = f"no complete response within timeout_s={timeout_s:g}", "timeout"
    except ConnectFailed as e:
        error, error_class = str(e), "connection"
    except (StreamBroken, EventTooLarge) as e:
        if not state.done:
            error, error_class = str(e), "stream"
    except (ServerStreamError, orjson.JSONDecodeError) as e:
        error, error_class = f"{type(e).__name__}: {e}", "stream"
    except anyio.get_cancelled_exc_class():
        if on_cancel is not None:
            on_cancel(make_record(spec, send_ns, time.monotonic_ns(), state, status, "cancelled", "client", sched_ns))
        raise
    except Exception as e:  # a bug of ours must still end as a record, not as a lost request
        error, error_class = f"{type(e).__name__}: {e}", "client"
    return make_record(spec, send_ns, end_ns or time.monotonic_ns(), state, status, error, error_class, sched_ns)


class _Runner:
    def __init__(
        self,
        streamer: Streamer,
        concurrency: int,
        headers: Mapping[str, str],
        timeout_s: float,
        on_record: Callable[[RawRecord], None] | None,
        on_send: Callable[[RequestSpec], None] | None,
        max_event_bytes: int,
        scheduled: bool = False,
    ) -> None:
        self.streamer = streamer
        self.headers = headers
        self.timeout_s = timeout_s
        self.max_event_bytes = max_event_bytes
        self.on_record = on_record
        self.on_send = on_send
        # fast_acquire: a free slot is taken without yielding to the loop, so the first wave of C requests
        # leaves in one burst (one yield per request spread 64 first sends over ~16 ms)
        self.slots = anyio.Semaphore(concurrency, fast_acquire=True)
        self.records: list[RawRecord] = []
        # the first wave is written in one pass over pre-opened connections (FastStreamer.launch) until they
        # run out; later requests are posted by their own task
        self.launch = streamer.launch if isinstance(streamer, FastStreamer) else None
        self.fast = streamer if isinstance(streamer, FastStreamer) else None
        self.scheduled = scheduled  # records carry their due time (sched_ns)
        self.t0_ns = 0

    def finish(self, rec: RawRecord) -> None:
        self.records.append(rec)
        if self.on_record is not None:
            self.on_record(rec)

    def due_ns(self, spec: RequestSpec) -> int:
        return self.t0_ns + round(spec.offset_s * 1e9)

    async def worker(self, spec: RequestSpec, launched: Launched) -> None:
        try:
            if launched is None and self.on_send is not None:
                self.on_send(spec)
            sched = self.due_ns(spec) if self.scheduled else None
            self.finish(
                await request_one(
                    spec,
                    self.streamer,
                    self.headers,
                    self.timeout_s,
                    self.finish,
                    launched,
                    self.max_event_bytes,
                    sched,
                )
            )
        finally:
            self.slots.release()

    def launch_now(self, spec: RequestSpec) -> Launched:
        """Write the request at once if a pre-opened connection takes it: (send time, the sent request)."""
        if self.launch is None:
            return None
        if self.on_send is not None:
            self.on_send(spec)  # the intent line before the first byte, as the worker does
        send_ns = time.monotonic_ns()
        sent = self.launch(spec.url, spec.body, self.headers)
        if sent is None:
            self.launch = None  # none left (or this one was stale): this request and later ones connect
        return send_ns, sent

    async def run(self, specs: Iterable[RequestSpec], start_ns: int | None = None) -> None:
        if start_ns is not None:  # one instant for every process of a shared load: one schedule
            await sleep_until(start_ns)
        async with anyio.create_task_group() as tg:
            self.t0_ns = start_ns if start_ns is not None else time.monotonic_ns()
            # launched requests whose tasks are not started yet: a task start costs more than a write, so the
            # writes of the first wave go first, back to back, and the tasks start before the next wait
            wave: list[tuple[RequestSpec, Launched]] = []
            for spec in specs:
                if spec.offset_s > 0 and time.monotonic_ns() < self.due_ns(spec):
                    self.start(tg, wave)
                    await self.connect_ahead(spec)
                    await sleep_until(self.due_ns(spec))
                if self.launch is not None and self.slots.value > 0:
                    self.slots.acquire_nowait()
                    wave.append((spec, self.launch_now(spec)))
                    continue
                self.start(tg, wave)
                await self.slots.acquire()  # a due request waits for a free slot; schedule order is kept
                tg.start_soon(self.worker, spec, self.launch_now(spec))
            self.start(tg, wave)

    async def connect_ahead(self, spec: RequestSpec) -> None:
        """A scheduled request whose due time is far enough ahead gets its connection now, so at its due time
        it is only written (as the first wave is): its send time is then the schedule's, not a task start and
        a connect later. A connection the server closes meanwhile is replaced at the write (FastStreamer)."""
        if self.fast is None or self.slots.value == 0 or self.due_ns(spec) - time.monotonic_ns() < AHEAD_MIN_NS:
            return
        await self.fast.preconnect([spec.url])
        self.launch = self.fast.launch

    def start(self, tg: anyio.abc.TaskGroup, wave: list[tuple[RequestSpec, Launched]]) -> None:
        for spec, launched in wave:
            tg.start_soon(self.worker, spec, launched)
        wave.clear()


SPIN_NS = 2_000_000  # the last 2 ms before a due send are waited by yielding, not by a timer
AHEAD_MIN_NS = 3_000_000  # a request due sooner than this connects itself (a loopback connect takes ~0.2 ms)


async def sleep_until(due_ns: int) -> None:
    """Wait until time.monotonic_ns() reaches due_ns, to well under a millisecond.

    A timer alone wakes up to ~1 ms late (epoll's timeout is in whole milliseconds, rounded up), so it is
    set SPIN_NS early and the rest is spent yielding to the event loop, which keeps serving the streams in
    flight meanwhile. The cost is at most SPIN_NS of one core per scheduled request.
    """
    delay = due_ns - time.monotonic_ns() - SPIN_NS
    if delay > 0:
        await anyio.sleep(delay / 1e9)
    while time.monotonic_ns() < due_ns:
        await anyio.sleep(0)


def first_wave(specs: list[RequestSpec], concurrency: int) -> list[RequestSpec]:
    """The requests sent at once when the load starts: the leading ones due at offset 0, at most C."""
    wave = []
    for spec in specs[:concurrency]:
        if spec.offset_s > 0:
            break
        wave.append(spec)
    return wave


def client_timing(
    records: Iterable[RawRecord], concurrency: int, burst: bool, anchor: Mapping[str, Any] | None
) -> dict[str, Any]:  # JSON: load evidence
    """The load client's own timing uncertainty, for the load evidence and the report: how far apart the
    first wave's C requests left (they are due at once when the load has no rate), and the bracket of the
    clock anchor that maps its monotonic times onto wall time (load/anchor.json, half its width)."""
    unc = anchor.get("uncertainty_ns") if anchor else None
    sends = sorted(r["send_ns"] for r in records if r["i"] < concurrency) if burst else []
    spread = round((sends[-1] - sends[0]) / 1e3, 1) if sends else None
    wave = (
        f"first wave of {len(sends)} sent within {spread / 1e3:.2f} ms"
        if spread is not None
        else "no first wave (requests leave on the rate schedule)"
        if not burst
        else "no request recorded"
    )
    anchor_text = f"wall-clock anchor ± {unc / 1e3:.1f} µs" if isinstance(unc, int) else "no clock anchor"
    return {
        "first_wave": len(sends),
        "launch_spread_us": spread,
        "anchor_uncertainty_ns": unc,
        "line": f"{wave}; {anchor_text}",
    }


def transport_used(urls: Iterable[str]) -> str:
    """What run_requests(transport=None) sends these URLs with: 'fast', 'httpx', or 'fast+httpx' when
    some are http:// and some are not (https always goes through httpx)."""
    if transport_choice() == "httpx":
        return "httpx"
    return "+".join(sorted({"httpx" if fast_target(u) is None else "fast" for u in urls})) or "fast"


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # another anyio backend (trio): FastStreamer is asyncio-only
        return False
    return True


def _is_httpx_transport(transport: httpx2.AsyncBaseTransport | Streamer) -> TypeIs[httpx2.AsyncBaseTransport]:
    # lazy: httpx2 only when a caller hands a transport (tests); the load client's fast path never imports it
    import httpx2

    return isinstance(transport, httpx2.AsyncBaseTransport)


def open_streamer(transport: httpx2.AsyncBaseTransport | Streamer | None, concurrency: int) -> tuple[Streamer, bool]:
    """The streamer run_requests sends with, and whether it is ours to close (see run_requests' transport)."""
    if transport is None and transport_choice() == "fast" and _on_asyncio():
        return FastStreamer(concurrency), True
    if transport is None:
        return HttpxStreamer(concurrency), True
    if _is_httpx_transport(transport):
        return HttpxStreamer(concurrency, transport), True
    return transport, False


async def run_requests(
    specs: Iterable[RequestSpec],
    concurrency: int,
    phase: str,
    *,
    transport: httpx2.AsyncBaseTransport | Streamer | None = None,
    api_key: str | None = None,
    on_record: Callable[[RawRecord], None] | None = None,
    on_send: Callable[[RequestSpec], None] | None = None,
    timeout_s: float,
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    scheduled: bool = False,
    start_ns: int | None = None,
    run_id: str | None = None,
) -> list[RawRecord]:
    """Send specs in schedule order, at their offsets, at most `concurrency` in flight; records sorted by i.

    transport: None (over the network: FastStreamer, or HttpxStreamer per CASELEDGER_LOAD_TRANSPORT), an
    httpx2 transport (e.g. MockTransport) or a Streamer.
    on_send is called as each request is sent, on_record as each ends (from the event loop: keep them
    short). A cancelled run records its in-flight requests with error_class 'client' before unwinding.
    max_event_bytes: the largest SSE event a response may send (load.max_event_bytes).
    scheduled: the specs' offsets are a schedule (a rate or a trace): each record carries its due time.
    start_ns: the monotonic instant offset 0 stands for (several processes share one); None: when sending starts.
    run_id: sent with every request (x-caseledger-run), so the server can tell whose requests it serves.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    streamer, owned = open_streamer(transport, concurrency)
    runner = _Runner(
        streamer,
        concurrency,
        request_headers(phase, api_key, run_id),
        timeout_s,
        on_record,
        on_send,
        max_event_bytes,
        scheduled,
    )
    specs = list(specs)
    try:
        if isinstance(streamer, FastStreamer):
            # the first wave's connections before its first send: those requests then only write
            await streamer.preconnect(s.url for s in first_wave(specs, concurrency))
        await runner.run(specs, start_ns)
    finally:
        if owned:
            with anyio.CancelScope(shield=True):
                await streamer.aclose()
    return sorted(runner.records, key=lambda r: r["i"])
