"""The MCP server's surface in memory: six flat, honestly annotated tools with short answers and structured
content, errors that name the fix, resources, and a blocking tool off the event loop. The transports:
tests/test_mcp_server.py."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, MCPError
from mcp.types import CallToolResult, TextResourceContents

import caseledger.server.toolset as toolset
from caseledger import tools
from caseledger.server import build_server
from caseledger.workspace import Workspace
from tests.conftest import free_port, tree_digest
from tests.helpers import SHORT, SIX, baseline_draft, mcp_workspace, text_of

pytestmark = pytest.mark.anyio


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return mcp_workspace(tmp_path)


# ------------------------------------------------------------------------------------- in memory: the surface


async def test_lists_exactly_the_six_tools_with_honest_annotations(ws: Workspace) -> None:
    async with Client(build_server(ws)) as c:
        listed = {t.name: t for t in (await c.list_tools()).tools}
    assert sorted(listed) == sorted(SIX)
    a = {n: t.annotations for n, t in listed.items()}
    for name in ("phase_status", "summarize"):  # readers: they write nothing into the ledger
        ann = a[name]
        assert ann is not None and ann.read_only_hint
    for name in ("freeze_case", "reprocess_raw"):
        ann = a[name]
        assert ann is not None and ann.idempotent_hint and not ann.read_only_hint and ann.destructive_hint is False
    for name in ("start_run", "resume"):  # a new run / attempt each call; may switch a live service
        ann = a[name]
        assert ann is not None and not ann.read_only_hint and not ann.idempotent_hint and ann.destructive_hint


async def test_tools_list_fits_8_kb_with_described_flat_inputs_and_id_patterns(ws: Workspace) -> None:
    async with Client(build_server(ws)) as c:
        answer = await c.list_tools()
    listed = answer.tools
    # the result as it goes over the wire (camelCase aliases, no nulls, compact JSON): every session pays it
    size = len(
        json.dumps(answer.model_dump(mode="json", by_alias=True, exclude_none=True), separators=(",", ":")).encode()
    )
    assert size <= 8 * 1024, f"tools/list is {size} bytes"
    for t in listed:
        schema = json.dumps(t.input_schema)
        assert "$ref" not in schema and "$defs" not in schema, t.name  # flat: no nested models
        for name, prop in t.input_schema["properties"].items():
            assert prop.get("description"), f"{t.name}.{name} has no description"
        assert t.description and "\n        " not in t.description  # dedented for the model
    props = {t.name: t.input_schema["properties"] for t in listed}
    assert set(props["freeze_case"]) == {"path", "draft", "parent"}
    assert props["summarize"]["run_ids"]["type"] == "array"
    run_pattern = props["resume"]["run_id"]["pattern"]
    assert props["summarize"]["run_ids"]["items"]["pattern"] == run_pattern == toolset.RUN_ID_PATTERN
    case_pattern = props["freeze_case"]["parent"]["pattern"]
    assert props["start_run"]["case_id"]["pattern"] == case_pattern == toolset.CASE_ID_PATTERN
    assert "title" not in json.dumps([t.input_schema for t in listed])  # generated titles are noise
    by_name = {t.name: t for t in listed}
    assert "caseledger://schema/case" in (by_name["freeze_case"].description or "")
    out = by_name["summarize"].output_schema  # the typed answer, with the decision words where agents read it
    assert out and out["type"] == "object" and "$defs" not in out
    assert all(
        w in out["properties"]["scenario"]["description"] for w in ("baseline:", "keep:", "close:", "insufficient:")
    )
    assert set(props["start_run"]) == {"case_id", "preflight_only", "queue"}  # no wait knob over MCP


async def test_decision_words_are_in_the_server_instructions_and_the_case_schema_is_a_resource(ws: Workspace) -> None:
    async with Client(build_server(ws)) as c:
        instructions = c.instructions
        schema = await c.read_resource("caseledger://schema/case")
        with pytest.raises(MCPError, match="has no frozen case"):
            await c.read_resource("caseledger://scenarios/nothing-here")
        templates = [t.uri_template for t in (await c.list_resource_templates()).resource_templates]
    assert instructions is not None
    for word in ("baseline:", "keep:", "close:", "insufficient:"):
        assert instructions.count(word) == 1, word
    body = schema.contents[0]
    assert isinstance(body, TextResourceContents)
    index = json.loads(body.text)
    assert (
        len(body.text.encode()) <= 8192
        and index["sections"]["decision"]["schema"] == "caseledger://schema/case/decision"
    )
    assert "caseledger://scenarios/{name}" in templates and "caseledger://schema/case/{section}" in templates


async def test_every_section_of_the_case_schema_index_is_reachable_and_whole(ws: Workspace) -> None:
    """The index names a resource for each section; each holds the section's whole schema (its $defs included),
    and together they hold every definition of the whole schema."""
    async with Client(build_server(ws)) as c:
        index = json.loads(_text(await c.read_resource("caseledger://schema/case")))
        uris = {name: s["schema"] for name, s in index["sections"].items() if "schema" in s}
        parts = {name: json.loads(_text(await c.read_resource(uri))) for name, uri in uris.items()}
        whole = json.loads(_text(await c.read_resource(index["whole"])))
        with pytest.raises(MCPError, match="no case section 'nope'"):
            await c.read_resource("caseledger://schema/case/nope")
    assert {"target", "service", "dataset", "load", "measurement", "decision"} <= set(uris)
    assert "tpot_p99_ms" in parts["decision"]["$defs"]["Limits"]["properties"]
    assert "limits" in parts["decision"]["properties"] and "argv" in parts["service"]["properties"]
    used = {d for p in parts.values() for d in p.get("$defs", {})} | {p.get("title") for p in parts.values()}
    assert set(whole["$defs"]) <= used, set(whole["$defs"]) - used


def _text(r: Any) -> str:
    body = r.contents[0]
    assert isinstance(body, TextResourceContents)
    return str(body.text)


async def test_freeze_case_answers_short_text_with_structured_case_id(ws: Workspace) -> None:
    async with Client(build_server(ws)) as c:
        r = await c.call_tool("freeze_case", {"path": "cases/draft.json"})
        again = await c.call_tool("freeze_case", {"draft": json.loads((ws.root / "cases/draft.json").read_text())})
    assert not r.is_error, text_of(r)
    assert r.structured_content is not None
    cid = r.structured_content["case_id"]
    assert cid.startswith("c-") and r.structured_content["created"] is True
    assert len(text_of(r).encode()) < SHORT
    assert f"start_run(case_id='{cid}')" in text_of(r)
    assert not text_of(r).lstrip().startswith("{")  # the short answer, not the JSON dump
    assert again.structured_content is not None
    assert again.structured_content["case_id"] == cid and again.structured_content["created"] is False


async def test_phase_status_of_unknown_run_is_a_tool_error_naming_the_fix(ws: Workspace) -> None:
    async with Client(build_server(ws)) as c:
        r = await c.call_tool("phase_status", {"run_id": "r-0123abcd"})
        latest = await c.call_tool("phase_status", {})
    assert r.is_error
    t = text_of(r)
    assert "r-0123abcd" in t and "fix:" in t and "start_run(" in t
    assert latest.is_error and "freeze_case(" in text_of(latest)


async def test_malformed_draft_is_a_tool_error_naming_the_field(ws: Workspace) -> None:
    bad = baseline_draft(free_port())
    bad["load"]["requests"] = "many"
    async with Client(build_server(ws)) as c:
        r = await c.call_tool("freeze_case", {"draft": bad})
    assert r.is_error
    assert "load.requests" in text_of(r) and "fix:" in text_of(r)
    assert not (ws.ledger / "cases").exists() or not any((ws.ledger / "cases").iterdir())


@pytest.mark.parametrize(
    ("tool", "args", "said"),
    [
        ("start_run", {"case_id": "c-0123456789ab", "wait": "yes"}, "start_run: unknown argument 'wait'"),
        ("start_run", {"case_id": "c-0123456789ab", "preflight_only": "yes"}, "argument 'preflight_only' 'yes' is"),
        ("start_run", {"case_id": 12}, "start_run: argument 'case_id' 12 is not of type 'string'"),
        ("start_run", {}, "start_run: argument 'case_id' is missing; fix: pass it"),
        ("phase_status", {"run_id": "r-0123abcd", "wait_s": "soon"}, "argument 'wait_s' 'soon' is not of type"),
    ],
)
async def test_tool_arguments_of_the_wrong_name_or_type_are_refused_naming_the_argument_and_the_fix(
    ws: Workspace, tool: str, args: dict[str, Any], said: str
) -> None:
    before = tree_digest(ws.root)
    async with Client(build_server(ws)) as c:
        r = await c.call_tool(tool, args)
    assert r.is_error and said in text_of(r) and "fix:" in text_of(r), text_of(r)
    assert tree_digest(ws.root) == before
    async with Client(build_server(ws)) as c:  # a JSON string for a number is read as JSON, as the SDK does
        ok = await c.call_tool("phase_status", {"run_id": "r-0123abcd", "wait_s": "0"})
    assert "'r-0123abcd' is not in the ledger" in text_of(ok), text_of(ok)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"path": "../outside.json"}, "outside the workspace"),
        ({}, "exactly one of path or draft"),
        ({"path": "cases/draft.json", "draft": {"scenario": "x"}}, "exactly one of path or draft"),
        ({"path": "cases/missing.json"}, "does not exist"),
    ],
)
async def test_freeze_case_path_is_workspace_relative_and_exclusive(
    ws: Workspace, args: dict[str, Any], expected: str
) -> None:
    (ws.root.parent / "outside.json").write_text(json.dumps(baseline_draft(free_port())))
    async with Client(build_server(ws)) as c:
        r = await c.call_tool("freeze_case", args)
    assert r.is_error and expected in text_of(r) and "fix:" in text_of(r)


async def test_the_campaign_schema_is_a_short_resource_whose_examples_freeze(ws: Workspace) -> None:
    """caseledger://schema/campaign: a few KB (the case schema is ~66 KB), the axis paths in words, an example per
    search kind; each example validates against it, and one frozen with its base given as a case id (as agents
    write it) gives the same campaign as with base_case."""
    import jsonschema

    from caseledger.campaign.model import CampaignDraft
    from caseledger.tools import freeze_any, freeze_case
    from tests.conftest import ref_draft

    async with Client(build_server(ws)) as c:
        body = (await c.read_resource("caseledger://schema/campaign")).contents[0]
        listed = {t.name: t for t in (await c.list_tools()).tools}
    size = len(body.text.encode())  # five search kinds with their fields and an example each
    assert isinstance(body, TextResourceContents) and size < 10_240, size
    doc = json.loads(body.text)
    assert "service.argv[-np]" in doc["description"] and "settle_runs" in doc["description"]
    kinds = [ex["campaign"].get("search", {}).get("kind", "auto") for ex in doc["examples"]]
    assert sorted(kinds) == ["auto", "grid", "halving", "knee", "tpe"], kinds  # auto: no kind, a budget
    assert set(doc["properties"]["search"]["oneOf"][2]["$ref"].split("/")[-1:]) == {"TpeSearch"}
    assert "axis" not in doc["$defs"]["GridSearch"]["properties"]  # each kind its own fields
    for ex in doc["examples"]:
        jsonschema.validate(ex["campaign"], doc)
        CampaignDraft.model_validate(ex["campaign"])  # and the model's own checks (monotone, limits, paths)
    assert "caseledger://schema/campaign" in (listed["freeze_case"].description or "")
    base = freeze_case(ws, draft=ref_draft(18011, scenario="by-id")).case_id
    grid = json.loads(json.dumps(doc["examples"][kinds.index("knee")]))
    grid["campaign"]["base"] = base
    by_id = freeze_any(ws, draft=grid)
    del grid["campaign"]["base"]
    grid["campaign"]["base_case"] = base
    again = freeze_any(ws, draft=grid)
    assert by_id.campaign_id == again.campaign_id and not again.created  # type: ignore[union-attr]


async def test_resources_handoff_and_report_errors(ws: Workspace) -> None:
    async with Client(build_server(ws)) as c:
        templates = [t.uri_template for t in (await c.list_resource_templates()).resource_templates]
        handoff = await c.read_resource("caseledger://handoff")
        with pytest.raises(MCPError, match=r"not in the ledger; fix: phase_status"):
            await c.read_resource("caseledger://runs/r-0123abcd/report")
        with pytest.raises(MCPError, match="not a valid id"):
            await c.read_resource("caseledger://runs/r-x/report")
    assert "caseledger://runs/{run_id}/report" in templates
    body = handoff.contents[0]
    assert isinstance(body, TextResourceContents) and body.text.startswith("# HANDOFF")
    assert (ws.root / "HANDOFF.md").exists()  # regenerated on read


async def test_report_resource_reads_the_runs_report_md(ws: Workspace) -> None:
    paths = ws.run("r-0123abcd")
    paths.root.mkdir(parents=True)
    paths.run_json.write_text("{}")
    async with Client(build_server(ws)) as c:
        with pytest.raises(MCPError, match=r"no report yet; fix: phase_status\(run_id='r-0123abcd'\): its decide"):
            await c.read_resource("caseledger://runs/r-0123abcd/report")
        paths.report_md.write_text("# Run r-0123abcd\n")
        r = await c.read_resource("caseledger://runs/r-0123abcd/report")
    assert isinstance(r.contents[0], TextResourceContents) and r.contents[0].text == "# Run r-0123abcd\n"


async def test_blocking_tool_runs_off_the_event_loop_and_heartbeats_progress(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    real = tools.freeze_any  # the freeze_case tool's entry (a case or a campaign draft)

    def slow_freeze(*a: Any, **k: Any) -> Any:
        assert release.wait(10)
        return real(*a, **k)

    monkeypatch.setattr(tools, "freeze_any", slow_freeze)
    monkeypatch.setattr(toolset, "HEARTBEAT_S", 0.05)
    beats: list[tuple[float, str | None]] = []

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        beats.append((progress, message))

    out: list[CallToolResult] = []
    async with Client(build_server(ws)) as c, anyio.create_task_group() as tg:

        async def freeze() -> None:
            out.append(await c.call_tool("freeze_case", {"path": "cases/draft.json"}, progress_callback=progress))

        tg.start_soon(freeze)
        with anyio.fail_after(5):  # answered while freeze_case is still blocked in its thread
            status = await c.call_tool("phase_status", {})
        assert status.is_error and not out
        with anyio.fail_after(10):  # bounded: a freeze that never blocks fails here, not hangs the suite
            while len(beats) < 2:
                await anyio.sleep(0.02)
        release.set()
    assert out and not out[0].is_error
    assert beats[0][1] is not None and beats[0][1].startswith("freezing the case")
    assert [p for p, _ in beats] == sorted(p for p, _ in beats)
