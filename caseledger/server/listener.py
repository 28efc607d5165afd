"""The HTTP listener under the streamable HTTP transport: uvicorn on its h11 protocol, with the bounds uvicorn
leaves out before the app (and so the bearer check) sees a request.

A request head is read whole before any ASGI code runs, so the token cannot bound it. uvicorn's httptools
protocol keeps every header byte (no size limit at all); its h11 protocol caps the unparsed head (h11's
`max_incomplete_event_size`) but answers 400, and neither times out a client that connects and then sends
a head slowly or never. `BoundedH11Protocol` answers 431 past `MAX_HEAD_BYTES` and 408 past `HEAD_TIMEOUT_S`,
then closes: an unauthenticated connection holds at most one read (asyncio's 256 KiB) plus the capped head,
for a bounded time. Header count and declared body size are checked one layer up (`app.RequestBounds`).
"""

from __future__ import annotations

import asyncio
import sys
from http import HTTPStatus

import h11
import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

MAX_HEAD_BYTES = 16 * 1024  # request line plus header fields (h11's and Node's default); an MCP client's is < 2 KiB
HEAD_TIMEOUT_S = 10.0  # a head arrives in one write from a real client; a slower one is holding a connection


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on every wait for a request head and 431 for an oversized head.

    The deadline runs while the server waits on the client with no app handling a request: from the
    connection's start, or a response's end, until a whole head has arrived, and while a body that nothing
    reads is drained after a response. When it passes, a begun head gets 408; otherwise the connection just
    closes. uvicorn's keep-alive timeout (5 s) still closes a connection idle after a response first.
    """

    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers every h11 RemoteProtocolError with 400 from inside its `except`; h11's hint tells
        # the head over the cap (431) from a malformed one
        exc = sys.exception()
        if isinstance(exc, h11.RemoteProtocolError) and exc.error_status_hint == 431:
            self._refuse(431, f"request head over {MAX_HEAD_BYTES} bytes\n")
        else:
            super().send_400_response(msg)

    def _watch(self) -> None:
        state = self.conn.their_state
        waiting = state is h11.IDLE or (
            state is h11.SEND_BODY and self.cycle is not None and self.cycle.response_complete
        )
        if waiting and self._deadline is None and not self.transport.is_closing():
            self._deadline = self.loop.call_later(HEAD_TIMEOUT_S, self._deadline_passed)
        elif not waiting:
            self._disarm()

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _deadline_passed(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
            self._refuse(408, f"request head not received within {HEAD_TIMEOUT_S:g} s\n")
        else:  # no request begun (a 408 would read as the answer to the client's next one), or a body drained
            self.transport.close()

    def _refuse(self, status: int, text: str) -> None:
        """Answer `status` with Connection: close and close, as uvicorn's own 400 does (written directly: h11
        may hold the client in an error state)."""
        body = text.encode()
        headers = [
            *self.server_state.default_headers,
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", b"%d" % len(body)),
            (b"connection", b"close"),
        ]
        head = b"HTTP/1.1 %d %s\r\n" % (status, HTTPStatus(status).phrase.encode())
        self.transport.write(head + b"".join(b"%s: %s\r\n" % h for h in headers) + b"\r\n" + body)
        self.transport.close()


def run(app: ASGIApp, host: str, port: int) -> None:
    """Serve `app` on host:port until interrupted: uvicorn with `BoundedH11Protocol` chosen explicitly (auto
    would pick httptools, which has no head limit) and no WebSocket protocol (MCP does not use one)."""
    # log_config=None: uvicorn's own config sends access logs to stdout; keep every log on stderr
    uvicorn.run(
        app,
        host=host,
        port=port,
        http=BoundedH11Protocol,
        ws="none",
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        log_config=None,
        log_level="info",
    )
