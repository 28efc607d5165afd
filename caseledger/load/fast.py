"""`FastStreamer`: the load client's HTTP seam on an asyncio Protocol with httptools (llhttp, the C parser
uvicorn uses) for plain http:// URLs; anything else goes to an `HttpxStreamer`.

Every request gets its own TCP connection (HTTP/1.1, `Connection: close`): llama-server closes after each
streamed response even when it announces keep-alive. httptools parses the status line, the headers and
the body framing (chunked, Content-Length, or until close); body bytes reach `aiter_raw` as one piece per
socket read, and SSE splitting stays above the seam (client.SSEParser). Failures are mapped like
HttpxStreamer's: ConnectFailed before the response headers, StreamBroken after, with httpx's error names
in the message; timeouts stay with the caller (`anyio.fail_after` around the whole request).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import NamedTuple
from urllib.parse import urlsplit

import httptools

from caseledger.load.transport import ConnectFailed, HttpxStreamer, StreamBroken, StreamResponse

READ_HIGH_WATER = 1 << 20  # unread body bytes at which the socket stops being read (an error body, say)
NO_RESPONSE = "RemoteProtocolError: Server disconnected without sending a response."
_FRAMING_HEADERS = (b"content-length", b"transfer-encoding")
_BAD_HEADER_CHARS = ("\r", "\n", "\0")


class _Target(NamedTuple):
    host: str
    port: int
    head: bytes  # request line and the fixed headers, ready to prepend


def fast_target(url: str) -> _Target | None:
    """Where FastStreamer sends `url`, or None when it is not a plain http:// URL it handles (https,
    userinfo, a non-ASCII path): those go through httpx."""
    u = urlsplit(url)
    if u.scheme.lower() != "http" or not u.hostname or u.username is not None or u.password is not None:
        return None
    try:
        port = u.port or 80
        target = (u.path or "/") + (f"?{u.query}" if u.query else "")
        host = f"[{u.hostname}]" if ":" in u.hostname else u.hostname
        authority = host if port == 80 else f"{host}:{port}"
        head = (f"POST {target} HTTP/1.1\r\nhost: {authority}\r\nconnection: close\r\n"
                "accept-encoding: identity\r\nuser-agent: caseledger-load\r\n").encode("ascii")
    except (ValueError, UnicodeEncodeError):
        return None
    return _Target(u.hostname, port, head)


def _request(target: _Target, body: bytes, headers: Mapping[str, str]) -> bytes:
    lines = [target.head]
    for name, value in headers.items():
        if any(c in name or c in value for c in _BAD_HEADER_CHARS) or ":" in name:
            # h11 refuses these too (httpx: LocalProtocolError, a transport error before any response)
            raise ConnectFailed(f"LocalProtocolError: illegal header {name!r}")
        lines.append(f"{name}: {value}\r\n".encode("ascii"))
    lines.append(b"content-length: %d\r\n\r\n" % len(body))
    lines.append(body)
    return b"".join(lines)


class _Exchange(asyncio.Protocol):
    """One request and its response on one connection: the asyncio Protocol, the httptools callbacks and
    the StreamResponse the caller reads."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._body: list[bytes] = []
        self._rx: list[int] = []  # arrival (monotonic ns) of each piece of _body: its data_received call
        self._rx_ns = 0
        self._buffered = 0
        self._paused = False
        self._framed = False  # Content-Length or Transfer-Encoding seen: the body does not end at close
        self._received = 0
        self._length: int | None = None
        self._informational = False
        self.status = 0
        self.headers_done = False
        self.complete = False
        self.error: str | None = None  # why the connection failed before the message was complete

    # ---- asyncio.Protocol -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._rx_ns = time.monotonic_ns()  # the time point: the bytes' arrival, before any parsing
        if self.complete or self.error is not None:
            return  # bytes after the message (the connection is closing anyway)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail("RemoteProtocolError: unexpected protocol upgrade")
        except httptools.HttpParserError as e:
            self._fail(f"RemoteProtocolError: {e}")
        if self._buffered > READ_HIGH_WATER and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool | None:
        return None  # let the transport close; connection_lost decides what the end means

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.complete and self.error is None:
            if not self.headers_done:
                self.error = f"ReadError: {exc}" if exc else NO_RESPONSE
            elif exc is not None:
                self.error = f"ReadError: {exc}"
            elif not self._framed:
                self.complete = True  # neither length nor chunked: the body is delimited by the close
            elif self._length is not None:
                self.error = (f"RemoteProtocolError: peer closed connection without sending complete message "
                              f"body (received {self._received} bytes, expected {self._length})")
            else:
                self.error = ("RemoteProtocolError: peer closed connection without sending complete message "
                              "body (incomplete chunked read)")
        self._wake()

    # ---- httptools callbacks ----------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name in _FRAMING_HEADERS:
            self._framed = True
            if name == b"content-length" and value.strip().isdigit():
                self._length = int(value)

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status < 200:  # 1xx: an interim response, the real one follows on the same connection
            self._informational = True
            self._framed, self._length = False, None
            return
        self.status = status
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        self._rx.append(self._rx_ns)
        self._buffered += len(body)
        self._received += len(body)

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
            return
        self.complete = True

    # ---- plumbing ---------------------------------------------------------------------------------

    def _fail(self, msg: str) -> None:
        self.error = msg
        if self._transport is not None:
            self._transport.abort()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)

    async def wait(self) -> None:
        self._waiter = w = self._loop.create_future()
        await w

    def send(self, data: bytes) -> None:
        assert self._transport is not None
        self._transport.write(data)

    def close(self) -> None:
        """Close the connection: gracefully after a whole response, at once otherwise."""
        t = self._transport
        if t is not None and not t.is_closing():
            if self.complete:
                t.close()
            else:
                t.abort()

    # ---- StreamResponse ---------------------------------------------------------------------------

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        """Body bytes (de-chunked) as they arrive, one piece per socket read (aiter_timed without the times)."""
        async for _, data in self.aiter_timed():
            yield data

    async def aiter_timed(self) -> AsyncIterator[tuple[int, bytes]]:
        """Body bytes with their arrival time: pieces of one data_received call together, each call apart."""
        body, rx = self._body, self._rx
        while True:
            if body:
                n, t = 1, rx[0]
                while n < len(body) and rx[n] == t:
                    n += 1
                data = body[0] if n == 1 else b"".join(body[:n])
                del body[:n], rx[:n]
                self._buffered -= len(data)
                if self._paused and self._transport is not None and self._buffered <= READ_HIGH_WATER // 2:
                    self._paused = False
                    self._transport.resume_reading()
                yield t, data
            elif self.complete:
                return
            elif self.error is not None:
                raise StreamBroken(self.error)
            else:
                await self.wait()

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_raw()])


class _Post:
    """`async with streamer.post(...) as resp`: connect, send, wait for the response headers."""

    __slots__ = ("_body", "_exchange", "_headers", "_target")

    def __init__(self, target: _Target, body: bytes, headers: Mapping[str, str]) -> None:
        self._target, self._body, self._headers = target, body, headers
        self._exchange: _Exchange | None = None

    async def __aenter__(self) -> StreamResponse:
        request = _request(self._target, self._body, self._headers)
        loop = asyncio.get_running_loop()
        ex = self._exchange = _Exchange(loop)
        try:
            try:
                await loop.create_connection(lambda: ex, self._target.host, self._target.port)
            except OSError as e:  # refused, unreachable, name not resolved
                raise ConnectFailed(f"ConnectError: {e}") from e
            ex.send(request)
            while not ex.headers_done:
                if ex.error is not None:
                    raise ConnectFailed(ex.error)
                await ex.wait()
        except BaseException:
            ex.close()
            raise
        return ex

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._exchange is not None:
            self._exchange.close()


class FastStreamer:
    """The Streamer seam on asyncio + httptools for http:// URLs; other URLs use an HttpxStreamer.

    Needs the asyncio event loop (anyio's default backend); run_requests falls back to httpx elsewhere.
    """

    def __init__(self, concurrency: int) -> None:
        self._concurrency = concurrency
        self._targets: dict[str, _Target | None] = {}
        self._fallback: HttpxStreamer | None = None

    def post(
        self, url: str, body: bytes, headers: Mapping[str, str]
    ) -> AbstractAsyncContextManager[StreamResponse]:
        try:
            target = self._targets[url]
        except KeyError:
            target = self._targets[url] = fast_target(url)
        if target is not None:
            return _Post(target, body, headers)
        if self._fallback is None:
            self._fallback = HttpxStreamer(self._concurrency)
        return self._fallback.post(url, body, headers)

    async def aclose(self) -> None:
        if self._fallback is not None:
            await self._fallback.aclose()
