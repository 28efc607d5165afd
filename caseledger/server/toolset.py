"""The six tools as thin MCP adapters over `caseledger.tools` (the resources: caseledger.server.resources).

Nothing here decides anything: every tool calls the plain function in a worker thread (they spawn processes
and poll), returns its short `.text()` as the text content (summarize adds its PNG as an image block) and
the validated model as structured content, and turns a `CaseledgerError` into a tool error naming the fix.

Light on purpose: `caseledger.tools` and whatever reads the ledger (the index, the result models, numpy) are
imported in the worker thread of the first call that needs them, never at registration, so a session answers
`initialize` and `tools/list` without paying about a second of imports (tests/test_mcp_start.py). The adapters'
signatures take their constants from caseledger.server.published for the same reason.
"""

# No `from __future__ import annotations`: the SDK reads the adapters' annotations at registration.

import base64
import inspect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol, TypeVar

import anyio
import anyio.from_thread
import anyio.to_thread
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import (
    CallToolResult,
    ImageContent,
    TextContent,
    ToolAnnotations,
)
from pydantic import BaseModel, Field, ValidationError

from caseledger import redact
from caseledger.errors import CaseInvalid, CaseledgerError, Unexpected, unexpected
from caseledger.ledger import calls
from caseledger.server.published import RATIO_MAX, RATIO_MIN_EXCLUSIVE, SCENARIO_PATTERN, NativeRule
from caseledger.workspace import Workspace
from caseledger.workspace.steps import Steps

if TYPE_CHECKING:
    from caseledger.tools import StatusResult

log = logging.getLogger("caseledger.server")


class _Result(Protocol):
    """What every tools.*Result offers: the short answer and the structured form."""

    def text(self) -> str: ...

    def model_dump(self, *, mode: str = ...) -> dict[str, Any]: ...  # JSON: what a tool answers with


_F = TypeVar("_F", bound=Callable[..., Any])


HEARTBEAT_S = 2.0  # progress cadence while a blocking tool runs (only sent when the client asked)


RUN_ID_PATTERN = r"^[rcg]-[0-9a-f]{6,64}$"  # a run; a case stands for its latest run; a campaign (g-)


CASE_ID_PATTERN = r"^[cg]-[0-9a-f]{6,64}$"  # a case, or a campaign (g-)


# The patterns are published for clients; the tool functions check ids themselves (check_id), so a bad id gets
# their message naming the fix rather than a bare schema error.
_RUN_ID = Field(
    description="Run id as returned by start_run, e.g. 'r-1a2b3c4d'", json_schema_extra={"pattern": RUN_ID_PATTERN}
)


def _answer(result: _Result, what: str, checked: bool) -> CallToolResult:
    """Short text for the model, the PNG where the result carries its chart (summarize); full structured content,
    checked against the result's model where `checked` (reprocess_raw, summarize: as the SDK checks a tool's declared
    output model, which these adapters cannot declare without importing the tools). The values of the workspace's
    secrets are masked in both: the last line of defence, for text an older version recorded unmasked."""
    secrets = redact.current()
    content: list[TextContent | ImageContent] = [TextContent(type="text", text=secrets.mask(result.text()))]
    chart = getattr(result, "chart", None)
    if isinstance(chart, bytes):
        content.append(ImageContent(type="image", mime_type="image/png", data=base64.b64encode(chart).decode()))
    structured = secrets.mask_obj(result.model_dump(mode="json"))
    if checked and isinstance(result, BaseModel):
        try:
            type(result).model_validate(structured)
        except ValidationError as e:
            raise tool_error(bug_logged(what, e)) from e
    return CallToolResult(content=list(content), structured_content=structured)


def bug_logged(what: str, e: Exception) -> CaseledgerError:
    """errors.unexpected(e); a bug's traceback goes to the log (a refused write is no bug)."""
    err = unexpected(e)
    if isinstance(err, Unexpected):
        log.error("%s failed unexpectedly", what, exc_info=e)
    return err


def tool_error(e: CaseledgerError) -> ToolError:
    message, fix = e.shown()
    return ToolError(f"{message}; fix: {fix or 'phase_status() shows where the latest run stands'}")


async def _off_loop(
    ctx: Context[Any, Any],
    ws: Workspace,
    what: str,
    fn: Callable[[], _Result],
    heartbeat_s: float | None = None,
    checked: bool = False,
    doing: Steps | None = None,
) -> CallToolResult:
    """Run a blocking tool function in a worker thread; heartbeat progress while it runs (heartbeat_s 0: none,
    the function reports its own), naming the slow step running then (`doing`, the Steps the function reports
    to); map errors; mask the values of the workspace's secrets in the answer (checked: the structured content
    against the result's model)."""
    every = HEARTBEAT_S if heartbeat_s is None else heartbeat_s

    def call() -> _Result:
        from caseledger.case.store import remember_secrets  # lazy: see the module's docstring

        remember_secrets(ws)  # the frozen cases' secret variables, new ones included, before the answer is made
        return fn()

    async def heartbeat() -> None:
        t0 = anyio.current_time()
        while True:
            await anyio.sleep(every)
            elapsed = anyio.current_time() - t0
            now = doing.current() if doing is not None else None
            try:
                await ctx.report_progress(elapsed, None, f"{what}: {now + ', ' if now else ''}{elapsed:.0f}s")
            except Exception:  # a lost progress channel must not fail the call itself
                log.debug("progress notification failed", exc_info=True)
                return

    outcome: list[_Result | Exception] = []
    async with anyio.create_task_group() as tg:
        if every > 0:
            tg.start_soon(heartbeat)
        try:
            outcome.append(await anyio.to_thread.run_sync(call))
        except Exception as e:  # re-raised below, outside the task group (no exception group)
            outcome.append(e)
        finally:
            tg.cancel_scope.cancel()
    result = outcome[0]
    if isinstance(result, CaseledgerError):
        raise tool_error(result) from result
    if isinstance(result, Exception):  # a read-only workspace, or a bug: the agent gets the fix either way
        raise tool_error(bug_logged(what, result)) from result
    return _answer(result, what, checked)


def _notifier(ctx: Context[Any, Any]) -> Callable[["StatusResult"], None]:
    """A wait's progress callback (it runs in the worker thread): a progress notification each time the run's
    progress value grows (report_progress sends nothing unless the request carried a progress token)."""
    last = [-1.0]

    def notify(s: "StatusResult") -> None:
        from caseledger.tools.phase_status import phases_progress  # lazy: loaded by the wait that calls this

        value, total, message = phases_progress(s)
        if value <= last[0]:
            return
        last[0] = value
        try:
            anyio.from_thread.run(ctx.report_progress, value, total, redact.mask(message))
        except Exception:  # a lost progress channel must not fail the wait itself
            log.debug("progress notification failed", exc_info=True)

    return notify


def _tool(mcp: MCPServer, name: str, annotations: ToolAnnotations) -> Callable[[_F], _F]:
    """Register an adapter under `name`; its docstring, dedented, is the description agents read."""

    def register(fn: _F) -> _F:
        mcp.add_tool(fn, name=name, description=inspect.cleandoc(fn.__doc__ or ""), annotations=annotations)
        return fn

    return register


def add_tools(mcp: MCPServer, ws: Workspace) -> None:
    """The run tools: freeze_case, start_run, phase_status (registered in this order: tools/list keeps it)."""
    for register in (_freeze_case, _start_run, _phase_status):
        register(mcp, ws)


def add_result_tools(mcp: MCPServer, ws: Workspace) -> None:
    """The tools that continue or read runs: resume, reprocess_raw, summarize."""
    for register in (_resume, _reprocess_raw, _summarize):
        register(mcp, ws)


# Each function below registers one tool. The plain functions are imported inside the worker thread's call
# (`lazy`): see the module's docstring.


def _freeze_case(mcp: MCPServer, ws: Workspace) -> None:
    @_tool(
        mcp,
        "freeze_case",
        annotations=ToolAnnotations(
            title="Freeze a case draft",
            read_only_hint=False,
            idempotent_hint=True,
            destructive_hint=False,
            open_world_hint=False,
        ),
    )
    async def freeze_case(
        ctx: Context[Any, Any],
        path: Annotated[
            str | None,
            Field(description="Workspace-relative draft file, e.g. 'cases/ref-baseline.json' (path or draft)"),
        ] = None,
        draft: Annotated[
            dict[str, Any] | None,  # JSON: a draft as the client sent it; freeze_case validates it
            Field(description="Inline draft: the JSON object a cases/*.json file holds (path or draft)"),
        ] = None,
        parent: Annotated[
            str | None,
            Field(
                description="Parent case id, e.g. 'c-1a2b3c4d5e6f'; overrides the draft's",
                json_schema_extra={"pattern": CASE_ID_PATTERN},
            ),
        ] = None,
    ) -> CallToolResult:
        """Validate a case draft (fields: resource caseledger://schema/case), fill defaults, materialize its
        dataset, store it under its content hash (same content: same case_id). Returns the case_id, the delta
        against the parent and the plan (phases run, reused or skipped). Next: start_run(case_id). A campaign
        draft {"campaign": {name, base (a draft or a case id), axes: [{path, values}], search: {kind:
        grid|knee|tpe|halving}, decision: {primary_metric, limits}, repeats}} returns a g-... id (fields, axis paths
        such as 'service.argv[-np]' and an example per kind: resource caseledger://schema/campaign). The decision
        section is the scenario's, not part of any id: changing a limit re-decides, sending nothing."""
        if (path is None) == (draft is None):
            raise tool_error(
                CaseInvalid(
                    "freeze_case needs exactly one of path or draft",
                    f"{calls.freeze_case('cases/x.json')} or freeze_case(draft={{...}})",
                )
            )

        steps = Steps()  # the heartbeat names the slow step running (hashing a GGUF, converting its tokenizer, ...)

        def call() -> _Result:
            from caseledger.tools import freeze_any  # lazy: see the module's docstring

            # resolved against the workspace (never the server's cwd), refused if it escapes it
            return freeze_any(ws, path, draft=draft, parent=parent, cwd_first=False, steps=steps)

        return await _off_loop(ctx, ws, "freezing the case", call, doing=steps)


def _start_run(mcp: MCPServer, ws: Workspace) -> None:
    @_tool(
        mcp,
        "start_run",
        # destructive: the service phase may stop a live service caseledger started to switch it to this
        # case's identity (only under authorization single/auto); not idempotent: each call is a new run.
        annotations=ToolAnnotations(
            title="Start a run",
            read_only_hint=False,
            idempotent_hint=False,
            destructive_hint=True,
            open_world_hint=True,
        ),
    )
    async def start_run(
        ctx: Context[Any, Any],
        case_id: Annotated[
            str,
            Field(
                description="Case id from freeze_case, e.g. 'c-1a2b3c4d5e6f', or a campaign "
                "id 'g-...' (runs every point it needs, no further call)",
                json_schema_extra={"pattern": CASE_ID_PATTERN},
            ),
        ],
        preflight_only: Annotated[
            bool, Field(description="Only check the case in a fresh socket-less process: no run, lease or request")
        ] = False,
        queue: Annotated[
            bool,
            Field(description="Target held by another run: preflight now, start when it frees (authorization auto)"),
        ] = False,
    ) -> CallToolResult:
        """Start a run of a frozen case: take the target's lease, spawn the detached controller, return once
        preflight passed or failed; the run goes on in its controller. Next: phase_status(run_id)."""

        def call() -> _Result:
            from caseledger.tools import start_any  # lazy: see the module's docstring

            return start_any(ws, case_id, preflight_only=preflight_only, queue=queue)

        return await _off_loop(ctx, ws, "preflight", call)


def _phase_status(mcp: MCPServer, ws: Workspace) -> None:
    @_tool(
        mcp,
        "phase_status",
        annotations=ToolAnnotations(title="Where a run stands", read_only_hint=True, open_world_hint=False),
    )
    async def phase_status(
        ctx: Context[Any, Any],
        run_id: Annotated[
            str | None,
            Field(
                description="Run id, e.g. 'r-1a2b3c4d', or a campaign id 'g-...'; omit for the latest run",
                json_schema_extra={"pattern": RUN_ID_PATTERN},
            ),
        ] = None,
        wait_s: Annotated[
            float,
            Field(
                ge=0,
                le=600,
                description="Wait up to this many seconds (at most 600; keep it under your client's tool timeout) "
                "until the run or campaign ends or needs you (see until) before answering; 0: at once",
            ),
        ] = 0.0,
        until: Annotated[
            Literal["end", "change"],
            Field(
                description="What a wait answers on: 'end' (default): the run ends, fails or needs you (a stopped "
                "process, a dead controller), a campaign completes, stops or is paused; 'change': the next change "
                "(a phase, a campaign's point), to follow it step by step"
            ),
        ] = "end",
    ) -> CallToolResult:
        """Where a run stands (events checked against evidence): phase, requests sent/done, load ended,
        results extracted, enough to decide, what the next step would repeat, the next call. wait_s: answer
        when something changes instead of polling with sleep."""

        def call() -> _Result:
            from caseledger.tools import status_any  # lazy: see the module's docstring

            return status_any(ws, run_id, wait_s=wait_s, progress=_notifier(ctx), until=until)

        # a bounded wait notifies from the state it polls (phases finished, the load's requests done): the
        # elapsed-time heartbeat would break the rule that a progress value only grows
        return await _off_loop(ctx, ws, "status", call, heartbeat_s=0 if wait_s > 0 else None)


def _resume(mcp: MCPServer, ws: Workspace) -> None:
    @_tool(
        mcp,
        "resume",
        # destructive for the same reason as start_run: its service phase may switch a live service
        annotations=ToolAnnotations(
            title="Resume a run at its failed phase",
            read_only_hint=False,
            idempotent_hint=False,
            destructive_hint=True,
            open_world_hint=True,
        ),
    )
    async def resume(
        ctx: Context[Any, Any],
        run_id: Annotated[str, _RUN_ID],
    ) -> CallToolResult:
        """Continue the SAME run at its first unfinished phase; finished phases are kept (service, warm
        caches, an ended load; a live load client is re-attached). Next: phase_status(run_id)."""

        def call() -> _Result:
            from caseledger.tools import resume_any  # lazy: see the module's docstring

            return resume_any(ws, run_id)

        return await _off_loop(ctx, ws, "resuming", call)


def _reprocess_raw(mcp: MCPServer, ws: Workspace) -> None:
    @_tool(
        mcp,
        "reprocess_raw",
        annotations=ToolAnnotations(
            title="Recompute results from raw data",
            read_only_hint=False,
            idempotent_hint=True,
            destructive_hint=False,
            open_world_hint=False,
        ),
    )
    async def reprocess_raw(
        ctx: Context[Any, Any],
        run_id: Annotated[str, _RUN_ID],
        rule: Annotated[
            NativeRule | None, Field(description="Native (steady-state) window rule; omit for the case's")
        ] = None,
        ratio: Annotated[
            float | None,
            Field(
                gt=RATIO_MIN_EXCLUSIVE,
                le=RATIO_MAX,
                description="sglang rule: share of peak concurrency, e.g. 0.9; omit for the case's",
            ),
        ] = None,
    ) -> CallToolResult:
        """Recompute a run's results from its raw records in a fresh process (versioned, nothing
        overwritten); without rule/ratio also re-decide. Sends no request. Next: summarize."""

        def call() -> _Result:
            from caseledger.tools import reprocess_raw  # lazy: see the module's docstring

            return reprocess_raw(ws, run_id, rule=rule, ratio=ratio)

        return await _off_loop(ctx, ws, "reprocessing", call, checked=True)


def _summarize(mcp: MCPServer, ws: Workspace) -> None:
    @_tool(
        mcp,
        "summarize",
        # read-only: it writes nothing into the ledger (its chart is drawn in memory where no writer drew it);
        # only the derived index may catch up with files that changed since it last read them
        annotations=ToolAnnotations(
            title="Summarize a scenario or runs",
            read_only_hint=True,
            idempotent_hint=True,
            destructive_hint=False,
            open_world_hint=False,
        ),
    )
    async def summarize(
        ctx: Context[Any, Any],
        run_ids: Annotated[
            list[str],
            Field(
                max_length=16,
                description="Runs side by side (whole vs whole, native vs native), or one "
                "campaign id (its answer); omit for the scenario view",
                json_schema_extra={"items": {"pattern": RUN_ID_PATTERN}},
            ),
        ] = [],  # noqa: B006 - the SDK copies arguments per call; never mutated
        scenario: Annotated[
            str | None,
            Field(
                description="Scenario name; omit (and run_ids) for the latest scenario",
                json_schema_extra={"pattern": SCENARIO_PATTERN},
            ),
        ] = None,
    ) -> CallToolResult:
        """One row per case of a scenario: change vs baseline (e.g. C=8), latest valid run, decision metric,
        TTFT/TPOT/ITL/E2E p50/p99, limit verdicts, decision, best within limits; or given runs. Adds a PNG;
        writes nothing (a run's report.md: resource caseledger://runs/{run_id}/report)."""

        def call() -> _Result:
            from caseledger.tools.summarize import chart_png, summarize  # lazy: see the module's docstring

            result = summarize(ws, run_ids, scenario=scenario)
            return result.with_chart(chart_png(ws, result))

        return await _off_loop(ctx, ws, "summarizing", call, checked=True)
