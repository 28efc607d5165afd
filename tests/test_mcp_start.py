"""An MCP session starts light: `caseledger mcp` answers initialize and tools/list without importing the tools, the
ledger readers or numpy (bench/bench_mcp_start.py times it), and what it lists is exactly what it listed when the
adapters imported the tools: the recorded surface in tests/data/mcp/surface.json, byte for byte."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import anyio
import pytest
from mcp import Client

from caseledger.server import build_server
from caseledger.server import published as pub
from caseledger.workspace import Workspace

REPO = Path(__file__).resolve().parents[1]
SURFACE = REPO / "tests" / "data" / "mcp" / "surface.json"

# What a session may not have imported before its first tool call or resource read: the tools, every reader of
# the ledger (index, folds, result and view models), numpy and matplotlib.
HEAVY = (
    "caseledger.tools",
    "caseledger.metrics",
    "caseledger.outcome",
    "caseledger.campaign",
    "caseledger.case.model",
    "caseledger.case.target",
    "caseledger.case.service",
    "caseledger.case.dataset",
    "caseledger.case.measurement",
    "caseledger.case.decision",
    "caseledger.ledger.index",
    "numpy",
    "matplotlib",
    "transformers",
)


async def surface(ws: Workspace) -> dict[str, Any]:
    """Everything a client learns before calling anything, as it goes over the wire (aliases, no nulls)."""

    def wire(m: Any) -> Any:
        return m.model_dump(mode="json", by_alias=True, exclude_none=True)

    async with Client(build_server(ws)) as c:
        return {
            "instructions": c.instructions,
            "tools/list": wire(await c.list_tools()),
            "resources/list": wire(await c.list_resources()),
            "resources/templates/list": wire(await c.list_resource_templates()),
        }


def encoded(s: dict[str, Any]) -> str:
    return json.dumps(s, indent=1) + "\n"


def test_the_listed_surface_is_byte_identical_to_the_recorded_one(tmp_path: Path) -> None:
    got = encoded(anyio.run(surface, Workspace.open(tmp_path)))
    if os.environ.get("CASELEDGER_UPDATE_SURFACE") == "1":  # an intended change of a tool's description or schema
        SURFACE.write_text(got)
    assert got == SURFACE.read_text(), (
        "tools/list, the resources or the instructions changed; if intended: "
        "CASELEDGER_UPDATE_SURFACE=1 pytest tests/test_mcp_start.py, and review the diff"
    )
    assert len(json.dumps(json.loads(got)["tools/list"], separators=(",", ":"))) <= 8 * 1024


def test_the_published_file_is_what_the_models_give_now() -> None:
    assert pub.encode(pub.generate()) == pub.PUBLISHED_FILE.read_bytes(), (
        "caseledger/data/mcp_published.json is stale: run `caseledger schema --package`"
    )


def test_the_constants_spelled_again_equal_their_sources() -> None:
    from caseledger.case.model import SCENARIO_PATTERN
    from caseledger.metrics import RATIO_MAX, RATIO_MIN_EXCLUSIVE
    from caseledger.metrics._models import NATIVE_RULES

    assert pub.SCENARIO_PATTERN == SCENARIO_PATTERN
    assert get_args(pub.NativeRule) == NATIVE_RULES
    assert (pub.RATIO_MIN_EXCLUSIVE, pub.RATIO_MAX) == (RATIO_MIN_EXCLUSIVE, RATIO_MAX)


CHILD = """
import json, sys, anyio
from mcp import Client
import caseledger.cli  # what `caseledger mcp` imports before it serves
from caseledger.server import build_server
from caseledger.workspace import Workspace
HEAVY = %r
def loaded():
    return sorted(h for h in HEAVY if any(m == h or m.startswith(h + ".") for m in sys.modules))
async def main():
    async with Client(build_server(Workspace.open(sys.argv[1]))) as c:
        await c.list_tools(); await c.list_resources(); await c.list_resource_templates()
        before = loaded()
        status = await c.call_tool("phase_status", {})
        text = status.content[0].text
        after = loaded()
    print(json.dumps({"before": before, "after": after, "status": text, "status_error": status.is_error}))
anyio.run(main)
"""


@pytest.mark.integration
def test_a_session_lists_without_importing_the_tools_and_loads_them_at_the_first_call(tmp_path: Path) -> None:
    (tmp_path / "cases").mkdir()
    p = subprocess.run(
        [sys.executable, "-c", CHILD % (HEAVY,), str(tmp_path)], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["before"] == [], f"loaded before any call: {out['before']}"
    assert "caseledger.tools" in out["after"]  # the first call did import them: the check above is not vacuous
    # the tool itself answered: an empty workspace is a tool error naming the fix, not an import failure
    assert out["status_error"] and "no runs in this workspace yet; fix: freeze_case" in out["status"]


@pytest.mark.integration
def test_stdio_caseledger_mcp_lists_the_recorded_tools(tmp_path: Path) -> None:
    """The real `caseledger mcp` over stdio sends the recorded tools/list, whatever the in-process client does."""
    exe = Path(sys.executable).with_name("caseledger")
    msgs = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "0"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    ]
    p = subprocess.Popen(
        [str(exe), "mcp", "--workspace", str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert p.stdin is not None and p.stdout is not None
    answers: dict[int, Any] = {}
    try:
        p.stdin.write("".join(json.dumps(m) + "\n" for m in msgs))
        p.stdin.flush()  # stdin stays open until both answers are in: EOF ends the session
        while len(answers) < 2:
            line = p.stdout.readline()
            assert line, "the server closed stdout before answering"
            m = json.loads(line)
            answers[m["id"]] = m
    finally:
        p.stdin.close()
        p.wait(30)
    recorded = json.loads(SURFACE.read_text())
    assert answers[2]["result"]["tools"] == recorded["tools/list"]["tools"]
    assert answers[1]["result"]["instructions"] == recorded["instructions"]
