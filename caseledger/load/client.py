"""The async load engine: send request specs with concurrency C and scheduled arrivals, record raw data.

`run_requests` is used by the formal load (`python -m caseledger.load`) and by the controller's warmup,
route_verify and cache_prepare phases; only the phase header differs. Every request ends as exactly one
`RawRecord` (success or failure), handed to `on_record` the moment it ends.

The HTTP transport sits behind one seam, `Streamer` (POST a body, get the status and the raw response
bytes as they arrive). Two implement it: `FastStreamer` (caseledger.load.fast: an asyncio Protocol with
httptools, for http:// URLs; the default) and `HttpxStreamer` (httpx2, HTTP/1.1, `aiter_raw`; https, and
everything when CASELEDGER_LOAD_TRANSPORT=httpx). SSE splitting, chunk parsing, timing and error classes
live here, above the seam, so both give the same records. Chunk times are taken when the raw bytes
arrive, before parsing.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

import anyio
import orjson
from typing_extensions import TypeIs

from caseledger import redact
from caseledger.case.bounds import DEFAULT_MAX_EVENT_BYTES
from caseledger.case.model import Case
from caseledger.errors import FailureClass, PhaseFailed
from caseledger.load.fast import FastStreamer, fast_target
from caseledger.load.plan import RequestSpec
from caseledger.load.transport import (
    ConnectFailed,
    HttpxStreamer,
    StreamBroken,
    Streamer,
    StreamResponse,
    transport_choice,
)
from caseledger.records import PHASE_HEADER, ErrorClass, RawRecord

if TYPE_CHECKING:
    import httpx2

HTTP_ERROR_BODY_CHARS = 200
LONG_LINE = 2**16  # a data line held longer than this has its value cut out in place; shorter ones take the loop
# a request written ahead of its task (FastStreamer.launch): its send time and the sent request (None: not
# written, its task posts it); None: nothing done ahead
Launched = tuple[int, AbstractAsyncContextManager[StreamResponse] | None] | None


# ---- SSE and chunk parsing (pure) --------------------------------------------------------------------


class EventTooLarge(Exception):
    """One SSE event grew past max_event_bytes: its request fails as a broken stream (class 'stream').

    `events`: the complete events ahead of it in the same read, which count as they would in any split.
    """

    def __init__(self, message: str, events: list[bytes]) -> None:
        super().__init__(message)
        self.events = events


class SSEParser:
    """Incremental SSE splitter: feed raw bytes, get the data payload of every complete event.

    Linear in the bytes fed: what is held is the unfinished line, with no newline in it (so the scan of each
    read starts at the read, never again at held bytes), and the data values of the pending event. The line
    is the rest of the last read as it came or, once it spans reads, a bytearray it grows in place.

    The size of a pending event is its payload so far (data values joined by newlines) plus the unfinished
    line (less a 'data:' field name and a trailing carriage return); past `max_event_bytes` the parser
    raises EventTooLarge and drops what it held, so it never holds more than the maximum (and a field name)
    plus one read. That size only grows with the position in the stream, so whether an event is too large
    does not depend on where the reads split it. After EventTooLarge the stream cannot be resynchronised:
    every later feed raises it.
    """

    __slots__ = ("_data", "_failed", "_fast_max", "_line", "_size", "max_event_bytes")

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self.max_event_bytes = max_event_bytes
        self._line: bytes | bytearray = b""  # the unfinished line
        self._data: list[bytes] = []  # data values of the pending event
        self._size = 0  # its payload's bytes: the values and the newlines that will join them
        self._failed: str | None = None  # set once an event was too large: the rest of the stream is lost
        self._fast_max = max_event_bytes + len(b"data: \n\n")  # the longest read the fast path takes; -1: lost

    def feed(self, chunk: bytes) -> list[bytes]:
        # fast path, the usual read: exactly one complete 'data: ...\n\n' event (not '\r\n\n'), nothing pending
        if (
            not self._line
            and not self._data
            and chunk.find(b"\n") == len(chunk) - 2
            and chunk.endswith(b"\n\n")
            and chunk.startswith(b"data: ")
            and chunk[-3] != 13
            and len(chunk) <= self._fast_max
        ):
            return [chunk[6:-2]]
        if self._failed is not None:
            raise EventTooLarge(self._failed, [])
        lines = chunk.split(b"\n")
        tail = lines.pop()
        held = self._line
        if held:
            if not lines:  # still no end of line: it grows in place, only this read is scanned
                if isinstance(held, bytes):
                    held = self._line = bytearray(held)
                held += tail
                if self._size + len(held) > self.max_event_bytes:  # near the maximum: measure it exactly
                    self._check_held([])
                return []
            if isinstance(held, bytearray) and len(held) > LONG_LINE and held.startswith(b"data:"):
                held += lines[0]
                self._held_data(held)
                del lines[0]
            else:  # the rest of one read, or a short line: joined as it is
                lines[0] = (held if isinstance(held, bytes) else bytes(held)) + lines[0]
            self._line = b""
        out: list[bytes] = []
        data, size, limit = self._data, self._size, self.max_event_bytes
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:  # blank line: dispatch the event
                if data:
                    out.append(data[0] if len(data) == 1 else b"\n".join(data))
                    data = self._data = []
                size = 0
            elif line.startswith(b"data:"):
                value = line[6:] if line.startswith(b" ", 5) else line[5:]
                size += len(value) + (1 if data else 0)
                if size > limit:
                    self._fail(out)
                data.append(value)
            elif size + len(line) > limit:  # checked as while it was held, so splits cannot matter
                self._fail(out)
            # event:, id:, retry: and ':' comments carry nothing we record
        self._size = size
        if tail:
            self._line = tail
            if size + len(tail) > limit:
                self._check_held(out)
        return out

    @property
    def held_bytes(self) -> int:
        """Bytes held between reads: the unfinished line and the pending event's data values."""
        return len(self._line) + self._size

    def _held_data(self, held: bytearray) -> None:
        """The unfinished line, now complete, is a long data line: its value joins the pending event, as in
        feed's loop, but cut out of the buffer in place (one copy of it, not two)."""
        if held.endswith(b"\r"):
            del held[-1]
        del held[: 6 if held.startswith(b" ", 5) else 5]  # deleting a bytearray's head is O(1)
        self._size += len(held) + (1 if self._data else 0)
        if self._size > self.max_event_bytes:
            self._fail([])
        self._data.append(bytes(held))

    def _check_held(self, out: list[bytes]) -> None:
        """Fail when the pending event with the unfinished line is already too large; the line is measured as
        it will count once complete, never more, so a split cannot fail an event that fits whole (feed calls
        this only when the line's whole length would pass the maximum: that bounds the exact measure)."""
        held = self._line
        n = len(held) - (held[-1] == 13)  # a trailing \r may be the first byte of the line's \r\n
        if held.startswith(b"data:"):  # its value, and the newline joining it to the event's data
            n += (1 if self._data else 0) - (6 if held.startswith(b"data: ") else 5)
        elif b"data:".startswith(held):  # may become a data line: its field name will not count
            n = 0
        if self._size + n > self.max_event_bytes:
            self._fail(out)

    def _fail(self, out: list[bytes]) -> None:
        self._line, self._fast_max = b"", -1
        self._data, self._size = [], 0
        self._failed = (
            f"SSE event exceeds {self.max_event_bytes:,} bytes (load.max_event_bytes); raise it if "
            "the server sends events this large"
        )
        raise EventTooLarge(self._failed, out)

    def close(self) -> list[bytes]:
        """Events left when the body ends without a final blank line."""
        out = self.feed(b"\n\n") if self._line or self._data else []
        self._line = b""
        return out


class ServerStreamError(Exception):
    """The server reported an error inside the stream (`data: {"error": ...}`)."""


class ChunkState:
    """What one response stream has shown so far; `feed` is the per-chunk hot path."""

    __slots__ = (
        "accepted",
        "chunk_ns",
        "chunk_tokens",
        "done",
        "drafted",
        "finish_reason",
        "last_completion",
        "steps",
        "text",
        "usage",
    )

    def __init__(self, keep_text: bool = False) -> None:
        # the reply's content pieces, kept only when asked (a conversation's next turn sends the reply back)
        self.text: list[str] | None = [] if keep_text else None
        self.chunk_ns: list[int] = []
        self.chunk_tokens: list[int | None] = []
        self.usage: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        self.last_completion = 0
        self.done = False
        self.drafted: int | None = None  # cumulative timings.draft_n, latest seen
        self.accepted: int | None = None  # cumulative timings.draft_n_accepted, latest seen
        self.steps: list[list[int]] | None = None  # [drafted, accepted] per verify step, from content chunks

    def feed(self, payload: bytes, now_ns: int) -> None:
        if payload == b"[DONE]":
            self.done = True
            return
        obj = orjson.loads(payload)
        if not isinstance(obj, dict):
            raise ServerStreamError(f"chunk is not a JSON object: {payload[:80]!r}")
        if "error" in obj:
            err = obj["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            # masked before the cut: a cut would keep the first characters of a key the server echoed
            raise ServerStreamError(f"server error in stream: {redact.cut(str(msg), HTTP_ERROR_BODY_CHARS)}")
        usage = obj.get("usage")
        completion: int | None = None
        if usage:
            self.usage = usage
            completion = usage.get("completion_tokens")
        choices = obj.get("choices")
        text = None
        if choices:
            c = choices[0]
            delta = c.get("delta")
            if delta is not None:
                text = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
                if self.text is not None and delta.get("content"):
                    self.text.append(delta["content"])
            else:
                text = c.get("text")
            if text:
                self.chunk_ns.append(now_ns)
                self.chunk_tokens.append(None if completion is None else completion - self.last_completion)
            if c.get("finish_reason"):
                self.finish_reason = c["finish_reason"]
        timings = obj.get("timings")
        if timings:
            self._draft_counts(timings, bool(text))
        if completion is not None:
            self.last_completion = completion

    def _draft_counts(self, timings: Any, content: bool) -> None:
        """Cumulative draft counts (llama.cpp's timings): the latest are the request's totals; on a content
        chunk (timings_per_token) a rise of draft_n starts a verify step, its accepted rise is that step's."""
        if not isinstance(timings, dict):
            return
        drafted, accepted = timings.get("draft_n"), timings.get("draft_n_accepted")
        if not isinstance(drafted, int) or not isinstance(accepted, int):
            return
        if content:
            steps = self.steps if self.steps is not None else []
            before_d, before_a = self.drafted or 0, self.accepted or 0
            if drafted > before_d:
                steps.append([drafted - before_d, accepted - before_a])
            self.steps = steps
        self.drafted, self.accepted = drafted, accepted


def make_record(
    spec: RequestSpec,
    send_ns: int,
    end_ns: int,
    state: ChunkState,
    status: int | None,
    error: str | None,
    error_class: ErrorClass | None,
    sched_ns: int | None = None,
) -> RawRecord:
    if error_class is None and state.finish_reason is None:
        error_class = "incomplete"
        error = "stream ended without a finish_reason" + ("" if state.done else " and without [DONE]")
    usage = state.usage or {}
    details = usage.get("prompt_tokens_details") or {}
    rec = RawRecord(
        i=spec.i,
        entry=spec.entry,
        route=spec.route,
        send_ns=send_ns,
        chunk_ns=state.chunk_ns,
        chunk_tokens=state.chunk_tokens,
        end_ns=end_ns,
        status=status,
        ok=error_class is None,
        # outside text (a server's body, a transport error) with the values of the case's secrets masked, before
        # it reaches raw.jsonl; only failed requests pay for it, never a chunk
        error=redact.mask(error) if error else error,
        error_class=error_class,
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        cached_tokens=details.get("cached_tokens") if isinstance(details, dict) else None,
        finish_reason=state.finish_reason,
        input_tokens_body=spec.input_tokens_body,
        input_tokens_chat=spec.input_tokens_chat,
        spec_draft_tokens=state.drafted,
        spec_accepted_tokens=state.accepted,
        spec_steps=state.steps,
    )
    if spec.max_tokens is not None:
        rec["max_tokens"] = spec.max_tokens
    if sched_ns is not None:
        rec["sched_ns"] = sched_ns
    if spec.trace_row is not None:
        rec["trace_row"] = spec.trace_row
    if spec.planned_shared_tokens is not None:
        rec["planned_shared_tokens"] = spec.planned_shared_tokens
    if spec.session is not None:
        rec["session"], rec["turn"], rec["turns"] = spec.session, spec.turn or 0, spec.turns or 1
    if state.text is not None:
        rec["reply"] = "".join(state.text)
    return rec


# ---- the engine --------------------------------------------------------------------------------------


def api_key_of(case: Case) -> str | None:
    """The case's API key, read from the variable target.api_key_env names (never stored)."""
    return os.environ.get(case.target.api_key_env) if case.target.api_key_env else None


def auth_header(api_key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {api_key}"} if api_key else {}


def request_headers(phase: str, api_key: str | None) -> dict[str, str]:
    return {
        "content-type": "application/json",
        "accept": "text/event-stream",
        PHASE_HEADER: phase,
        **auth_header(api_key),
    }


AUTH_STATUSES = (401, 403)


def refuse_auth(case: Case, where: str, statuses: list[int | None]) -> None:
    """A target that refused the credentials on every request: an authentication failure (class auth),
    not a service fault: the service is healthy and kept; the fix is the key."""
    if not statuses or not all(st in AUTH_STATUSES for st in statuses):
        return
    env = case.target.api_key_env
    key = f"the variable {env} (target.api_key_env)" if env else "target.api_key_env (none is set)"
    raise PhaseFailed(
        f"{where}: the target refused the credentials (HTTP {statuses[0]} on {len(statuses)} of {len(statuses)})",
        FailureClass.AUTH,
        f"check {key}: it must hold the key the server expects; then resume (the service is kept)",
    )


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
                    error, error_class = f"HTTP {status}: {redact.cut(text, HTTP_ERROR_BODY_CHARS)}", "http"
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
                await self.slots.acquire()  # a due request waits for a free slot; plan order is kept
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
) -> dict[str, Any]:
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
) -> list[RawRecord]:
    """Send specs in plan order, at their offsets, at most `concurrency` in flight; records sorted by i.

    transport: None (over the network: FastStreamer, or HttpxStreamer per CASELEDGER_LOAD_TRANSPORT), an
    httpx2 transport (e.g. MockTransport) or a Streamer.
    on_send is called as each request is sent, on_record as each ends (from the event loop: keep them
    short). A cancelled run records its in-flight requests with error_class 'client' before unwinding.
    max_event_bytes: the largest SSE event a response may send (load.max_event_bytes).
    scheduled: the specs' offsets are a schedule (a rate or a trace): each record carries its due time.
    start_ns: the monotonic instant offset 0 stands for (several processes share one); None: when sending starts.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    streamer, owned = open_streamer(transport, concurrency)
    runner = _Runner(
        streamer,
        concurrency,
        request_headers(phase, api_key),
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
