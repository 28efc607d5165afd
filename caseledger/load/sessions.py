"""Multi-turn conversations (dataset.sessions): each conversation sends its turns one after another.

Turn k of a conversation leaves only after turn k-1's response ended and its think time passed; at most
`concurrency` conversations are open at once (a conversation holds its slot from its first turn's send to its last
turn's end, as a chat user does). Turn k's messages are the earlier turns' user messages, each followed by the reply
the server gave to it (the content the client streamed: what a real chat sends back and what the server's prefix
cache holds), then turn k's own user message. Requests ask temperature 0 and the user messages are fixed by the
dataset, so conversations repeat as far as the engine is deterministic; nothing else about the reply is planned.

A turn that fails ends its conversation: the later turns are never sent (their history would be a failed reply),
and the result counts the conversation as incomplete. The same holds for a load that is cancelled or killed: a
turn in flight is recorded (cancel) or lost (kill), and a resumed run never continues the conversation, because
the load client never sends a run's formal requests twice.

Each turn's record carries `planned_shared_tokens`: the history as the server counted it when turn k-1 ended
(its prompt_tokens + completion_tokens), the prefix a cache that keeps the reply's tokens can hit; an engine that
caches prompt blocks only (the reference target) can hit turn k-1's prompt_tokens of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import anyio
import orjson

from caseledger.case.bounds import DEFAULT_MAX_EVENT_BYTES
from caseledger.load.auth import request_headers
from caseledger.load.client import open_streamer, request_one, sleep_until
from caseledger.load.schedule import RequestSpec, Schedule
from caseledger.load.transport import Streamer
from caseledger.records import RawRecord

if TYPE_CHECKING:
    import httpx2


def turn_body(spec: RequestSpec, history: list[dict[str, str]]) -> bytes:
    """The turn's body: the conversation so far, then the turn's own user message (the schedule's body holds it)."""
    if not history:
        return spec.body
    body: dict[str, Any] = orjson.loads(spec.body)  # JSON: the request body
    body["messages"] = [*history, *body["messages"]]
    return orjson.dumps(body)


def history_tokens(rec: RawRecord) -> int | None:
    """What the server holds of a conversation after this turn: its prompt and its reply, as it counted them."""
    p, c = rec["prompt_tokens"], rec["completion_tokens"]
    return p + c if isinstance(p, int) and isinstance(c, int) else None


class _Conversations:
    def __init__(
        self,
        schedule: Schedule,
        streamer: Streamer,
        headers: Mapping[str, str],
        on_record: Callable[[RawRecord], None] | None,
        on_send: Callable[[RequestSpec], None] | None,
        max_event_bytes: int,
    ) -> None:
        self.schedule, self.streamer, self.headers = schedule, streamer, headers
        self.on_record, self.on_send = on_record, on_send
        self.max_event_bytes = max_event_bytes
        self.slots = anyio.Semaphore(schedule.concurrency)
        self.records: list[RawRecord] = []

    def finish(self, rec: RawRecord) -> None:
        self.records.append(rec)
        if self.on_record is not None:
            self.on_record(rec)

    async def conversation(self, turns: tuple[int, ...]) -> None:
        try:
            history: list[dict[str, str]] = []
            shared: int | None = None
            for k, idx in enumerate(turns):
                spec = self.schedule.specs[idx]
                if k and spec.think_s > 0:
                    await anyio.sleep(spec.think_s)
                sent = replace(spec, body=turn_body(spec, history), planned_shared_tokens=shared)
                if self.on_send is not None:
                    self.on_send(sent)  # the intent line before the first byte
                rec = await request_one(
                    sent,
                    self.streamer,
                    self.headers,
                    self.schedule.timeout_s,
                    self.finish,
                    max_event_bytes=self.max_event_bytes,
                    keep_text=True,
                )
                self.finish(rec)
                if not rec["ok"]:
                    return  # a failed turn ends the conversation: its later turns are never sent
                history += [orjson.loads(spec.body)["messages"][-1], {"role": "assistant", "content": rec["reply"]}]
                shared = history_tokens(rec)
        finally:
            self.slots.release()

    async def run(self) -> None:
        assert self.schedule.sessions is not None
        async with anyio.create_task_group() as tg:
            for turns in self.schedule.sessions:
                await self.slots.acquire()  # conversations open in order, at most C at once
                tg.start_soon(self.conversation, turns)


async def run_sessions(
    schedule: Schedule,
    phase: str,
    *,
    transport: httpx2.AsyncBaseTransport | Streamer | None = None,
    api_key: str | None = None,
    on_record: Callable[[RawRecord], None] | None = None,
    on_send: Callable[[RequestSpec], None] | None = None,
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    start_ns: int | None = None,
    run_id: str | None = None,
) -> list[RawRecord]:
    """Send a schedule's conversations (schedule.sessions), at most schedule.concurrency at once; records sorted by i.

    transport, api_key, on_record, on_send as for run_requests; a cancelled load records its turns in flight
    with error_class 'client' before unwinding, and sends no later turn.
    """
    if schedule.sessions is None:
        raise ValueError("run_sessions needs a schedule with sessions (dataset.sessions)")
    streamer, owned = open_streamer(transport, schedule.concurrency)
    runner = _Conversations(
        schedule, streamer, request_headers(phase, api_key, run_id), on_record, on_send, max_event_bytes
    )
    try:
        if start_ns is not None:
            await sleep_until(start_ns)
        await runner.run()
    finally:
        if owned:
            with anyio.CancelScope(shield=True):
                await streamer.aclose()
    return sorted(runner.records, key=lambda r: r["i"])
