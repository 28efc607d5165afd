"""The resources as thin MCP adapters: HANDOFF.md, reports (markdown and HTML), the case schema, the scenario view.

Readers: a read writes nothing into the ledger (HTML pages are rendered in memory; report.md is the one the run's
decide phase wrote); only the derived index may catch up with files that changed. Each reads in a worker thread and
turns a `CaseledgerError` into a resource error naming the fix (the mapping is the tools', caseledger.server.toolset).
Light on purpose, as the tools are: what reads the ledger (the case models, the index, the tools' report renderers) is
imported by the first read that needs it, never at registration, so a session answers `initialize` and
`resources/list` without paying for those imports (tests/test_mcp_start.py).
"""

# No `from __future__ import annotations`: the SDK reads the adapters' annotations at registration.

import re

import anyio
import anyio.to_thread
from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError

from caseledger import redact
from caseledger.errors import CaseledgerError
from caseledger.ledger import calls
from caseledger.server.published import SCENARIO_PATTERN
from caseledger.server.toolset import bug_logged, tool_error
from caseledger.workspace import Workspace


def add_resources(mcp: MCPServer, ws: Workspace) -> None:
    """HANDOFF.md, reports (markdown and HTML), the case schema and the scenario view."""

    @mcp.resource(
        "caseledger://handoff",
        name="handoff",
        mime_type="text/markdown",
        description="HANDOFF.md: a few lines for a new session (state, owner, the one next "
        "action), regenerated from the ledger on every read",
    )
    async def handoff_md() -> str:
        try:
            return await anyio.to_thread.run_sync(_read_handoff, ws)
        except CaseledgerError as e:
            raise ResourceError(str(tool_error(e))) from e
        except Exception as e:  # a read-only workspace (HANDOFF.md is rewritten when it changed), or a bug
            raise ResourceError(str(tool_error(bug_logged("handoff", e)))) from e

    @mcp.resource(
        "caseledger://runs/{run_id}/report",
        name="run_report",
        mime_type="text/markdown",
        description="report.md of one run (written by its decide phase, and by reprocess_raw)",
    )
    async def run_report(run_id: str) -> str:
        return await anyio.to_thread.run_sync(_read_report, ws, run_id)

    _add_schemas(mcp)

    @mcp.resource(
        "caseledger://scenarios/{name}",
        name="scenario",
        mime_type="text/plain",
        description="The scenario view: one row per case (change, run, metric, percentiles, limit "
        "verdicts, decision); reads only",
    )
    async def scenario_rows(name: str) -> str:
        return await anyio.to_thread.run_sync(_read_scenario, ws, name)

    @mcp.resource(
        "caseledger://runs/{run_id}/report.html",
        name="run_report_html",
        mime_type="text/html",
        description="A run's report as one self-contained HTML page (rendered on read; nothing is written)",
    )
    async def run_report_html(run_id: str) -> str:
        return await anyio.to_thread.run_sync(_read_html, ws, [run_id], None)

    @mcp.resource(
        "caseledger://scenarios/{name}/report.html",
        name="scenario_report_html",
        mime_type="text/html",
        description="A scenario's report as one self-contained HTML page: rows, decisions, limits, "
        "latency CDFs, evidence flags",
    )
    async def scenario_report_html(name: str) -> str:
        return await anyio.to_thread.run_sync(_read_html, ws, [], name)

    @mcp.resource(
        "caseledger://campaigns/{campaign_id}/report.html",
        name="campaign_report_html",
        mime_type="text/html",
        description="A campaign's answer as one self-contained HTML page: points, "
        "the Pareto frontier, limits, latency CDFs, evidence flags",
    )
    async def campaign_report_html(campaign_id: str) -> str:
        return await anyio.to_thread.run_sync(_read_html, ws, [campaign_id], None)


def _add_schemas(mcp: MCPServer) -> None:
    """The case draft's schema (complete) and the campaign draft's (short, with an example per search kind)."""

    @mcp.resource(
        "caseledger://schema/case",
        name="case_schema",
        mime_type="application/json",
        description="The case draft's schema in short (a few KB): each section (target, service, dataset, load, "
        "measurement, decision, ...) with its description, its fields and the resource of its whole schema",
    )
    async def case_schema_index() -> str:
        from caseledger.case.schema import schema_index  # lazy: the case models

        return schema_index().decode()

    @mcp.resource(
        "caseledger://schema/case/{section}",
        name="case_schema_section",
        mime_type="application/schema+json",
        description="JSON Schema of one section of a case draft (e.g. service, load, decision) with the "
        "definitions it uses: every field with its bounds and description; 'all': the whole schema (~70 KB)",
    )
    async def case_schema_section(section: str) -> str:
        from caseledger.case.schema import section_schema  # lazy: the case models

        try:
            return section_schema(section).decode()
        except KeyError as e:
            raise ResourceError(str(e.args[0])) from None

    @mcp.resource(
        "caseledger://schema/campaign",
        name="campaign_schema",
        mime_type="application/schema+json",
        description="JSON Schema of a campaign draft (a few KB): axis paths in words (a flag by name, a "
        "component's flag, an env var), the repeat policy, one example per search kind (grid, knee, tpe, tpe "
        "with a knee, halving)",
    )
    async def campaign_schema_json() -> str:
        from caseledger.campaign.schema import campaign_schema  # lazy: the case models

        return campaign_schema().decode()


def _read_html(ws: Workspace, run_ids: list[str], scenario: str | None) -> str:
    """The HTML page of one run, scenario or campaign, rendered now in memory (`caseledger report --html` writes the
    same page for a person to open)."""
    if scenario is not None:
        _check_scenario_name(scenario)
    from caseledger.case.store import remember_secrets  # lazy: see the module's docstring
    from caseledger.tools.report import render_html

    try:
        remember_secrets(ws)
        return redact.mask(render_html(ws, run_ids, scenario=scenario).pages[0])
    except CaseledgerError as e:
        raise ResourceNotFoundError(str(tool_error(e))) from e
    except Exception as e:  # a bug (nothing is written here): the reader gets the fix either way
        raise ResourceError(str(tool_error(bug_logged("html report", e)))) from e


def _check_scenario_name(name: str) -> None:
    if not re.fullmatch(SCENARIO_PATTERN, name):
        raise ResourceNotFoundError(
            f"'{name[:60]}' is not a scenario name; fix: read caseledger://handoff for the current scenario"
        )


def _read_scenario(ws: Workspace, name: str) -> str:
    _check_scenario_name(name)
    from caseledger.case.store import remember_secrets  # lazy: see the module's docstring
    from caseledger.views.scenario import scenario_next, scenario_view  # lazy: see the module's docstring

    try:
        remember_secrets(ws)
        view = scenario_view(ws, name)
    except CaseledgerError as e:
        raise ResourceNotFoundError(str(tool_error(e))) from e
    return redact.mask(view.text() + f"\nnext: {scenario_next(view)}\n")


def _read_handoff(ws: Workspace) -> str:
    from caseledger.views import handoff  # lazy: see the module's docstring

    return handoff.refresh(ws, verify=True)


def _read_report(ws: Workspace, run_id: str) -> str:
    from caseledger.case.store import remember_secrets  # lazy: see the module's docstring
    from caseledger.ledger.runs import check_not_link

    try:
        paths = check_not_link(ws.run(run_id))  # an id that is no id, a run directory that is a link: refused
    except CaseledgerError as e:
        raise ResourceNotFoundError(str(tool_error(e))) from e
    if not paths.run_json.exists():
        raise ResourceNotFoundError(f"run {run_id} is not in the ledger; fix: phase_status() names the latest run")
    try:
        remember_secrets(ws)
        return redact.mask(paths.report_md.read_text())  # a report an older version wrote unmasked
    except FileNotFoundError:
        raise ResourceNotFoundError(
            f"run {run_id} has no report yet; fix: {calls.phase_status(run_id)}: its decide phase writes "
            f"it once results are extracted ({calls.reprocess_raw(run_id)} when postprocess failed)"
        ) from None
