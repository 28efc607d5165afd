"""Strategies that propose a campaign's points one at a time (ask/tell), for spaces too large to enumerate.

The ledger is the truth: at every proposal the strategy is rebuilt from the campaign's observations (each
measured point's objective, mean over its valid runs, and its limit verdict), with a sampler seeded by the
campaign's seed and the number of observations. The same observations therefore give the same next point, and a
driver that died (or a campaign resumed days later) continues exactly where it was, never proposing a measured
point again. A proposed point is frozen as a case when proposed (campaign/store.add_point), with its reason.

'tpe' is Optuna's TPE sampler (multivariate). A point that breaks a limit is told as worse than every point that
meets them, ordered by how far it breaks them; a point without a valid result is no evidence (never proposed
again). What the search itself does not settle -- noise between the best points -- the planner's settle rule
does once the search has ended (campaign/plan.py).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from caseledger.campaign.model import Axis, Scalar, Search, active, allowed, space_of

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
    return [a for a in axes if a.path.startswith(("service.", "target."))]


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
    if search.axis is not None:
        return _tpe_knee(axes, search, higher, observed, constraints or [])
    svc = service_axes(axes)
    if not svc or len(svc) == len(axes) or live is None:
        return _ask(axes, search, higher, observed, {}, set(), constraints or [])
    on_live = [ob for ob in observed if ob.service_key == live]
    quota = min(NEIGHBOURS, space_size([a for a in axes if a not in svc]))
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
    axes: list[Axis], search: Search, higher: bool, observed: list[Observed], constraints: list[str]
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
        nxt = _bisect(line, groups[key(rest)], ax, constraints, rest)
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


def _bisect(
    line: list[Scalar], members: list[Observed], ax: str, constraints: list[str], rest: dict[str, Scalar]
) -> tuple[Scalar, str] | None:
    """The next value of the knee axis for one setting, or None when its bracket is closed."""
    meets = {key({ax: m.values[ax]}): bool(m.meets) for m in members}
    verdict = [meets.get(key({ax: v})) for v in line]
    hb = next((i for i, v in enumerate(verdict) if v is False), len(line))
    lm = max((i for i, v in enumerate(verdict[:hb]) if v is True), default=-1)
    while hb - lm > 1:
        mid = (lm + hb) // 2
        if allowed(constraints, {**rest, ax: line[mid]}):
            low = f"{line[lm]} meets" if lm >= 0 else "nothing measured below"
            high = f"{line[hb]} breaks" if hb < len(line) else "nothing measured above"
            return line[mid], f"bisecting between {low} and {high}"
        hb = mid  # outside the constraints: as if it broke (nothing above it is tried either)
    return None


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
    assert search.screen_requests is not None
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


# Strategies that propose points, by search kind (model.PROPOSING): one function each, the same signature.
STRATEGIES: dict[str, Strategy] = {"tpe": tpe, "halving": halving}
