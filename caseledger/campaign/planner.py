"""The planner: from what every point measured so far, which point runs next and why, which are skipped (and
why), and when the campaign is complete. Pure: no I/O, so the same observations always give the same standing.

- grid: every point gets `repeats.runs` valid runs.
- knee: per combination of the other axes, bisect the ordered axis between the highest value known to meet
  every limit and the lowest known to break one (like vLLM's serve_sla); under the declared monotonicity, values
  below a meeting one and above a breaking one are skipped with that reason.
- noise: the leader and the runner-up are repeated until their gap is beyond the noise (within-run interval
  and run-to-run spread) or `settle_runs` is reached (then: a tie); a limit verdict within its interval at a
  point the answer rests on is repeated the same way. Repeats stop when the budget is spent.
- a point whose runs end without a valid result (distorted, failed) runs again, up to max_attempts.
- drift (campaign/drift.py): per service identity, the point measured first is its control, measured again
  between and after the others. A control run that moved beyond the noise floor learned from the control's own
  like runs (the host's CPU contention counts) is a suspected change: no winner until the control confirms or
  refutes it. Confirmed, the runs before it are set aside and their points measured again; a second confirmed
  change means the target keeps drifting: nothing more runs, and the answer is inconclusive.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from caseledger.campaign import drift
from caseledger.campaign.model import Repeats, Scalar, Search
from caseledger.campaign.observed import LimitObs as LimitObs  # the planner's public names
from caseledger.campaign.observed import PointObs as PointObs
from caseledger.campaign.observed import Verdict as Verdict
from caseledger.campaign.search import bisect, bracket_why


@dataclass
class Standing:
    next: list[tuple[str, str]] = field(default_factory=list)  # (case_id, why), the first runs next
    skipped: dict[str, str] = field(default_factory=dict)  # case_id -> why it is not measured
    pending: dict[str, str] = field(default_factory=dict)  # case_id -> why it may still run (inside the bracket)
    given_up: dict[str, str] = field(default_factory=dict)  # case_id -> why it has no valid result
    refused: dict[str, str] = field(default_factory=dict)  # case_id -> why the host refused to start it
    leader: str | None = None
    runner_up: str | None = None
    settled: bool = False  # the leader is beyond the noise of the runner-up (or alone)
    tie: bool = False  # within noise after settle_runs each or the budget: a declared tie
    gap_rel: float | None = None
    noise_rel: float | None = None
    repeats_used: int = 0
    notes: list[str] = field(default_factory=list)  # what the answer must say (a monotonicity that does not hold)
    controls: list[str] = field(default_factory=list)  # per service identity, its point measured first
    cut: str | None = None  # the target changed at this run time (UTC): runs before it are set aside
    drift: str | None = None  # the target changed twice: how and when; the answer is inconclusive
    over_budget: dict[str, str] = field(default_factory=dict)  # case_id -> why its next run is not started
    budget_end: str | None = None  # the budget ended the campaign: why (campaign/budget.py)
    suspect: str | None = None  # a control moved and no run of it has confirmed it yet: how and when
    challengers: list[str] = field(default_factory=list)  # better than the leader, a limit uncertain: may still win
    contention_gap: float = 0.0  # the leader's and the runner-up's mean other-CPU share, apart

    @property
    def blocked(self) -> str | None:
        """The answer when the controls allow no winner (the target keeps drifting, or a change of it is not
        confirmed yet); None when they allow one. Every view's answer starts here."""
        if self.drift is not None:
            return f"inconclusive: the target keeps drifting: {self.drift}; no winner is crowned across it"
        if self.suspect is not None:
            return (
                f"drift unconfirmed: re-measure the control: {self.suspect}; no winner is named until a run of "
                "it under like contention confirms or refutes the change"
            )
        return None


def _better(higher: bool, p: PointObs) -> float:
    m = p.mean or 0.0
    return m if higher else -m


def standing(
    points: list[PointObs],
    search: Search,
    repeats: Repeats,
    higher: bool,
    live_service: str | None,
    min_effect: float = 0.0,
    open_search: bool = False,
) -> Standing:
    """Where the campaign stands now. `live_service`: the service key of the latest run (its points go first, so a
    service identity is started once); `higher`: the objective is better higher; `min_effect`: the smallest
    relative change that counts (a control moving less has not drifted); `open_search`: a strategy will propose
    more points (campaign/search.py): its proposed points run first, repeats and the control's last run wait
    until it has ended."""
    out = Standing()
    judged = drift.judge(points, min_effect)
    out.cut, out.drift, out.notes = judged.cut, judged.drift, judged.notes
    out.suspect = judged.suspect.said if judged.suspect is not None else None
    if out.drift is not None:
        return out  # nothing more runs: a comparison across a drifting target would not mean anything
    points = judged.points
    out.repeats_used = sum(max(0, p.runs - repeats.runs) for p in points)
    usable: list[PointObs] = []
    for p in points:
        if p.refused is not None:
            out.refused[p.case_id] = p.refused
            if p.runs:
                out.notes.append(f"{p.label}: no further run of it starts: {p.refused}")
        if p.runs == 0 and p.refused is not None:
            continue  # no evidence either way, as a point given up: the search goes on around it
        if p.runs == 0 and p.bad_runs >= repeats.max_attempts:
            out.given_up[p.case_id] = (
                f"given up after {p.bad_runs} attempt(s) without a valid result"
                + (f" (last: {p.last_problem})" if p.last_problem else "")
                + f"; {p.sent} formal request(s) sent to it"
            )
        else:
            usable.append(p)
    wanted: list[tuple[PointObs, str]] = []
    if search.kind == "knee" and search.knee:
        wanted += _knee(usable, search.knee, out)
    elif search.proposes:
        wanted += [(p, f"{p.why or 'proposed'}") for p in usable if p.runs == 0]
    else:
        wanted += [(p, "grid point") for p in usable if p.runs == 0]
    # the first `runs` valid runs of every measured point (a point the knee needs, or any grid point)
    final = [p for p in usable if not p.screen]  # the points that may be the answer
    wanted += [
        (p, f"repeat {p.runs + 1}/{repeats.runs} of every point")
        for p in final
        if 0 < p.runs < repeats.runs and p.case_id not in out.skipped
    ]
    settle = _settle(final, repeats, higher, out)
    if not open_search:  # a search still proposing: no repeats yet, the leader may change
        wanted += settle
        wanted += _before_leaving(final, wanted, live_service, repeats, out)
    wanted[:0] = drift.control_runs(usable, wanted, live_service, open_search, judged.suspect, out.controls)
    seen: set[str] = set()
    active = {p.case_id for p in points if p.active}
    for p, why in sorted(wanted, key=lambda pw: (pw[0].service_key != live_service, pw[0].service_key)):
        if p.case_id not in seen and p.case_id not in active and p.refused is None:
            seen.add(p.case_id)
            out.next.append((p.case_id, why))
    return out


def _knee(usable: list[PointObs], axis: str, out: Standing) -> list[tuple[PointObs, str]]:
    """Per combination of the other axes, the next bisection point of the ordered axis; skips the implied. A
    point given up (no valid result) is no evidence either way: the bisection goes on around it."""
    groups: dict[tuple[tuple[str, Scalar], ...], list[PointObs]] = {}
    for p in usable:
        key = tuple(sorted((k, v) for k, v in p.values.items() if k != axis))
        groups.setdefault(key, []).append(p)
    wanted: list[tuple[PointObs, str]] = []
    for members in groups.values():
        line = sorted(members, key=lambda p: float(p.values[axis]))
        verdict = [p.meets for p in line]
        b = bisect(verdict)
        lm, hb = b.meets, b.breaks
        for i, p in enumerate(line):
            if verdict[i] is not None:
                if verdict[i] is True and i > hb:
                    out.notes.append(
                        f"{p.label} meets every limit although {line[hb].label} breaks one: the "
                        "declared monotonicity does not hold here"
                    )
                continue
            if i < lm:
                out.skipped[p.case_id] = (
                    f"below {line[lm].label}, which meets every limit (limits declared monotone: it meets them too)"
                )
            elif i > hb:
                out.skipped[p.case_id] = (
                    f"above {line[hb].label}, which breaks {line[hb].broken()} (limits "
                    "declared monotone: it breaks too)"
                )
            else:
                out.pending[p.case_id] = "inside the knee's bracket: the bisection may still need it"
        if b.next is not None:
            mid = line[b.next]
            if mid.runs == 0 and not mid.active:
                low = line[lm].label if lm >= 0 else None
                wanted.append((mid, f"knee: {bracket_why(low, line[hb].label if hb < len(line) else None)}"))
            # points still inside the bracket but not the midpoint wait for it: not skipped, not run yet
    return wanted


CONTENTION_NOISE = 0.5  # a run whose host lent s more of its CPU to other processes may be up to ~s/2 slower


def contention(p: PointObs) -> float | None:
    """The mean share of the host's CPU other processes used during the point's valid runs; None: not recorded."""
    seen = [s for s in p.others if s is not None]
    return sum(seen) / len(seen) if seen else None


def contention_apart(a: PointObs, b: PointObs) -> float:
    ca, cb = contention(a), contention(b)
    return abs(ca - cb) if ca is not None and cb is not None else 0.0


def _challengers(usable: list[PointObs], lead: PointObs | None, higher: bool) -> list[PointObs]:
    """Points better than the leader (every point, with no leader) whose only fault is a limit still uncertain
    (its interval straddles the bound): they may still win, so their settle runs come before the leader's."""
    return [
        p
        for p in usable
        if p.meets is False
        and p.uncertain
        and not any(lo.verdict == "breaks" for lo in p.limits.values())
        and (lead is None or _better(higher, p) > _better(higher, lead))
    ]


def _settle(usable: list[PointObs], repeats: Repeats, higher: bool, out: Standing) -> list[tuple[PointObs, str]]:
    """Repeats where the answer depends on the noise, spent only where they can change the answer: first a point
    better than the leader whose limit is uncertain, then the leader against the runner-up (their gap judged
    against their noise, widened by the difference in host contention their runs saw), and limit verdicts within
    their interval at either of them. A point that cannot win gets none."""
    eligible = sorted((p for p in usable if p.meets), key=lambda p: _better(higher, p), reverse=True)
    budget_left = repeats.budget - out.repeats_used
    wanted: list[tuple[PointObs, str]] = []
    for c in _challengers(usable, eligible[0] if eligible else None, higher):
        out.challengers.append(c.case_id)
        if c.runs < repeats.settle_runs and budget_left - len(wanted) > 0 and not c.active:
            said = ", ".join(c.uncertain)
            wanted.append((c, f"repeat: {c.label} would lead but {said}: more runs settle whether it meets them"))
    if not eligible:
        return wanted
    budget_left -= len(wanted)
    lead = eligible[0]
    out.leader = lead.case_id
    for p in eligible[:2]:
        for name, lo in p.limits.items():
            if not lo.settled and p.runs < repeats.settle_runs and budget_left > 0 and not p.active:
                wanted.append(
                    (p, f"repeat: {name} {lo.mean:.4g} is within its noise (±{lo.noise:.2g}) of the limit {lo.bound:g}")
                )
    if len(eligible) == 1:
        out.settled = True
        return wanted
    second = eligible[1]
    out.runner_up = second.case_id
    gap = abs((lead.mean or 0.0) - (second.mean or 0.0)) / abs(second.mean or 1.0)
    apart = contention_apart(lead, second)
    noise = math.hypot(lead.noise_rel, second.noise_rel, CONTENTION_NOISE * apart)
    out.gap_rel, out.noise_rel, out.contention_gap = gap, noise, apart
    known = lead.runs > 1 and second.runs > 1  # run-to-run noise measured on both sides
    if apart > drift.CONTENTION_GAP:  # a gain that coincides with a contention difference: measured again first
        busier = max((lead, second), key=lambda p: contention(p) or 0.0)
        if busier.runs < repeats.settle_runs and budget_left > 0 and not busier.active:
            other = second if busier is lead else lead
            wanted.append(
                (
                    busier,
                    f"repeat: {busier.label}'s runs saw {contention(busier):.0%} of the host used by other processes, "
                    f"{other.label}'s {contention(other):.0%}: measured again before their gap is believed",
                )
            )
            return wanted
    if known and gap > noise:
        out.settled = True
        return wanted
    # both sides that may still repeat, the one with fewer runs first: the planner's order then puts the side whose
    # service is live first, so a live identity serves its repeats before the campaign switches (one start each)
    sides = [p for p in sorted((lead, second), key=lambda p: p.runs) if p.runs < repeats.settle_runs]
    if sides and budget_left > 0:
        what = "run-to-run noise unknown (1 run)" if not known else f"gap {gap:.1%} within noise ±{noise:.1%}"
        wanted += [(p, f"repeat: the leader {lead.label} and the runner-up {second.label}: {what}") for p in sides]
    elif not wanted:
        out.tie = gap <= noise
        out.settled = not out.tie
    return wanted


def _before_leaving(
    usable: list[PointObs], wanted: list[tuple[PointObs, str]], live: str | None, repeats: Repeats, out: Standing
) -> list[tuple[PointObs, str]]:
    """The leader so far (and a runner-up within its noise) on the live service, repeated up to settle_runs
    before the campaign leaves that service for points not measured yet: a later settle would start the service
    again (a restart per switch; the answer needs each identity started once)."""
    if live is None or not any(p.service_key != live and p.runs == 0 for p, _ in wanted):
        return []
    return _leaders_on(live, usable, wanted, repeats, out)


def _leaders_on(
    live: str, usable: list[PointObs], wanted: list[tuple[PointObs, str]], repeats: Repeats, out: Standing
) -> list[tuple[PointObs, str]]:
    """The leader (and a runner-up within its noise) on the live service, to repeat up to settle_runs now."""
    budget_left = repeats.budget - out.repeats_used - sum(1 for p, _ in wanted if p.runs >= repeats.runs)
    by_id = {p.case_id: p for p in usable}
    contenders = [out.leader] + ([out.runner_up] if not out.settled else [])
    extra: list[tuple[PointObs, str]] = []
    for cid in contenders:
        p = by_id.get(cid or "")
        if p is None or p.service_key != live or p.active or p.runs >= repeats.settle_runs or budget_left <= 0:
            continue
        if any(q is p for q, _ in wanted):
            continue
        extra.append(
            (p, f"repeat before leaving its service: {p.label} leads so far (a later settle would restart it)")
        )
        budget_left -= 1
    return extra


def before_leaving(points: list[PointObs], repeats: Repeats, higher: bool, live: str) -> list[tuple[str, str]]:
    """What a proposing search owes the live service before its next point starts another one: the settle
    repeats on it (the leader and a runner-up within noise, a limit within its interval) and the leader so far on
    it, up to settle_runs. Run now, they need no second start of this service later (one start per identity)."""
    out = Standing()
    out.repeats_used = sum(max(0, p.runs - repeats.runs) for p in points)
    final = [p for p in points if not p.screen and not (p.runs == 0 and p.bad_runs >= repeats.max_attempts)]
    wanted = [(p, w) for p, w in _settle(final, repeats, higher, out) if p.service_key == live and not p.active]
    wanted += _leaders_on(live, final, wanted, repeats, out)
    wanted = [(p, w) for p, w in wanted if p.refused is None]  # the host refused it: never owed a run
    return list({p.case_id: (p.case_id, w) for p, w in reversed(wanted)}.values())[::-1]  # each once, first why


def pm(rel: float | None) -> str:
    """A relative noise for people: '±1.2%', '±<0.1%' when it rounds to zero, '±?' when it was not measured."""
    if rel is None:
        return "±?"
    return f"±{rel:.1%}" if rel >= 0.0005 else "±<0.1%"
