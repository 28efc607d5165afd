"""MCP assembly: the server over one workspace (six tools, seven resources, compacted tools/list), the stdio
and streamable HTTP transports. tools/list is compacted (no pydantic titles, `type: [X, "null"]` instead of
anyOf): every agent session pays for it in tokens.
"""

import contextlib
import io
import json
import logging
import os
from importlib import metadata
from pathlib import Path
from typing import Any, cast

import anyio
import anyio.from_thread
import anyio.to_thread
import jsonschema  # type: ignore[import-untyped]
from mcp.server import MCPServer
from mcp.server.lowlevel.server import Server as LowlevelServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp.types import CallToolResult, InputRequiredResult
from mcp.types import Tool as MCPTool
from starlette.types import ASGIApp

from caseledger.errors import CaseledgerError, NotAuthorized, quoted
from caseledger.ledger import calls
from caseledger.run.admission.policy import CALLER_ENV
from caseledger.server.guards import (
    MAX_BODY_BYTES,
    BearerToken,
    CheckedLines,
    RequestBounds,
    parse_host_port,
    read_token,
    transport_security,
)
from caseledger.server.published import compact_schema, published
from caseledger.server.resources import add_resources
from caseledger.server.toolset import add_result_tools, add_tools
from caseledger.workspace import Workspace

log = logging.getLogger("caseledger.server")


def instructions() -> str:
    """What a new session reads first (the decision words from caseledger.server.published)."""
    return f"""\
caseledger runs LLM-serving performance experiments from frozen cases; every fact is in an on-disk ledger.
New session: read the resource caseledger://handoff first (a few lines: state and the one next action).
Loop: {calls.freeze_case("cases/x.json")} -> start_run(case_id) -> phase_status(run_id) until it says done \
-> summarize() (one row per case of the scenario: change, run, metric, TTFT/TPOT/ITL/E2E p50/p99, limit \
verdicts, decision). Repair only the failed phase: resume(run_id) or reprocess_raw(run_id) (never re-sends \
requests). Every answer ends with 'next: ...' naming the call to make. Case fields: resource \
caseledger://schema/case. Decisions: {published().decision_words}."""


def lowlevel_server(server: MCPServer) -> "LowlevelServer[Any]":
    """The SDK's private low-level server behind an MCPServer: the one reach into SDK internals. Needed because
    MCPServer.run_stdio_async takes no streams, and our stdio wire is filtered (CheckedLines) before the SDK
    reads it; the SDK's own run_stdio_async and in-memory client read the same attribute. A test
    (test_mcp_server) fails when an SDK release renames or retypes it."""
    lowlevel = server._lowlevel_server
    if not isinstance(lowlevel, LowlevelServer):
        raise TypeError(f"mcp {metadata.version('mcp')}: MCPServer._lowlevel_server is no longer a low-level Server")
    return lowlevel


class _Server(MCPServer):
    """MCPServer whose tools/list carries compacted schemas (computed once: tools never change), and summarize's
    output schema as published (caseledger.server.published: the adapters do not import the result models)."""

    _listed: list[MCPTool] | None = None

    async def list_tools(self) -> list[MCPTool]:
        if self._listed is None:
            self._listed = [
                t.model_copy(
                    update={
                        "input_schema": compact_schema(t.input_schema),
                        "output_schema": published().outputs.get(t.name),
                    }
                )
                for t in await super().list_tools()
            ]
        return self._listed

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any],  # JSON: a tool call's arguments
        context: Any = None,
    ) -> CallToolResult | InputRequiredResult:
        """Arguments checked against the tool's published schema first: an unknown argument, a missing one or a
        value of the wrong type is a tool error naming the argument and the fix (the SDK would ignore the first
        and coerce 'yes' to true)."""
        tool = next((t for t in await self.list_tools() if t.name == name), None)
        if tool is not None:
            problem = argument_problem(name, tool.input_schema, arguments or {})
            if problem:
                raise ToolError(problem)
        return await super().call_tool(name, arguments, context)


MAX_ARGUMENT_CHARS = 10_000  # a string argument is an id, a name or a path: never this long


def argument_problem(tool: str, schema: dict[str, Any], arguments: dict[str, Any]) -> str | None:  # JSON: both
    """The first thing wrong with a tool call's arguments against its input schema, with the fix; None if none.
    A JSON string for a non-string argument is read as JSON first (some clients send '60' for 60)."""
    props: dict[str, Any] = schema.get("properties", {})  # JSON: the input schema's properties
    known = ", ".join(props) or "none"
    for k in arguments:
        if k not in props:
            return f"{tool}: unknown argument '{quoted(k, 60)}' (its arguments: {known}); fix: drop it"
    for k in schema.get("required", []):
        if k not in arguments:
            return f"{tool}: argument '{k}' is missing; fix: pass it ({props.get(k, {}).get('description', '')})"
    for k, v in arguments.items():
        if isinstance(v, str) and len(v) > MAX_ARGUMENT_CHARS:  # checked before a validator formats it whole
            return f"{tool}: argument '{k}' is {len(v)} chars; fix: pass the id or name as returned (a few dozen chars)"
        value = v
        if isinstance(v, str) and "string" not in str(props[k].get("type", "string")):
            with contextlib.suppress(ValueError):
                value = json.loads(v)
        err = next(iter(jsonschema.Draft202012Validator(props[k]).iter_errors(value)), None)
        if err is not None:
            want, about = props[k].get("type", "the documented value"), props[k].get("description", "")
            return f"{tool}: argument '{k}' {quoted(err.message, 200)}; fix: pass {want} ({about})"
    return None


def build_server(ws: Workspace) -> MCPServer:
    """The caseledger MCP server over one workspace: six tools, the handoff and per-run report resources."""
    try:
        version = metadata.version("caseledger")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        version = "0"
    mcp: MCPServer = _Server("caseledger", version=version, instructions=instructions())
    add_tools(mcp, ws)
    add_result_tools(mcp, ws)
    add_resources(mcp, ws)
    return mcp


def http_app(ws: Workspace, host: str, port: int, token: str, read_token: str | None = None) -> ASGIApp:
    """The streamable HTTP ASGI app at /mcp: Host/Origin checked against the bind address (every bind), behind
    the bearer check (a read-only token, when given, may call only the reading tools), and the request bounds in
    front of both."""
    app: ASGIApp = build_server(ws).streamable_http_app(
        streamable_http_path="/mcp",
        host=host,
        transport_security=transport_security(host, port),
        max_request_body_size=MAX_BODY_BYTES,
    )
    return RequestBounds(BearerToken(app, token, read_token))


async def run_stdio(server: MCPServer) -> None:
    """The SDK's stdio transport, with stdin checked for over-deep lines; fd 0 points at the null device while
    serving (children read EOF), as the SDK does when it owns stdin."""
    wire = os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    stdin = anyio.wrap_file(io.TextIOWrapper(os.fdopen(wire, "rb", closefd=False), encoding="utf-8", errors="replace"))
    refused_send, refused_recv = anyio.create_memory_object_stream[SessionMessage](16)
    try:
        async with stdio_server(stdin=cast("anyio.AsyncFile[str]", CheckedLines(stdin, refused_send))) as (
            read_stream,
            write_stream,
        ):

            async def forward() -> None:
                async for message in refused_recv:
                    await write_stream.send(message)

            async with anyio.create_task_group() as tg:
                tg.start_soon(forward)
                lowlevel = lowlevel_server(server)
                await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())
                tg.cancel_scope.cancel()
    finally:
        os.dup2(wire, 0)
        os.close(wire)


def serve(
    ws: Workspace, http: str | None = None, token_env: str | None = None, read_token_env: str | None = None
) -> None:
    """Serve over stdio (default) or streamable HTTP at http://HOST:PORT/mcp. Never writes to stdout itself:
    on stdio, stdout is the wire; logs go to stderr. Over HTTP every request needs the bearer token, loopback
    too (any local process or user reaches a loopback port), and the server and every process it starts are
    the 'http' caller of the host policy (caseledger.run.admission.policy)."""
    if http is None:
        if token_env is not None or read_token_env is not None:
            raise CaseledgerError(
                "--token-env and --read-token-env only apply to --http", "drop them, or add --http HOST:PORT"
            )
        anyio.run(run_stdio, build_server(ws))
        return
    from caseledger.server import listener  # lazy: it imports uvicorn, which only the HTTP transport needs

    host, port = parse_host_port(http)
    if token_env is None:
        raise NotAuthorized(
            f"--http {http} without a bearer token would give every process that reaches the port (loopback "
            "included) the tools, and with them whatever the host policy lets a case start",
            "add --token-env NAME with the token in $NAME (and --read-token-env NAME2 for read-only clients)",
        )
    token = read_token(token_env)
    reader = read_token(read_token_env) if read_token_env is not None else None
    if reader is not None and reader == token:
        raise NotAuthorized(
            f"${read_token_env} holds the same token as ${token_env}: a read-only client could then run anything",
            f"give {read_token_env} a token of its own",
        )
    os.environ[CALLER_ENV] = "http"  # this process and every process it starts: the host policy's HTTP caller
    asgi = http_app(ws, host, port, token, reader)  # builds the server, which configures logging (stderr)
    log.info(
        "caseledger MCP on http://%s:%d/mcp (workspace %s, bearer token required%s)",
        host,
        port,
        Path(ws.root),
        ", read-only token accepted" if reader else "",
    )
    listener.run(asgi, host, port)
