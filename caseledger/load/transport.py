"""The transport seam of the load client: POST a body, get the status and the raw response bytes as they
arrive. Two implement it: `FastStreamer` (caseledger.load.fast: asyncio + httptools, http:// only, the
default) and `HttpxStreamer` (httpx2, here: https, and everything when CASELEDGER_LOAD_TRANSPORT=httpx).
Both raise the same errors: ConnectFailed before the response headers, StreamBroken after.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    import httpx2

TRANSPORT_ENV = "CASELEDGER_LOAD_TRANSPORT"  # 'fast' (default) or 'httpx': the transport for http:// URLs
TRANSPORTS = ("fast", "httpx")


class ConnectFailed(Exception):
    """No response: the connection could not be made or was closed before a status line."""


class StreamBroken(Exception):
    """The connection failed after the response started."""


class StreamResponse(Protocol):
    @property
    def status(self) -> int: ...

    def aiter_raw(self) -> AsyncIterator[bytes]:
        """Response body bytes (de-chunked) as they arrive."""
        ...

    def aiter_timed(self) -> AsyncIterator[tuple[int, bytes]]:
        """(monotonic ns when the bytes arrived, the bytes): the time point is taken where the transport
        first sees them (the fast transport: in data_received, before parsing), not when the reader runs."""
        ...

    async def aread(self) -> bytes: ...


class Streamer(Protocol):
    """The one HTTP seam. Errors: ConnectFailed before a response, StreamBroken after."""

    def post(
        self, url: str, body: bytes, headers: Mapping[str, str]
    ) -> AbstractAsyncContextManager[StreamResponse]: ...

    async def aclose(self) -> None: ...


class _HttpxResponse:
    __slots__ = ("_r",)

    def __init__(self, r: httpx2.Response) -> None:
        self._r = r

    @property
    def status(self) -> int:
        return self._r.status_code

    def aiter_raw(self) -> AsyncIterator[bytes]:
        return self._r.aiter_raw()  # the generator itself: no wrapper on the per-chunk path

    async def aiter_timed(self) -> AsyncIterator[tuple[int, bytes]]:
        async for raw in self._r.aiter_raw():  # httpx hands bytes over after its own parsing: time them here
            yield time.monotonic_ns(), raw

    async def aread(self) -> bytes:
        return await self._r.aread()


class HttpxStreamer:
    """Default seam: one httpx2.AsyncClient, HTTP/1.1, pool sized to the concurrency.

    trust_env=False: a proxy from the environment must never sit between the client and a loopback
    target (it would be measured as the server). Timeouts are owned by run_requests (whole request).
    """

    def __init__(self, concurrency: int, transport: httpx2.AsyncBaseTransport | None = None) -> None:
        # lazy: httpx2 (~0.1 CPU-s) only where this seam is used: https, CASELEDGER_LOAD_TRANSPORT=httpx, tests
        import httpx2

        self._transport_error = httpx2.TransportError
        # no keep-alive: llama-server closes the connection after each streamed response while advertising
        # Keep-Alive, so a reused connection fails at once ('Server disconnected without sending a response')
        limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=0)
        self._client = httpx2.AsyncClient(
            transport=transport,
            limits=limits,
            timeout=None,
            http2=False,
            trust_env=False,
            follow_redirects=False,
        )

    @asynccontextmanager
    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> AsyncIterator[StreamResponse]:
        started = False
        try:
            async with self._client.stream("POST", url, content=body, headers=headers) as r:
                started = True
                yield _HttpxResponse(r)
        except self._transport_error as e:  # includes httpx timeouts; ours is the outer fail_after
            msg = f"{type(e).__name__}: {e}".rstrip(": ")
            raise (StreamBroken(msg) if started else ConnectFailed(msg)) from e

    async def aclose(self) -> None:
        await self._client.aclose()


def transport_choice() -> Literal["fast", "httpx"]:
    """The transport run_requests(transport=None) uses for http:// URLs, from CASELEDGER_LOAD_TRANSPORT."""
    value = os.environ.get(TRANSPORT_ENV) or "fast"
    if value == "fast":
        return "fast"
    if value == "httpx":
        return "httpx"
    raise ValueError(f"{TRANSPORT_ENV}={value!r} is not a transport; known: {', '.join(TRANSPORTS)}")
