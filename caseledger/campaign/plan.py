"""The planner: from what every point measured so far, which point runs next and why, which are skipped (and
why), and when the campaign is complete. Pure: no I/O, so the same observations always give the same plan.

- grid: every point gets `repeats.runs` valid runs.
- knee: per combination of the other axes, bisect the ordered axis between the highest value known to meet
  every limit and the lowest known to break one (like vLLM's serve_sla); under the declared monotonicity, values
  below a meeting one and above a breaking one are skipped with that reason.
- noise: the leader and the runner-up are repeated until their gap is beyond the noise (within-run interval
  and run-to-run spread) or `settle_runs` is reached (then: a tie); a limit verdict within its interval at a
  point the answer rests on is repeated the same way. Repeats stop when the budget is spent.
- a point whose runs end without a valid result (distorted, failed) runs again, up to max_attempts.
- drift: the point measured first is the control. It is measured again after every CONTROL_EVERY runs of other
  points and once after the last of them; when one of its runs differs from its first beyond both runs'
  within-run noise (and min_effect), the target drifted: nothing more runs, and no winner is crowned across it.
  Observations without run times (`when`) have no control.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from caseledger.campaign.model import Repeats, Scalar, Search


@dataclass(frozen=True)
class LimitObs:
    """One limit at one point: its value in each valid run and the within-run half-width of the latest."""

    bound: float
    values: list[float]
    half_width: float | None  # bootstrap 95% half-width over the latest valid run's requests (ms)

    @property
    def mean(self) -> float | None:
        return sum(self.values) / len(self.values) if self.values else None

    @property
    def noise(self) -> float:
        spread = (max(self.values) - min(self.values)) / 2 if len(self.values) > 1 else 0.0
        return max(self.half_width or 0.0, spread)

    @property
    def verdict(self) -> str:
        m = self.mean
        return "not_observed" if m is None else "meets" if m <= self.bound else "breaks"

    @property
    def settled(self) -> bool:
        m = self.mean
        return m is not None and abs(m - self.bound) > self.noise


@dataclass(frozen=True)
class PointObs:
    """What one point measured so far, read from the ledger (campaign/view.py)."""

    case_id: str
    label: str
    values: dict[str, Scalar]
    service_key: str
    metric: list[float]  # the objective in each valid run
    interval_rel: float | None  # within-run bootstrap half-width / value of the latest valid run
    limits: dict[str, LimitObs]
    bad_runs: int  # load attempts without a valid result (distorted, invalid, failed; a resent load is one more)
    active: str | None = None  # a run of it that is going on now
    last_problem: str | None = None  # why its last run gave no valid result
    when: list[str] = field(default_factory=list)  # each valid run's creation time (UTC, ms), as metric
    run_rel: list[float | None] = field(default_factory=list)  # each valid run's within-run half-width / value
    sent: int = 0  # formal requests sent to it, over every run and load attempt

    @property
    def runs(self) -> int:
        return len(self.metric)

    @property
    def mean(self) -> float | None:
        return sum(self.metric) / len(self.metric) if self.metric else None

    @property
    def spread_rel(self) -> float | None:
        m = self.mean
        return (max(self.metric) - min(self.metric)) / 2 / abs(m) if len(self.metric) > 1 and m else None

    @property
    def noise_rel(self) -> float:
        return max(self.interval_rel or 0.0, self.spread_rel or 0.0)

    @property
    def meets(self) -> bool | None:
        """Every limit met (by the mean over its runs); None before a valid run."""
        if not self.metric:
            return None
        return all(lo.verdict == "meets" for lo in self.limits.values())

    def broken(self) -> str:
        return ", ".join(
            f"{k} {lo.mean:.4g} > {lo.bound:g}"
            for k, lo in self.limits.items()
            if lo.verdict == "breaks" and lo.mean is not None
        )


@dataclass
class Plan:
    next: list[tuple[str, str]] = field(default_factory=list)  # (case_id, why), the first runs next
    skipped: dict[str, str] = field(default_factory=dict)  # case_id -> why it is not measured
    pending: dict[str, str] = field(default_factory=dict)  # case_id -> why it may still run (inside the bracket)
    given_up: dict[str, str] = field(default_factory=dict)  # case_id -> why it has no valid result
    leader: str | None = None
    runner_up: str | None = None
    settled: bool = False  # the leader is beyond the noise of the runner-up (or alone)
    tie: bool = False  # within noise after settle_runs each or the budget: a declared tie
    gap_rel: float | None = None
    noise_rel: float | None = None
    repeats_used: int = 0
    notes: list[str] = field(default_factory=list)  # what the answer must say (a monotonicity that does not hold)
    control: str | None = None  # the point measured first: measured again to see the target drift
    drift: str | None = None  # how the control moved beyond its noise, and when: the answer is inconclusive


CONTROL_EVERY = 4  # runs of other points between two runs of the control


def _better(higher: bool, p: PointObs) -> float:
    m = p.mean or 0.0
    return m if higher else -m


def plan(
    points: list[PointObs],
    search: Search,
    repeats: Repeats,
    higher: bool,
    live_service: str | None,
    min_effect: float = 0.0,
) -> Plan:
    """The campaign's plan now. `live_service`: the service key of the latest run (its points go first, so a
    service identity is started once); `higher`: the objective is better higher; `min_effect`: the smallest
    relative change that counts (a control moving less has not drifted)."""
    out = Plan()
    out.repeats_used = sum(max(0, p.runs - repeats.runs) for p in points)
    usable: list[PointObs] = []
    for p in points:
        if p.runs == 0 and p.bad_runs >= repeats.max_attempts:
            out.given_up[p.case_id] = (
                f"given up after {p.bad_runs} attempt(s) without a valid result"
                + (f" (last: {p.last_problem})" if p.last_problem else "")
                + f"; {p.sent} formal request(s) sent to it"
            )
        else:
            usable.append(p)
    wanted: list[tuple[PointObs, str]] = []
    if search.kind == "knee" and search.axis:
        wanted += _knee(usable, search.axis, out)
    else:
        wanted += [(p, "grid point") for p in usable if p.runs == 0]
    # the first `runs` valid runs of every measured point (a point the knee needs, or any grid point)
    wanted += [
        (p, f"repeat {p.runs + 1}/{repeats.runs} of every point")
        for p in usable
        if 0 < p.runs < repeats.runs and p.case_id not in out.skipped
    ]
    wanted += _settle(usable, repeats, higher, out)
    control = _control(usable, min_effect, bool(wanted), out)
    if out.drift is not None:
        out.settled = out.tie = False
        return out  # nothing more runs: a comparison across the drift would not mean anything
    if control is not None:
        wanted.insert(0, control)
    seen: set[str] = set()
    active = {p.case_id for p in points if p.active}
    for p, why in sorted(wanted, key=lambda pw: (pw[0].service_key != live_service, pw[0].service_key)):
        if p.case_id not in seen and p.case_id not in active:
            seen.add(p.case_id)
            out.next.append((p.case_id, why))
    return out


def _knee(usable: list[PointObs], axis: str, out: Plan) -> list[tuple[PointObs, str]]:
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
        hb = next((i for i, v in enumerate(verdict) if v is False), len(line))
        lm = max((i for i, v in enumerate(verdict[:hb]) if v is True), default=-1)
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
        if hb - lm > 1:
            mid = line[(lm + hb) // 2]
            if mid.runs == 0 and not mid.active:
                low = line[lm].label + " meets" if lm >= 0 else "nothing measured below"
                high = line[hb].label + " breaks" if hb < len(line) else "nothing measured above"
                wanted.append((mid, f"knee: bisecting between {low} and {high}"))
            # points still inside the bracket but not the midpoint wait for it: not skipped, not run yet
    return wanted


def _settle(usable: list[PointObs], repeats: Repeats, higher: bool, out: Plan) -> list[tuple[PointObs, str]]:
    """Repeats where the answer depends on the noise: the leader against the runner-up, and limit verdicts
    within their interval at either of them."""
    eligible = sorted((p for p in usable if p.meets), key=lambda p: _better(higher, p), reverse=True)
    if not eligible:
        return []
    budget_left = repeats.budget - out.repeats_used
    lead = eligible[0]
    out.leader = lead.case_id
    wanted: list[tuple[PointObs, str]] = []
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
    noise = math.hypot(lead.noise_rel, second.noise_rel)
    out.gap_rel, out.noise_rel = gap, noise
    known = lead.runs > 1 and second.runs > 1  # run-to-run noise measured on both sides
    if known and gap > noise:
        out.settled = True
        return wanted
    side = min((lead, second), key=lambda p: p.runs)
    if side.runs < repeats.settle_runs and budget_left > 0:
        what = "run-to-run noise unknown (1 run)" if not known else f"gap {gap:.1%} within noise ±{noise:.1%}"
        wanted.append((side, f"repeat: the leader {lead.label} and the runner-up {second.label}: {what}"))
    elif not wanted:
        out.tie = gap <= noise
        out.settled = not out.tie
    return wanted


def _control(usable: list[PointObs], min_effect: float, more: bool, out: Plan) -> tuple[PointObs, str] | None:
    """The control (the point measured first): its drift, else whether it runs again now (after CONTROL_EVERY
    runs of other points, or as the last run when nothing else is wanted: `more` is False)."""
    timed = sorted((w, i) for i, p in enumerate(usable) if len(p.when) == len(p.metric) for w in p.when)
    if not timed:
        return None
    ctl = usable[timed[0][1]]
    out.control = ctl.case_id
    out.drift = _drift(ctl, min_effect)
    if out.drift is not None or ctl.active:
        return None
    last = max(ctl.when)
    since = sum(1 for w, i in timed if usable[i] is not ctl and w > last)
    if since >= CONTROL_EVERY:
        return ctl, f"control: {ctl.label} again after {since} runs of other points, to see whether the target drifts"
    if since and not more:
        return ctl, f"control: a last run of {ctl.label} after every other point, to see whether the target drifted"
    return None


def _drift(ctl: PointObs, min_effect: float) -> str | None:
    """How the control's objective moved from its first run beyond both runs' within-run noise, or None."""
    if len(ctl.metric) < 2 or not ctl.metric[0]:
        return None
    first, rel0 = ctl.metric[0], ctl.run_rel[0] if ctl.run_rel else None
    for k in range(1, len(ctl.metric)):
        rel = ctl.run_rel[k] if k < len(ctl.run_rel) else None
        change = (ctl.metric[k] - first) / abs(first)
        noise = math.hypot(rel0 or 0.0, rel or 0.0)
        if abs(change) > max(noise, min_effect):
            return (
                f"the control {ctl.label} moved {change:+.1%} (beyond its noise ±{noise:.1%}) between its run "
                f"at {ctl.when[0]} and its run at {ctl.when[k]}"
            )
    return None
