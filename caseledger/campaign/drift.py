"""The drift rule of a campaign on a shared host: has the target changed while the campaign measured it? Pure,
like the planner that calls it (campaign/planner.py).

Per service identity, the point measured first is its control. It is measured again after every CONTROL_EVERY
runs of other points of that identity and once before the campaign leaves it (no extra service start).

- A control run is compared with the control's earlier runs on the same target measured under like contention
  (the other processes' share of the host's CPU within CONTENTION_GAP of its own). A run with none of those is
  no evidence of a change of the target: host noise, and the answer says so.
- It moved when its change from their mean is beyond the noise floor: min_effect, DRIFT_NOISE times the runs'
  within-run noise, and the control's own run-to-run noise: the 99% prediction interval of one more run from
  those runs (Student's t: wide from few runs); HOST_FLOOR while they are fewer than LEARN_RUNS (the spread of
  one or two runs says little).
- A run that moved is a suspected change: the control is measured again at once, and no winner is named until
  its next like run confirms the change (moved the same way beyond the floor) or refutes it. Confirmed, the
  target changed at that run: the runs before it are set aside and their points measured again.
- A second confirmed change: the target keeps drifting, nothing more runs and the answer is inconclusive.

Observations without run times (`when`) have no control.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from caseledger.campaign.observed import LimitObs, PointObs

CONTROL_EVERY = 4  # runs of other points between two runs of the control
DRIFT_NOISE = 2.0  # beyond this many times the within-run noise: run-to-run varies more than one run says
HOST_FLOOR = 0.25  # the floor until the control has LEARN_RUNS like runs: a shared host moves a run ±8-12%, at times 2x
LEARN_RUNS = 3
T99 = (63.66, 9.92, 5.84, 4.60, 4.03, 3.71, 3.50, 3.36, 3.25, 3.17)  # Student t, two-sided 99%, by degrees of freedom
CONTENTION_GAP = 0.10  # other processes' CPU share (of the host) two runs may differ by and still compare
CONFIRM_TRIES = 2  # control runs under unlike contention after a suspected change before it stops asking


@dataclass(frozen=True)
class Change:
    """A control that moved beyond its noise floor at run time `at`: confirmed by its next like run or not."""

    confirmed: bool
    at: str
    said: str
    control: str  # the control's case id
    tries: int = 0  # its runs since, none comparable with it (unlike contention)


@dataclass
class Controls:
    """What the controls say: the observations the answer rests on and why no winner may be named."""

    points: list[PointObs]
    cut: str | None = None  # the target changed at this run time: runs before it are set aside
    drift: str | None = None  # the target changed twice: how and when
    suspect: Change | None = None  # a change not confirmed yet: no winner until it is
    notes: list[str] = field(default_factory=list)


def judge(points: list[PointObs], min_effect: float) -> Controls:
    """The controls' verdict on the observations: a confirmed change sets the runs before it aside; a second
    one is drift; an unconfirmed one is a suspect."""
    out = Controls(points=points)
    first = _change(points, min_effect, out.notes)
    if first is None or not first.confirmed:
        out.suspect = first
        return out
    out.cut = first.at
    _note(out.notes, first.said + ": the runs before it are set aside and their points measured again")
    out.points = set_aside(points, first.at)
    again = _change(out.points, min_effect, out.notes)
    if again is not None and again.confirmed:
        out.drift = f"{first.said}, and again: {again.said}"
    else:
        out.suspect = again
    return out


def timed(p: PointObs) -> bool:
    return bool(p.when) and len(p.when) == len(p.metric)


def control_of(group: list[PointObs]) -> PointObs | None:
    """The point of one service identity measured first (by its first valid run's time)."""
    runs = [p for p in group if timed(p)]
    return min(runs, key=lambda p: p.when[0]) if runs else None


def by_service(points: list[PointObs]) -> dict[str, list[PointObs]]:
    out: dict[str, list[PointObs]] = {}
    for p in points:
        out.setdefault(p.service_key, []).append(p)
    return out


def _note(notes: list[str], said: str) -> None:
    if said not in notes:
        notes.append(said)


def _change(points: list[PointObs], min_effect: float, notes: list[str]) -> Change | None:
    """The earliest change of any control beyond its noise floor."""
    found = [c for g in by_service(points).values() if (ctl := control_of(g)) and (c := _moved(ctl, min_effect, notes))]
    return min(found, key=lambda c: c.at) if found else None


def _comparable(ctl: PointObs, a: int, b: int) -> bool:
    """Runs a and b of the control may be compared: the same target, and like contention (unknown: alike)."""
    if len(ctl.targets) == len(ctl.metric) and ctl.targets[a] != ctl.targets[b]:
        return False
    share = [ctl.others[j] if j < len(ctl.others) else None for j in (a, b)]
    return share[0] is None or share[1] is None or abs(share[0] - share[1]) <= CONTENTION_GAP


def _floor(ctl: PointObs, base: list[int], k: int, min_effect: float) -> tuple[float, str]:
    """The noise floor of run k against the runs `base`, and what it rests on: from LEARN_RUNS like runs on, the
    99% prediction interval of one more run from theirs (few runs: a wide one), before that HOST_FLOOR."""
    rel = [ctl.run_rel[j] or 0.0 for j in (*base, k) if j < len(ctl.run_rel)]
    within = DRIFT_NOISE * math.hypot(max(rel[:-1], default=0.0), rel[-1] if rel else 0.0)
    vals = [ctl.metric[j] for j in base]
    n, mean = len(vals), sum(vals) / len(vals)
    if n >= LEARN_RUNS and mean:
        sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)) / abs(mean)
        spread = (T99[n - 2] if n - 1 <= len(T99) else 2.6) * sd * math.sqrt(1 + 1 / n)
        how = f"the next of its {n} like runs (sd ±{sd:.1%}) within ±{spread:.1%} at 99%"
    else:
        spread = HOST_FLOOR
        how = f"±{spread:.0%} assumed for a shared host until it has {LEARN_RUNS} like runs"
    floor = max(min_effect, within, spread)
    return floor, f"noise floor ±{floor:.0%}: {how}"


def _rel(ctl: PointObs, base: list[int], k: int) -> float:
    mean = sum(ctl.metric[j] for j in base) / len(base)
    return (ctl.metric[k] - mean) / abs(mean) if mean else 0.0


def _moved(ctl: PointObs, min_effect: float, notes: list[str]) -> Change | None:
    """The control's first run that moved beyond its noise floor, confirmed or not; a move of a run under
    unlike contention is noted as host noise."""
    n = len(ctl.metric)
    for k in range(1, n):
        base = [j for j in range(k) if _comparable(ctl, j, k)]
        if not base:
            _contended(ctl, k, min_effect, notes)
            continue
        floor, how = _floor(ctl, base, k, min_effect)
        change = _rel(ctl, base, k)
        if abs(change) <= floor:
            continue
        on = f" (on {ctl.targets[k]})" if len(ctl.targets) == n else ""
        said = (
            f"the control {ctl.label} moved {change:+.1%} from its {len(base)} earlier run(s) since "
            f"{ctl.when[base[0]]}{on} ({how})"
        )
        later = [j for j in range(k + 1, n) if _comparable(ctl, j, k)]
        if not later:
            return Change(False, ctl.when[k], f"{said} in its run at {ctl.when[k]}", ctl.case_id, tries=n - 1 - k)
        nxt = _rel(ctl, base, later[0])
        if abs(nxt) > floor and (nxt > 0) == (change > 0):
            said = f"the target changed at {ctl.when[k]}: {said} (confirmed by its next run)"
            return Change(True, ctl.when[k], said, ctl.case_id)
    return None


def _contended(ctl: PointObs, k: int, min_effect: float, notes: list[str]) -> None:
    """Note a control run that moved under other contention than every earlier run of it (same target)."""
    same = [j for j in range(k) if len(ctl.targets) != len(ctl.metric) or ctl.targets[j] == ctl.targets[k]]
    if not same or k >= len(ctl.others) or ctl.others[k] is None:
        return
    floor, _ = _floor(ctl, same, k, min_effect)
    change = _rel(ctl, same, k)
    if abs(change) <= floor:
        return
    theirs = ", ".join(f"{s:.0%}" for j in same if j < len(ctl.others) and (s := ctl.others[j]) is not None)
    _note(
        notes,
        f"the control {ctl.label} moved {change:+.1%} at {ctl.when[k]} while other processes took "
        f"{ctl.others[k]:.0%} of the host (in its earlier runs: {theirs}): host noise, not evidence of target drift",
    )


def _unpooled(limits: dict[str, LimitObs], drop: int) -> dict[str, LimitObs]:
    """Limits without their pooled figures when runs are dropped (the pool held them): each limit then rests on
    the mean and spread of the runs kept."""
    if not drop:
        return limits
    return {n: replace(lo, pooled=None, low=None, high=None, requests=0) for n, lo in limits.items()}


def set_aside(points: list[PointObs], cut: str) -> list[PointObs]:
    """The observations without the runs made before `cut` (the time the target changed): what the answer
    rests on after a confirmed change. A point with no run since is measured again."""
    out = []
    for p in points:
        if not timed(p):
            out.append(p)
            continue
        keep = [k for k, w in enumerate(p.when) if w >= cut]
        drop = len(p.metric) - len(keep)
        limits = {
            n: replace(lo, values=lo.values[drop:] if len(lo.values) == len(p.metric) else lo.values[-len(keep) :])
            if keep
            else replace(lo, values=[], half_width=None)
            for n, lo in _unpooled(p.limits, drop).items()
        }
        out.append(
            replace(
                p,
                metric=[p.metric[k] for k in keep],
                when=[p.when[k] for k in keep],
                run_rel=[p.run_rel[k] for k in keep if k < len(p.run_rel)],
                targets=[p.targets[k] for k in keep if k < len(p.targets)],
                others=[p.others[k] for k in keep if k < len(p.others)],
                interval_rel=p.interval_rel if keep else None,
                limits=limits,
            )
        )
    return out


def control_runs(
    usable: list[PointObs],
    wanted: list[tuple[PointObs, str]],
    live: str | None,
    open_search: bool,
    suspect: Change | None,
    controls: list[str],
) -> list[tuple[PointObs, str]]:
    """Each service identity's control (into `controls`), and the control runs wanted now: a suspected change
    confirmed at once (until CONFIRM_TRIES runs under unlike contention); on the live identity, a control run
    after CONTROL_EVERY runs of other points, and one before the campaign leaves the identity or ends."""
    runs: list[tuple[PointObs, str]] = []
    for key, group in by_service(usable).items():
        ctl = control_of(group)
        if ctl is None:
            continue
        controls.append(ctl.case_id)
        if ctl.active:
            continue
        if suspect is not None and suspect.control == ctl.case_id:
            if suspect.tries < CONFIRM_TRIES:
                runs.append((ctl, f"control: {suspect.said}; measured once more to confirm it"))
            continue
        since = sum(1 for p in group if p is not ctl for w in p.when if w > max(ctl.when))
        if key != live:
            continue
        if since >= CONTROL_EVERY:
            runs.append((ctl, f"control: {ctl.label} again after {since} runs of other points (target drift?)"))
        elif since and not open_search and not any(p.service_key == key for p, _ in wanted):
            runs.append((ctl, f"control: {ctl.label} again before leaving its service (target drift?)"))
    return runs
