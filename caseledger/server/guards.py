"""The server's guards at its edges: request bounds, the bearer token, Host/Origin checks for HTTP, and the
JSON-depth check of stdio lines (what the SDK's parser would drop without an answer)."""


# No `from __future__ import annotations`: the SDK reads the adapters' annotations at registration.

import hmac
import ipaddress
import logging
import os
import re
import socket
from collections.abc import AsyncIterator

import anyio
import anyio.from_thread
import anyio.to_thread
import orjson
from anyio.streams.memory import MemoryObjectSendStream
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.message import SessionMessage
from mcp.types import (
    INVALID_REQUEST,
    ErrorData,
    JSONRPCError,
)
from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from caseledger.errors import CaseledgerError, NotAuthorized
from caseledger.ledger import calls

log = logging.getLogger("caseledger.server")


MAX_HEADERS = 100  # header fields in one request (Apache's LimitRequestFields); an MCP client sends about 10


MAX_BODY_BYTES = 4 * 2**20  # the SDK's default body cap, kept behind the token too; a case draft is a few KB


class RequestBounds:
    """ASGI middleware in front of the bearer check: more than MAX_HEADERS header fields get 431, a declared
    Content-Length over MAX_BODY_BYTES gets 413 with the body unread; both close the connection.

    The head's size and the time to send it are bounded below this, in the HTTP protocol (server.listener). A
    body sent without a length is capped by the SDK at the same MAX_BODY_BYTES, behind the token: nothing reads
    an unauthenticated request's body.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refused = _out_of_bounds(scope)
            if refused is not None:
                await refused(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _out_of_bounds(scope: Scope) -> PlainTextResponse | None:
    close = {"Connection": "close"}
    if len(scope["headers"]) > MAX_HEADERS:
        return PlainTextResponse(
            f"{len(scope['headers'])} header fields; at most {MAX_HEADERS}\n", status_code=431, headers=close
        )
    declared = Headers(scope=scope).get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:  # h11 has refused a malformed length already (400)
        return PlainTextResponse(
            f"body of {declared} bytes; at most {MAX_BODY_BYTES}\n", status_code=413, headers=close
        )
    return None


READ_TOOLS = ("phase_status", "summarize")  # what a read-only token may call (resources and lists as well)


class BearerToken:
    """ASGI middleware: every HTTP request needs `Authorization: Bearer <token>`, else 401. A request with the
    read-only token (when one is given) passes only if it calls no tool outside READ_TOOLS (403 otherwise): its
    body is read here (RequestBounds has bounded it) and handed on unchanged.

    Plain shared-secret check (constant-time compare). The SDK's OAuth hooks would also publish
    protected-resource metadata pointing at an authorization server that does not exist here.
    """

    def __init__(self, app: ASGIApp, token: str, read_token: str | None = None) -> None:
        self.app = app
        self._expected = token.encode()
        self._reader = read_token.encode() if read_token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # RFC 7235: the scheme name is case-insensitive ("bearer", "BEARER"); the token is not
        scheme, _, got_s = Headers(scope=scope).get("authorization", "").strip().partition(" ")
        got = got_s.strip().encode()
        bearer = scheme.lower() == "bearer"
        if bearer and hmac.compare_digest(got, self._expected):
            await self.app(scope, receive, send)
            return
        if bearer and self._reader is not None and hmac.compare_digest(got, self._reader):
            await self._read_only(scope, receive, send)
            return
        challenge = {"WWW-Authenticate": 'Bearer realm="caseledger"'}
        response = PlainTextResponse("missing or wrong bearer token\n", status_code=401, headers=challenge)
        await response(scope, receive, send)

    async def _read_only(self, scope: Scope, receive: Receive, send: Send) -> None:
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > MAX_BODY_BYTES:
                await PlainTextResponse(f"body over {MAX_BODY_BYTES} bytes\n", status_code=413)(scope, receive, send)
                return
        body = b"".join(chunks)
        refused = _writing_tool(body)
        if refused is not None:
            name, rid = refused
            text = (
                f"the read-only token may call {', '.join(READ_TOOLS)} and read resources, not {name}; "
                "fix: call it with the full token (the server's --token-env)"
            )
            # a JSON-RPC error in the body at 403: the SDK's client shows its message, not a bare status
            err = {"jsonrpc": "2.0", "id": rid, "error": {"code": INVALID_REQUEST, "message": text}}
            refusal = Response(orjson.dumps(err), status_code=403, media_type="application/json")
            await refusal(scope, receive, send)
            return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _writing_tool(body: bytes) -> tuple[str, object] | None:
    """(name, request id) of the first tool a JSON-RPC body (one message or a batch) calls that is not a reading
    tool; a body that does not parse is let through (the SDK answers it with its parse error; no tool runs)."""
    try:
        got = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return None
    for m in got if isinstance(got, list) else [got]:
        if isinstance(m, dict) and m.get("method") == "tools/call":
            params = m.get("params")
            name = params.get("name") if isinstance(params, dict) else None
            if name not in READ_TOOLS:
                rid = m.get("id")
                return repr(name)[:80], rid if isinstance(rid, (str, int)) else None
    return None


def parse_host_port(value: str) -> tuple[str, int]:
    """'127.0.0.1:8765', 'localhost:8765', '[::1]:8765' -> (host, port)."""
    host, sep, port_s = value.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port_s.isdigit() or not 0 < int(port_s) < 65536:
        raise CaseledgerError(f"--http '{value}' is not HOST:PORT", "e.g. --http 127.0.0.1:8765")
    return host, int(port_s)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost may resolve anywhere
        return False


MIN_TOKEN_CHARS = 16


def read_token(token_env: str) -> str:
    token = os.environ.get(token_env, "")
    if len(token) < MIN_TOKEN_CHARS:
        raise NotAuthorized(
            f"env var {token_env} must hold the bearer token (at least {MIN_TOKEN_CHARS} "
            f"characters; it has {len(token)})",
            f"export {token_env}=$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')",
        )
    return token


_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def _bracketed(name: str) -> str:
    return f"[{name}]" if ":" in name else name


def _spellings(host: str) -> list[str]:
    """The bind host as given, and for an IP address its compressed and exploded forms ('[0:0:0:0:0:0:0:1]'
    binds '::1'); host names lower-cased (the check compares exactly)."""
    out = [host.lower()]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return out
    return [*out, str(ip), ip.exploded]


def _own_names() -> list[str]:
    """This machine's names and their addresses: what a client uses to reach a wildcard (0.0.0.0, ::) bind."""
    names = [socket.gethostname(), socket.getfqdn()]
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None)
    except OSError:  # a host name that does not resolve: its names only
        infos = []
    return [n.lower() for n in [*names, *(str(info[4][0]) for info in infos)] if n]


def transport_security(host: str, port: int) -> TransportSecuritySettings:
    """DNS-rebinding protection for every bind, built from the bind address itself (the SDK switches its own
    on only for exactly 127.0.0.1, localhost and ::1, leaving 127.0.0.2 or '[0:0:0:0:0:0:0:1]' open).

    Allowed Host values: every spelling of the bind address with the bound port (for a wildcard bind, this
    machine's names and addresses); for a loopback bind also localhost, 127.0.0.1 and [::1] on any port (an SSH
    forward, `ssh -L 9000:127.0.0.1:8765`, arrives with its own port, and a loopback literal can never be a
    rebinding attacker's name). Allowed Origins: http:// plus an allowed Host. Anything else -- `Host:
    evil.example` from a page whose name was rebound to this address -- is refused (421 Host, 403 Origin)
    before any tool runs."""
    try:
        wildcard = ipaddress.ip_address(host).is_unspecified  # 0.0.0.0, :: listen on loopback too
    except ValueError:
        wildcard = False
    exact = _spellings(host) + (_own_names() if wildcard else [])
    hosts = [f"{_bracketed(n)}:{port}" for n in exact]
    if is_loopback(host) or wildcard:
        hosts += [f"{_bracketed(n)}:*" for n in _LOOPBACK_NAMES]
    hosts = list(dict.fromkeys(hosts))
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=[f"http://{h}" for h in hosts]
    )


MAX_NESTING = 200  # JSON nesting the SDK's parser takes (pydantic stops near 255 and the SDK drops the line)


def request_id(line: str) -> int | str | None:
    """The top-level "id" of a JSON-RPC line that cannot be parsed whole (too deep), by a flat scan: the
    id comes back in the refusal, so the caller's request ends instead of waiting for ever."""
    depth, i, n, key = 0, 0, len(line), None
    while i < n:
        c = line[i]
        if c == '"':
            j = i + 1
            while j < n and line[j] != '"':
                j += 2 if line[j] == "\\" else 1
            text = line[i + 1 : j]
            i = j + 1
            if depth == 1:
                rest = line[i:].lstrip()
                if rest.startswith(":"):
                    key = text
                    if key == "id":
                        value = rest[1:].lstrip()
                        m = _ID_VALUE.match(value)
                        if m is None:
                            return None
                        return m.group(1) if m.group(1) is not None else int(m.group(2))
            continue
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
        i += 1
    return None


_ID_VALUE = re.compile(r'"([^"\\]{0,200})"|(-?\d{1,18})\b')


class CheckedLines:
    """stdin lines for the SDK; a line nested too deep for its parser is answered here with an error naming
    the fix (the SDK would drop it and the caller would wait for ever)."""

    def __init__(self, lines: anyio.AsyncFile[str], refused: MemoryObjectSendStream[SessionMessage]) -> None:
        self._lines = lines
        self._refused = refused

    def __aiter__(self) -> AsyncIterator[str]:
        return self._checked()

    async def _checked(self) -> AsyncIterator[str]:
        async for line in self._lines:
            if line.count("{") + line.count("[") > MAX_NESTING and _too_deep(line):
                rid = request_id(line)
                if rid is not None:
                    err = ErrorData(
                        code=INVALID_REQUEST,
                        message=(
                            f"request nested deeper than {MAX_NESTING} levels; fix: send the case as a file "
                            f"({calls.freeze_case('cases/x.json')}) or flatten the draft"
                        ),
                    )
                    await self._refused.send(SessionMessage(JSONRPCError(jsonrpc="2.0", id=rid, error=err)))
                    continue
            yield line


def _too_deep(line: str) -> bool:
    depth = top = 0
    in_str = esc = False
    for c in line:
        if in_str:
            esc = not esc and c == "\\"
            in_str = esc or c != '"'
        elif c == '"':
            in_str = True
        elif c in "{[":
            depth += 1
            top = max(top, depth)
            if top > MAX_NESTING:
                return True
        elif c in "}]":
            depth -= 1
    return False
