"""Strategies that propose a campaign's points one at a time (ask/tell), for spaces too large to enumerate.

The ledger is the truth: at every proposal the strategy is rebuilt from the campaign's observations (each
measured point's objective, mean over its valid runs, and its limit verdict), with a sampler seeded by the
campaign's seed and the number of observations. The same observations therefore give the same next point, and a
driver that died (or a campaign resumed days later) continues exactly where it was, never proposing a measured
point again. A proposed point is frozen as a case when proposed (campaign/store.add_point), with its reason.

'tpe' is Optuna's TPE sampler (multivariate). A point that breaks a limit is told as worse than every point that
meets them, ordered by how far it breaks them; a point without a valid result is no evidence (never proposed
again). What the search itself does not settle -- noise between the best points -- the planner's settle rule
does once the search has ended (campaign/planner.py).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from caseledger.campaign.model import (
    MAX_POINTS,
    SERVICE_PREFIXES,
    Axis,
    Budget,
    GridSearch,
    HalvingSearch,
    KneeSearch,
    Scalar,
    Search,
    TpeSearch,
    active,
    allowed,
    space_of,
)

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

MAX_ASKS = 64  # proposals of measured points in a row before the search counts as converged
NEIGHBOURS = 3  # load-only points measured on a proposed service identity before the search moves to another


@dataclass(frozen=True)
class Observed:
    """One proposed point as measured so far."""

    values: dict[str, Scalar]
    value: float | None  # the objective, mean over its valid runs; None: no valid result (yet)
    meets: bool | None  # every limit met (None: no valid result)
    breach: float  # how far its worst limit is broken (mean / bound - 1); 0 when it meets them
    label: str = ""
    service_key: str = ""  # its service identity (campaign/view.service_key): points that share it share a start
    running: bool = False  # being measured now (on another target of a pool): a pending trial, not a failed one


@dataclass(frozen=True)
class Proposal:
    values: dict[str, Scalar]
    why: str


def key(values: dict[str, Scalar]) -> tuple[tuple[str, str], ...]:
    """A point's identity by value (1 and 1.0 are the same setting of a field)."""
    return tuple(sorted((p, f"{v:.12g}" if isinstance(v, float) else repr(v)) for p, v in values.items()))


def space_size(axes: list[Axis]) -> float:
    return math.prod(a.size() for a in axes)


def _distributions(axes: list[Axis]) -> dict[str, BaseDistribution]:  # the sampler's, by axis path
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution  # lazy: optuna

    out: dict[str, BaseDistribution] = {}
    for a in axes:
        if a.values is not None:
            out[a.path] = CategoricalDistribution(a.values)
        elif a.integer:
            assert a.low is not None and a.high is not None
            out[a.path] = IntDistribution(int(a.low), int(a.high), step=int(a.step or 1), log=a.log)
        else:
            assert a.low is not None and a.high is not None
            out[a.path] = FloatDistribution(float(a.low), float(a.high), step=a.step, log=a.log)
    return out


def _score(ob: Observed, higher: bool, worst: float) -> float:
    """What the sampler is told: the objective when every limit is met, else worse than any point that meets
    them (by `worst`, the observed extreme), the further from the limits the worse."""
    assert ob.value is not None
    if ob.meets:
        return ob.value
    return (-1.0 - ob.breach) if higher else worst * (2.0 + ob.breach) + 1.0


def service_axes(axes: list[Axis]) -> list[Axis]:
    """The axes that change the service identity (a start), as against those measured on a running service."""
    return [a for a in axes if a.path.startswith(SERVICE_PREFIXES)]


def tpe(
    axes: list[Axis],
    search: Search,
    higher: bool,
    observed: list[Observed],
    live: str | None = None,
    constraints: list[str] | None = None,
    *,
    full_requests: int = 0,  # the base's N (halving's; unused here)
) -> Proposal | None:
    """The next point Optuna's TPE proposes from the observations, or None when it only proposes measured
    points (converged) or the space is measured whole. live: the service identity running now (the latest
    measured point's): with service and load axes, its load-only neighbours come first (see the module)."""
    if len(observed) >= space_size(axes):
        return None
    assert isinstance(search, TpeSearch)
    if search.axis is not None:
        return _tpe_knee(axes, search, higher, observed, constraints or [])
    svc = service_axes(axes)
    if not svc or len(svc) == len(axes) or live is None:
        return _ask(axes, search, higher, observed, {}, set(), constraints or [])
    on_live = [ob for ob in observed if ob.service_key == live]
    quota = min(search.neighbours or NEIGHBOURS, space_size([a for a in axes if a not in svc]))
    if on_live and len(on_live) < quota:
        fixed = {a.path: on_live[0].values[a.path] for a in svc if a.path in on_live[0].values}
        got = _ask(axes, search, higher, observed, fixed, set(), constraints or [])
        if got is not None:
            why = f"{got.why}; a load-only neighbour on the running service ({len(on_live) + 1} of {quota})"
            return Proposal(got.values, why)
    left = {
        key({a.path: ob.values[a.path] for a in svc if a.path in ob.values})
        for ob in observed
        if ob.service_key != live
    }
    return _ask(axes, search, higher, observed, {}, left, constraints or [])


def _ask(
    axes: list[Axis],
    search: Search,
    higher: bool,
    observed: list[Observed],
    fixed: dict[str, Scalar],
    left: set[tuple[tuple[str, str], ...]],
    constraints: list[str],
    trials: int | None = None,
) -> Proposal | None:
    """Optuna's TPE rebuilt from the observations, asked for a point not measured yet: with `fixed` values (the
    running service's), or outside the service identities in `left` (started before and left: never again)."""
    import optuna  # lazy: only a proposing driver needs it (~0.5 s of imports)

    assert isinstance(search, TpeSearch)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dists = _distributions(axes)
    n = len(observed)
    assert search.max_points is not None
    startup = min(10, max(3, (trials or search.max_points) // 4))
    running = [ob for ob in observed if ob.running and ob.value is None]
    # a pool's points in flight are pending trials: TPE's constant liar keeps the next proposal away from them
    # (the usual way to ask a batch); with none running the sampler is the one a single target always had
    sampler: optuna.samplers.BaseSampler = optuna.samplers.TPESampler(
        seed=search.seed + n, n_startup_trials=startup, multivariate=True, constant_liar=bool(running)
    )
    if fixed:
        with warnings.catch_warnings():  # "experimental" since 2.4 (stable since): a notice, not a fault
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.PartialFixedSampler(fixed, sampler)
    study = optuna.create_study(direction="maximize" if higher else "minimize", sampler=sampler)
    valued = [ob for ob in observed if ob.value is not None]
    worst = max((abs(ob.value or 0.0) for ob in valued), default=1.0)
    for ob in valued:
        present = {p: dists[p] for p in ob.values if p in dists}  # an axis its `when` left out: not a param
        trial = optuna.trial.create_trial(params=ob.values, distributions=present, value=_score(ob, higher, worst))
        study.add_trial(trial)
    for ob in running:
        present = {p: dists[p] for p in ob.values if p in dists}
        study.add_trial(
            optuna.trial.create_trial(params=ob.values, distributions=present, state=optuna.trial.TrialState.RUNNING)
        )
    seen = {key(ob.values): ob for ob in observed}
    svc = service_axes(axes)
    for _ in range(MAX_ASKS):
        t = study.ask(dists)
        values = active(axes, {a.path: t.params[a.path] for a in axes})
        known = seen.get(key(values))
        keeps = allowed(constraints, values)
        if known is None and keeps and key({a.path: values[a.path] for a in svc if a.path in values}) not in left:
            return Proposal(values, _why(n, startup, valued, higher))
        # the sampler moves on: a measured point told its own result; one outside the constraints told as a point
        # far beyond the limits (so it learns where they lie); a service left before, a failed trial
        if not keeps:
            study.tell(t, _score(Observed(values=values, value=0.0, meets=False, breach=1.0), higher, worst))
        elif known is None or known.value is None:
            study.tell(t, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(t, _score(known, higher, worst))
    return None


def _tpe_knee(
    axes: list[Axis], search: TpeSearch, higher: bool, observed: list[Observed], constraints: list[str]
) -> Proposal | None:
    """TPE over the other axes, a knee on `search.axis` for each of its proposals: the setting proposed last is
    bisected to its largest value within the limits (declared monotone) before TPE is asked again, told each
    bisected setting's best point (its setting's worth). A point without a valid result counts as breaking."""
    ax = search.axis
    assert ax is not None
    line = sorted(next(a.grid() or [] for a in axes if a.path == ax), key=float)
    others = [a for a in axes if a.path != ax]
    groups: dict[tuple[tuple[str, str], ...], list[Observed]] = {}
    for ob in observed:
        groups.setdefault(key({p: v for p, v in ob.values.items() if p != ax}), []).append(ob)
    if observed:  # the setting proposed last: finish its knee first
        last = observed[-1]
        rest = {p: v for p, v in last.values.items() if p != ax}
        nxt = _knee_step(line, groups[key(rest)], ax, constraints, rest)
        if nxt is not None:
            value, why = nxt
            label = " ".join(a.label(rest[a.path]) for a in axes if a.path in rest)
            return Proposal({**rest, ax: value}, f"knee on {ax}{' for ' + label if label else ''}: {why}")
    told = [_setting(members, ax, higher) for members in groups.values()]
    settings = int(search.max_points or 0) // math.ceil(math.log2(len(line) + 1))  # a knee: ~log2 points each
    among = [c for c in constraints if ax not in c.split()]  # those between the other axes; the knee's below
    if not others:  # the knee axis alone: one knee
        got = None if observed else Proposal({}, "proposed by tpe, setting 1: the knee axis alone")
    else:
        got = _ask(others, search, higher, told, {}, set(), among, trials=settings)
    if got is None:
        return None
    start = next((v for v in _middle_out(line) if allowed(constraints, {**got.values, ax: v})), None)
    if start is None:
        return None
    why = got.why.replace(f"trial {len(told) + 1}", f"setting {len(told) + 1}", 1)
    return Proposal({**got.values, ax: start}, f"{why}; its knee on {ax} starts at {start}")


@dataclass(frozen=True)
class Bracket:
    """A knee's bracket on its ordered line: `meets` the highest index known to meet every limit below `breaks`,
    the lowest known to break one (-1 and len(line) when none), and `next` the index to measure (None: closed)."""

    meets: int
    breaks: int
    next: int | None


def bisect(verdicts: list[bool | None], allowed_at: Callable[[int], bool] = lambda _: True) -> Bracket:
    """The one bisection of every knee: the bracket of an ordered line's verdicts (True meets every limit, False
    breaks one, None: not measured, or no evidence) and its midpoint. An index outside the constraints counts as
    breaking: nothing above it is tried either."""
    hb = next((i for i, v in enumerate(verdicts) if v is False), len(verdicts))
    lm = max((i for i, v in enumerate(verdicts[:hb]) if v is True), default=-1)
    top = hb
    while top - lm > 1:
        mid = (lm + top) // 2
        if allowed_at(mid):
            return Bracket(lm, hb, mid)
        top = mid
    return Bracket(lm, hb, None)


def bracket_why(low: str | None, high: str | None) -> str:
    """'bisecting between C=2 meets and C=8 breaks' (None: nothing measured on that side)."""
    lo = f"{low} meets" if low is not None else "nothing measured below"
    hi = f"{high} breaks" if high is not None else "nothing measured above"
    return f"bisecting between {lo} and {hi}"


def _knee_step(
    line: list[Scalar], members: list[Observed], ax: str, constraints: list[str], rest: dict[str, Scalar]
) -> tuple[Scalar, str] | None:
    """The next value of the knee axis for one setting, or None when its bracket is closed."""
    meets = {key({ax: m.values[ax]}): bool(m.meets) for m in members}  # no valid result: as if it broke
    b = bisect([meets.get(key({ax: v})) for v in line], lambda i: allowed(constraints, {**rest, ax: line[i]}))
    if b.next is None:
        return None
    low = str(line[b.meets]) if b.meets >= 0 else None
    high = str(line[b.breaks]) if b.breaks < len(line) else None
    return line[b.next], bracket_why(low, high)


def _middle_out(line: list[Scalar]) -> list[Scalar]:
    """The knee axis's values from the first bisection point outward (a constraint may exclude the middle)."""
    mid = (len(line) - 1) // 2
    return sorted(line, key=lambda v: (abs(line.index(v) - mid), line.index(v)))


def _setting(members: list[Observed], ax: str, higher: bool) -> Observed:
    """What TPE is told of one bisected setting: its best point within the limits, else its least breaking."""
    rest = {p: v for p, v in members[0].values.items() if p != ax}
    valued = [m for m in members if m.value is not None]
    if not valued:
        return Observed(values=rest, value=None, meets=None, breach=0.0, label=members[0].label)
    meeting = [m for m in valued if m.meets]
    pick = (
        (max if higher else min)(meeting, key=lambda m: m.value or 0.0)
        if meeting
        else min(valued, key=lambda m: m.breach)
    )
    return Observed(values=rest, value=pick.value, meets=pick.meets, breach=pick.breach, label=pick.label)


def _why(n: int, startup: int, valued: list[Observed], higher: bool) -> str:
    if n < startup:
        return f"proposed by tpe, trial {n + 1}: random start ({n + 1} of {startup})"
    meeting = [ob for ob in valued if ob.meets]
    if not meeting:
        return f"proposed by tpe, trial {n + 1}: toward the limits (no point of {len(valued)} meets them yet)"
    best = (max if higher else min)(meeting, key=lambda ob: ob.value or 0.0)
    return (
        f"proposed by tpe, trial {n + 1}: sampled where the better points of {len(valued)} lie "
        f"(leader {best.label or key(best.values)} {best.value:.4g})"
    )


REQUESTS = "load.requests"  # the field a halving screen sets beside the axes


def screens(first: int, eta: int, full: int) -> list[int]:
    """N of each screen of a halving search: first, eta times more each, the last the base's N."""
    out = [first]
    while out[-1] * eta < full:
        out.append(out[-1] * eta)
    return [*out, full]


def halving(
    axes: list[Axis],
    search: Search,
    higher: bool,
    observed: list[Observed],
    live: str | None = None,
    constraints: list[str] | None = None,
    *,
    full_requests: int,
) -> Proposal | None:
    """Successive halving over the enumerated space: every point once with screen_requests, then the best 1/eta
    of each screen (within the limits first, by the objective; then the least breaking) again with eta times the
    requests, until the base's N; the last screen's points are the campaign's answer (its settle rule repeats
    them). None once the last screen is measured. Within a screen, the running service's points come first and
    each service identity's points follow one another (one start each)."""
    assert isinstance(search, HalvingSearch) and search.screen_requests is not None
    ns = screens(search.screen_requests, search.eta, full_requests)
    seen = {key(ob.values): ob for ob in observed}
    svc = service_axes(axes)

    def ident(values: dict[str, Scalar]) -> tuple[tuple[str, str], ...]:
        return key({a.path: values[a.path] for a in svc if a.path in values})

    running = next((ident(ob.values) for ob in reversed(observed) if ob.service_key == live), None)
    alive = space_of(axes, constraints or [])
    for rung, n in enumerate(ns):
        at = [({**v, REQUESTS: n} if n != full_requests else v) for v in alive]
        todo = [v for v in at if key(v) not in seen]
        if todo:
            first: dict[tuple[tuple[str, str], ...], int] = {}
            for i, v in enumerate(todo):
                first.setdefault(ident(v), i)
            pick = min(todo, key=lambda v: (ident(v) != running, first[ident(v)]))
            where = f"screen {rung + 1} of {len(ns)}, N={n}"
            if rung == 0:
                return Proposal(pick, f"proposed by halving, {where}: every point of the space once")
            return Proposal(pick, f"proposed by halving, {where}: in the best 1/{search.eta} of screen {rung}")
        ranked = sorted((seen[key(v)] for v in at), key=lambda ob: _rank(ob, higher))
        keep = ranked[: max(1, -(-len(at) // search.eta))]
        alive = [{p: v for p, v in ob.values.items() if p != REQUESTS} for ob in keep]
    return None


def _rank(ob: Observed, higher: bool) -> tuple[int, float]:
    """Within the limits first (by the objective), then breaking (the least first), no result last."""
    if ob.value is None:
        return (2, 0.0)
    if ob.meets:
        return (0, -ob.value if higher else ob.value)
    return (1, ob.breach)


def _ident(svc: list[Axis], values: dict[str, Scalar]) -> tuple[tuple[str, str], ...]:
    """A point's service identity by its service axes' values."""
    return key({a.path: values[a.path] for a in svc if a.path in values})


def _running(svc: list[Axis], observed: list[Observed], live: str | None) -> tuple[tuple[str, str], ...] | None:
    return next((_ident(svc, ob.values) for ob in reversed(observed) if ob.service_key == live), None)


def grid(
    axes: list[Axis],
    search: Search,
    higher: bool,
    observed: list[Observed],
    live: str | None = None,
    constraints: list[str] | None = None,
    *,
    full_requests: int = 0,
) -> Proposal | None:
    """Every point of the space once, in the axes' order, the running service's points first (one start per
    identity); None once every point is measured."""
    seen = {key(ob.values) for ob in observed}
    todo = [v for v in space_of(axes, constraints or []) if key(v) not in seen]
    if not todo:
        return None
    svc = service_axes(axes)
    running = _running(svc, observed, live)
    pick = next((v for v in todo if _ident(svc, v) == running), todo[0])
    return Proposal(pick, f"grid point {len(observed) + 1}")


def knee(
    axes: list[Axis],
    search: Search,
    higher: bool,
    observed: list[Observed],
    live: str | None = None,
    constraints: list[str] | None = None,
    *,
    full_requests: int = 0,
) -> Proposal | None:
    """Per setting of the other axes (the running service's first), the next bisection point of the knee axis;
    None once every setting's bracket is closed."""
    ax = search.knee
    assert ax is not None
    line = sorted(next(a.grid() or [] for a in axes if a.path == ax), key=float)
    others = [a for a in axes if a.path != ax]
    settings = space_of(others, [c for c in constraints or [] if ax not in c.split()])
    svc = service_axes(axes)
    running = _running(svc, observed, live)
    members: dict[tuple[tuple[str, str], ...], list[Observed]] = {}
    for ob in observed:
        members.setdefault(key({p: v for p, v in ob.values.items() if p != ax}), []).append(ob)
    for rest in sorted(settings, key=lambda r: _ident(svc, r) != running):  # stable: the axes' order otherwise
        nxt = _knee_step(line, members.get(key(rest), []), ax, constraints or [], rest)
        if nxt is not None:
            label = " ".join(a.label(rest[a.path]) for a in others if a.path in rest)
            return Proposal({**rest, ax: nxt[0]}, f"knee on {ax}{' for ' + label if label else ''}: {nxt[1]}")
    return None


class Strategy(Protocol):
    """Proposes a campaign's next point from what was measured (None: the search has ended)."""

    def __call__(
        self,
        axes: list[Axis],
        search: Search,
        higher: bool,
        observed: list[Observed],
        live: str | None = None,
        constraints: list[str] | None = None,
        *,
        full_requests: int,
    ) -> Proposal | None: ...


# Every search kind's strategy, one function each with the same signature (auto: the one it chose at freeze). A
# proposing kind's (model.PROPOSING) is asked by the driver; grid's and knee's points are frozen up front and the
# planner runs them (campaign/planner.py), on the same bisection.
STRATEGIES: dict[str, Strategy] = {"grid": grid, "knee": knee, "tpe": tpe, "halving": halving}


ASSUMED_START_S = 30.0  # no run of the identity, engine or model yet: a start as a model server's takes
ASSUMED_REQUEST_S = 1.0
LOAD_ORDERED = ("load.concurrency", "load.rate")  # load axes whose limits only worsen as they grow: a knee's
SCREEN_MIN_N = 8  # a base N below this is too few requests to screen on
RESERVE = 6  # auto keeps 1/RESERVE of a measurement budget for settle and control runs (up to repeats.budget)


@dataclass(frozen=True)
class Price:
    """What a start and a request cost, for auto's choice (campaign/costs.py learns them from the ledger)."""

    start_s: float = ASSUMED_START_S
    request_s: float = ASSUMED_REQUEST_S
    said: str = "assumed"


@dataclass(frozen=True)
class Space:
    """What auto chooses from: the space, its limits, the base's N and what runs and repeats it may spend."""

    axes: list[Axis]
    constraints: list[str]
    limits: bool  # the decision has limits (a knee looks for the largest value within them)
    requests: int  # the base's N
    runs: int = 1  # repeats.runs
    repeats: int = 8  # repeats.budget


def choose(sp: Space, budget: Budget, price: Price, seed: int = 0) -> tuple[Search, str]:
    """auto's strategy, and why in words. Each candidate's spend (measurements, starts, seconds, from the costs)
    is weighed against the budget: a grid when the whole space fits; a knee on an ordered load axis when only
    load axes vary and its bisections fit; halving when a start costs no more than a run and every screen fits
    (screens spend fewer requests); else tpe on the budget's measurements, with a knee per proposed identity where
    a load axis is ordered. Pure: the same space, budget and costs give the same choice."""
    points = len(space_of(sp.axes, sp.constraints)) if space_size(sp.axes) <= MAX_POINTS else space_size(sp.axes)
    svc = service_axes(sp.axes)
    idents = space_size(svc)
    run_s = sp.requests * price.request_s
    ratio = price.start_s / max(run_s, 1e-9)  # a start costs this many runs
    cost = f"a start costs {price.start_s:.3g} s, a run {run_s:.3g} s ({price.said})"
    ax = next((a for a in sp.axes if a.path in LOAD_ORDERED and a.when is None and len(a.grid() or []) >= 3), None)
    line = len(ax.grid() or []) if ax is not None else 1
    per = math.ceil(math.log2(line + 1))  # a knee's bisection points on one setting, at most
    grid_ = _Spend(points * sp.runs, idents, points * sp.runs * run_s + idents * price.start_s)
    if points <= MAX_POINTS and grid_.within(budget):
        return GridSearch(), f"auto: grid: its {points:g} points fit {_said(budget)}; {cost}"
    knee_on = ax is not None and sp.limits
    if knee_on and ax is not None and not svc and points <= MAX_POINTS:
        n = points / line * per
        if _Spend(n, 1, n * run_s + price.start_s).within(budget):
            why = f"auto: knee on {ax.path}: only load axes vary; {points / line:g} setting(s) × ~{per} points fit"
            return KneeSearch(kind="knee", axis=ax.path, monotone=True), f"{why} {_said(budget)}; {cost}"
    halving_ = _halving(sp, points, idents, ratio, price, budget)
    if halving_ is not None:
        return halving_, (
            f"auto: halving from N={halving_.screen_requests}: a start costs {ratio:.2g} run(s) and every screen "
            f"fits {_said(budget)}, the grid does not; {cost}"
        )
    most = _measurements(budget, sp, price, idents)
    if most is None:  # no budget, a space too large to enumerate: a share of it
        most = min(MAX_POINTS, max(10, math.ceil(0.15 * points)) if not math.isinf(points) else 30)
    keep = max(2, most - min(sp.repeats, most // RESERVE))
    have = f"budget {most} measurements"
    if knee_on and ax is not None:
        tpe_ = TpeSearch(kind="tpe", max_points=keep, seed=seed, axis=ax.path, monotone=True)
        short = ax.label(0).split("=")[0]
        return tpe_, (
            f"auto: tpe with a knee on {ax.path} per proposed identity: {idents:g} identities × {line} {short} > "
            f"{have}; {keep} proposed, the rest for settle runs; {cost}"
        )
    near = max(1, min(1 + round(ratio), keep))  # a start is worth this many runs on the service already started
    tpe_ = TpeSearch(kind="tpe", max_points=keep, seed=seed, neighbours=near if svc else None)
    stay = f"; {near} point(s) on a started service before another start (a start costs {ratio:.2g} runs)"
    return tpe_, f"auto: tpe: {points:g} points > {have}; {keep} proposed{stay if svc else ''}; {cost}"


@dataclass(frozen=True)
class _Spend:
    measurements: float
    starts: float
    seconds: float

    def within(self, b: Budget) -> bool:
        """Every part of the budget given holds it (none given: nothing does; auto then chooses by the space)."""
        caps = [
            (b.measurements, self.measurements),
            (b.starts, self.starts),
            (b.minutes * 60 if b.minutes is not None else None, self.seconds),
        ]
        given = [(cap, need) for cap, need in caps if cap is not None]
        return bool(given) and all(need <= cap for cap, need in given)


def _said(b: Budget) -> str:
    parts = [
        f"{b.measurements} measurements" if b.measurements is not None else "",
        f"{b.starts} starts" if b.starts is not None else "",
        f"{b.minutes:g} min" if b.minutes is not None else "",
    ]
    return "budget " + ", ".join(p for p in parts if p) if any(parts) else "no budget"


def _measurements(budget: Budget, sp: Space, price: Price, idents: float) -> int | None:
    """The measurements a budget allows: its own count, or what its minutes or starts buy (None: no budget)."""
    got: list[int] = []
    if budget.measurements is not None:
        got.append(budget.measurements)
    if budget.minutes is not None:
        got.append(int(budget.minutes * 60 / (sp.requests * price.request_s + price.start_s / 2)))
    if budget.starts is not None:
        per = space_size([a for a in sp.axes if a not in service_axes(sp.axes)]) or 1
        got.append(int(budget.starts * min(per, 8)))
    return max(2, min(got)) if got else None


def _halving(
    sp: Space, points: float, idents: float, ratio: float, price: Price, budget: Budget
) -> HalvingSearch | None:
    """Halving when a start costs no more than a run, the base's N can be screened, and every screen fits."""
    if ratio > 1 or sp.requests < SCREEN_MIN_N or points > MAX_POINTS or "load.requests" in {a.path for a in sp.axes}:
        return None
    first, eta = max(1, sp.requests // 8), 3
    ns = screens(first, eta, sp.requests)
    alive, runs, seconds = int(points), 0, idents * len(ns) * price.start_s  # each identity once per screen
    for n in ns:
        runs += alive
        seconds += alive * n * price.request_s
        alive = max(1, -(-alive // eta))
    ok = _Spend(runs, idents * len(ns), seconds).within(budget)
    return HalvingSearch(kind="halving", screen_requests=first, eta=eta) if ok else None
