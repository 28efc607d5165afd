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
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from caseledger.campaign.model import Axis, Scalar, Search, allowed

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
) -> Proposal | None:
    """The next point Optuna's TPE proposes from the observations, or None when it only proposes measured
    points (converged) or the space is measured whole. live: the service identity running now (the latest
    measured point's): with service and load axes, its load-only neighbours come first (see the module)."""
    if len(observed) >= space_size(axes):
        return None
    svc = service_axes(axes)
    if not svc or len(svc) == len(axes) or live is None:
        return _ask(axes, search, higher, observed, {}, set(), constraints or [])
    on_live = [ob for ob in observed if ob.service_key == live]
    quota = min(NEIGHBOURS, space_size([a for a in axes if a not in svc]))
    if on_live and len(on_live) < quota:
        fixed = {a.path: on_live[0].values[a.path] for a in svc}
        got = _ask(axes, search, higher, observed, fixed, set(), constraints or [])
        if got is not None:
            why = f"{got.why}; a load-only neighbour on the running service ({len(on_live) + 1} of {quota})"
            return Proposal(got.values, why)
    left = {key({a.path: ob.values[a.path] for a in svc}) for ob in observed if ob.service_key != live}
    return _ask(axes, search, higher, observed, {}, left, constraints or [])


def _ask(
    axes: list[Axis],
    search: Search,
    higher: bool,
    observed: list[Observed],
    fixed: dict[str, Scalar],
    left: set[tuple[tuple[str, str], ...]],
    constraints: list[str],
) -> Proposal | None:
    """Optuna's TPE rebuilt from the observations, asked for a point not measured yet: with `fixed` values (the
    running service's), or outside the service identities in `left` (started before and left: never again)."""
    import optuna  # lazy: only a proposing driver needs it (~0.5 s of imports)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dists = _distributions(axes)
    n = len(observed)
    assert search.max_points is not None
    startup = min(10, max(3, search.max_points // 4))
    sampler: optuna.samplers.BaseSampler = optuna.samplers.TPESampler(
        seed=search.seed + n, n_startup_trials=startup, multivariate=True
    )
    if fixed:
        with warnings.catch_warnings():  # "experimental" since 2.4 (stable since): a notice, not a fault
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.PartialFixedSampler(fixed, sampler)
    study = optuna.create_study(direction="maximize" if higher else "minimize", sampler=sampler)
    valued = [ob for ob in observed if ob.value is not None]
    worst = max((abs(ob.value or 0.0) for ob in valued), default=1.0)
    for ob in valued:
        trial = optuna.trial.create_trial(params=ob.values, distributions=dists, value=_score(ob, higher, worst))
        study.add_trial(trial)
    seen = {key(ob.values): ob for ob in observed}
    svc = service_axes(axes)
    for _ in range(MAX_ASKS):
        t = study.ask(dists)
        values = {a.path: t.params[a.path] for a in axes}
        known = seen.get(key(values))
        keeps = allowed(constraints, values)
        if known is None and keeps and key({a.path: values[a.path] for a in svc}) not in left:
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


# Strategies that propose points, by search kind: one function each, the same signature.
STRATEGIES: dict[
    str, Callable[[list[Axis], Search, bool, list[Observed], str | None, list[str] | None], Proposal | None]
] = {"tpe": tpe}
