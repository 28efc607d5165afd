"""`caseledger inspect`: list the tools or resources, call a tool or read a resource, over a REAL stdio session
with `caseledger mcp`.

It checks what an agent would see: the server is started as a subprocess exactly as a client would start
it, so a stray print on stdout, an import error or a schema problem shows up here first.

    caseledger inspect                                   tools with input/output schemas (compact)
    caseledger inspect call phase_status run_id=r-1a2b3c4d
    caseledger inspect call summarize run_ids=r-a,r-b --json
    caseledger inspect resources                         resources and resource templates
    caseledger inspect read caseledger://scenarios/NAME  one resource's text
"""

from __future__ import annotations

import os
import sys
import tempfile
import textwrap
from typing import Any, TextIO

import anyio
import orjson
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import CallToolResult, ImageContent, TextContent, TextResourceContents, Tool

from caseledger.errors import quoted
from caseledger.workspace import Workspace

DESCRIPTION_CHARS = 4000  # a tool description is ours and short (tools/list <= 8 KB); the bound is for safety
USAGE = "usage: caseledger inspect [call TOOL key=value ... | resources | read URI] [--json]"


def inspect_main(ws: Workspace, words: list[str], *, as_json: bool = False) -> int:
    """List the tools (no words), call one ('call TOOL k=v ...'), list the resources ('resources') or read one
    ('read URI'); returns the process exit code."""
    ok = (
        not words
        or (words[0] == "call" and len(words) >= 2)
        or words == ["resources"]
        or (words[0] == "read" and len(words) == 2)
    )
    if not ok:
        sys.stderr.write(f"{USAGE}\n")
        return 2
    with tempfile.TemporaryFile("w+") as errlog:
        try:
            if words and words[0] in ("resources", "read"):
                return anyio.run(_resources, ws, words[1] if len(words) > 1 else None, as_json, errlog)
            return anyio.run(_session, ws, words[1:] if words else None, as_json, errlog)
        except Exception as e:  # show why the server did not answer, with its stderr tail
            errlog.seek(0)
            tail = errlog.read()[-2000:]
            sys.stderr.write(
                f"error: MCP session with `caseledger mcp` failed: {type(e).__name__}: {e}\n"
                f"server stderr (tail):\n{tail}\n"
            )
            return 1


def server_params(ws: Workspace) -> StdioServerParameters:
    """How a client starts the server: this interpreter, `-m caseledger mcp`, the caller's environment."""
    return StdioServerParameters(
        command=sys.executable, args=["-m", "caseledger", "mcp", "--workspace", str(ws.root)], env=dict(os.environ)
    )


async def _session(ws: Workspace, call: list[str] | None, as_json: bool, errlog: TextIO) -> int:
    async with Client(stdio_client(server_params(ws), errlog=errlog)) as client:
        listed = (await client.list_tools()).tools
        if call is None:
            _print_tools(listed, as_json)
            return 0
        name, pairs = call[0], call[1:]
        tool = next((t for t in listed if t.name == name), None)
        if tool is None:
            sys.stderr.write(f"error: unknown tool '{name}'; known: {', '.join(t.name for t in listed)}\n")
            return 2
        try:
            args = parse_arguments(pairs, tool.input_schema)
        except ValueError as e:
            sys.stderr.write(f"error: {e}\n{USAGE}\n")
            return 2
        result = await client.call_tool(name, args)
        _print_result(result, as_json)
        return 1 if result.is_error else 0


async def _resources(ws: Workspace, uri: str | None, as_json: bool, errlog: TextIO) -> int:
    async with Client(stdio_client(server_params(ws), errlog=errlog)) as client:
        if uri is None:
            listed = [
                {"uri": str(r.uri), "name": r.name, "description": r.description}
                for r in (await client.list_resources()).resources
            ]
            listed += [
                {"uri": t.uri_template, "name": t.name, "description": t.description}
                for t in (await client.list_resource_templates()).resource_templates
            ]
            if as_json:
                sys.stdout.write(orjson.dumps(listed, option=orjson.OPT_INDENT_2).decode() + "\n")
            else:
                sys.stdout.write("".join(f"{r['uri']}  {r['description'] or ''}\n" for r in listed))
            return 0
        try:
            read = await client.read_resource(uri)
        except Exception as e:  # the server's refusal names the fix; show it as an error, not a crash
            sys.stderr.write(f"error: {e}\n")
            return 1
        text = "".join(c.text for c in read.contents if isinstance(c, TextResourceContents))
        if as_json:
            sys.stdout.write(orjson.dumps({"uri": uri, "text": text}, option=orjson.OPT_INDENT_2).decode() + "\n")
        else:
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return 0


# JSON: a tool's input schema in, its arguments out
def parse_arguments(pairs: list[str], input_schema: dict[str, Any]) -> dict[str, Any]:
    """'k=v' words -> arguments. A value is JSON when it parses, else a string; for an array parameter a
    plain string splits on commas (run_ids=r-a,r-b); a string parameter keeps the raw text (parent=1234)."""
    props: dict[str, Any] = input_schema.get("properties", {})  # JSON: the schema's properties
    out: dict[str, Any] = {}  # JSON: the tool call's arguments
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"'{pair}' is not key=value")
        if key not in props:
            raise ValueError(f"unknown parameter '{key}'; known: {', '.join(props) or 'none'}")
        types = _types(props[key])
        try:
            value: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            value = raw
        if isinstance(value, str) and "array" in types:
            value = [v for v in value.split(",") if v] if value else []
        elif "string" in types and _json_type(value) not in types:
            value = raw  # e.g. a numeric-looking id for a string parameter
        out[key] = value
    return out


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else "string"


def _types(prop: dict[str, Any]) -> set[str]:  # JSON: a Schema property
    arms = prop.get("anyOf", [prop])
    out: set[str] = set()
    for a in arms:
        kind = a.get("type")
        out |= {str(k) for k in kind} if isinstance(kind, list) else {str(kind)} if kind else set()
    return out


def _print_result(result: CallToolResult, as_json: bool) -> None:
    text = "\n".join(c.text for c in result.content if isinstance(c, TextContent))
    images = [f"{c.mime_type}, {len(c.data) * 3 // 4} bytes" for c in result.content if isinstance(c, ImageContent)]
    if images and not as_json:
        text += "".join(f"\n[image: {i}]" for i in images)
    if as_json:
        doc = {
            "is_error": result.is_error,
            "text": text,
            "images": images,
            "structured_content": result.structured_content,
        }
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        (sys.stderr if result.is_error else sys.stdout).write(text + "\n")


def _print_tools(listed: list[Tool], as_json: bool) -> None:
    if as_json:
        doc = [
            {
                "name": t.name,
                "description": t.description,
                "annotations": t.annotations.model_dump(exclude_none=True) if t.annotations else None,
                "input_schema": t.input_schema,
                "output_schema": t.output_schema,
            }
            for t in listed
        ]
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    for t in listed:
        hints = t.annotations.model_dump(exclude_none=True) if t.annotations else {}
        flags = [k.removesuffix("_hint").replace("_", "-") for k, v in hints.items() if v is True]
        sys.stdout.write(f"{t.name}  [{', '.join(flags) or 'no hints'}]\n")
        # the whole description, wrapped: a first sentence cut at "e.g." or at 160 characters hid what the tool takes
        desc = quoted(" ".join((t.description or "").split()), DESCRIPTION_CHARS)
        sys.stdout.writelines(f"  {line}\n" for line in textwrap.wrap(desc, 110))
        sys.stdout.write(f"  in:  {_compact(t.input_schema)}\n")
        sys.stdout.write(f"  out: {_compact(t.output_schema) if t.output_schema else 'none'}\n")


def _compact(schema: dict[str, Any]) -> str:  # JSON: a Schema document
    """'name: type' per top-level property; '?' marks an optional one."""
    required = set(schema.get("required", []))
    parts = []
    for name, prop in schema.get("properties", {}).items():
        parts.append(f"{name}{'' if name in required else '?'}: {_type_name(prop)}")
    return ", ".join(parts) or "(none)"


def _type_name(prop: dict[str, Any]) -> str:  # JSON: a Schema property
    if "anyOf" in prop:
        return "|".join(_type_name(a) for a in prop["anyOf"])
    if "enum" in prop:
        return "|".join(repr(v) for v in prop["enum"])
    if "$ref" in prop:
        return str(prop["$ref"]).rsplit("/", 1)[-1]
    raw = prop.get("type", "any")
    if isinstance(raw, list):
        return "|".join(_type_name({**prop, "type": k}) for k in raw)
    kind = str(raw)
    if kind == "array":
        return f"list[{_type_name(prop.get('items', {}))}]"
    return kind
