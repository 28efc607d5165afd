"""A campaign's answer and progress, read from the ledger (writes nothing): what each point measured (its valid
runs' objective and limits, their noise), the planner's next points and skips, the winner or the tie, the
Pareto frontier, and the time ledger (service starts, the share of the wall time spent in formal windows)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import Field

from caseledger import procs
from caseledger.campaign import budget, drift, planner, pool, resolution
from caseledger.campaign.costs import Costs, engine_model, learn, run_costs
from caseledger.campaign.costs import service_key as service_key  # where the driver finds it
from caseledger.campaign.costs import started_service as started_service
from caseledger.campaign.model import GridSearch, setting_label
from caseledger.campaign.search import REQUESTS
from caseledger.campaign.store import (
    Campaign,
    Point,
    driver_events,
    driver_file,
    host_refusals,
    load_campaign,
    scenario_campaigns,
    waiting_on,
)
from caseledger.case.metrics import LIMITS, METRICS
from caseledger.case.model import Case
from caseledger.case.store import load_case
from caseledger.errors import quoted
from caseledger.ledger import authorization, calls
from caseledger.ledger.event_types import SearchEnded
from caseledger.ledger.runs import RunMeta, load_run, scan_runs
from caseledger.ledger.state import RunState, fold
from caseledger.metrics import FrozenModel, HostLoad, Interval, Result, latest_result
from caseledger.outcome.decide import LimitVerdict
from caseledger.outcome.summary import latency_samples, time_ledger, valid, window_stat
from caseledger.workspace import Workspace, read_json_or_none

if TYPE_CHECKING:  # numpy's types only: these modules import numpy lazily
    from caseledger.metrics import F64


SHOWN = ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms")  # every row shows these beside its limits
PointStatus = Literal[
    "measured",
    "screened",
    "running",
    "queued",
    "pending",
    "skipped",
    "given_up",
    "over_budget",
    "refused",
    "not_needed",
]


PointVerdict = Literal["winner", "tie", "loses", "uncertain", "not measured"]


class PointRun(FrozenModel):
    """One run of a point, as the answer counts it."""

    run_id: str
    metric: float | None = Field(description="The objective on the decision window (null: no valid figure)")
    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    other_cpu: float | None = Field(description="Share of the host's CPU other processes used in its window")
    counts: Literal["valid", "distorted", "invalid", "failed", "set aside", "running"] = Field(
        description="valid: counted; distorted/invalid/failed: repeated, never counted; set aside: before a "
        "confirmed change of the target; running"
    )
    why: str | None = Field(None, description="Why it does not count")


def point_verdict(
    case_id: str, runs: int, uncertain: bool, winner: str | None, tie: list[str], unsettled: list[str]
) -> PointVerdict:
    """The one word every view gives a point (campaign rows, scenario rows, HANDOFF.md, a point's run): winner or
    tie from the answer; uncertain when a limit straddles its bound, or it is the leader or the runner-up of an
    answer not settled yet (`unsettled`); loses when measured and settled below; not measured before a valid
    run."""
    if case_id == winner:
        return "winner"
    if case_id in tie:
        return "tie"
    if runs == 0:
        return "not measured"
    if uncertain or (case_id in unsettled and winner is None and not tie):
        return "uncertain"
    return "loses"


def unsettled(pl: planner.Standing) -> list[str]:
    """The leader and the runner-up while their gap is not settled: the points the answer may still name."""
    if pl.settled or pl.tie:
        return []
    return [c for c in (pl.leader, pl.runner_up) if c]


class PointRow(FrozenModel):
    """One point of a campaign: what it measured over its valid runs."""

    label: str = Field(description="Its axis values, e.g. 'C=8' or '-np=2 C=8'")
    case_id: str = Field(description="The point's frozen case")
    status: PointStatus = Field(
        description="measured: has valid runs; screened: a halving screen, measured with fewer requests (never "
        "the answer); running; queued: the planner runs it next; pending: the search may "
        "still need it; skipped: implied by a measured point (reason); given_up: its runs gave no valid result; "
        "over_budget: its next run would pass the campaign's budget; refused: the host refused to start it (why: its "
        "policy's words and the fix; a new start checks again); not_needed: the answer does not depend on it"
    )
    why: str | None = Field(None, description="Why it runs next, is skipped or was given up")
    runs: int = Field(description="Valid runs (distorted, invalid or failed runs are repeated, never counted)")
    metric_mean: float | None = Field(description="The objective, mean over its valid runs")
    noise_rel: float | None = Field(
        description="Its noise: the larger of the within-run interval and the run-to-run "
        "spread, relative; null: not measured"
    )
    run_to_run: str = Field(description="'±x% over n runs', or 'unknown (1 run)'")
    limits: dict[str, str] = Field(
        description="Per limit: its percentile over the valid runs' requests pooled, with the 95% interval "
        "(runs and requests resampled), the bound and the verdict: meets or breaks when the interval is on one side "
        "of the bound, uncertain when it straddles it; and in how many runs it was met, e.g. '59.2 [51, 66.4] "
        "pooled over 48 requests in 3 run(s) <= 60: uncertain (met in 2/3 runs)'"
    )
    meets: bool | None = Field(
        description="Every limit's pooled figure within its bound (some perhaps uncertain); null: not measured"
    )
    verdicts: list[LimitVerdict] = Field(
        default_factory=list, description="Each limit as data: pooled figure, bound, verdict, met in k/n runs"
    )
    uncertain: list[str] = Field(
        default_factory=list,
        description="Limits whose interval straddles the bound, e.g. 'tpot_p99_ms met in 2/3 runs'",
    )
    requests: int | None = Field(description="Successful requests the latest run's percentiles rest on")
    per_user_tok_s: float | None = Field(description="Output tok/s per user (1000 / TPOT p50) of the latest run")
    per_card_tok_s: float | None = Field(description="Output tok/s per card of the latest run")
    pareto: bool = Field(False, description="On the Pareto frontier (tok/s per card vs tok/s per user) within limits")
    latency: dict[str, float] = Field(
        default_factory=dict,
        description="TTFT and TPOT p50 and p99 (ms), each the mean over its valid runs: beside the limits' verdicts",
    )
    verdict: PointVerdict = Field(
        "not measured",
        description="The answer's word for the point, the same in every view: winner, tie, loses, uncertain (a "
        "limit's interval straddles its bound, or it leads unsettled), not measured (see status and why)",
    )
    run_list: list[PointRun] = Field(
        default_factory=list, description="Every run of the point: its figures, host contention, and whether it counts"
    )
    run_ids: list[str] = Field(default_factory=list, description="Its runs, oldest first")
    sent: int = Field(0, description="Formal requests sent to it over all its runs and load attempts")
    on: list[str] = Field(
        default_factory=list, description="A pool's: the target of each valid run, oldest first (empty: one target)"
    )
    cases: dict[str, str] = Field(default_factory=dict, description="A pool's: target -> the point's case there")


class CampaignView(FrozenModel):
    """A campaign: progress, every point, and its one answer."""

    campaign_id: str
    name: str
    scenario: str
    objective: str = Field(description="primary_metric on window, and which way is better")
    limits: list[str] = Field(description="The scenario's limits, e.g. 'tpot_p99_ms<=40'")
    search: str = Field(description="grid, knee on the axis, or tpe with its budget")
    rows: list[PointRow]
    complete: bool = Field(description="Nothing is left to run: the answer is final for these limits")
    answer: str = Field(description="The winner with its interval, a tie within noise, or why there is none")
    winner: str | None = Field(description="Case id of the winner (null: none yet, or a tie)")
    tie: list[str] = Field(default_factory=list, description="The pair tied within noise (case ids)")
    pareto: list[str] = Field(default_factory=list, description="Labels on the Pareto frontier")
    notes: list[str] = Field(default_factory=list, description="What the answer must add (monotonicity broken...)")
    controls: list[str] = Field(
        default_factory=list, description="Per service identity, its control: measured again to see the target drift"
    )
    drift: str | None = Field(None, description="How and when the target changed twice (then no winner)")
    pool: list[str] = Field(
        default_factory=list,
        description="A pool's targets: runs on each, and a target refused because its measured identity differs",
    )
    progress: dict[str, Any] = Field(  # JSON: progress figures
        description="points measured/running/queued/skipped/given_up, runs, sent (formal requests over every "
        "run and load attempt), service starts, elapsed_s, formal_window_share"
    )
    driver_alive: bool = Field(description="The campaign's driver process is alive (it starts queued points)")
    authorization: str = Field("", description="paused starts no new point")
    waiting: str | None = Field(
        None,
        description="Why the driver waits now (a paused authorization, a target held by another run or campaign, "
        "a service another workspace keeps on the target), with the fix; null when it is not waiting",
    )
    plan: list[str] = Field(
        default_factory=list, description="The next points the planner runs, in order, with why (at most 3)"
    )
    budget: str | None = Field(
        None,
        description="What it spent of its budget and what is left, e.g. 'budget: 18/25 measurements, 3/6 starts, "
        "9.5/30 min (left: 7 measurements, 3 starts, 20.5 min)'; null: no budget",
    )
    budget_end: str | None = Field(None, description="Why the budget ended it (a run it did not start); null: not")
    untested: str | None = Field(
        None, description="Ended by its budget: the points never measured, e.g. '3 of 6 points never measured: ...'"
    )
    uncertain: list[str] = Field(
        default_factory=list,
        description="Ended by its budget: the points whose verdict the noise still decides (a limit's interval "
        "straddles its bound; the leader and runner-up within noise)",
    )
    next_call: str

    def text(self, rows: bool = True) -> str:
        p = self.progress
        head = f"campaign {self.campaign_id} {self.name} ({self.scenario}): {self.search}; {self.objective}" + (
            f"; limits {', '.join(self.limits)}" if self.limits else ""
        )
        share = p.get("formal_window_share")
        prog = (
            f"points {p['measured']} measured, "
            + (f"{p['screened']} screened, " if p.get("screened") else "")
            + f"{p['running']} running, {p['queued'] + p['pending']} queued or "
            f"pending, {p['skipped']} skipped, {p['given_up']} given up"
            + (f", {p['refused']} refused by the host" if p.get("refused") else "")
            + f"; {p['runs']} runs, "
            f"{p.get('sent', 0)} formal requests sent, "
            f"{p['service_starts']} service start(s), "
            f"{p['elapsed_s']:.0f} s"
            + (f", {share:.0%} in formal windows" if share is not None else "")
            + f"; driver {'alive' if self.driver_alive else 'stopped'}"
            + (f"; authorization {self.authorization}" if self.authorization not in ("auto", "") else "")
        )
        lines = [head, prog]
        if self.waiting and self.driver_alive:
            lines.append(f"driver waiting: {self.waiting}")
        if rows:
            for r in self.rows:
                lim = "; ".join(f"{k} {v}" for k, v in r.limits.items())
                fig = (
                    f" {_n(r.metric_mean)} {planner.pm(r.noise_rel)} run-to-run {r.run_to_run}"
                    if r.metric_mean is not None
                    else ""
                )
                n = f" n={r.requests}" if r.requests is not None else ""
                n += _latency(r.latency)
                mark = " *" if r.case_id == self.winner else " =" if r.case_id in self.tie else ""
                mark += " (control)" if r.case_id in self.controls else ""
                why = f" — {r.why}" if r.why and r.status != "measured" else ""
                on = f" on {','.join(r.on)}" if r.on else ""
                word = r.verdict if r.runs and r.status not in ("running", "queued") else r.status
                lines.append(f"{r.label}{mark} {r.case_id} {word}{fig}{n}{on}{' | ' + lim if lim else ''}{why}")
                lines += [f"  {_run_line(x)}" for x in r.run_list]
        lines.append(("campaign complete: " if self.complete else "so far: ") + self.answer)
        if self.budget:
            lines.append(self.budget + (f"; ended at the budget: {self.budget_end}" if self.budget_end else ""))
        if self.untested:
            lines.append(f"untested: {self.untested}")
        if self.uncertain:
            lines.append(f"still uncertain: {'; '.join(self.uncertain)}")
        if self.pareto:
            lines.append("pareto (tok/s per card vs per user): " + ", ".join(self.pareto))
        lines += [f"note: {x}" for x in self.notes]
        lines += [f"pool {x}" for x in self.pool]
        if self.plan and not self.complete:
            lines.append("plan: " + "; ".join(self.plan))
            lines.append(
                "pause: caseledger authorize paused (the running point finishes, none starts); stop: caseledger "
                "target stop (drivers, then the running point, which ends partial with every record it has, then "
                "services)"
            )
        lines.append(f"next: {self.next_call}")
        return "\n".join(lines)


def _pct(x: float) -> str:
    """A relative spread in percent; one too small to show at 0.1% is '<0.1%', never a claimed 0.0%."""
    return "<0.1%" if abs(x) < 0.0005 else f"{x:.1%}"


def _n(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}"


@dataclass(frozen=True)
class _Extra:
    run_ids: list[str]
    requests: int | None
    per_user: float | None
    per_card: float | None
    latency: dict[str, list[float]] = field(default_factory=dict)  # SHOWN and decision.tie_break, per valid run


def _run_line(x: PointRun) -> str:
    """'r-1a2b3c4d 28.1 TTFT p99 1.8e+03 TPOT p99 55 ms, other CPU 12%: valid'."""
    host = f", other CPU {x.other_cpu:.0%}" if x.other_cpu is not None else ""
    lat = f" TTFT p99 {_n(x.ttft_p99_ms)} TPOT p99 {_n(x.tpot_p99_ms)} ms" if x.ttft_p99_ms is not None else ""
    why = f" ({quoted(x.why, 160)})" if x.why else ""
    return f"{x.run_id} {_n(x.metric)}{lat}{host}: {x.counts}{why}"


def _latency(lat: dict[str, float]) -> str:
    """' | TTFT p50/p99 120/310 TPOT p50/p99 5.1/6.2 ms': the figures a person reads beside the limits."""
    if not lat:
        return ""
    said = [f"{w} p50/p99 {_n(lat.get(k + '_p50_ms'))}/{_n(lat.get(k + '_p99_ms'))}" for k, w in _WORDS]
    return " | " + " ".join(said) + " ms"


_WORDS = (("ttft", "TTFT"), ("tpot", "TPOT"))


def _observe_point(
    ws: Workspace, camp: Campaign, point: Point, metas: list[RunMeta], refused: dict[str, str]
) -> tuple[planner.PointObs, _Extra]:
    d, window = camp.decision, camp.decision.window
    cid, label, values = point.case_id, point.label, point.values
    ids = set(point.case_ids)
    own = [m for m in metas if m.case_id in ids and point.target_of(m.case_id) not in refused]
    targets: list[str] = []  # a pool's: each valid run's target
    metric: list[float] = []
    when: list[str] = []
    run_rel: list[float | None] = []
    others: list[float | None] = []  # each valid run's other processes' CPU share of the host
    limit_values: dict[str, list[float]] = {k: [] for k in d.limits.bounds()}
    latency: dict[str, list[float]] = {k: [] for k in (*SHOWN, d.tie_break)}  # per valid run
    pool: list[dict[str, F64]] = []  # per valid run: its window's per-request samples (limits only)
    latest_valid: tuple[str, Result] | None = None
    bad, active, problem, sent = 0, None, None, 0  # sent: formal requests the target got, every run and attempt
    for m in own:
        view = fold(ws, load_run(ws, m.run_id))
        sent += 0 if m.load_reuse else view.counts.sent_all
        if view.state in (RunState.RUNNING, RunState.CREATED) or view.controller_alive:
            active = m.run_id
            continue
        bad += len(view.counts.earlier)  # a load sent again by a resume: each earlier attempt gave no result
        r = latest_result(ws.run(m.run_id).root)
        v = window_stat(r.windows.of(window), d.primary_metric) if r is not None and valid(r, window) else None
        if r is None or v is None:
            bad += 1
            fc = f" [{view.failure_class}]" if view.failure_class else ""
            problem = (view.state.value if r is None else _why_invalid(r, window)) + fc
            continue
        metric.append(v)
        targets.append(point.target_of(m.case_id))
        w = r.windows.of(window)
        when.append(m.created_utc)
        others.append(r.host.other_share if isinstance(r.host, HostLoad) else None)
        run_rel.append(
            w.noise.half_width_rel if isinstance(w.noise, Interval) and w.noise.metric == d.primary_metric else None
        )
        for name, into in (*limit_values.items(), *latency.items()):
            if (lv := window_stat(w, name)) is not None:
                into.append(lv)
        if limit_values:  # the requests the limits' pooled percentiles rest on (the window's, run by run)
            span = (w.start_s, w.end_s) if w.start_s is not None and w.end_s is not None else None
            pool.append(latency_samples(ws, m.run_id, span))
        latest_valid = (m.run_id, r)
    interval_rel: float | None = None
    limits: dict[str, planner.LimitObs] = {}
    requests = per_user = per_card = None
    if latest_valid is not None:
        _, r = latest_valid
        w = r.windows.of(window)
        n = w.noise
        interval_rel = n.half_width_rel if isinstance(n, Interval) and n.metric == d.primary_metric else None
        requests = w.ok
        tpot50 = window_stat(w, "tpot_p50")
        per_user = 1000.0 / tpot50 if tpot50 else None
        per_card = window_stat(w, "output_throughput_per_card")
    for name, bound in d.limits.bounds().items():
        limits[name] = _limit(name, bound, limit_values[name], pool)
    obs = planner.PointObs(
        case_id=cid,
        label=label,
        values=values,
        service_key=service_key(load_case(ws, cid)),
        metric=metric,
        interval_rel=interval_rel,
        limits=limits,
        bad_runs=bad,
        active=active,
        last_problem=problem,
        when=when,
        run_rel=run_rel,
        others=others,
        sent=sent,
        screen=REQUESTS in values and all(a.path != REQUESTS for a in camp.axes),
        targets=targets if camp.pool else [],
    )
    extra = _Extra([m.run_id for m in own], requests, per_user, per_card, latency)
    return obs, extra


def _limit(limit: str, bound: float, values: list[float], pool: list[dict[str, F64]]) -> planner.LimitObs:
    """A limit at a point: its value per valid run and, for a percentile of per-request samples (TTFT, TPOT,
    E2E), the percentile over the valid runs' requests pooled with its two-stage bootstrap interval
    (metrics.pooled); ITL (no per-request samples) rests on the runs' mean and spread."""
    m = LIMITS[limit]
    if not values:
        return planner.LimitObs(bound=bound, values=values, half_width=None)
    from caseledger.metrics import pooled  # lazy: numpy, only where a limit's samples are pooled

    iv = pooled(f"{m.figure}_{m.stat}", pool) if any(m.figure in p for p in pool) else None
    if not isinstance(iv, Interval):
        return planner.LimitObs(bound=bound, values=values, half_width=None)
    return planner.LimitObs(
        bound=bound, values=values, half_width=None, pooled=iv.point, low=iv.low, high=iv.high, requests=iv.requests
    )


def run_list(ws: Workspace, metas: list[RunMeta], camp: Campaign, cut: str | None) -> list[PointRun]:
    """Every run of a point as the answer counts it: valid, distorted, invalid or failed (repeated, never
    counted), set aside (before a confirmed change of the target), or running; with its figures and the share of
    the host other processes used."""
    d = camp.decision
    out = []
    for m in metas:
        view = fold(ws, load_run(ws, m.run_id))
        r = latest_result(ws.run(m.run_id).root)
        w = r.windows.of(d.window) if r is not None else None
        fig = {k: window_stat(w, k) if w is not None else None for k in ("ttft_p99_ms", "tpot_p99_ms")}
        host = r.host.other_share if r is not None and isinstance(r.host, HostLoad) else None
        counts: Any = "valid"
        why = None
        if view.state in (RunState.RUNNING, RunState.CREATED) or view.controller_alive:
            counts = "running"
        elif r is None or w is None or not valid(r, d.window):
            why = view.state.value if r is None else _why_invalid(r, d.window)
            counts = "distorted" if why.startswith("distorted") else "failed" if r is None or r.failed else "invalid"
        elif cut is not None and m.created_utc < cut:
            counts, why = "set aside", f"before the target changed ({cut})"
        metric = window_stat(w, d.primary_metric) if w is not None and counts != "failed" else None
        out.append(PointRun(run_id=m.run_id, metric=metric, **fig, other_cpu=host, counts=counts, why=why))
    return out


def _why_invalid(r: Result, window: str) -> str:
    w = r.windows.of(window)
    if w.distorted:
        return "distorted: " + w.distorted[0]
    if w.invalid:
        return f"{w.invalid} response(s) with server counts that fail the checks"
    if r.failed:
        return f"{r.failed} failed request(s)"
    if not w.found:
        return f"no {window} window"
    return "below the window's minimums"


def observe(ws: Workspace, camp: Campaign) -> tuple[list[planner.PointObs], dict[str, _Extra], list[RunMeta]]:
    """Every point's observations, oldest run first, and the metas of the campaign's runs (a pool's refused
    targets' runs count for no point: see campaign/pool.py)."""
    metas = scan_runs(ws).metas
    ids = {c for p in camp.points for c in p.case_ids}
    mine = [m for m in metas if m.case_id in ids]
    refused = pool.check(ws, camp, mine).refused if camp.pool else {}
    barred = host_refusals(ws, camp.campaign_id)
    obs, extra = [], {}
    for p in camp.points:
        o, e = _observe_point(ws, camp, p, mine, refused)
        # refused by the host on every target it has: the point cannot run (on a pool, the others may take it)
        no = [barred[c] for c in p.case_ids if c in barred]
        obs.append(replace(o, why=p.why, refused=no[0] if no and len(no) == len(p.case_ids) else None))
        extra[p.case_id] = e
    return obs, extra, mine


def started_at(ws: Workspace, campaign_id: str) -> float | None:
    d = read_json_or_none(driver_file(ws, campaign_id)) or {}
    v = d.get("first_started_unix")
    return float(v) if isinstance(v, int | float) else None


def driver_alive(ws: Workspace, campaign_id: str) -> bool:
    return procs.alive(read_json_or_none(driver_file(ws, campaign_id)))


def current_standing(
    ws: Workspace, camp: Campaign
) -> tuple[planner.Standing, list[planner.PointObs], dict[str, _Extra], list[RunMeta]]:
    obs, extra, mine = observe(ws, camp)
    primary = {c: p.case_id for p in camp.points for c in p.case_ids}  # a pool's: any target's case -> the point
    live = next((o.service_key for m in reversed(mine) for o in obs if o.case_id == primary.get(m.case_id)), None)
    higher = METRICS[camp.decision.primary_metric].higher_is_better
    acct = account(ws, camp, mine) if camp.budget.given() else None
    pl = planner.standing(
        obs, camp.search, camp.repeats, higher, live, camp.decision.min_effect, open_search=search_open(ws, camp, acct)
    )
    if acct is not None:
        _within_budget(ws, camp, pl, obs, live, acct)
    return pl, obs, extra, mine


def search_open(ws: Workspace, camp: Campaign, acct: budget.Account | None = None) -> bool:
    """A strategy that proposes points (search kind 'tpe') may still propose one: its max_points and the budget's
    measurements and minutes are not spent, and its driver has not recorded that it ended (converged, the space
    measured whole, a proposal the budget refused) at this many points."""
    if not camp.search.proposes:
        return False
    if camp.search.cap is not None and len(camp.points) >= camp.search.cap:
        return False
    if camp.budget.given() and (acct or account(ws, camp)).exhausted() is not None:
        return False
    return search_ended(ws, camp) is None


def account(ws: Workspace, camp: Campaign, mine: list[RunMeta] | None = None) -> budget.Account:
    """What the campaign spent against its budget: its runs, the service starts among them, and the minutes since
    its driver first started (until it ended, while no driver is alive)."""
    if mine is None:
        ids = {c for p in camp.points for c in p.case_ids}
        mine = [m for m in scan_runs(ws).metas if m.case_id in ids]
    info = read_json_or_none(driver_file(ws, camp.campaign_id)) or {}
    since = started_at(ws, camp.campaign_id)
    end = time.time()
    if not procs.alive(info) and isinstance(info.get("ended_utc"), str):
        end = datetime.fromisoformat(str(info["ended_utc"]).replace("Z", "+00:00")).timestamp()
    return budget.Account(
        camp.budget,
        measurements=len(mine),
        starts=sum(started_service(ws, m) for m in mine) if camp.budget.starts is not None else 0,
        minutes=max(0.0, end - since) / 60 if since is not None else 0.0,
    )


def costs_of(ws: Workspace) -> Callable[[Case], Costs]:
    """A case's costs, learned from the workspace's finished runs (campaign/costs.py), read from the ledger once."""
    facts = run_costs(ws)
    return lambda case: learn(facts, service_key(case), engine_model(case))


def run_minutes(case: Case, start: bool, costs: Callable[[Case], Costs]) -> float:
    """A run of this case's estimated minutes (with its service start when `start`)."""
    return costs(case).run_s(case.load.requests, start) / 60


def _within_budget(
    ws: Workspace,
    camp: Campaign,
    pl: planner.Standing,
    obs: list[planner.PointObs],
    live: str | None,
    acct: budget.Account,
) -> None:
    """The budget on the planner's next runs, the one place it is enforced: the next runs in order, each booked
    while it fits (a start where its service is not the one running before it; its minutes estimated from the
    ledger); a run that would pass the budget leaves `next` with why. Nothing left to run for it: the budget ended
    the campaign."""
    by_id = {o.case_id: o for o in obs}
    costs = costs_of(ws) if camp.budget.minutes is not None else None
    keep: list[tuple[str, str]] = []
    for cid, why in pl.next:
        o = by_id[cid]
        case = load_case(ws, cid)
        start = o.service_key != live and case.service.traits.launched
        refused = acct.take(start=start, minutes=run_minutes(case, start, costs) if costs else None)
        if refused is None:
            keep.append((cid, why))
            live = o.service_key
        else:
            pl.over_budget[cid] = f"not started: {refused}"
    if pl.over_budget and not keep:
        pl.budget_end = next(iter(pl.over_budget.values())).removeprefix("not started: ")
    pl.next = keep


def _pareto(rows: list[PointRow]) -> set[str]:
    pts = [
        (r.case_id, r.per_card_tok_s, r.per_user_tok_s)
        for r in rows
        if r.meets and r.status != "screened" and r.per_card_tok_s is not None and r.per_user_tok_s is not None
    ]
    front = set()
    for cid, a, b in pts:
        assert a is not None and b is not None
        if not any(
            (a2 >= a and b2 >= b and (a2 > a or b2 > b)) for _, a2, b2 in pts if a2 is not None and b2 is not None
        ):
            front.add(cid)
    return front


def _progress(
    ws: Workspace,
    camp: Campaign,
    rows: list[PointRow],
    mine: list[RunMeta],
) -> dict[str, Any]:  # JSON: CampaignView.progress
    since = started_at(ws, camp.campaign_id)
    starts, formal, last_end = 0, 0.0, since or 0.0
    runs = 0
    for m in mine:
        tl = time_ledger(load_run(ws, m.run_id))
        runs += 1
        formal += float(tl.get("formal_window_s") or 0.0)
        starts += started_service(ws, m)
        end = _end_of(tl, m)
        last_end = max(last_end, end or 0.0)
    live = any(r.status == "running" for r in rows) or driver_alive(ws, camp.campaign_id)
    elapsed = ((time.time() if live else last_end) - since) if since else 0.0
    count = {s: sum(1 for r in rows if r.status == s) for s in get_args(PointStatus)}
    return {
        **count,
        "runs": runs,
        "sent": sum(r.sent for r in rows),
        "service_starts": starts,
        "elapsed_s": round(max(elapsed, 0.0), 1),
        "formal_window_s": round(formal, 1),
        # a share of the campaign's own wall time: none before its clock covers its windows (runs measured before
        # its driver started, or a clock read at 0 s elapsed), never a share above 100%
        "formal_window_share": round(formal / elapsed, 3) if elapsed >= max(formal, 1.0) else None,
    }


def search_ended(ws: Workspace, camp: Campaign, *, by_budget: bool = False) -> str | None:
    """Why a proposing search ended at its current number of points (its driver's record), or None. An end the
    budget caused holds only under that budget: frozen again with another, the search goes on. by_budget: only
    such an end."""
    now = camp.budget.model_dump(mode="json")
    for e in reversed(driver_events(ws, camp.campaign_id)):
        if isinstance(e, SearchEnded) and e.points == len(camp.points):
            if e.budget is not None and e.budget != now:
                continue
            if by_budget and e.budget is None:
                return None
            return e.why or "ended"
    return None


def _budget_end(ws: Workspace, camp: Campaign, pl: planner.Standing, acct: budget.Account) -> str | None:
    """Why the budget ended the campaign: a run it did not start, a proposal it refused, or (a proposing search)
    measurements or minutes spent before its strategy had ended; None while it has not."""
    if pl.budget_end is not None or not camp.search.proposes:
        return pl.budget_end
    ended = search_ended(ws, camp, by_budget=True)
    if ended is not None or search_ended(ws, camp) is not None:
        return ended
    full = camp.search.cap is not None and len(camp.points) >= camp.search.cap
    return None if full else acct.exhausted()


def _end_of(tl: dict[str, Any], m: RunMeta) -> float | None:  # JSON: the time ledger
    created = datetime.fromisoformat(m.created_utc.replace("Z", "+00:00")).timestamp() if m.created_utc else None
    wall = tl.get("run_wall_s")
    return created + float(wall) if created is not None and isinstance(wall, int | float) else None


def campaign_view(ws: Workspace, campaign_id: str) -> CampaignView:
    camp = load_campaign(ws, campaign_id)
    auth = authorization.current_mode(ws)
    pl, obs, extra, mine = current_standing(ws, camp)
    if pl.cut is not None:  # the target changed: the rows and the answer rest on the runs since, as the planner does
        obs = drift.set_aside(obs, pl.cut)
    obs = full_labels(ws, camp, obs)
    d = camp.decision
    higher = METRICS[d.primary_metric].higher_is_better
    complete = not pl.next and not any(o.active for o in obs) and not search_open(ws, camp)
    rows = [_row(o, extra[o.case_id], *_status(o, pl, complete)) for o in obs]
    if camp.pool:
        on = {p.case_id: p.on for p in camp.points}
        rows = [r.model_copy(update={"cases": on.get(r.case_id, {})}) for r in rows]
    front = _pareto(rows)
    rows = [r.model_copy(update={"pareto": r.case_id in front}) for r in rows]
    by_id = {o.case_id: o for o in obs}
    answer, winner, tie = _answer(pl, by_id, higher, d.primary_metric, complete)
    metas = {m.run_id: m for m in mine}
    rows = [
        r.model_copy(
            update={
                "verdict": point_verdict(r.case_id, r.runs, bool(r.uncertain), winner, tie, unsettled(pl)),
                "run_list": run_list(ws, [metas[x] for x in r.run_ids if x in metas], camp, pl.cut),
            }
        )
        for r in rows
    ]
    answer += tie_break(d.tie_break, [(by_id[c].label, extra[c].latency[d.tie_break]) for c in tie])
    answer += _rests_on(pl, by_id, camp, higher, {c: e.requests for c, e in extra.items()})
    unmeasured = [by_id[c].label for c in pl.refused if c in by_id and not by_id[c].runs]
    if unmeasured:  # an answer over the points the host let run, not over the space
        answer += f"; not measured (refused by the host): {', '.join(unmeasured)}"
    lines: list[str] = []
    if camp.pool:
        lines = _host_refused_on(ws, camp, pool.check(ws, camp, mine).lines())
        answer += _noise_seen(obs)
    alive = driver_alive(ws, campaign_id)
    spent = _spent(ws, camp, pl, obs, rows, mine) if camp.budget.given() else {}
    return CampaignView(
        campaign_id=campaign_id,
        name=camp.name,
        scenario=camp.scenario,
        objective=f"{d.primary_metric} on {d.window} ({'higher' if higher else 'lower'} is better)",
        limits=[f"{k}<={v:g}" for k, v in d.limits.bounds().items()],
        search=camp.describe() + (f"; ended: {why}" if (why := search_ended(ws, camp)) else ""),
        rows=rows,
        complete=complete,
        answer=answer,
        winner=winner,
        tie=tie,
        pareto=[r.label for r in rows if r.pareto],
        notes=pl.notes,
        controls=[c for c in pl.controls if sum(o.service_key == by_id[c].service_key for o in obs) > 1],
        drift=pl.drift,
        pool=lines,
        progress=_progress(ws, camp, rows, mine),
        driver_alive=alive,
        authorization=auth,
        waiting=waiting_on(ws, campaign_id) if alive else None,
        plan=[f"{by_id[cid].label}: {why}" for cid, why in pl.next[:3] if cid in by_id],
        **spent,
        next_call=_refused_first(campaign_id, pl, complete)
        + _next_call(campaign_id, pl, complete, alive, auth, spent.get("budget_end")),
    )


def _host_refused_on(ws: Workspace, camp: Campaign, lines: list[str]) -> list[str]:
    """A pool's lines (one per target, in its order), each with what the host refused to start on it."""
    barred = host_refusals(ws, camp.campaign_id)
    out = []
    for t, line in zip((x.name for x in camp.pool), lines, strict=True):
        said = [why for cid, why in barred.items() if pool.target_of(camp, cid) == t]
        out.append(line + (f"; the host refused {len(said)} point(s) on it: {said[0]}" if said else ""))
    return out


def _refused_first(campaign_id: str, pl: planner.Standing, complete: bool) -> str:
    """A complete campaign with points the host refused: what measures them, before what else is next."""
    if not complete or not pl.refused:
        return ""
    return (
        f"the host refused {len(pl.refused)} point(s) (each row says why and the fix): once a person has changed "
        f"that, {calls.start_run(campaign_id)} checks and runs them; otherwise "
    )


def full_labels(ws: Workspace, camp: Campaign, obs: list[planner.PointObs]) -> list[planner.PointObs]:
    """Each point labelled with its full setting: its axis values, then every other knob its case sets away from
    the scenario's first case (the base of the scenario's oldest campaign), so a point of a campaign whose base
    changed '-b' says '-b=512' too. A pool's points differ by target only: their axis labels stand."""
    ids = scenario_campaigns(ws, camp.scenario)
    if camp.pool or not ids:
        return obs
    first = load_case(ws, load_campaign(ws, ids[0]).base_case)
    axes = [a.path for a in camp.axes]
    out = []
    for o in obs:
        extra = setting_label(first, load_case(ws, o.case_id), [*axes, *o.values])
        out.append(replace(o, label=f"{o.label} {extra}".strip()) if extra else o)
    return out


@dataclass(frozen=True)
class ScenarioAnswer:
    """The one answer of a scenario that several campaigns measured: their points ranked together."""

    answer: str
    winner: str | None
    tie: list[str]
    complete: bool
    unsettled: list[str] = field(default_factory=list)  # the leader and runner-up of an answer not settled yet


def scenario_answer(ws: Workspace, scenario: str) -> ScenarioAnswer | None:
    """The points of every campaign of the scenario ranked together (a case two campaigns measured is one point:
    its runs are the same), by the same planner and words as one campaign's answer; None with fewer than two
    campaigns (the campaign's own answer is the scenario's)."""
    ids = scenario_campaigns(ws, scenario)
    if len(ids) < 2:
        return None
    merged: dict[str, planner.PointObs] = {}
    extras: dict[str, _Extra] = {}
    complete = True
    blocked: list[str] = []  # a campaign whose controls allow no winner allows none across campaigns either
    for gid in ids:  # oldest first: a newer campaign's view of a shared case (after its own drift cut) stands
        camp = load_campaign(ws, gid)
        pl, obs, extra, _ = current_standing(ws, camp)
        extras.update(extra)
        blocked += [f"{gid}: {pl.blocked}"] if pl.blocked is not None else []
        obs = full_labels(ws, camp, drift.set_aside(obs, pl.cut) if pl.cut is not None else obs)
        complete = complete and not pl.next and not any(o.active for o in obs) and not search_open(ws, camp)
        merged.update({o.case_id: o for o in obs if not o.screen})
    if blocked:
        return ScenarioAnswer(f"across {len(ids)} campaigns: {'; '.join(blocked)}", None, [], complete)
    newest = load_campaign(ws, ids[-1])
    d = newest.decision
    higher = METRICS[d.primary_metric].higher_is_better
    pl = planner.standing(list(merged.values()), GridSearch(), newest.repeats, higher, None, d.min_effect)
    answer, winner, tie = _answer(pl, merged, higher, d.primary_metric, complete)
    answer += tie_break(d.tie_break, [(merged[c].label, extras[c].latency[d.tie_break]) for c in tie])
    answer += _rests_on(pl, merged, load_campaign(ws, ids[0]), higher, {c: e.requests for c, e in extras.items()})
    return ScenarioAnswer(f"across {len(ids)} campaigns: {answer}", winner, tie, complete, unsettled(pl))


def _spent(
    ws: Workspace,
    camp: Campaign,
    pl: planner.Standing,
    obs: list[planner.PointObs],
    rows: list[PointRow],
    mine: list[RunMeta],
) -> dict[str, Any]:  # JSON: CampaignView's budget fields
    """The budget spent and left; once it ended the campaign, what it ends with besides the answer: the points
    never measured and those the noise still decides."""
    acct = account(ws, camp, mine)
    end = _budget_end(ws, camp, pl, acct)
    out: dict[str, Any] = {"budget": acct.said(), "budget_end": end}  # JSON: the fields
    if end is None:
        return out
    out["untested"] = budget.untested(camp.axes, camp.constraints, [o.values for o in obs if o.runs])
    unsure = [f"{r.label}: {', '.join(r.uncertain)}" for r in rows if r.uncertain]
    by_id = {o.case_id: o for o in obs}
    if pl.leader and pl.runner_up and not pl.settled and not pl.tie:
        lead, second = by_id[pl.leader], by_id[pl.runner_up]
        gap, noise = pl.gap_rel or 0.0, pl.noise_rel or 0.0
        why = f"gap {gap:.1%} within noise {planner.pm(noise)}" if gap <= noise else "run-to-run noise unknown"
        unsure.append(
            f"the leader {lead.label} and the runner-up {second.label}: {why} ({lead.runs} and {second.runs} runs)"
        )
    out["uncertain"] = unsure
    return out


def _status(o: planner.PointObs, pl: planner.Standing, complete: bool) -> tuple[PointStatus, str | None]:
    """A point's status and why, in the order that wins: running, queued, given up, measured, skipped, pending."""
    queued = dict(pl.next)
    if o.active:
        return "running", None
    if o.case_id in queued:
        return "queued", queued[o.case_id]
    if o.refused is not None and not o.runs:
        return "refused", o.refused
    if o.case_id in pl.given_up:
        return "given_up", pl.given_up[o.case_id]
    if o.case_id in pl.over_budget and not o.runs:
        return "over_budget", pl.over_budget[o.case_id]
    if o.runs:
        return ("screened", o.why or None) if o.screen else ("measured", None)
    if o.case_id in pl.skipped:
        return "skipped", pl.skipped[o.case_id]
    if o.case_id in pl.pending and not complete:
        return "pending", pl.pending[o.case_id]
    return "not_needed", "the answer does not depend on it"


def _row(o: planner.PointObs, e: _Extra, status: PointStatus, why: str | None) -> PointRow:
    limits = {name: lo.said() for name, lo in o.limits.items() if lo.mean is not None}
    rtr = (
        f"±{_pct(o.spread_rel)} over {o.runs} runs"
        if o.spread_rel is not None
        else ("unknown (1 run)" if o.runs == 1 else "unknown")
    )
    return PointRow(
        label=o.label,
        case_id=o.case_id,
        status=status,
        why=why,
        runs=o.runs,
        metric_mean=o.mean,
        noise_rel=o.noise_measured if o.runs else None,
        run_to_run=rtr,
        limits=limits,
        meets=o.meets,
        verdicts=[
            LimitVerdict(
                limit=k, bound=lo.bound, value=lo.mean, verdict=lo.verdict, met=lo.met, low=lo.low, high=lo.high
            )
            for k, lo in o.limits.items()
        ],
        uncertain=o.uncertain,
        requests=e.requests,
        per_user_tok_s=e.per_user,
        per_card_tok_s=e.per_card,
        latency={k: round(sum(v) / len(v), 3) for k in SHOWN if (v := e.latency.get(k))},
        run_ids=e.run_ids,
        sent=o.sent,
        on=o.targets,
    )


def _next_call(
    campaign_id: str, pl: planner.Standing, complete: bool, alive: bool, auth: str, budget_end: str | None = None
) -> str:
    if pl.drift is not None and complete:
        return (
            "find why the target changed (another load on it, throttling, a restart: phase_status of the control's "
            "runs), then measure again: freeze_case of the campaign draft under a new name"
        )
    if pl.suspect is not None and complete:
        return (
            "the control's runs since its change were measured under other contention: measure the campaign again "
            "on a quieter host (freeze_case of the campaign draft under a new name)"
        )
    if complete and budget_end is not None:
        return (
            f"nothing, within its budget; to go on where it ended: freeze_case of the campaign draft with a larger "
            f"campaign.budget, then {calls.start_run(campaign_id)}"
        )
    if complete:
        return (
            "nothing: the campaign is complete; a changed limit or objective (freeze_case of the campaign draft) "
            "re-decides it with no request sent"
        )
    if not alive:
        if not pl.next:
            return f"{calls.start_run(campaign_id)} starts its driver: it proposes the next point and runs it"
        return f"{calls.start_run(campaign_id)} starts its driver: it runs the {len(pl.next)} queued point(s)"
    if auth == "paused":
        return "caseledger authorize auto: while paused no new point starts"
    return calls.wait(campaign_id)


def _answer(
    pl: planner.Standing, by_id: dict[str, planner.PointObs], higher: bool, metric: str, complete: bool
) -> tuple[str, str | None, list[str]]:
    if pl.blocked is not None:  # the controls allow no winner (campaign/drift.py)
        return pl.blocked, None, []
    if pl.leader is None:
        if any(o.runs for o in by_id.values()):
            return "no measured point meets every limit", None, []
        if pl.given_up:  # every run of every point tried was invalid: say why, never "nothing measured"
            first = quoted(next(iter(pl.given_up.values())), 240)
            return f"no valid result: {len(pl.given_up)} point(s) given up; the first: {first}", None, []
        return "nothing measured yet", None, []
    lead = by_id[pl.leader]
    fig = f"{metric} {_n(lead.mean)} {planner.pm(lead.noise_measured)} noise"
    if pl.runner_up is None:
        text = f"winner {lead.label} ({lead.case_id}): {fig}, the only measured point within every limit"
        return text + _unsure([lead]), pl.leader, []
    second = by_id[pl.runner_up]
    vs = (
        f"runner-up {second.label} {_n(second.mean)} {planner.pm(second.noise_measured)}; gap {pl.gap_rel or 0:.1%} "
        f"vs noise {planner.pm(pl.noise_rel)} ({lead.runs} and {second.runs} runs; noise: the larger of the within-run "
        "interval and the run-to-run spread, both sides combined)"
    )
    if pl.tie:
        pair = sorted([lead, second], key=lambda o: o.label)
        return (
            f"tie within noise: {pair[0].label} and {pair[1].label} ({vs})" + _unsure(pair),
            None,
            [pair[0].case_id, pair[1].case_id],
        )
    if pl.settled:
        return f"winner {lead.label} ({lead.case_id}): {fig}; {vs}" + _unsure([lead]), pl.leader, []
    return f"leading {lead.label} ({lead.case_id}): {fig}; {vs}; not settled yet" + _unsure([lead]), None, []


def _rests_on(
    pl: planner.Standing,
    by_id: dict[str, planner.PointObs],
    camp: Campaign,
    higher: bool,
    requests: dict[str, int | None],
) -> str:
    """What the answer rests on and what could change it (campaign/resolution.py); nothing while the controls
    allow no winner (the drift's words are the answer)."""
    if pl.blocked is not None:
        return ""
    return (
        resolution.versus_base(pl, by_id, camp.base_case, higher)
        + resolution.resolution(pl, by_id, requests, camp.decision.min_effect)
        + resolution.could_change(pl, by_id, camp.repeats)
    )


TIE_BREAK_UNKNOWN = 0.10  # with one run a side (no run-to-run spread), a tie-break gap below this names no point


def tie_break(metric: str, tied: list[tuple[str, list[float]]]) -> str:
    """'; tie-break on ttft_p99_ms: C=2 better, 1.8e+03 vs 3.7e+03 ms (-51%; run-to-run ±4%)': the better of a
    tie's points on decision.tie_break (lower is better), by its mean over their valid runs; when the gap is within
    the run-to-run spread, it says so rather than naming a better one."""
    if len(tied) != 2 or not all(v for _, v in tied):
        return ""
    (la, va), (lb, vb) = sorted(tied, key=lambda t: sum(t[1]) / len(t[1]))
    ma, mb = sum(va) / len(va), sum(vb) / len(vb)
    spreads = [(max(v) - min(v)) / 2 / m for v, m in ((va, ma), (vb, mb)) if len(v) > 1 and m > 0]
    spread = max(spreads, default=None)
    gap = (ma - mb) / mb if mb else 0.0
    noise = f"run-to-run ±{spread:.0%}" if spread is not None else "run-to-run unknown (1 run each)"
    if abs(gap) <= (2 * spread if spread is not None else TIE_BREAK_UNKNOWN):  # within noise, or too close to call
        return f"; tie-break on {metric}: {_n(ma)} vs {_n(mb)} ms ({gap:+.0%}), within noise ({noise}): still a tie"
    return f"; tie-break on {metric}: {la} better, {_n(ma)} vs {_n(mb)} ms for {lb} ({gap:+.0%}; {noise})"


def _noise_seen(obs: list[planner.PointObs]) -> str:
    """What a pool's noise was made of: run-to-run on one target, and between targets where a point ran on two."""
    within, between = [], []
    for o in obs:
        w, b = pool.spread(o.metric, o.targets) if len(o.targets) == len(o.metric) else (None, None)
        within += [w] if w is not None else []
        between += [b] if b is not None else []
    said = (
        f"run-to-run on one target up to ±{_pct(max(within))} ({len(within)} point(s))"
        if within
        else ("run-to-run on one target not measured")
    )
    if between:
        return f"; noise seen: {said}, between targets up to ±{_pct(max(between))} ({len(between)} point(s) on 2+)"
    return f"; noise seen: {said}; between targets not seen (no point ran on two targets)"


def _unsure(points: list[planner.PointObs]) -> str:
    """'; uncertain: -np=2 C=1 tpot_p99_ms met in 2/3 runs (...)' for limits whose interval straddles the bound."""
    said = [f"{p.label} {u}" for p in points for u in p.uncertain]
    if not said:
        return ""
    return (
        "; uncertain: " + ", ".join(said) + " (the pooled percentile's 95% interval straddles the bound: "
        "more runs, or more requests per run, settle it)"
    )
