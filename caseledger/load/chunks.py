"""One response stream's state (pure): the SSE payloads of a reply read chunk by chunk, and the `RawRecord` it
ends as.

`ChunkState.feed` is the per-chunk hot path of the load client (load/client.py's `request_one`); `make_record`
runs once per request, when it ends.
"""

from __future__ import annotations

from typing import Any

import orjson

from caseledger import redact
from caseledger.load.schedule import RequestSpec
from caseledger.records import ErrorClass, RawRecord

ERROR_LINE_CHARS = 120  # a target's error text, as the ledger and every view show it: a status line, not a body


def error_line(text: str) -> str:
    """A target's error body as one short line: the message of a JSON error (OpenAI's {"error": {"message"}},
    {"message"}, {"detail"}), else the body's first non-empty line; control characters dropped, masked, cut at
    ERROR_LINE_CHARS. A body is never kept whole: the target may be a service that was not meant to be read."""
    msg: object = text
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    else:
        if isinstance(obj, dict):
            err = obj.get("error", obj)
            msg = next((err[k] for k in ("message", "detail") if isinstance(err, dict) and k in err), err)
    flat = str(msg).strip()
    first = next((ln.strip() for ln in flat.splitlines() if ln.strip()), "")
    clean = "".join(c if c.isprintable() else " " for c in first)
    short = redact.cut(clean, ERROR_LINE_CHARS)
    return short + ("…" if len(clean) > ERROR_LINE_CHARS else "")


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
        self.usage: dict[str, Any] | None = None  # JSON: the stream's usage object
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
            # masked before the cut (error_line): a cut would keep the first characters of a key the server echoed
            raise ServerStreamError(f"server error in stream: {error_line(payload.decode('utf-8', 'replace'))}")
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
