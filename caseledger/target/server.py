"""HTTP surface of the reference target: OpenAI-compatible routes over a `ReferenceEngine`, and the CLI
(request bodies are validated in caseledger.target.requests).

Routes: GET /health, /v1/models, /metrics (Prometheus, vLLM names), /stats (requests counted by the
`x-caseledger-phase` header), /props (llama.cpp-like identity); POST /v1/chat/completions,
/v1/completions (stream or not), /reset_prefix_cache (vLLM) and /flush_cache (SGLang, also GET).

Streaming writes pre-encoded SSE bytes (no pydantic per chunk): a role-only first chunk for chat, one
chunk per engine emission (a decode step; several tokens with speculative decoding), a finish chunk
with an empty delta, a usage chunk (`choices: []`) for chat when `stream_options.include_usage`
(completions carry usage in the finish chunk), then `data: [DONE]`. `continuous_usage_stats` adds the
cumulative usage to every chunk, as vLLM does. Emissions buffered since the last write go out in one
write, still as separate SSE events. With speculative decoding (`spec_tokens > 0`) the last chunk carries
llama.cpp's `timings` {predicted_n, draft_n, draft_n_accepted} for the request, and with the request field
`timings_per_token` every content chunk carries them cumulatively (one content chunk per decode step).

`requests_total` and `by_phase` count requests to the two completion routes, whatever their outcome, and `by_run`
their runs (the x-caseledger-run header: requests, first and last arrival in wall time: the target's own count of
its owners)
(4xx, injected 500, stall); health, metrics and the other routes are not counted. Faults are dealt on
arrival in that same order: the K-th completion request is the K-th one counted. SIGUSR1 doubles every prefill
and decode step time from then on (a target that drifts, on demand; /stats shows the factor as `slowdown`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from caseledger.case.service import ReferenceConfig
from caseledger.engines import profile as engine_profile
from caseledger.errors import CaseledgerError
from caseledger.records import PHASE_HEADER, RUN_HEADER  # the headers the load client sends
from caseledger.target.options import add_serve_arguments
from caseledger.target.parts import Sequence, Ticket
from caseledger.target.reference import ReferenceEngine
from caseledger.target.requests import BadRequest, Parsed, parse_request

log = logging.getLogger("caseledger.target")


CRASH_EXIT_CODE = 3
_THREAD_TOKENIZE_CHARS = 32_000  # longer prompts are tokenized off the event loop
_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
_DONE = b"data: [DONE]\n\n"
_USAGE = b'{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}'


def _json(obj: Any, status: int = 200, background: BackgroundTask | None = None) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json", background=background)


def _error_body(
    message: str,
    kind: str,
    code: int,
    param: str | None = None,
) -> dict[str, Any]:  # JSON: an HTTP error body
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class _Reply(Response):
    """ASGI response driven by one engine sequence: SSE stream or one JSON body, stall and disconnect aware.

    A watcher task reads `receive()` so a client disconnect aborts the sequence (freeing its slot) even
    while nothing is being written (queued, prefilling, stalled).
    """

    def __init__(self, target: ReferenceTarget, seq: Sequence, ticket: Ticket, p: Parsed, chat: bool) -> None:
        # Response.__init__ is skipped on purpose: this class writes its own start and body messages.
        self.target = target
        self.seq = seq
        self.ticket = ticket
        self.p = p
        self.chat = chat
        self.stall = ticket.fault == "stall"
        self.spec = target.engine.config.spec_tokens > 0  # report per-request draft counts (llama.cpp's timings)
        self.gone = asyncio.Event()
        created = int(time.time())
        if chat:
            self.rid = f"chatcmpl-{target.id_prefix}{ticket.ordinal:x}"
            obj = b"chat.completion.chunk"
        else:
            self.rid = f"cmpl-{target.id_prefix}{ticket.ordinal:x}"
            obj = b"text_completion"
        self.created = created
        self.head = b'data: {"id":"%s","object":"%s","created":%d,"model":%s,"choices":[' % (
            self.rid.encode(),
            obj,
            created,
            target.model_json,
        )

    def _usage(self, completion: int) -> bytes:
        s = self.seq
        return _USAGE % (s.prompt_tokens, s.prompt_tokens + completion, completion, s.cached_tokens)

    async def _watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.gone.set()
                self.target.engine.abort(self.seq)
                return

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.get_running_loop().create_task(self._watch(receive))
        try:
            if self.p.stream:
                await self._stream(send)
            else:
                await self._whole(scope, receive, send)
        finally:
            watcher.cancel()
            self.target.engine.abort(self.seq)  # no-op when finished
            self.target.finished(self.ticket)

    async def _stream(self, send: Send) -> None:
        seq, head, chat = self.seq, self.head, self.chat
        cont = self.p.continuous_usage
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        first = True
        while True:
            await seq.wait()
            if self.gone.is_set():
                return
            parts: list[bytes] = []
            items = seq.take()
            if first and items:
                first = False
                if chat:
                    parts.append(
                        head + b'{"index":0,"delta":{"role":"assistant","content":""},'
                        b'"logprobs":null,"finish_reason":null}]'
                        + (b',"usage":' + self._usage(0) if cont else b"")
                        + b"}\n\n"
                    )
            per_chunk = self.spec and self.p.timings_per_token
            for text, done, drafted, accepted in items:
                usage = b',"usage":' + self._usage(done) if cont else b""
                if per_chunk:
                    usage += self._timings(done, drafted, accepted)
                usage += b"}\n\n"
                if chat:
                    parts.append(
                        head
                        + b'{"index":0,"delta":{"content":'
                        + orjson.dumps(text)
                        + b'},"logprobs":null,"finish_reason":null}]'
                        + usage
                    )
                else:
                    parts.append(
                        head
                        + b'{"index":0,"text":'
                        + orjson.dumps(text)
                        + b',"logprobs":null,"finish_reason":null}]'
                        + usage
                    )
            if self.stall and parts:
                # fault: the first chunk goes out, then nothing until the client gives up
                await send({"type": "http.response.body", "body": parts[0], "more_body": True})
                await self.gone.wait()
                return
            reason = seq.finish_reason
            if reason is None and seq.aborted:  # ended by the engine: cut the stream, no [DONE]
                await send({"type": "http.response.body", "body": b"".join(parts), "more_body": False})
                return
            if reason is not None:
                parts.append(self._finish_chunk(reason))
                await send({"type": "http.response.body", "body": b"".join(parts), "more_body": False})
                return
            if parts:
                await send({"type": "http.response.body", "body": b"".join(parts), "more_body": True})

    def _timings(self, completion: int, drafted: int, accepted: int) -> bytes:
        return b',"timings":{"predicted_n":%d,"draft_n":%d,"draft_n_accepted":%d}' % (completion, drafted, accepted)

    def _finish_chunk(self, reason: str) -> bytes:
        """The finish chunk (and chat's usage chunk); the last of them carries the request's draft counts in
        `timings`, as llama.cpp does, when the engine decodes speculatively."""
        head, p, seq = self.head, self.p, self.seq
        final = self._usage(seq.completion_tokens)
        timings = self._timings(seq.completion_tokens, seq.drafted, seq.accepted) if self.spec else b""
        r = reason.encode()
        if self.chat:
            out = head + b'{"index":0,"delta":{},"logprobs":null,"finish_reason":"%s"}]' % r
            out += (b',"usage":' + final if p.continuous_usage else b"") + (b"" if p.include_usage else timings)
            out += b"}\n\n"
            if p.include_usage:
                out += head + b'],"usage":' + final + timings + b"}\n\n"
        else:
            out = head + b'{"index":0,"text":"","logprobs":null,"finish_reason":"%s"}]' % r
            out += (b',"usage":' + final if p.include_usage or p.continuous_usage else b"") + timings + b"}\n\n"
        return out + _DONE

    async def _whole(self, scope: Scope, receive: Receive, send: Send) -> None:
        seq = self.seq
        texts: list[str] = []
        while not seq.done:
            await seq.wait()
            texts.extend(e.text for e in seq.take())
        texts.extend(e.text for e in seq.take())
        if self.stall or self.gone.is_set():
            await self.gone.wait()
            return
        if seq.finish_reason is None:  # aborted by the engine
            r = _json(_error_body("the engine aborted the request", "InternalServerError", 500), 500)
            await r(scope, receive, send)
            return
        text = "".join(texts)
        usage = orjson.loads(self._usage(seq.completion_tokens))
        choice: dict[str, Any]  # JSON: a chunk's choice
        if self.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": seq.finish_reason,
            }
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": seq.finish_reason}
            obj = "text_completion"
        reply: dict[str, Any] = {  # JSON: the response body
            "id": self.rid,
            "object": obj,
            "created": self.created,
            "model": self.target.model,
            "choices": [choice],
            "usage": usage,
        }
        if self.spec:
            reply["timings"] = {
                "predicted_n": seq.completion_tokens,
                "draft_n": seq.drafted,
                "draft_n_accepted": seq.accepted,
            }
        body = orjson.dumps(reply)
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


class ReferenceTarget:
    """Route handlers over one engine."""

    def __init__(self, engine: ReferenceEngine) -> None:
        self.engine = engine
        # the engine whose version endpoint it answers: only when its config names one (by default none, as always)
        cfg = engine.config
        self.versions = dict(engine_profile(cfg.metrics_as).version) if "metrics_as" in cfg.model_fields_set else {}
        self.model = engine.model
        self.model_json = orjson.dumps(engine.model)
        self.id_prefix = f"{engine.pid:x}-"

    def finished(self, ticket: Ticket) -> None:
        """Called once a completion request's response is over; carries out `crash_after`."""
        if self.engine.crash_due(ticket):
            log.error("fault crash_after=%d reached: exiting with code %d", ticket.ordinal, CRASH_EXIT_CODE)
            for h in logging.getLogger().handlers:
                h.flush()
            # a moment for the transport to hand the last response to the kernel, then die abruptly
            asyncio.get_running_loop().call_later(0.02, os._exit, CRASH_EXIT_CODE)

    def _after(self, ticket: Ticket) -> BackgroundTask:
        return BackgroundTask(self.finished, ticket)

    async def chat(self, request: Request) -> Response:
        return await self._completion(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._completion(request, chat=False)

    async def _completion(self, request: Request, chat: bool) -> Response:
        raw = await request.body()
        engine = self.engine
        ticket = engine.count_request(request.headers.get(PHASE_HEADER), request.headers.get(RUN_HEADER))
        try:
            p = parse_request(raw, chat)
        except BadRequest as e:
            return _json(_error_body(e.message, "BadRequestError", 400, e.param), 400, self._after(ticket))
        if p.model is not None and p.model != self.model:
            return _json(
                _error_body(
                    f"The model `{p.model}` does not exist; served: {self.model}", "NotFoundError", 404, "model"
                ),
                404,
                self._after(ticket),
            )
        if ticket.fault == "error":
            return _json(
                _error_body(f"injected fault (error_rate={engine.config.error_rate})", "InternalServerError", 500),
                500,
                self._after(ticket),
            )
        if isinstance(p.prompt, str):
            if len(p.prompt) > _THREAD_TOKENIZE_CHARS:
                ids = await asyncio.to_thread(engine.encode, p.prompt)
            else:
                ids = engine.encode(p.prompt)
        else:
            ids = p.prompt
        if not ids:
            return _json(
                _error_body("the prompt has no tokens", "BadRequestError", 400, "prompt"), 400, self._after(ticket)
            )
        limit = engine.config.max_model_len
        if limit is not None and len(ids) + p.max_tokens > limit:  # vLLM's wording and status
            return _json(
                _error_body(
                    f"This model's maximum context length is {limit} tokens. However, you requested "
                    f"{len(ids) + p.max_tokens} tokens ({len(ids)} in the messages, {p.max_tokens} in the completion).",
                    "BadRequestError",
                    400,
                    "max_tokens",
                ),
                400,
                self._after(ticket),
            )
        max_tokens = 1 if ticket.fault == "stall" else p.max_tokens  # a stalled request holds no slot
        seq = engine.submit(ids, max_tokens, ignore_eos=p.ignore_eos, cache_prompt=p.cache_prompt)
        return _Reply(self, seq, ticket, p, chat)

    async def health(self, request: Request) -> Response:
        return _json({"status": "ok"})

    async def models(self, request: Request) -> Response:
        card = {"id": self.model, "object": "model", "owned_by": "caseledger"}
        return _json({"object": "list", "data": [card]})

    async def metrics(self, request: Request) -> Response:
        return Response(self.engine.metrics_text(), media_type="text/plain; version=0.0.4")

    async def stats(self, request: Request) -> Response:
        return _json(self.engine.stats())

    async def props(self, request: Request) -> Response:
        e = self.engine
        return _json(
            {
                "model": self.model,
                "argv": sys.argv,
                "orig_argv": sys.orig_argv,
                "pid": e.pid,
                "config_sha256": e.config_sha256,
                "tokenizer": e.tokenizer_name,
                **self._version_at("/props"),
            }
        )

    async def version(self, request: Request) -> Response:
        """The version endpoint of the engine it serves as (config.metrics_as)."""
        return _json(self._version_at(request.url.path))

    def _version_at(self, path: str) -> dict[str, str]:
        """The version field of `path` when the target answers an engine's version endpoint there."""
        served = self.engine.config.metrics_as
        return {self.versions[path]: f"caseledger-reference (as {served})"} if path in self.versions else {}

    async def reset_cache(self, request: Request) -> Response:
        n = self.engine.reset_prefix_cache()
        log.info("prefix cache cleared (%d blocks) via %s", n, request.url.path)
        return _json({"status": "ok", "cleared_blocks": n})


def build_app(model: str, config: ReferenceConfig | None = None, *, tokenizer: str = "builtin") -> Starlette:
    """The reference target as an ASGI app; the engine is at `app.state.engine`.

    The scheduler starts with the first request, so the app also works in process (e.g. under
    `httpx.ASGITransport`); note that `crash_after` then ends the calling process.
    """
    cfg = config or ReferenceConfig.model_validate({})
    engine = ReferenceEngine(cfg, model, tokenizer)
    t = ReferenceTarget(engine)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await engine.aclose()

    app = Starlette(
        routes=[
            Route("/health", t.health, methods=["GET"]),
            Route("/v1/models", t.models, methods=["GET"]),
            Route("/v1/chat/completions", t.chat, methods=["POST"]),
            Route("/v1/completions", t.completions, methods=["POST"]),
            Route("/metrics", t.metrics, methods=["GET"]),
            Route("/stats", t.stats, methods=["GET"]),
            Route("/props", t.props, methods=["GET"]),
            Route("/reset_prefix_cache", t.reset_cache, methods=["POST"]),
            Route("/flush_cache", t.reset_cache, methods=["GET", "POST"]),
            *(
                Route(path, t.version, methods=["GET"])
                for path in t.versions
                if path != "/props"  # llama.cpp's is answered by /props above
            ),
        ],
        lifespan=lifespan,
    )
    app.state.engine = engine
    return app


def main(argv: list[str] | None = None) -> int:
    """`python -m caseledger.target serve ...`: run the reference target until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(
        prog="python -m caseledger.target", description="The embedded reference target (OpenAI-compatible)."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_arguments(sub.add_parser("serve", help="serve the reference target over HTTP"))
    return serve(parser.parse_args(argv))


def serve(args: argparse.Namespace) -> int:
    """Serve with parsed serve options (caseledger.target.options) until SIGINT/SIGTERM."""
    logging.basicConfig(
        stream=sys.stderr, level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = ReferenceConfig.model_validate_json(args.config_json)
    except ValidationError as e:
        log.error(
            "--config-json is not a valid ReferenceConfig (fields: %s): %s", ", ".join(ReferenceConfig.model_fields), e
        )
        return 2
    try:
        app = build_app(args.model, config, tokenizer=args.tokenizer)
    except (CaseledgerError, OSError, ValueError) as e:
        log.error("cannot load tokenizer '%s': %s", args.tokenizer, e)
        return 2

    import uvicorn  # lazy: only serving needs it; importing the package stays light

    uv_config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_config=None,
        log_level=args.log_level,
        access_log=False,
        loop="asyncio",
        http="h11",
        ws="none",
        lifespan="on",
        timeout_graceful_shutdown=3,
    )
    try:
        sock = uv_config.bind_socket()
    except SystemExit:  # uvicorn exits on bind errors after logging them
        return 2
    host, port = sock.getsockname()[:2]
    engine: ReferenceEngine = app.state.engine
    log.info(
        "reference target pid=%d model=%s on http://%s:%d config_sha256=%s",
        engine.pid,
        args.model,
        host,
        port,
        engine.config_sha256,
    )

    def slower(signum: int, frame: object) -> None:  # a drifting target on demand: the drift tests' lever
        engine.slowdown *= 2
        log.warning("SIGUSR1: every step now takes %gx as long", engine.slowdown)

    signal.signal(signal.SIGUSR1, slower)
    server = uvicorn.Server(uv_config)
    server.run(sockets=[sock])
    return 0 if server.started else 1
