"""freeze_case: validate a draft, fill defaults, store it under its content hash; delta and plan."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from caseledger import datasets, services
from caseledger.campaign.store import is_campaign_draft
from caseledger.case.model import Case
from caseledger.case.plan import (
    DeltaItem,
    Live,
    PlanStep,
    argv_change,
    decision_words,
    delta,
    freeze_warnings,
    plan,
)
from caseledger.case.store import (
    check_parent,
    load_case,
    read_draft,
    record_decision,
    refuse_unfilled,
    store,
    validate,
)
from caseledger.errors import CaseInvalid
from caseledger.ledger import calls
from caseledger.ledger.leases import target_key
from caseledger.ledger.runs import scan_runs
from caseledger.ledger.state import fold
from caseledger.tools import campaigns
from caseledger.workspace import Workspace
from caseledger.workspace.steps import Steps


class FreezeResult(BaseModel):
    case_id: str = Field(description="Content hash id of the frozen case")
    created: bool = Field(description="False when identical content was already frozen (nothing written)")
    scenario: str
    parent: str | None
    dataset_id: str | None = Field(description="Materialized dataset id (entries, hash, token counts)")
    delta: list[DeltaItem] = Field(description="Changed field paths against the parent, old -> new, impact class")
    plan: list[PlanStep] = Field(description="For each phase: run, reuse, check or skip, with the reason")
    path: str = Field(description="Where the frozen case is stored (read-only)")
    runs: list[str] = Field(default_factory=list, description="Runs of this case so far, oldest first")
    latest_run_state: str | None = Field(None, description="State of the latest run of this case, if any")
    next_call: str = Field("", description="The one next call")
    decision_change: str | None = Field(
        None,
        description="What this freeze changed in the scenario's decision (objective, limits, min_effect): "
        "every case of the scenario is re-decided from its results, no request sent; null: unchanged",
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="What the case will measure that it may not mean (frozen all the same), each with its fix",
    )

    def text(self) -> str:
        if self.delta:
            d = ", ".join(
                f"{x.path} {argv_change(x.old, x.new) or f'{x.old}->{x.new}'} [{x.impact}]" for x in self.delta[:4]
            )
            d += f" (+{len(self.delta) - 4})" if len(self.delta) > 4 else ""
        elif self.parent == self.case_id:
            d = "none: the same measurement as its parent (one case; parent and note do not change the id)"
        elif self.parent:
            d = f"none against parent {self.parent}"
        else:
            d = "none (no parent)"
        p = " ".join(f"{s.phase}={s.action}" for s in self.plan)
        lines = [
            f"case {self.case_id} ({'new' if self.created else 'already frozen'}), scenario {self.scenario}, "
            f"dataset {self.dataset_id}",
            f"delta: {d}",
            f"plan: {p}",
        ]
        if self.runs:
            more = f" (+{len(self.runs) - 1} earlier)" if len(self.runs) > 1 else ""
            lines.append(f"measured: {self.runs[-1]} {self.latest_run_state}{more}")
        if self.decision_change:
            lines.append(
                f"scenario decision: {self.decision_change}; every case re-decided from its results, 0 requests sent"
            )
        lines += [f"WARNING: {w}" for w in self.warnings]
        lines.append(f"next: {self.next_call}")
        return "\n".join(lines)


def freeze_case(
    workspace: Workspace,
    path: str | Path | None = None,
    *,
    draft: dict[str, Any] | None = None,  # JSON: a case draft
    parent: str | None = None,
    cwd_first: bool = True,
    steps: Steps | None = None,
) -> FreezeResult:
    """Freeze a case draft (a file path or an inline dict). Identical content returns the same id, writes nothing.
    cwd_first: a relative path is looked up in the current directory before the workspace (the CLI). steps: told
    each slow step (hashing a GGUF, converting its tokenizer, generating the dataset) that lasts its after_s."""
    obj, source = _read(workspace, path, draft, cwd_first)
    with steps.active() if steps is not None else nullcontext():
        return _freeze(workspace, obj, source, parent)


def _freeze(
    workspace: Workspace,
    obj: dict[str, Any],  # JSON: a case draft
    source: str,
    parent: str | None,
) -> FreezeResult:
    if is_campaign_draft(obj):
        raise CaseInvalid(
            f"{source} is a campaign draft, not a case",
            "freeze it with the freeze_case tool or `caseledger freeze` (tools.freeze_any takes both)",
        )
    if parent is not None:
        obj["parent"] = parent
    case = datasets.pin(workspace, validate(obj, source))  # a trace's sha256 joins the case (and dataset) id
    parent_case = check_parent(workspace, case.parent)
    if case.dataset.source == "file" and case.dataset.path:
        workspace.inside(case.dataset.path, "dataset.path")
    datasets.check_generation(workspace, [("", case)], source)  # a bounded freeze, refused before anything is written
    dataset_id = _materialize(workspace, case)
    cid, created = store(workspace, case, source)
    # the decision section is the scenario's, not the case's: a draft that writes one makes it current
    before = record_decision(workspace, case.scenario, case.decision, f"case {cid}") if "decision" in obj else None
    case = load_case(workspace, cid)  # with its lineage: a lookup without parent keeps the recorded one
    parent_case = check_parent(workspace, case.parent) if case.parent != cid else None
    runs = [m.run_id for m in scan_runs(workspace).metas if m.case_id == cid]
    state = fold(workspace, runs[-1]) if runs else None
    if state is None:
        nxt = calls.start_run(cid)
    elif state.state.value in ("succeeded", "partial"):
        nxt = f"{calls.run_succeeded(state.run_id)} — already measured; {calls.start_run(cid)} repeats it"
    else:
        nxt = state.next_call
    return FreezeResult(
        case_id=cid,
        created=created,
        scenario=case.scenario,
        parent=case.parent,
        dataset_id=dataset_id,
        delta=(changes := delta(parent_case, case)),
        plan=_preview(workspace, case, changes, parent_case is not None),
        path=str(workspace.frozen_case(cid)),
        runs=runs,
        latest_run_state=state.state.value if state else None,
        next_call=nxt,
        decision_change=(
            words if before is not None and (words := decision_words(before, case.decision)) != "unchanged" else None
        ),
        warnings=freeze_warnings(case),
    )


def _read(
    ws: Workspace,
    path: str | Path | None,
    draft: dict[str, Any] | None,  # JSON: a case draft
    cwd_first: bool,
) -> tuple[dict[str, Any], str]:  # JSON: a case draft
    if draft is not None:
        obj, source = dict(draft), "inline draft"
    elif path is None:
        raise CaseInvalid("freeze_case needs a draft", "give path='cases/x.json' or an inline draft object")
    else:
        obj, source = read_draft(ws, path, cwd_first=cwd_first)
    refuse_unfilled(obj, source)  # a template's value left for its user: named before anything is checked
    return obj, source


def freeze_any(
    workspace: Workspace,
    path: str | Path | None = None,
    *,
    draft: dict[str, Any] | None = None,  # JSON: a case draft
    parent: str | None = None,
    cwd_first: bool = True,
    steps: Steps | None = None,
) -> FreezeResult | campaigns.CampaignFrozen:
    """The freeze_case tool: a case draft, or a campaign draft ({"campaign": {...}}), which freezes the campaign
    and every point as cases. steps: as freeze_case's."""
    obj, source = _read(workspace, path, draft, cwd_first)
    if not is_campaign_draft(obj):
        with steps.active() if steps is not None else nullcontext():
            return _freeze(workspace, obj, source, parent)  # the draft read once
    if parent is not None:
        raise CaseInvalid(
            "parent is not a field of a campaign",
            "name the base with campaign.base_case (a frozen case id) instead; nothing was written",
        )
    obj = _base_from_file(workspace, obj, cwd_first)
    with steps.active() if steps is not None else nullcontext():
        return campaigns.freeze(workspace, obj, source)


def _base_from_file(ws: Workspace, obj: dict[str, Any], cwd_first: bool) -> dict[str, Any]:  # JSON: a campaign draft
    """campaign.base given as a case draft's path ('cases/vllm.json', as freeze_case's path reads it): that draft,
    read now, so a campaign and the case it sweeps share one file to fill."""
    body = obj.get("campaign")
    base = body.get("base") if isinstance(body, dict) else None
    if not (isinstance(body, dict) and isinstance(base, str) and base.endswith(".json")):
        return obj
    draft, _ = _read(ws, base, None, cwd_first)
    draft.pop("$schema", None)
    return {**obj, "campaign": {**body, "base": draft}}


def _preview(ws: Workspace, case: Case, changes: list[DeltaItem], has_parent: bool) -> list[PlanStep]:
    """The plan shown at freeze: against the live target when this case's service is up now (what start_run
    would do), else against the parent (what it will do when the parent's service is up)."""
    alive, warm, routes = services.live_state(ws, case, target_key(case.canonical()))
    return plan(case, changes, has_parent, Live(service=True, warm=warm, routes=routes) if alive else None)


def _materialize(ws: Workspace, case: Any) -> str:

    return datasets.materialize(ws, case).dataset_id
