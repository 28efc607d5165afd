"""The six tools on a campaign id (g-...): freeze_case takes a campaign draft, start_run and resume start its
driver, phase_status shows its progress (with a bounded wait), summarize its answer."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

from caseledger.campaign.costs import (
    Costs,
    engine_model,
    estimate,
    expected_runs,
    learn,
    run_costs,
    said_estimate,
    service_key,
)
from caseledger.campaign.search import Price
from caseledger.campaign.store import Campaign, freeze_campaign, load_campaign, startable_cases
from caseledger.campaign.view import CampaignView, campaign_view, driver_alive
from caseledger.case.model import Case
from caseledger.case.plan import decision_words
from caseledger.case.store import load_case
from caseledger.errors import CaseInvalid
from caseledger.ledger import calls
from caseledger.ledger.runs import scan_runs
from caseledger.ledger.state import fold
from caseledger.run.admission.admit import check_start
from caseledger.run.campaign_driver import spawn, stamp
from caseledger.run.progress import ProgressLine
from caseledger.run.resume import ResumeResult, resume
from caseledger.tools.phase_status import MAX_WAIT_S, StatusResult, Until, check_wait, phase_status
from caseledger.tools.start_run import StartResult, start_run
from caseledger.views import handoff
from caseledger.workspace import Workspace, check_id, is_id

WAIT_POLL_S = 0.5


class CampaignFrozen(BaseModel):
    campaign_id: str = Field(description="Content hash id of the campaign (base case and axes)")
    created: bool = Field(description="False when the same campaign was already frozen")
    name: str
    scenario: str
    base_case: str
    points: dict[str, str] = Field(description="Point label -> its frozen case id")
    search: str
    decision_change: str | None = Field(None, description="What this freeze changed in the scenario's decision")
    policy_changed: bool = Field(description="The search or repeat policy changed with this freeze")
    estimate: str = Field(
        "",
        description="What it is expected to spend (measurements, service starts, minutes), from the costs the "
        "workspace's runs measured (or assumed, said so), against its budget",
    )
    next_call: str

    def text(self) -> str:
        pts = ", ".join(f"{k} {v}" for k, v in list(self.points.items())[:8])
        more = f" (+{len(self.points) - 8})" if len(self.points) > 8 else ""
        lines = [
            f"campaign {self.campaign_id} ({'new' if self.created else 'already frozen'}) {self.name}, "
            f"scenario {self.scenario}, base {self.base_case}: {self.search}",
            f"points: {pts}{more}",
            self.estimate,
        ]
        if self.decision_change:
            lines.append(
                f"scenario decision: {self.decision_change}; every point re-decided from its results, 0 requests sent"
            )
        lines.append(f"next: {self.next_call}")
        return "\n".join(lines)


def freeze(ws: Workspace, obj: dict[str, Any], source: str) -> CampaignFrozen:  # JSON: a campaign draft
    f = freeze_campaign(ws, obj, source, price=lambda base: _price(ws, base))
    c = f.campaign
    change = decision_words(f.decision_before, c.decision) if f.decision_before is not None else None
    r = c.repeats
    search = c.describe() + f"; runs {r.runs}, settle {r.settle_runs}, budget {r.budget}"
    return CampaignFrozen(
        campaign_id=c.campaign_id,
        created=f.created,
        name=c.name,
        scenario=c.scenario,
        base_case=c.base_case,
        points={p.label: p.case_id for p in c.points},
        search=search,
        decision_change=change if change != "unchanged" else None,
        policy_changed=f.policy_changed,
        estimate=_estimate(ws, c),
        next_call=(
            f"{calls.summarize([c.campaign_id])} shows it re-decided"
            if change and not f.created
            else f"{calls.start_run(c.campaign_id)} runs it to the end; then {calls.summarize([c.campaign_id])}"
        ),
    )


def _price(ws: Workspace, base: Case) -> Price:
    """What a start and a request of the base's service cost, as the workspace's runs measured them."""
    return learn(run_costs(ws), service_key(base), engine_model(base)).price()


def _estimate(ws: Workspace, c: Campaign) -> str:
    """The campaign's expected spend, from the costs learned from the workspace's finished runs."""
    facts = run_costs(ws)
    base = load_case(ws, c.base_case)
    cases = {p.case_id: load_case(ws, p.case_id) for p in c.points}
    by_key = {service_key(k): k for k in cases.values()}
    said = learn(facts, service_key(base), engine_model(base))

    def costs(key: str) -> Costs:
        case = by_key.get(key)
        return learn(facts, key, engine_model(case)) if case is not None else said

    points = {cid: (service_key(k), k.load.requests) for cid, k in cases.items()}
    runs = expected_runs(c, points, (service_key(base), base.load.requests))
    return said_estimate(estimate(runs, costs), said, c.repeats.budget, c.budget)


VIEW_EVERY_S = 2.0  # a waiting start reads the campaign's view this often, its running point's state every poll


def start(ws: Workspace, gid: str, *, wait: bool = False, progress: ProgressLine | None = None) -> CampaignView:
    """Start the campaign's driver unless one is alive; the answer is its progress right after, or with wait
    when the campaign is complete or its driver stopped. Before anything is written, the one check of every start
    (run/admission/admit.py) over every case the campaign can name now: a refused value stops the start here, in the
    words start_run would use, instead of a driver refused at every point. progress: sees the running point's state and
    the points done of total."""
    check_id(gid, "case_id", "g")
    camp = load_campaign(ws, gid)
    if not driver_alive(ws, gid):
        cases = startable_cases(ws, camp)
        check_start(f"campaign {gid}", cases)
        keep: set[str] = set()
        for _, case in cases:
            keep |= case.env_names()
        spawn(ws, gid, keep)
        handoff.refresh(ws)
    view = campaign_view(ws, gid)
    ids = {p.case_id for p in camp.points}
    while wait and view.driver_alive and not view.complete:
        if progress is not None:
            done = ("measured", "skipped", "given_up", "refused")
            progress.points = (sum(r.status in done for r in view.rows), len(view.rows))
        mine = [m.run_id for m in scan_runs(ws).metas if m.case_id in ids]
        until = time.monotonic() + VIEW_EVERY_S
        while time.monotonic() < until:
            if progress is not None and mine:
                progress(fold(ws, mine[-1]))
            time.sleep(WAIT_POLL_S / 2)
        view = campaign_view(ws, gid)
    return view


def campaign_needs_caller(v: CampaignView) -> bool:
    """The campaign is complete, its driver stopped, or it cannot go on without the caller (a paused
    authorization): what a default wait (until='end') answers on."""
    return v.complete or not v.driver_alive or v.authorization == "paused"


def status(ws: Workspace, gid: str, wait_s: float = 0.0, until: Until = "end") -> CampaignView:
    """The campaign's progress; wait_s > 0: answer when it is complete, its driver stops or it needs the caller
    (until='end'), or at its next change (until='change': a point starts or ends, the driver waits), polling a
    cheap mark rather than the view."""
    check_id(gid, "run_id", "g")
    first = campaign_view(ws, gid)
    if wait_s <= 0 or campaign_needs_caller(first):
        return first
    deadline = time.monotonic() + min(wait_s, MAX_WAIT_S)
    mark = stamp(ws, gid)
    while time.monotonic() < deadline:
        time.sleep(min(WAIT_POLL_S, max(0.0, deadline - time.monotonic())))
        if stamp(ws, gid) == mark:
            continue
        if until == "change":
            break
        mark, view = stamp(ws, gid), campaign_view(ws, gid)
        if campaign_needs_caller(view):
            return view
    return campaign_view(ws, gid)


def start_any(ws: Workspace, case_id: str, **kw: Any) -> StartResult | CampaignView:
    """The start_run tool: a case id starts a run, a campaign id its driver (wait and progress apply to both)."""
    if is_id(case_id, "g"):
        if kw.get("preflight_only"):  # it would start the campaign: its points send load
            raise CaseInvalid(
                f"preflight_only checks one case; {case_id} is a campaign (its driver preflights each point as it "
                "starts it)",
                f"{calls.start_run('c-...', preflight_only=True)} on one of its points (freeze_case listed them), "
                f"or {calls.start_run(case_id)} to run it; nothing was started",
            )
        return start(ws, case_id, wait=kw.get("wait", False), progress=kw.get("progress"))
    return start_run(ws, case_id, **kw)


def status_any(
    ws: Workspace,
    run_id: str | None,
    wait_s: float = 0.0,
    progress: Callable[[StatusResult], None] | None = None,
    until: Until = "end",
) -> StatusResult | CampaignView:
    """The phase_status tool: a run (or a case's latest run), or a campaign's progress. progress: a run's
    bounded wait hands it every status it reads; until: what a wait answers on (phase_status.UNTIL)."""
    if run_id is not None and is_id(run_id, "g"):
        check_wait(wait_s)
        return status(ws, run_id, wait_s, until)
    return phase_status(ws, run_id, wait_s=wait_s, progress=progress, until=until)


def resume_any(ws: Workspace, run_id: str, **kw: Any) -> ResumeResult | CampaignView:
    """The resume tool: a run at its failed phase, or a campaign (its driver again: running points are waited
    for, failed ones resumed at their phase, finished ones never run again)."""
    if is_id(run_id, "g"):
        return start(ws, run_id, wait=kw.get("wait", False), progress=kw.get("progress"))
    return resume(ws, run_id, **kw)
