"""`FastStreamer`: the load client's HTTP seam on an asyncio Protocol with httptools (llhttp, the C parser
uvicorn uses) for plain http:// URLs; anything else goes to an `HttpxStreamer`.

Every request gets its own TCP connection (HTTP/1.1, `Connection: close`): llama-server closes after each
streamed response even when it announces keep-alive. The connections of the first wave (the requests due
at the start, at most C) are opened before the first send (`FastStreamer.preconnect`), and the runner
writes the first wave's requests on them in one pass (`FastStreamer.launch`), before their tasks start:
one connect per request (~47 µs of loop time each) had spread the 64 first sends of C=64 over ~5 ms; now
~0.8 ms (bench/bench_timestamps.py). A pre-opened connection the server closed while it was idle (EOF
seen, or pending on the socket) is never written to: the request opens a fresh connection instead; one
whose first write failed (nothing was sent) likewise. A request already written is never sent again.

Each connection's socket is read by stamped.StampedTransport, so a read's time point is the kernel's receive
time of its bytes, not the moment the loop got to them. httptools parses the status line, the headers and the
body framing (chunked, Content-Length, or until close); body bytes reach `aiter_raw` as one piece per socket
read, and SSE splitting stays above the seam (sse.SSEParser). Failures are mapped like HttpxStreamer's:
ConnectFailed before the response headers, StreamBroken after, with httpx's error names in the message; timeouts stay
with the caller (`anyio.fail_after` around the whole request).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import httptools

from caseledger.load.stamped import StampedTransport, connect
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
        head = (
            f"POST {target} HTTP/1.1\r\nhost: {authority}\r\nconnection: close\r\n"
            "accept-encoding: identity\r\nuser-agent: caseledger-load\r\n"
        ).encode("ascii")
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


class _Exchange:
    """One request and its response on one connection: the stamped.Receiver its transport calls, the
    httptools callbacks and the StreamResponse the caller reads."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket | None = None) -> None:
        self._loop = loop
        self._parser = httptools.HttpResponseParser(self)
        self._transport: StampedTransport | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._body: list[bytes] = []
        self._rx: list[int] = []  # arrival (monotonic ns) of each piece of _body: its read's kernel stamp
        self._rx_ns = 0
        self._buffered = 0
        self._paused = False
        self._framed = False  # Content-Length or Transfer-Encoding seen: the body does not end at close
        self._received = 0
        self._length: int | None = None
        self._informational = False
        self._sock = sock  # given when pre-opened: peeked for a pending close before use
        # pre-opened: idle until a request is written; bytes or a close from the server before then make it
        # stale. A fresh connection is "sent" from the start (a server may answer before reading, as before).
        self.sent = sock is None
        self.stale = False  # closed or spoken to by the server while idle, before any request
        self.status = 0
        self.headers_done = False
        self.complete = False
        self.error: str | None = None  # why the connection failed before the message was complete

    # ---- stamped.Receiver -------------------------------------------------------------------------

    def connection_made(self, transport: StampedTransport) -> None:
        self._transport = transport

    def stamped_data(self, data: bytes, rx_ns: int) -> None:
        self._rx_ns = rx_ns  # the time point: the bytes' arrival at this host (stamped.py), before any parsing
        if not self.sent:  # an idle pre-opened connection: no response is due (a 408 before closing, say)
            self.stale = True
            return
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
        if not self.sent:
            self.stale = True
        if not self.complete and self.error is None:
            if not self.headers_done:
                self.error = f"ReadError: {exc}" if exc else NO_RESPONSE
            elif exc is not None:
                self.error = f"ReadError: {exc}"
            elif not self._framed:
                self.complete = True  # neither length nor chunked: the body is delimited by the close
            elif self._length is not None:
                self.error = (
                    f"RemoteProtocolError: peer closed connection without sending complete message "
                    f"body (received {self._received} bytes, expected {self._length})"
                )
            else:
                self.error = (
                    "RemoteProtocolError: peer closed connection without sending complete message "
                    "body (incomplete chunked read)"
                )
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

    def send(self, data: bytes) -> bool:
        """Write the request; False when the first write failed at once (nothing was sent: the socket had
        been reset), so the request may go on a fresh connection."""
        t = self._transport
        assert t is not None
        self.sent = True
        t.write(data)
        # a send(2) error inside write() closes the transport at once; a partial write is buffered and
        # fails (if at all) later, in the loop, after bytes were sent: that request is not sent again
        return not t.is_closing()

    def usable(self) -> bool:
        """Whether an idle pre-opened connection can carry a request: open, and the server has neither
        closed it nor sent anything (a close can be pending on the socket before the loop has seen it)."""
        t, sock = self._transport, self._sock
        if self.stale or self.error is not None or t is None or t.is_closing() or sock is None:
            return False
        try:
            sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return True  # nothing pending: open and quiet
        except OSError:
            return False  # reset
        return False  # b"": the server closed it; bytes: it spoke first (a 408, say)

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
        """Body bytes with their arrival time: pieces of one read together, each read apart."""
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


class _Pool:
    """Idle pre-opened connections per target, each for one request (`Connection: close` still)."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[_Exchange]] = {}

    async def fill(self, target: _Target, n: int) -> None:
        """Open connections until `n` are idle for `target` (concurrently; failures are left to the requests,
        which connect themselves and report the error as usual)."""
        idle = self._idle.setdefault((target.host, target.port), [])
        need = n - len(idle)
        if need <= 0:
            return
        loop = asyncio.get_running_loop()
        try:
            family, _, proto, _, addr = (await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM))[0]
        except OSError:
            return
        await asyncio.gather(*(self._open(loop, family, proto, addr, idle) for _ in range(need)))

    @staticmethod
    async def _open(loop: asyncio.AbstractEventLoop, family: int, proto: int, addr: Any, idle: list[_Exchange]) -> None:
        sock = socket.socket(family, socket.SOCK_STREAM, proto)
        sock.setblocking(False)
        ex = _Exchange(loop, sock)
        try:
            await loop.sock_connect(sock, addr)
            StampedTransport(loop, sock, ex)
        except OSError:
            sock.close()  # refused, say: the request connects itself and records the error
            return
        except BaseException:
            sock.close()
            raise
        idle.append(ex)  # at once: a cancelled fill leaves nothing open that aclose would not close

    def take(self, target: _Target) -> _Exchange | None:
        """An idle connection that can still carry a request, or None; stale ones are closed on the way."""
        idle = self._idle.get((target.host, target.port))
        while idle:
            ex = idle.pop()
            if ex.usable():
                return ex
            ex.close()
        return None

    def close(self) -> None:
        for idle in self._idle.values():
            for ex in idle:
                ex.close()
            idle.clear()


def _send_pooled(pool: _Pool, target: _Target, request: bytes) -> _Exchange | None:
    """Write `request` on a pre-opened connection: the exchange, or None when none can take it (nothing was
    sent: the caller connects)."""
    ex = pool.take(target)
    if ex is not None and not ex.send(request):
        ex.close()  # reset before our first byte: nothing was sent, so a fresh connection carries it
        return None
    return ex


class _Post:
    """`async with streamer.post(...) as resp`: take a pre-opened connection or connect, send, wait for the
    response headers."""

    __slots__ = ("_body", "_exchange", "_headers", "_pool", "_target")

    def __init__(
        self, target: _Target, body: bytes, headers: Mapping[str, str], pool: _Pool, sent: _Exchange | None = None
    ) -> None:
        self._target, self._body, self._headers, self._pool = target, body, headers, pool
        self._exchange = sent  # given: the request is already written on it (FastStreamer.launch)

    async def __aenter__(self) -> StreamResponse:
        ex = self._exchange
        if ex is None:
            request = _request(self._target, self._body, self._headers)
            ex = self._exchange = _send_pooled(self._pool, self._target, request)
            if ex is None:
                ex = self._exchange = _Exchange(asyncio.get_running_loop())
                await self._connect(ex)
                ex.send(request)
        try:
            while not ex.headers_done:
                if ex.error is not None:
                    raise ConnectFailed(ex.error)
                await ex.wait()
        except BaseException:
            ex.close()
            raise
        return ex

    async def _connect(self, ex: _Exchange) -> None:
        try:
            await connect(asyncio.get_running_loop(), self._target.host, self._target.port, ex)
        except OSError as e:  # refused, unreachable, name not resolved
            ex.close()
            raise ConnectFailed(f"ConnectError: {e}") from e

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
        self._pool = _Pool()

    def _target(self, url: str) -> _Target | None:
        try:
            return self._targets[url]
        except KeyError:
            target = self._targets[url] = fast_target(url)
            return target

    async def preconnect(self, urls: Iterable[str]) -> None:
        """Open one connection per URL given (the first wave's), so those requests only write; URLs that
        go through httpx are skipped. Called right before the first send: the connections are used within
        milliseconds, so a server's idle timeout cannot close them first (and stale ones are replaced)."""
        want: dict[_Target, int] = {}
        for url in urls:
            target = self._target(url)
            if target is not None:
                want[target] = want.get(target, 0) + 1
        await asyncio.gather(*(self._pool.fill(t, n) for t, n in want.items()))

    def launch(
        self, url: str, body: bytes, headers: Mapping[str, str]
    ) -> AbstractAsyncContextManager[StreamResponse] | None:
        """Write the request now, on a pre-opened connection, without yielding to the loop: what `post`
        returns, already sent (entering it only waits for the response headers). None when no pre-opened
        connection can take it: nothing was sent, `post` connects. The runner launches the first wave this
        way in one pass, so its requests leave back to back instead of one task switch apart."""
        target = self._target(url)
        if target is None:
            return None
        try:
            request = _request(target, body, headers)
        except ConnectFailed:
            return None  # post raises it again, inside the request, where it becomes the request's record
        ex = _send_pooled(self._pool, target, request)
        return None if ex is None else _Post(target, body, headers, self._pool, ex)

    def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> AbstractAsyncContextManager[StreamResponse]:
        target = self._target(url)
        if target is not None:
            return _Post(target, body, headers, self._pool)
        if self._fallback is None:
            self._fallback = HttpxStreamer(self._concurrency)
        return self._fallback.post(url, body, headers)

    async def aclose(self) -> None:
        self._pool.close()
        if self._fallback is not None:
            await self._fallback.aclose()
