"""The load engine: raw records from SSE streams, errors, timeouts, concurrency, arrivals; the formal load
process end to end (files, server-side request counts) and after a kill."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from caseledger.case.model import DEFAULT_MAX_EVENT_BYTES
from caseledger.load import (
    EventTooLarge,
    HttpxStreamer,
    RequestSpec,
    SSEParser,
    request_one,
    run_requests,
    schedule_from_run_dir,
)
from caseledger.load.chunks import ERROR_LINE_CHARS, ChunkState, make_record
from caseledger.load.client import client_timing
from caseledger.records import PHASE_HEADER, RawRecord, read_records
from caseledger.workspace import RunPaths, Workspace, read_json
from tests.conftest import free_port, reference_targets
from tests.helpers import load_draft, make_run_dir

URL = "http://target.test/v1/chat/completions"


def spec(i: int = 0, offset_s: float = 0.0, url: str = URL) -> RequestSpec:
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    return RequestSpec(
        i=i, entry=100 + i, route=0, offset_s=offset_s, url=url, body=body, input_tokens_body=7, input_tokens_chat=12
    )


def sse(*events: Any) -> list[bytes]:
    return [b"data: " + (e if isinstance(e, bytes) else orjson.dumps(e)) + b"\n\n" for e in events]


def chat_chunk(
    content: str | None = None,
    *,
    role: str | None = None,
    finish: str | None = None,
    completion: int | None = None,
    prompt: int = 10,
) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    obj: dict[str, Any] = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if completion is not None:
        obj["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return obj


def final_usage(prompt: int, completion: int, cached: int | None) -> dict[str, Any]:
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return {"choices": [], "usage": usage}


def streaming(
    parts: list[bytes],
    *,
    delay_s: float = 0.0,
    stall_after: int | None = None,
    seen: list[httpx2.Request] | None = None,
) -> httpx2.MockTransport:
    async def body() -> AsyncIterator[bytes]:
        for n, part in enumerate(parts):
            if stall_after is not None and n == stall_after:
                await anyio.sleep(3600)
            if delay_s:
                await anyio.sleep(delay_s)
            yield part

    async def handler(request: httpx2.Request) -> httpx2.Response:
        if seen is not None:
            seen.append(request)
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body())

    return httpx2.MockTransport(handler)


def run(
    specs: list[RequestSpec],
    transport: Any,
    *,
    concurrency: int = 4,
    timeout_s: float = 5.0,
    phase: str = "test",
    api_key: str | None = None,
) -> list[RawRecord]:
    async def go() -> list[RawRecord]:
        return await run_requests(specs, concurrency, phase, transport=transport, api_key=api_key, timeout_s=timeout_s)

    return anyio.run(go)


# ---- SSE and chunk parsing -------------------------------------------------------------------------


def test_sse_parser_joins_split_events_and_ignores_comments_and_crlf() -> None:
    p = SSEParser()
    assert p.feed(b': keep-alive\r\n\r\ndata: {"a"') == []
    assert p.feed(b":1}\r\n\r\ndata: x\n") == [b'{"a":1}']
    assert p.feed(b"data: y\n\nevent: e\ndata:[DONE]\n\n") == [b"x\ny", b"[DONE]"]
    assert p.feed(b"data: tail") == []
    assert p.close() == [b"tail"]


_ends = st.sampled_from([b"\n", b"\r\n"])
_values = st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"").replace(b"\r", b""))
_fields = st.sampled_from([b"data:", b"data: ", b"data: ", b": ", b"event: ", b"id: "])  # mostly data


Stream = tuple[bytes, list[tuple[bytes | None, int]]]


@st.composite
def sse_streams(draw: st.DrawFn) -> Stream:
    """A stream as a server may write it (events of data lines, comments and other fields, \n or \r\n, maybe
    a last event cut inside its last line), and per event its payload (None: no data line) and its peak
    size: the most its payload so far (values joined by newlines) plus one more line ever was."""
    raw: list[bytes] = []
    events: list[tuple[bytes | None, int]] = []
    whole = draw(st.integers(0, 6))
    for k in range(whole + draw(st.integers(0, 1))):
        cut = k == whole  # the body ends inside this event: close() ends its line and dispatches it
        values: list[bytes] = []
        size = peak = 0
        lines = draw(st.integers(1 if cut else 0, 4))
        for j in range(lines):
            field, value = draw(_fields), draw(_values)
            raw.append(field + value + (b"" if cut and j == lines - 1 else draw(_ends)))
            if field.startswith(b"data"):  # one space after the colon is not part of the value
                values.append(value[1:] if field == b"data:" and value.startswith(b" ") else value)
                size += len(values[-1]) + (len(values) > 1)
                peak = max(peak, size)
            else:
                peak = max(peak, size + len(field + value))
        if not cut:
            raw.append(draw(_ends))
        events.append((b"\n".join(values) if values else None, peak))
    return b"".join(raw), events


def payloads(events: list[tuple[bytes | None, int]], max_event_bytes: int) -> tuple[list[bytes], bool]:
    """What a parser must yield: the payloads up to the first event whose peak is over the maximum."""
    out: list[bytes] = []
    for payload, peak in events:
        if peak > max_event_bytes:
            return out, True
        if payload is not None:
            out.append(payload)
    return out, False


def reads_of(raw: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(raw) + 1) for c in cuts})
    return [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]


def parsed(parts: list[bytes], max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> tuple[list[bytes], bool]:
    """(the payloads, whether an event was too large), checking after every read what the parser holds."""
    p, got = SSEParser(max_event_bytes), []
    try:
        for part in parts:
            got += p.feed(part)
            # the pending event, plus a 'data: ' field name and a trailing \r not yet known to end the line
            assert p.held_bytes <= max_event_bytes + len(b"data: \r")
        got += p.close()
    except EventTooLarge as e:
        assert p.held_bytes == 0
        return got + e.events, True
    return got, False


@settings(max_examples=400)  # cheap examples; the edge cases (a \r\n across reads, a field name split) are rare
@given(sse_streams(), st.lists(st.integers(0, 10_000), max_size=12))
def test_sse_parser_yields_the_same_events_wherever_the_reads_split_the_stream(
    stream: Stream,
    cuts: list[int],
) -> None:
    raw, events = stream
    want = payloads(events, DEFAULT_MAX_EVENT_BYTES)
    assert not want[1]
    assert parsed([raw]) == want
    assert parsed(reads_of(raw, cuts)) == want
    assert parsed([raw[k : k + 1] for k in range(len(raw))]) == want  # one byte per read


@settings(max_examples=400)
@given(sse_streams(), st.lists(st.integers(0, 10_000), max_size=12), st.data())
def test_whether_an_event_is_too_large_does_not_depend_on_where_the_reads_split_it(
    stream: Stream,
    cuts: list[int],
    data: st.DataObject,
) -> None:
    raw, events = stream
    at_a_peak = st.sampled_from([peak for _, peak in events] or [0]).flatmap(lambda p: st.sampled_from([p - 1, p]))
    max_event_bytes = data.draw(st.one_of(st.integers(0, 80), at_a_peak.filter(lambda m: m >= 0)))
    want = payloads(events, max_event_bytes)  # the events before a large one are kept
    assert parsed([raw], max_event_bytes) == want
    assert parsed(reads_of(raw, cuts), max_event_bytes) == want


@pytest.mark.parametrize(
    ("raw", "payload", "peak"),
    [
        (b"data: xxxxxxxxxx\r\n\r\n", b"x" * 10, 10),  # one read of it takes the fast path
        (b"data: x\r\n\n", b"x", 1),  # mixed line ends: not the fast path's shape
        (b"data:  x\n\n", b" x", 2),  # only the first space goes
        (b"data: aaaa\r\ndata:\r\n\r\n", b"aaaa\n", 5),  # the joining newline counts; 'data' alone may be a value
        (b"data: aaaa\nid: 7\n\n", b"aaaa", 9),  # a field held while it arrives counts with the data before it
    ],
)
def test_small_events_at_and_one_byte_under_the_maximum_fit_or_fail_at_every_split(
    raw: bytes,
    payload: bytes,
    peak: int,
) -> None:
    n = len(raw)
    splits = [[raw], [raw[k : k + 1] for k in range(n)]]
    splits += [[raw[:i], raw[i:j], raw[j:]] for i in range(n + 1) for j in range(i, n + 1)]
    for parts in splits:
        assert parsed(parts) == ([payload], False), parts
        assert parsed(parts, peak) == ([payload], False), parts
        assert parsed(parts, peak - 1) == ([], True), parts


LONG = b"x" * 100_000  # held over several reads, longer than client.LONG_LINE: its value is cut out in place


@pytest.mark.parametrize(
    ("raw", "payload", "peak"),
    [
        (b"data: a\ndata: " + LONG + b"\n\n", b"a\n" + LONG, len(LONG) + 2),
        (b"data:" + LONG + b"\r\n\r\n", LONG, len(LONG)),
        (b"data:  " + LONG + b"\r\n\n", b" " + LONG, len(LONG) + 1),
        (b": " + LONG + b"\ndata: a\n\n", b"a", len(LONG) + 2),  # a long comment is held too, and counts while it is
    ],
)
def test_long_lines_held_over_many_reads_fit_or_fail_exactly_at_the_maximum(
    raw: bytes,
    payload: bytes,
    peak: int,
) -> None:
    for read in (4096, 65536, 65537, len(raw)):
        parts = [raw[k : k + read] for k in range(0, len(raw), read)]
        assert parsed(parts, peak) == ([payload], False), read
        assert parsed(parts, peak - 1) == ([], True), read


def test_an_endless_event_fails_at_the_read_past_the_maximum_and_the_stream_stays_lost() -> None:
    limit, read = 2**16, 4096
    p = SSEParser(limit)
    assert p.feed(b'data: {"a":"') == []
    fed = 6  # bytes of the value so far
    with pytest.raises(EventTooLarge, match=r"^SSE event exceeds 65,536 bytes \(load.max_event_bytes\)"):
        while True:  # one line that never ends
            p.feed(b"x" * read)
            fed += read
            assert p.held_bytes <= limit + len(b"data: ")  # never more than the maximum, let alone one read more
    assert fed <= limit < fed + read and p.held_bytes == 0
    for later in (b"\n\ndata: {}\n\n", b"data: {}\n\n"):  # the parser cannot tell where events start again
        with pytest.raises(EventTooLarge):
            p.feed(later)


def test_record_counts_content_chunks_only_and_attributes_continuous_usage_tokens() -> None:
    parts = sse(
        chat_chunk("", role="assistant", completion=0),  # role-only: not a content chunk
        chat_chunk("Hel", completion=1),
        chat_chunk("lo wor", completion=3),  # speculative decoding: several tokens in one chunk
    )
    split = sse(chat_chunk("ld", completion=4))[0]
    parts += [split[:15], split[15:]]  # one event across two reads
    parts += [b"".join(sse(chat_chunk("", finish="length", completion=4), final_usage(10, 4, 8), b"[DONE]"))]
    seen: list[httpx2.Request] = []
    asked = dataclasses.replace(spec(), max_tokens=4)
    (rec,) = run([asked], streaming(parts, seen=seen), phase="warmup", api_key="sk-test")
    assert rec["ok"] and rec["error"] is None and rec["error_class"] is None and rec["status"] == 200
    assert rec["max_tokens"] == 4  # what the body asked: its completion_tokens is checked against it
    assert len(rec["chunk_ns"]) == 3
    assert rec["chunk_tokens"] == [1, 2, 1]
    assert rec["send_ns"] <= rec["chunk_ns"][0] <= rec["chunk_ns"][1] <= rec["chunk_ns"][2] <= rec["end_ns"]
    assert (rec["prompt_tokens"], rec["completion_tokens"], rec["cached_tokens"]) == (10, 4, 8)
    assert rec["finish_reason"] == "length"
    assert (rec["i"], rec["entry"], rec["route"]) == (0, 100, 0)
    assert (rec["input_tokens_body"], rec["input_tokens_chat"]) == (7, 12)
    assert seen[0].headers[PHASE_HEADER] == "warmup"
    assert seen[0].headers["authorization"] == "Bearer sk-test"
    # every field, but those of a scheduled send, a trace row and a conversation's turn: this request is none
    assert set(rec) == set(RawRecord.__annotations__) - {
        "sched_ns",
        "trace_row",
        "planned_shared_tokens",
        "session",
        "turn",
        "turns",
        "reply",
    }


def test_chunk_tokens_are_none_without_continuous_usage_and_cached_tokens_absent_is_none() -> None:
    parts = sse(chat_chunk("a"), chat_chunk("b"), chat_chunk(None, finish="stop"), final_usage(5, 2, None), b"[DONE]")
    (rec,) = run([spec()], streaming(parts))
    assert rec["ok"] and rec["chunk_tokens"] == [None, None]
    assert (rec["completion_tokens"], rec["cached_tokens"], rec["finish_reason"]) == (2, None, "stop")


def test_completions_api_text_chunks_are_content() -> None:
    parts = sse(
        {"choices": [{"text": "x", "finish_reason": None}]},
        {"choices": [{"text": "", "finish_reason": "length"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}},
        b"[DONE]",
    )
    (rec,) = run([spec(url="http://target.test/v1/completions")], streaming(parts))
    assert rec["ok"] and len(rec["chunk_ns"]) == 1 and rec["completion_tokens"] == 1


def _with_large_event(size: int) -> list[bytes]:
    """A stream whose second event has `size` bytes of content, sent in 64 KiB reads; the first read also
    carries the first event and the last read the rest of the stream."""
    first, big = sse(chat_chunk("a", completion=1))[0], sse(chat_chunk("x" * size, completion=2))[0]
    rest = b"".join(sse(chat_chunk(None, finish="stop", completion=2), b"[DONE]"))
    raw = first + big + rest
    return [raw[k : k + 65536] for k in range(0, len(raw), 65536)]


def test_an_event_over_the_maximum_fails_its_request_as_a_broken_stream_naming_the_size() -> None:
    (rec,) = run([spec()], streaming(_with_large_event(DEFAULT_MAX_EVENT_BYTES + 1)))
    assert (rec["ok"], rec["status"], rec["error_class"]) == (False, 200, "stream")
    assert rec["error"] == (
        "SSE event exceeds 8,388,608 bytes (load.max_event_bytes); raise it if the server sends events this large"
    )
    assert len(rec["chunk_ns"]) == 1  # the event read with the start of the large one still counts


def test_max_event_bytes_reaches_the_parser_of_every_request() -> None:
    parts = _with_large_event(200_000)

    async def one(max_event_bytes: int) -> RawRecord:
        s = HttpxStreamer(1, streaming(parts))
        try:
            return await request_one(spec(), s, {}, 5.0, max_event_bytes=max_event_bytes)
        finally:
            await s.aclose()

    size = len(orjson.dumps(chat_chunk("x" * 200_000, completion=2)))  # the large event's payload
    fits, too_large = anyio.run(one, size), anyio.run(one, size - 1)
    assert fits["ok"] and len(fits["chunk_ns"]) == 2 and fits["finish_reason"] == "stop"
    assert too_large["error_class"] == "stream" and f"exceeds {size - 1:,} bytes" in (too_large["error"] or "")

    async def many() -> list[RawRecord]:
        return await run_requests(
            [spec(0), spec(1)], 2, "test", transport=streaming(parts), timeout_s=5, max_event_bytes=2**17
        )

    assert [r["error_class"] for r in anyio.run(many)] == ["stream", "stream"]
    assert run([spec()], streaming(parts))[0]["ok"]  # the default maximum is far above 200 kB


def test_http_500_is_recorded_with_status_and_a_short_line_of_its_body() -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(500, text="E" * 500)

    (rec,) = run([spec()], httpx2.MockTransport(handler))
    assert rec["status"] == 500 and not rec["ok"] and rec["error_class"] == "http"
    assert rec["error"] is not None and rec["error"].count("E") == ERROR_LINE_CHARS and rec["error"].endswith("…")
    assert rec["chunk_ns"] == [] and rec["finish_reason"] is None


def test_stalled_stream_ends_as_timeout_without_hanging() -> None:
    parts = sse(chat_chunk("a", completion=1), chat_chunk("b", completion=2), b"[DONE]")
    t0 = time.monotonic()
    (rec,) = run([spec()], streaming(parts, stall_after=1), timeout_s=0.2)
    assert time.monotonic() - t0 < 2.0
    assert rec["error_class"] == "timeout" and not rec["ok"] and rec["status"] == 200
    assert len(rec["chunk_ns"]) == 1  # what arrived before the stall is kept
    assert 0.15e9 < rec["end_ns"] - rec["send_ns"] < 1.5e9


def test_stream_without_finish_reason_is_incomplete_and_error_event_is_stream() -> None:
    (rec,) = run([spec()], streaming(sse(chat_chunk("a"))))
    assert rec["error_class"] == "incomplete" and not rec["ok"] and len(rec["chunk_ns"]) == 1
    (rec,) = run([spec()], streaming(sse(chat_chunk("a"), {"error": {"message": "engine died"}})))
    assert rec["error_class"] == "stream" and "engine died" in (rec["error"] or "")


def test_connection_refused_is_a_connection_error_record() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1/chat/completions"
    recs = run([spec(0, url=url), spec(1, url=url)], None, timeout_s=5)
    assert [r["error_class"] for r in recs] == ["connection", "connection"]
    assert all(r["status"] is None and not r["ok"] for r in recs)


def test_concurrency_limit_and_plan_order_are_kept() -> None:
    state = {"now": 0, "max": 0}
    order: list[int] = []

    async def body() -> AsyncIterator[bytes]:
        try:
            await anyio.sleep(0.03)
            for part in sse(chat_chunk("a", finish="length", completion=1), b"[DONE]"):
                yield part
        finally:
            state["now"] -= 1

    async def handler(request: httpx2.Request) -> httpx2.Response:
        order.append(orjson.loads(request.content)["i"])
        state["now"] += 1
        state["max"] = max(state["max"], state["now"])
        return httpx2.Response(200, content=body())

    specs = [RequestSpec(i=i, entry=i, route=0, offset_s=0.0, url=URL, body=orjson.dumps({"i": i})) for i in range(12)]
    recs = run(specs, httpx2.MockTransport(handler), concurrency=3)
    assert state["max"] == 3
    assert order == list(range(12))
    assert [r["i"] for r in recs] == list(range(12)) and all(r["ok"] for r in recs)


def test_scheduled_offsets_are_honoured() -> None:
    parts = sse(chat_chunk("a", finish="length", completion=1), b"[DONE]")
    specs = [spec(i, offset_s=0.05 * i) for i in range(5)]
    recs = run(specs, streaming(parts), concurrency=5)
    sends = [r["send_ns"] for r in recs]
    for i in range(1, 5):
        gap = (sends[i] - sends[0]) / 1e9
        assert 0.05 * i - 0.005 <= gap < 0.05 * i + 0.15  # never early; late only by scheduling noise


def test_cancelled_run_records_in_flight_requests_as_client_errors() -> None:
    parts = sse(chat_chunk("a", completion=1), chat_chunk("b", completion=2), b"[DONE]")
    got: list[RawRecord] = []

    async def go() -> None:
        with anyio.move_on_after(0.2):
            await run_requests(
                [spec(0), spec(1), spec(2, offset_s=60)],
                4,
                "load",
                transport=streaming(parts, stall_after=1),
                on_record=got.append,
                timeout_s=30,
            )

    anyio.run(go)
    assert sorted(r["i"] for r in got) == [0, 1]  # request 2 was never sent, so it has no record
    assert all(r["error_class"] == "client" and r["error"] == "cancelled" for r in got)
    assert all(len(r["chunk_ns"]) == 1 for r in got)  # what arrived before the cancel is kept


def test_client_timing_states_the_first_waves_launch_spread_and_the_anchor_bracket() -> None:
    def rec(i: int, send_ns: int) -> RawRecord:
        return {**make_record(spec(i), send_ns, send_ns + 10, ChunkState(), 200, None, None), "ok": True}

    # the first wave is requests 0..C-1 in plan order, whatever order they finished in
    recs = [rec(3, 9_000_000), rec(0, 1_000_000), rec(2, 1_400_000), rec(1, 1_950_000), rec(4, 2_000_000)]
    burst = client_timing(recs, 3, True, {"uncertainty_ns": 120})
    assert (burst["first_wave"], burst["launch_spread_us"], burst["anchor_uncertainty_ns"]) == (3, 950.0, 120)
    assert burst["line"] == "first wave of 3 sent within 0.95 ms; wall-clock anchor ± 0.1 µs"
    paced = client_timing(recs, 3, False, None)
    assert paced["launch_spread_us"] is None and paced["anchor_uncertainty_ns"] is None
    assert paced["line"] == "no first wave (requests leave on the rate schedule); no clock anchor"


# ---- the formal load process ------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]
FAST_TARGET = {"prefill_tokens_per_s": 1e7, "decode_step_s": 0.001, "decode_step_per_seq_s": 0.0, "slots": 16}


def test_public_api_all_is_sorted_and_complete() -> None:
    import caseledger.load as pkg

    public = {
        n
        for n, v in vars(pkg).items()
        if not n.startswith("_") and getattr(v, "__module__", "").startswith("caseledger.load")
    }
    assert pkg.__all__ == sorted(pkg.__all__) and set(pkg.__all__) == public


@pytest.mark.integration
def test_load_client_start_up_imports_neither_mcp_nor_transformers() -> None:
    code = (
        "import sys, caseledger.load.__main__; print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'mcp', 'transformers', 'torch', 'tokenizers', 'uvicorn', 'starlette'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


class Target:
    def __init__(self, proc: subprocess.Popen[bytes], port: int) -> None:
        self.proc, self.port = proc, port
        self.base = f"http://127.0.0.1:{port}"

    def by_phase(self) -> dict[str, int]:
        return dict(httpx2.get(self.base + "/stats", timeout=5).json()["by_phase"])


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    with reference_targets({"target": FAST_TARGET}, tmp_path_factory.mktemp("target")) as served:
        yield Target(served["target"].proc, served["target"].port)


def run_client(
    paths: RunPaths, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "caseledger.load", str(paths.root)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full,
    )


@pytest.mark.integration
def test_formal_load_writes_records_progress_and_end_and_the_server_saw_exactly_n(
    target: Target, tmp_path: Path
) -> None:
    paths = make_run_dir(Workspace(tmp_path / "ws"), load_draft(target.port, 12, 4))
    before = target.by_phase().get("load", 0)
    out = run_client(paths)
    assert out.returncode == 0, out.stderr
    assert target.by_phase().get("load", 0) - before == 12

    raw = read_records(paths.raw)
    assert not raw.torn_tail and raw.bad_lines == 0
    recs = sorted(raw.records, key=lambda r: r["i"])
    assert [r["i"] for r in recs] == list(range(12))
    for r in recs:
        assert r["ok"] and r["status"] == 200 and r["finish_reason"] == "length", r
        assert r["completion_tokens"] == 8 and sum(t or 0 for t in r["chunk_tokens"]) == 8
        assert r["prompt_tokens"] == r["input_tokens_chat"]  # the dataset's count is what the server counted
        assert r["send_ns"] < r["chunk_ns"][0] and r["chunk_ns"][-1] <= r["end_ns"]

    end = read_json(paths.load_end)
    assert end["exit"] == "complete"
    assert (end["planned"], end["sent"], end["done"], end["ok"], end["failed"]) == (12, 12, 12, 12, 0)
    assert end["chunks"] == sum(len(r["chunk_ns"]) for r in recs)
    assert end["first_send_ns"] == min(r["send_ns"] for r in recs)
    assert end["last_end_ns"] == max(r["end_ns"] for r in recs)
    assert end["cpu_user_s"] > 0 and end["cpu_sys_s"] >= 0 and end["wall_start_utc"] < end["wall_end_utc"]
    assert end["plan_sha256"] == schedule_from_run_dir(paths.root).digest()
    progress = read_json(paths.load_progress)
    assert {k: progress[k] for k in ("planned", "sent", "done", "ok", "failed")} == {
        "planned": 12,
        "sent": 12,
        "done": 12,
        "ok": 12,
        "failed": 0,
    }
    anchor = read_json(paths.load_anchor)
    assert anchor["mono_ns"] <= end["first_send_ns"] and anchor["wall_utc"].endswith("Z")
    pid = read_json(paths.load_pid)
    assert set(pid) == {"pid", "start_time", "host"}
    assert isinstance(pid["start_time"], int) and pid["start_time"] > 0

    again = run_client(paths)  # formal requests are never sent twice
    assert again.returncode == 3 and "refused" in again.stderr
    assert target.by_phase().get("load", 0) - before == 12


@pytest.mark.processes
@pytest.mark.integration
def test_kill_after_three_records_leaves_exactly_three_complete_records_and_no_end_file(
    target: Target, tmp_path: Path
) -> None:
    paths = make_run_dir(Workspace(tmp_path / "ws"), load_draft(target.port, 12, 2))
    out = run_client(paths, {"CASELEDGER_FAULT": "load:exit_after=3"})
    assert out.returncode == 137, out.stderr
    raw = read_records(paths.raw)
    assert len(raw.records) == 3 and not raw.torn_tail and all(r["ok"] for r in raw.records)
    assert not paths.load_end.exists()
    again = run_client(paths)
    assert again.returncode == 3 and "not empty" in again.stderr


@pytest.mark.processes
@pytest.mark.integration
def test_sigterm_records_in_flight_requests_and_ends_as_cancelled(target: Target, tmp_path: Path) -> None:
    # 4000 tokens at 1 ms per step: each request streams for ~4 s, so SIGTERM lands mid-stream
    paths = make_run_dir(Workspace(tmp_path / "ws"), load_draft(target.port, 6, 3, max_tokens=4000))
    proc = subprocess.Popen(
        [sys.executable, "-m", "caseledger.load", str(paths.root)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 30
    while not (paths.load_progress.exists() and read_json(paths.load_progress)["sent"] == 3):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 1
    end = read_json(paths.load_end)
    assert (end["exit"], end["signal"], end["sent"], end["done"]) == ("cancelled", "SIGTERM", 3, 3)
    recs = read_records(paths.raw).records
    assert len(recs) == 3 and all(r["error_class"] == "client" and len(r["chunk_ns"]) > 0 for r in recs)


def test_refuses_when_the_load_already_started_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from caseledger.load.__main__ import main

    paths = RunPaths(tmp_path / "r-000000000001")
    paths.load_dir.mkdir(parents=True)
    paths.load_anchor.write_text("{}")  # a client reached its first send, then died before any record
    assert main([str(paths.root)]) == 3
    assert "anchor.json exists" in capsys.readouterr().err
    assert not paths.load_pid.exists()
    paths.load_anchor.unlink()
    assert main([str(paths.root)]) == 2  # no case.json: not started, nothing sent


def test_a_connection_left_open_after_done_is_still_a_whole_response() -> None:
    parts = sse(chat_chunk("a", completion=1), chat_chunk(None, finish="stop", completion=1), b"[DONE]")
    (rec,) = run([spec()], streaming([*parts, b""], stall_after=3), timeout_s=0.3)
    assert rec["ok"] and rec["error_class"] is None and rec["end_ns"] - rec["send_ns"] < 0.25e9
