"""`caseledger init [DIR] --engine E`: a new workspace, ready to fill and freeze.

Writes, each only where nothing is yet (a file already there is kept and named, never overwritten):
cases/<E>.json (the engine's template: the values left for its user are "<FILL: ...>", and freeze refuses a draft
that still holds one), schemas/case.schema.json (the packaged schema, so the template's `"$schema":
"../schemas/case.schema.json"` resolves in the new workspace), .mcp.json (Claude Code's project file: the
`caseledger mcp` server of this workspace) and HANDOFF.md (where the workspace stands: what to fill, the next call).
Every input is checked before the first write: a bad one writes nothing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import orjson
from pydantic import BaseModel, Field

from caseledger import engines
from caseledger.case.metrics import LIMITS
from caseledger.case.schema import CASE_SCHEMA, PACKAGED_SCHEMAS
from caseledger.case.store import unfilled
from caseledger.errors import CaseInvalid, NotWritable, quoted
from caseledger.ledger import authorization, calls
from caseledger.workspace import Workspace, atomic_write, utc_now

TEMPLATES = engines.TEMPLATES  # package data, one draft per engine
NOT_ENGINES = ("external", "reference")  # a server already running; the embedded reference target (no GPU)
ENGINES = (*engines.templated(), *NOT_ENGINES)  # the engine profiles with a template, then the two above
ENGINE_CHOICES = "|".join(ENGINES)
MCP_SERVER = "caseledger"  # the server's name in .mcp.json


class InitResult(BaseModel):
    workspace: str = Field(description="The workspace directory (absolute)")
    engine: str
    template: str = Field(description="The case draft for the engine, relative to the workspace")
    written: list[str] = Field(description="Files written now, relative to the workspace")
    kept: list[str] = Field(description="Files that were already there and were left as they are, with why")
    to_fill: list[str] = Field(description="Fields of the template that still hold a <FILL: ...> value")
    next_call: str

    def text(self) -> str:
        lines = [f"workspace {self.workspace} (engine {self.engine})"]
        lines += [f"wrote {p}" for p in self.written]
        lines += [f"kept {p}" for p in self.kept]
        if self.to_fill:
            lines.append(f"fill in {self.template}: {', '.join(self.to_fill)}")
        lines.append(f"next: {self.next_call}")
        return "\n".join(lines)


def init_workspace(directory: str | os.PathLike[str], engine: str | None) -> InitResult:
    """Create (or complete) a workspace for `engine`; every argument checked before anything is written."""
    root = _check_args(directory, engine)
    assert engine is not None  # _check_args refused None
    ws = Workspace(root)
    template = f"cases/{engine}.json"
    files = {
        template: (TEMPLATES / f"{engine}.json").read_bytes(),
        SWEEP: sweep_draft(template),
        f"schemas/{CASE_SCHEMA}": (PACKAGED_SCHEMAS / CASE_SCHEMA).read_bytes(),
        ".mcp.json": mcp_json(root),
    }
    for rel in [*files, "HANDOFF.md"]:  # a directory where a file goes, or a file where a directory goes
        _check_target(root, rel)
    written: list[str] = []
    kept: list[str] = []
    for rel, data in files.items():
        target = root / rel
        if target.exists():
            kept.append(f"{rel} ({_why_kept(rel, target.read_bytes(), data)})")
            continue
        _write(target, data)
        written.append(rel)
    to_fill = [path for path, _ in unfilled(orjson.loads((root / template).read_bytes()))]
    freeze = calls.freeze_case(template)
    nxt = f"fill the <FILL: ...> values of {template}, then {freeze}" if to_fill else f"{freeze}, then start_run"
    nxt += f"; or the best C under a TTFT p99 limit: {calls.freeze_case(SWEEP)}, then start the id it prints"
    if ws.handoff.exists():
        kept.append("HANDOFF.md (exists; `caseledger handoff` regenerates it from the ledger)")
    else:
        _write(ws.handoff, _handoff(ws, template, to_fill, nxt).encode())
        written.append("HANDOFF.md")
    return InitResult(
        workspace=str(root),
        engine=engine,
        template=template,
        written=written,
        kept=kept,
        to_fill=to_fill,
        next_call=nxt,
    )


SWEEP = "cases/sweep.json"  # the commonest question, ready to freeze once the engine's draft is filled


def sweep_draft(template: str) -> bytes:
    """A campaign draft for the commonest question: the best concurrency under a latency limit (a knee on C,
    bisected), over the engine's own draft as its base. Its note lists the limit keys a person may use instead."""

    draft = {
        "campaign": {
            "name": "c-sweep",
            "note": "The best C within a TTFT p99 limit (knee: C is bisected, points past the limit skipped). "
            f"Other limits (ms): {', '.join(LIMITS)}; several may be given. Budget: repeats.budget extra runs "
            "settle the answer (settle_runs at most per point). Freeze: " + calls.freeze_case("cases/sweep.json") + ".",
            "base": template,
            "axes": [{"path": "load.concurrency", "values": [1, 2, 4, 8, 16]}],
            "search": {"kind": "knee", "axis": "load.concurrency", "monotone": True},
            "decision": {"primary_metric": "output_throughput", "limits": {"ttft_p99_ms": 2000}},
            "repeats": {"runs": 1, "settle_runs": 3, "budget": 4},
        }
    }
    return orjson.dumps(draft, option=orjson.OPT_INDENT_2) + b"\n"


def _check_args(directory: str | os.PathLike[str], engine: str | None) -> Path:
    if engine is None:
        raise CaseInvalid(
            "caseledger init needs --engine",
            f"caseledger init DIR --engine {ENGINE_CHOICES} (external: a server that is already running; "
            "reference: the embedded reference target, no GPU); nothing was written",
        )
    if engine not in ENGINES:
        raise CaseInvalid(
            f"unknown --engine '{quoted(engine, 40)}'; known: {', '.join(ENGINES)}",
            f"caseledger init DIR --engine {ENGINE_CHOICES}; nothing was written",
        )
    root = Path(directory).expanduser().resolve()
    if root.exists() and not root.is_dir():
        raise CaseInvalid(
            f"DIR '{quoted(str(directory), 200)}' is a file, not a directory",
            "give a new or existing directory as DIR (caseledger init DIR --engine ...); nothing was written",
        )
    near = next(p for p in (root, *root.parents) if p.exists())  # the directory where creation starts
    if not near.is_dir() or not os.access(near, os.W_OK | os.X_OK):
        raise NotWritable(
            f"not writable: {near} (DIR '{quoted(str(directory), 200)}')",
            "give a DIR you may write to, or fix its permissions; nothing was written",
        )
    return root


def _check_target(root: Path, rel: str) -> None:
    """A file init would write must be a file or absent, and each directory on its way a directory or absent."""
    target = root / rel
    for p in [*reversed(target.relative_to(root).parents[:-1]), Path(rel)]:
        here = root / p
        want_dir = here != target
        if here.exists() and here.is_dir() != want_dir:
            kind = "a directory" if want_dir else "a file"
            raise CaseInvalid(
                f"{here} is in the way: caseledger init needs {kind} there",
                f"move {here} aside (or init another DIR) and run caseledger init again; nothing was written",
            )


def _write(target: Path, data: bytes) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, data)
    except PermissionError as e:
        raise NotWritable(f"not writable: {target}", f"fix the permissions of {target.parent} ({e.strerror})") from e


def _why_kept(rel: str, have: bytes, ours: bytes) -> str:
    if have == ours:
        return "exists, the same"
    if rel.startswith("schemas/"):
        return "exists, differs from this version's: `caseledger schema` writes this version's"
    if rel == ".mcp.json":
        try:
            servers = orjson.loads(have).get("mcpServers") or {}
        except (orjson.JSONDecodeError, AttributeError):
            servers = {}
        if MCP_SERVER not in servers:
            entry = orjson.dumps({MCP_SERVER: orjson.loads(ours)["mcpServers"][MCP_SERVER]}).decode()
            return f"exists without a '{MCP_SERVER}' server: add {entry} to its mcpServers"
    return "exists; never overwritten"


def caseledger_program() -> str:
    """The `caseledger` program of this installation: beside the running interpreter (a venv), else on PATH."""
    beside = Path(sys.executable).parent / "caseledger"
    return str(beside) if beside.is_file() else "caseledger"


def mcp_json(root: Path) -> bytes:
    """Claude Code's project file (.mcp.json): this workspace's MCP server over stdio."""
    server = {"command": caseledger_program(), "args": ["mcp", "--workspace", str(root)]}
    return orjson.dumps({"mcpServers": {MCP_SERVER: server}}, option=orjson.OPT_INDENT_2) + b"\n"


def _handoff(ws: Workspace, template: str, to_fill: list[str], nxt: str) -> str:
    lines = [
        f"# HANDOFF — written {utc_now()[:19]}Z by caseledger init; `caseledger handoff` regenerates it from ledger/",
        f"authorization: {authorization.current_mode(ws)}",
        "no runs yet",
    ]
    if to_fill:
        lines.append(f"to fill in {template}: {', '.join(to_fill)}")
    return "\n".join([*lines, f"next: {nxt}"]) + "\n"
