"""A misbehaving OpenAI-style target for the evidence tests: a real HTTP server on loopback (adapter 'external').

Every request outside the formal load (warmup, route_verify, ...) is answered honestly, so a run reaches its
load phase; the formal requests (x-caseledger-phase: load) get the server's `mode`:

    honest     one content chunk per token, max_tokens tokens, usage that matches
    lie        the same stream, but usage says completion_tokens 99999 and cached_tokens 5 x prompt_tokens
    cached     honest completion, cached_tokens > prompt_tokens
    http:N     HTTP N with a JSON error body (429, 503, 400, 500, ...)
    timeout    headers never come (the client's load.timeout_s ends it)
    reset      the connection is reset (TCP RST) before any byte
    badjson    a stream whose chunk is not JSON
    badutf8    a stream whose chunk is not UTF-8
    echo:KEY   HTTP 400 whose message echoes the bearer token it got

Requests are counted per phase (`counts`), as the target sees them.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson

PROMPT_TOKENS = 100  # what this target says it counted (the formal load only; see _honest)


def _chunk(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def stream(tokens: int, usage: dict[str, Any] | None) -> bytes:
    """A chat stream of `tokens` one-token content chunks, a finish chunk, a usage chunk (when given), [DONE]."""
    parts = [
        _chunk({"choices": [{"index": 0, "delta": {"content": f" t{k}"}, "finish_reason": None}]})
        for k in range(tokens)
    ]
    parts.append(_chunk({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}))
    if usage is not None:
        parts.append(_chunk({"choices": [], "usage": usage}))
    return b"".join(parts) + b"data: [DONE]\n\n"


class Target:
    """The server's state: its mode and what it counted."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.delay_s = 0.0  # each formal request waits this long before its answer (a slower or faster target)
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()

    def count(self, phase: str) -> None:
        with self.lock:
            self.counts[phase] += 1


def _make_handler(target: Target) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            body = b'{"data": [{"id": "ref-model"}]}' if "models" in self.path else b"ok"
            self._send(200, "application/json", body)

        def do_POST(self) -> None:
            body = orjson.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            phase = self.headers.get("x-caseledger-phase", "unlabelled")
            target.count(phase)
            n = int(body.get("max_tokens") or 16)
            mode = target.mode if phase == "load" else "honest"
            if phase == "load" and target.delay_s:
                time.sleep(target.delay_s)
            if mode == "honest":
                # outside the formal load no prompt count: route verification then compares nothing (a canned
                # target cannot tokenize the dataset's prompts)
                usage: dict[str, Any] = {"completion_tokens": n}
                if phase == "load":
                    usage.update(prompt_tokens=PROMPT_TOKENS, prompt_tokens_details={"cached_tokens": 0})
                self._send(200, "text/event-stream", stream(n, usage))
            elif mode == "lie":
                self._send(
                    200,
                    "text/event-stream",
                    stream(
                        n,
                        {
                            "prompt_tokens": PROMPT_TOKENS,
                            "completion_tokens": 99999,
                            "prompt_tokens_details": {"cached_tokens": 5 * PROMPT_TOKENS},
                        },
                    ),
                )
            elif mode == "cached":
                self._send(
                    200,
                    "text/event-stream",
                    stream(
                        n,
                        {
                            "prompt_tokens": PROMPT_TOKENS,
                            "completion_tokens": n,
                            "prompt_tokens_details": {"cached_tokens": PROMPT_TOKENS + 1},
                        },
                    ),
                )
            elif mode.startswith("http:"):
                status = int(mode.split(":")[1])
                self._send(
                    status,
                    "application/json",
                    orjson.dumps({"error": {"message": f"refused with {status}", "code": status}}),
                )
            elif mode.startswith("echo:"):
                got = self.headers.get("authorization", "")
                self._send(
                    400, "application/json", orjson.dumps({"error": {"message": f"bad request; got auth {got}"}})
                )
            elif mode == "timeout":
                time.sleep(30)
            elif mode == "reset":
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
                self.close_connection = True
            elif mode == "badjson":
                self._send(200, "text/event-stream", b"data: {not json\n\ndata: [DONE]\n\n")
            elif mode == "badutf8":
                self._send(
                    200,
                    "text/event-stream",
                    b'data: {"choices": [{"index": 0, "delta": {"content": "\xff\xfe"}}]}\n\ndata: [DONE]\n\n',
                )
            else:
                raise ValueError(f"unknown mode {mode}")

        def _send(self, status: int, ctype: str, body: bytes) -> None:
            try:
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:
                pass  # the client gave up (timeout): nothing to answer

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def misbehaving(mode: str) -> Iterator[tuple[int, Target]]:
    """Serve `mode` on a free loopback port; yields (port, target)."""
    target = Target(mode)
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(target))
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield int(srv.server_address[1]), target
    finally:
        srv.shutdown()
        srv.server_close()
