"""The MCP server as an agent sees it over its transports: stdio and streamable HTTP, their rules, tokens, DNS
rebinding and bounds on what an unauthenticated client can cost, a real run end to end with short answers. The
tools in memory: tests/test_mcp_tools.py."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager, contextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx2
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.server.transport_security import TransportSecurityMiddleware
from mcp.types import CallToolResult, TextResourceContents
from starlette.requests import Request

import caseledger.server.guards as guards
from caseledger.errors import CaseledgerError, NotAuthorized
from caseledger.server import build_server, listener, serve
from caseledger.server.inspect import inspect_main, parse_arguments
from caseledger.workspace import Workspace
from tests.conftest import free_port, mcp_over_http, stats, tree_digest
from tests.helpers import SHORT, SIX, baseline_draft, mcp_workspace, text_of

pytestmark = pytest.mark.anyio


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return mcp_workspace(tmp_path)


# ------------------------------------------------------------------------------------- transports: rules


def test_http_binding_rules() -> None:
    assert guards.parse_host_port("127.0.0.1:8765") == ("127.0.0.1", 8765)
    assert guards.parse_host_port("[::1]:8765") == ("::1", 8765)
    for bad in ("8765", "host:", "host:99999", ":80"):
        with pytest.raises(CaseledgerError, match="HOST:PORT"):
            guards.parse_host_port(bad)
    assert guards.is_loopback("127.0.0.1") and guards.is_loopback("::1") and guards.is_loopback("localhost")
    assert not guards.is_loopback("0.0.0.0") and not guards.is_loopback("example.org")


def test_inspect_arguments_parse_json_else_string() -> None:
    schema = {
        "properties": {
            "run_ids": {"type": "array", "items": {"type": "string"}},
            "parent": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "ratio": {"anyOf": [{"type": "number"}, {"type": "null"}]},
            "draft": {"anyOf": [{"type": "object"}, {"type": "null"}]},
        }
    }
    got = parse_arguments(["run_ids=r-a,r-b", "parent=1234", "ratio=0.9", 'draft={"a": 1}'], schema)
    assert got == {"run_ids": ["r-a", "r-b"], "parent": "1234", "ratio": 0.9, "draft": {"a": 1}}
    assert parse_arguments(['run_ids=["r-a"]'], schema) == {"run_ids": ["r-a"]}
    with pytest.raises(ValueError, match="unknown parameter 'nope'"):
        parse_arguments(["nope=1"], schema)


# ------------------------------------------------------------------------------------- transports: real processes


def server_params(ws: Workspace) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable, args=["-m", "caseledger", "mcp", "--workspace", str(ws.root)], env=dict(os.environ)
    )


@pytest.mark.integration
def test_stdio_stdout_carries_only_json_rpc(ws: Workspace) -> None:
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
    }
    lines = [
        init,
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    ]
    p = subprocess.Popen(
        [sys.executable, "-m", "caseledger", "mcp", "--workspace", str(ws.root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert p.stdin is not None and p.stdout is not None
    try:
        p.stdin.write("".join(json.dumps(m) + "\n" for m in lines).encode())
        p.stdin.flush()
        got = [json.loads(p.stdout.readline()) for _ in range(2)]  # a stray print fails to parse here
    finally:
        p.stdin.close()
        rest = p.stdout.read()
        p.wait(10)
    assert [m["id"] for m in got] == [1, 2]
    assert sorted(t["name"] for t in got[1]["result"]["tools"]) == sorted(SIX)
    assert all(json.loads(line)["jsonrpc"] == "2.0" for line in rest.splitlines() if line.strip())


@pytest.mark.integration
async def test_stdio_subprocess_lists_tools_freezes_and_names_fixes(ws: Workspace) -> None:
    async with Client(server_params(ws)) as c:
        assert sorted(t.name for t in (await c.list_tools()).tools) == sorted(SIX)
        r = await c.call_tool("freeze_case", {"path": "cases/draft.json"})
        err = await c.call_tool("phase_status", {"run_id": "r-0123abcd"})
    assert not r.is_error and r.structured_content and r.structured_content["case_id"].startswith("c-")
    assert len(text_of(r).encode()) < SHORT
    assert err.is_error and "fix:" in text_of(err)


@pytest.mark.integration
def test_inspect_lists_and_calls_over_real_stdio(ws: Workspace, capsys: pytest.CaptureFixture[str]) -> None:
    assert inspect_main(ws, []) == 0
    listing = capsys.readouterr().out
    assert all(f"{name}  [" in listing for name in SIX)
    # every description whole: none cut at a length or at an "e.g." taken for the end of a sentence
    assert inspect_main(ws, [], as_json=True) == 0
    tools = json.loads(capsys.readouterr().out)
    listed = " ".join(listing.split())
    assert len(tools) == 6 and all(" ".join(t["description"].split()) in listed for t in tools), listing
    assert "in:  path?: string|null, draft?: object|null, parent?: string|null" in listing
    assert inspect_main(ws, ["call", "phase_status", "run_id=r-0123abcd"], as_json=True) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["is_error"] is True and "fix:" in doc["text"] and doc["structured_content"] is None


TOKEN = "t0ken-" + "x" * 20
READ_TOKEN = "r3ad-" + "y" * 20


@contextmanager
def _mcp_http(ws: Workspace, bind: str, *extra: str, env: dict[str, str] | None = None) -> Iterator[tuple[str, int]]:
    """`caseledger mcp --http BIND:PORT --token-env CL_TEST_TOKEN` (TOKEN; READ_TOKEN in CL_READ_TOKEN) as a
    subprocess, waited for until it listens; yields the /mcp URL and the server's pid."""
    port = free_port()
    argv = [sys.executable, "-m", "caseledger", "mcp", "--workspace", str(ws.root), "--http", f"{bind}:{port}"]
    argv += ["--token-env", "CL_TEST_TOKEN", *extra]
    p = subprocess.Popen(
        argv,
        env=env or {**os.environ, "CL_TEST_TOKEN": TOKEN, "CL_READ_TOKEN": READ_TOKEN},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert p.poll() is None, "server exited"
            try:
                socket.create_connection((bind.strip("[]"), port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "server did not listen"
                time.sleep(0.1)
        yield f"http://{bind}:{port}/mcp", p.pid
    finally:
        p.terminate()
        p.wait(10)


def _client(url: str, token: str = TOKEN) -> AbstractAsyncContextManager[Client]:
    """An MCP client over streamable HTTP that sends the bearer token."""
    return mcp_over_http(url, token)


@pytest.fixture
def http_server(ws: Workspace) -> Iterator[str]:
    """`caseledger mcp --http 127.0.0.1:PORT` with a token and a read-only token, as a subprocess: its URL."""
    with _mcp_http(ws, "127.0.0.1", "--read-token-env", "CL_READ_TOKEN") as (url, _):
        yield url


@pytest.mark.integration
async def test_streamable_http_on_loopback(http_server: str) -> None:
    async with _client(http_server) as c:
        assert sorted(t.name for t in (await c.list_tools()).tools) == sorted(SIX)
        r = await c.call_tool("phase_status", {"run_id": "r-0123abcd"})
    assert r.is_error and "fix:" in text_of(r)


@pytest.mark.integration
async def test_streamable_http_needs_the_token_on_loopback_too(http_server: str, ws: Workspace) -> None:
    url = http_server
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    async with httpx2.AsyncClient() as h:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}, {"Authorization": "Basic x"}):
            resp = await h.post(url, json=body, headers=headers)
            assert resp.status_code == 401, headers
            assert resp.headers["www-authenticate"].startswith("Bearer")
    async with _client(url) as c:
        assert sorted(t.name for t in (await c.list_tools()).tools) == sorted(SIX)
    # the read-only token lists, reads and asks, and is refused (403, nothing written) any other tool
    async with _client(url, READ_TOKEN) as c:
        assert sorted(t.name for t in (await c.list_tools()).tools) == sorted(SIX)
        r = await c.call_tool("phase_status", {"run_id": "r-0123abcd"})
        assert r.is_error and "fix:" in text_of(r)  # answered by the tool: it was let through
        assert (await c.read_resource("caseledger://handoff")).contents
        before = tree_digest(ws.root)
        for name, args in (("freeze_case", {"path": "cases/draft.json"}), ("start_run", {"case_id": "c-0123abcd"})):
            with pytest.raises(MCPError, match=f"read-only token may call phase_status, summarize .* not '{name}'"):
                await c.call_tool(name, args)
    assert tree_digest(ws.root) == before
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {READ_TOKEN}"}) as h:
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "resume", "arguments": {}}}
        resp = await h.post(url, json=[call], headers={"Accept": "application/json, text/event-stream"})
        assert resp.status_code == 403 and "not 'resume'; fix: call it with the full token" in resp.text


def _refusal(ws: Workspace, **kw: Any) -> BaseException:
    """What serve() raised, from a thread: a serve that does not refuse (it binds, even port 1 as root, and serves)
    fails the test after 10 s instead of hanging the suite."""
    import threading

    got: list[BaseException] = []

    def call() -> None:
        try:
            serve(ws, **kw)
        except BaseException as e:
            got.append(e)

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(timeout=10.0)
    assert got, f"serve({kw}) did not refuse: it served"
    return got[0]


def test_http_serving_needs_a_token_and_a_read_token_of_its_own(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    for bind in ("127.0.0.1:1", "[::1]:1", "0.0.0.0:1"):
        e = _refusal(ws, http=bind, token_env=None)
        assert isinstance(e, NotAuthorized) and "loopback included" in e.message, e
        assert "--token-env NAME" in (e.fix or "")
    monkeypatch.setenv("CL_SHORT", "abc")
    e = _refusal(ws, http="127.0.0.1:1", token_env="CL_SHORT")
    assert isinstance(e, NotAuthorized) and "at least 16" in e.message, e
    monkeypatch.setenv("CL_TEST_TOKEN", TOKEN)
    e = _refusal(ws, http="127.0.0.1:1", token_env="CL_TEST_TOKEN", read_token_env="CL_TEST_TOKEN")
    assert isinstance(e, NotAuthorized) and "same token" in e.message, e
    with pytest.raises(CaseledgerError, match="only apply to --http"):
        serve(ws, http=None, token_env="CL_SHORT")
    assert os.environ.get("CASELEDGER_CALLER") is None  # refused before this process became the HTTP caller


# ------------------------------------------------------------------------------------- transports: DNS rebinding


async def _checked(bind: str, port: int, host: str, origin: str | None = None) -> int:
    """The status the server's Host/Origin check gives a JSON POST (200: let through to the MCP transport)."""
    headers = [(b"host", host.encode()), (b"content-type", b"application/json")]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": headers, "query_string": b""}
    refused = await TransportSecurityMiddleware(guards.transport_security(bind, port)).validate_request(
        Request(scope), is_post=True
    )
    return 200 if refused is None else refused.status_code


@pytest.mark.parametrize(
    ("bind", "own"),
    [
        ("127.0.0.2", ["127.0.0.2:8765", "localhost:8765", "127.0.0.1:9000"]),  # loopback names on any port: ssh -L
        ("0:0:0:0:0:0:0:1", ["[0:0:0:0:0:0:0:1]:8765", "[::1]:8765", "localhost:8765"]),
        ("::1", ["[::1]:8765", "[0000:0000:0000:0000:0000:0000:0000:0001]:8765", "localhost:8765"]),
        ("127.0.0.1", ["127.0.0.1:8765", "localhost:8765", "[::1]:8765"]),
        ("localhost", ["localhost:8765", "127.0.0.1:8765"]),
        ("10.1.2.3", ["10.1.2.3:8765"]),
    ],
)
async def test_host_and_origin_are_checked_against_the_bind_address_on_every_bind(bind: str, own: list[str]) -> None:
    for host in own:
        assert await _checked(bind, 8765, host) == 200, host
        assert await _checked(bind, 8765, host, origin=f"http://{host}") == 200, host
        assert await _checked(bind, 8765, host, origin="http://evil.example") == 403, host
        assert await _checked(bind, 8765, host, origin="null") == 403, host
    for foreign in ("evil.example", "evil.example:8765", "127.0.0.2.evil.example:8765", ""):
        assert await _checked(bind, 8765, foreign) == 421, foreign
    assert await _checked("127.0.0.2", 8765, "127.0.0.2:8766") == 421  # the bind address: its own port only
    assert await _checked("10.1.2.3", 8765, "10.1.2.3:8766") == 421
    assert await _checked("10.1.2.3", 8765, "localhost:8765") == 421  # off loopback: no loopback names


@pytest.fixture
def http_server_on(ws: Workspace, request: pytest.FixtureRequest) -> Iterator[str]:
    """`caseledger mcp --http BIND:PORT` for another loopback bind spelling (request.param); the /mcp URL."""
    with _mcp_http(ws, request.param) as (url, _):
        yield url


@pytest.mark.integration
@pytest.mark.parametrize("http_server_on", ["127.0.0.2", "[0:0:0:0:0:0:0:1]"], indirect=True)
async def test_other_loopback_binds_refuse_a_foreign_host_and_origin(ws: Workspace, http_server_on: str) -> None:
    url = http_server_on
    authority = url.split("/")[2]
    freeze = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "freeze_case", "arguments": {"draft": baseline_draft(free_port())}},
    }
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
    }
    accept = {"Accept": "application/json, text/event-stream", "Authorization": f"Bearer {TOKEN}"}
    before = tree_digest(ws.root)
    async with httpx2.AsyncClient() as h:
        for body in (init, freeze):
            r = await h.post(url, json=body, headers={**accept, "Host": "evil.example"})
            assert r.status_code == 421, r.text
            r = await h.post(url, json=body, headers={**accept, "Host": f"evil.example:{url.rsplit(':', 1)[1]}"})
            assert r.status_code == 421, r.text
            r = await h.post(url, json=body, headers={**accept, "Origin": "http://evil.example"})
            assert r.status_code == 403, r.text
        r = await h.post(url, json=init, headers={**accept, "Host": authority, "Origin": f"http://{authority}"})
        assert r.status_code == 200, r.text  # the right Host (and same-origin Origin) gets the MCP answer
    assert tree_digest(ws.root) == before  # refused: nothing written, no case frozen
    async with _client(url) as c:
        assert sorted(t.name for t in (await c.list_tools()).tools) == sorted(SIX)
        r2 = await c.call_tool("phase_status", {"run_id": "r-0123abcd"})
    assert r2.is_error and "fix:" in text_of(r2)


# ------------------------------------------------------------------------------ transports: bounds before the token

WAIT_S = listener.HEAD_TIMEOUT_S + 20  # the longest a bounded server may take to answer and close


@pytest.fixture
def tokened(ws: Workspace) -> Iterator[tuple[str, int]]:
    """`caseledger mcp --http 127.0.0.2:PORT --token-env CL_TEST_TOKEN` as a subprocess: its /mcp URL and pid."""
    with _mcp_http(ws, "127.0.0.2") as served:
        yield served


def _rss_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])


def _head(url: str, *fields: str, method: str = "GET") -> bytes:
    """A request head for url without a token: the request line, Host, then `fields` (header lines)."""
    authority = url.split("/")[2]
    return "".join(f"{line}\r\n" for line in (f"{method} /mcp HTTP/1.1", f"Host: {authority}", *fields, "")).encode()


def _connect(url: str) -> socket.socket:
    host, port = url.split("/")[2].rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=WAIT_S)


def _answer(s: socket.socket) -> bytes:
    """Everything the server sends until it closes (a reset after its answer counts as closing)."""
    out = bytearray()
    try:
        while chunk := s.recv(65536):
            out.extend(chunk)
    except ConnectionResetError:
        pass
    return bytes(out)  # a TimeoutError (the server kept the connection open past WAIT_S) fails the test


def _status(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:80]
    return int(answer.split(b" ", 2)[1])


def _exchange(url: str, head: bytes, fill: bytes = b"", fill_bytes: int = 0) -> tuple[bytes, int]:
    """Send `head`, then `fill` again and again up to `fill_bytes` while the server takes it; the server's answer
    (all it sent until it closed) and how many fill bytes it took."""
    answer: list[bytes] = []

    def read(s: socket.socket) -> None:
        with suppress(TimeoutError):  # the server kept the connection open: no answer
            answer.append(_answer(s))

    with _connect(url) as s:
        reader = threading.Thread(target=read, args=(s,))
        reader.start()
        sent = 0
        try:
            s.sendall(head)
            while sent < fill_bytes and reader.is_alive():
                s.sendall(fill)
                sent += len(fill)
        except (BrokenPipeError, ConnectionResetError):  # the server closed while we were sending
            pass
        reader.join(WAIT_S + 1)
    assert answer, "the server kept the connection open"
    return answer[0], sent


@pytest.mark.integration
async def test_100_mb_of_header_bytes_without_a_token_get_431_and_cost_the_server_under_10_mb(
    tokened: tuple[str, int],
) -> None:
    url, pid = tokened
    answer, _ = _exchange(url, _head(url, "Connection: close"))
    assert _status(answer) == 401  # warmed: the token is required, and the server has served a request
    before = _rss_kb(pid)
    fill = (b"X-Fill: " + b"a" * 1014 + b"\r\n") * 64  # header lines, 64 KiB a write, never the blank line
    answer, taken = _exchange(url, _head(url)[:-2], fill, fill_bytes=100 * 2**20)
    grown = _rss_kb(pid) - before
    assert _status(answer) == 431 and b"request head over" in answer
    assert taken < 100 * 2**20  # the server stopped reading and closed
    assert grown < 10 * 1024, f"RSS grew {grown} kB"
    async with _client(url) as c:  # and still serves an authorized client
        assert sorted(t.name for t in (await c.list_tools()).tools) == sorted(SIX)


@pytest.mark.integration
def test_too_many_header_fields_get_431_before_the_token_is_checked(tokened: tuple[str, int]) -> None:
    url, _ = tokened
    fields = [f"X-Field-{i}: 1" for i in range(guards.MAX_HEADERS - 2)]  # with Host and Connection: the cap exactly
    answer, _ = _exchange(url, _head(url, "Connection: close", *fields))
    assert _status(answer) == 401
    answer, _ = _exchange(url, _head(url, "Connection: close", *fields, "X-One-Too-Many: 1"))
    assert _status(answer) == 431 and f"at most {guards.MAX_HEADERS}".encode() in answer
    assert b"www-authenticate" not in answer.lower()


@pytest.mark.integration
def test_a_declared_body_over_the_cap_gets_413_unread(tokened: tuple[str, int]) -> None:
    url, _ = tokened
    json_post = ("Content-Type: application/json", "Accept: application/json, text/event-stream")
    over = _head(url, *json_post, f"Content-Length: {guards.MAX_BODY_BYTES + 1}", method="POST")
    answer, _ = _exchange(url, over)  # the head only: the answer comes without a byte of the body
    assert _status(answer) == 413 and f"at most {guards.MAX_BODY_BYTES}".encode() in answer
    at_cap = _head(url, *json_post, f"Content-Length: {guards.MAX_BODY_BYTES}", "Connection: close", method="POST")
    answer, _ = _exchange(url, at_cap)
    assert _status(answer) == 401  # at the cap: past the bounds to the token check, still unread


@pytest.mark.integration
def test_slow_and_dribbling_heads_get_408_and_silent_clients_are_closed(tokened: tuple[str, int]) -> None:
    url, _ = tokened
    silent, partial, dribbler = _connect(url), _connect(url), _connect(url)
    with silent, partial, dribbler:
        partial.sendall(b"POST /mcp HT")
        dribbler.sendall(_head(url)[:-2] + b"X-Slow: ")
        deadline = time.monotonic() + WAIT_S
        while not select.select([dribbler], [], [], 0.5)[0]:  # a header byte every half second until answered
            assert time.monotonic() < deadline, "the dribbling client was never answered"
            dribbler.sendall(b"a")
        for s in (partial, dribbler):
            answer = _answer(s)
            assert _status(answer) == 408 and b"request head not received" in answer
        assert _answer(silent) == b""  # closed: no request begun, so no answer to misread as a later one's


# ------------------------------------------------------------------------------------- a real run, end to end


@pytest.mark.integration
async def test_full_run_over_stdio_with_short_answers(ws: Workspace) -> None:
    async with Client(server_params(ws)) as c:
        await _full_run(c, ws)


@pytest.mark.integration
async def test_full_run_over_streamable_http_with_short_answers(ws: Workspace, http_server: str) -> None:
    async with _client(http_server) as c:
        await _full_run(c, ws)


async def _full_run(c: Client, ws: Workspace) -> None:
    """freeze, start, poll phase_status to the end, summarize, reprocess, read the report; every answer short."""
    from caseledger import services
    from caseledger.ledger import authorization

    authorization.set_mode(ws, "auto")
    sizes: dict[str, int] = {}

    def short(name: str, r: CallToolResult, limit: int = SHORT) -> dict[str, Any]:
        assert not r.is_error, f"{name}: {text_of(r)}"
        sizes[name] = max(sizes.get(name, 0), len(text_of(r).encode()))
        assert sizes[name] < limit, f"{name} answered {sizes[name]} bytes:\n{text_of(r)}"
        assert "next: " in text_of(r)
        out: dict[str, Any] | None = r.structured_content
        assert out is not None
        return out

    try:
        cid = short("freeze_case", await c.call_tool("freeze_case", {"path": "cases/draft.json"}))["case_id"]
        started = short("start_run", await c.call_tool("start_run", {"case_id": cid}))
        rid = started["run_id"]
        assert started["preflight"] == "passed", started
        with anyio.fail_after(180):
            while True:
                st = short("phase_status", await c.call_tool("phase_status", {"run_id": rid}))
                if st["state"] not in ("created", "running"):
                    break
                await anyio.sleep(1)
        assert st["state"] == "succeeded" and st["results_extracted"], st
        assert st["sent"] == st["done"] == 8
        summ = short(
            "summarize", await c.call_tool("summarize", {"run_ids": [rid]}), 2500
        )  # the report's headline: both windows, E2E, ITL, what was not observed
        assert summ["runs"][0]["results_extracted"]
        port = urlsplit(
            json.loads((ws.root / "cases/draft.json").read_text())["target"]["endpoints"][0]["base_url"]
        ).port
        assert port is not None
        before = stats(port)["requests_total"]
        rep = short("reprocess_raw", await c.call_tool("reprocess_raw", {"run_id": rid}))
        assert rep["requests"] == 8 and stats(port)["requests_total"] == before  # counted at the target
        report = await c.read_resource(f"caseledger://runs/{rid}/report")
        assert isinstance(report.contents[0], TextResourceContents) and rid in report.contents[0].text
    finally:
        services.stop_all(ws)


def test_lowlevel_shim_reaches_the_sdk_server_that_runs_stdio(ws: Workspace) -> None:
    """The stdio transport drives the SDK's private low-level server (MCPServer.run_stdio_async takes no streams).
    This fails when an mcp release renames, retypes or stops using `_lowlevel_server`."""
    from mcp.server.lowlevel.server import Server as LowlevelServer

    from caseledger.server.app import lowlevel_server

    server = build_server(ws)
    lowlevel = lowlevel_server(server)
    assert isinstance(lowlevel, LowlevelServer)
    assert lowlevel.name == server.name
    options = lowlevel.create_initialization_options()
    assert options.server_name == server.name
    assert options.capabilities.tools is not None


def test_lowlevel_shim_refuses_a_changed_sdk(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    """A renamed or retyped attribute gives an error naming the SDK version, not a late AttributeError."""
    from caseledger.server.app import lowlevel_server

    server = build_server(ws)
    monkeypatch.setattr(server, "_lowlevel_server", object())
    with pytest.raises(TypeError, match="_lowlevel_server is no longer"):
        lowlevel_server(server)
