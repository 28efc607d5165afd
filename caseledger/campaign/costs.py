"""What a measurement costs, learned from the workspace's finished runs: per service identity, a start (a run
that started its service: its service, warmup, route_verify and cache_prepare phases, up to the first formal
request) and a request (the load phase's duration / N). Runs of the same engine and model count where the
identity has none; with neither, an assumed figure, said as such.

The figures are pure functions over `RunCost` facts (`learn`, `estimate`); `run_costs` reads the facts from the
ledger, each run's kept in the index under its signature (a run is folded once, not at every look).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from datetime import datetime

import orjson

from caseledger.campaign.model import Budget, HalvingSearch, Scalar, TpeSearch, space_of
from caseledger.campaign.search import ASSUMED_REQUEST_S, ASSUMED_START_S, Price, screens, service_axes
from caseledger.campaign.store import Campaign
from caseledger.case.model import Case
from caseledger.case.phases import Phase
from caseledger.case.store import load_case
from caseledger.errors import CaseledgerError
from caseledger.ledger.evidence import ServiceRecord, read_evidence
from caseledger.ledger.index import open_index
from caseledger.ledger.runs import RunMeta, load_run
from caseledger.ledger.state import PhaseState, fold
from caseledger.ledger.view import PhaseView
from caseledger.workspace import Workspace, canonical_json, sha256_bytes

START_PHASES = (Phase.SERVICE, Phase.WARMUP, Phase.ROUTE_VERIFY, Phase.CACHE_PREPARE)
MAX_RUNS = 500  # the newest finished runs the figures are learned from
_VERSION = "1"  # of a run's facts as the index keeps them


@dataclass(frozen=True)
class RunCost:
    """One finished run's cost facts."""

    service_key: str  # its service identity (service_key)
    engine_model: str  # its engine (or adapter) and model: 'llamacpp/qwen3-8b'
    start_s: float | None  # its start to the first formal request; None: it reused a running service
    load_s: float | None  # its load phase's duration; None: no load of its own
    requests: int  # its N


@dataclass(frozen=True)
class Figure:
    """One learned figure: its value (s), how many runs it rests on (0: assumed) and whose runs they are."""

    value: float
    n: int
    scope: str  # 'this service', 'the same engine and model', 'assumed'


@dataclass(frozen=True)
class Costs:
    """What a start and a request cost for one service identity."""

    start: Figure
    request: Figure

    def run_s(self, requests: int, start: bool) -> float:
        """A run's estimated seconds: its start (when it starts its service) and its requests."""
        return (self.start.value if start else 0.0) + requests * self.request.value

    def price(self) -> Price:
        """The figures as search kind auto weighs them (campaign/search.choose)."""
        said = "assumed" if not self.start.n and not self.request.n else "measured"
        return Price(self.start.value, self.request.value, said)

    def said(self) -> str:
        """'measured: start 6.1 s (3 starts), 1.7 s/request (4 runs)'; 'no runs yet: assumed ...'."""
        if not self.start.n and not self.request.n:
            return f"no runs yet: assumed start {self.start.value:g} s, {self.request.value:g} s/request"
        start = _said(self.start, "start", "{:.1f} s", "starts")
        request = _said(self.request, "", "{:.2g} s/request", "runs")
        return f"measured: {start}, {request}"


def _said(f: Figure, name: str, fmt: str, unit: str) -> str:
    fig = (name + " " if name else "") + fmt.format(f.value)
    if not f.n:
        return f"{fig} assumed"
    scope = "" if f.scope == "this service" else f", {f.scope}"
    return f"{fig} ({f.n} {unit if f.n != 1 else unit[:-1]}{scope})"


def service_key(case: Case) -> str:
    """A case's service identity as campaigns group points by it: its service and target sections."""
    c = case.canonical()
    return sha256_bytes(canonical_json({"service": c["service"], "target": c["target"]}))[:12]


def engine_model(case: Case) -> str:
    """The engine (or, without one named, the adapter) and the model a case serves: 'llamacpp/qwen3-8b'."""
    return f"{case.service.engine or case.service.adapter}/{case.target.endpoints[0].model}"


def _figure(values: list[float], scope: str, assumed: float) -> Figure:
    return Figure(statistics.median(values), len(values), scope) if values else Figure(assumed, 0, "assumed")


def learn(facts: Iterable[RunCost], service: str, engine_and_model: str) -> Costs:
    """The costs of one service identity: each figure the median over its own runs, else over the runs of the
    same engine and model, else assumed."""
    facts = list(facts)
    own = [f for f in facts if f.service_key == service]
    kin = [f for f in facts if f.engine_model == engine_and_model]

    def pick(get: Callable[[RunCost], float | None], assumed: float) -> Figure:
        for group, scope in ((own, "this service"), (kin, "the same engine and model")):
            values = [v for f in group if (v := get(f)) is not None]
            if values:
                return _figure(values, scope, assumed)
        return _figure([], "assumed", assumed)

    return Costs(
        start=pick(lambda f: f.start_s, ASSUMED_START_S),
        request=pick(
            lambda f: f.load_s / f.requests if f.load_s is not None and f.requests else None, ASSUMED_REQUEST_S
        ),
    )


@dataclass(frozen=True)
class Estimate:
    """What a campaign will spend: runs, service starts and minutes."""

    measurements: int
    starts: int
    minutes: float


def estimate(runs: list[tuple[str, int]], costs: Callable[[str], Costs]) -> Estimate:
    """The cost of these runs, in order ((service identity, N) each): a start wherever the identity differs from
    the run before's (the planner keeps an identity's points together: one start each)."""
    seconds, starts, live = 0.0, 0, None
    for key, n in runs:
        start = key != live
        starts += int(start)
        seconds += costs(key).run_s(n, start)
        live = key
    return Estimate(measurements=len(runs), starts=starts, minutes=seconds / 60)


def started_service(ws: Workspace, m: RunMeta) -> bool:
    """The run started its service (not reused; an external target is verified, never started)."""
    svc = read_evidence(ws.run(m.run_id), Phase.SERVICE)
    return isinstance(svc, ServiceRecord) and svc.outcome == "done" and any(p.pid for p in svc.processes)


def _wall(ph: PhaseView) -> float | None:
    if ph.state != PhaseState.DONE:
        return None
    if ph.started_mono is not None and ph.ended_mono is not None:
        return max(0.0, (ph.ended_mono - ph.started_mono) / 1e9)
    if ph.started_utc and ph.ended_utc:
        return max(0.0, (_unix(ph.ended_utc) - _unix(ph.started_utc)))
    return None


def _unix(utc: str) -> float:
    return datetime.fromisoformat(utc.replace("Z", "+00:00")).timestamp()


def _facts_of(ws: Workspace, run_id: str) -> RunCost | None:
    """One finished run's facts; None when its case cannot be read."""
    v = fold(ws, load_run(ws, run_id))
    try:
        case = load_case(ws, v.meta.case_id)
    except CaseledgerError:
        return None
    start: float | None = None
    if started_service(ws, v.meta):
        walls = [_wall(v.phases[p]) for p in START_PHASES if p in v.phases]
        start = sum(w for w in walls if w is not None)
    load = None if v.meta.load_reused else _wall(v.phases[Phase.LOAD]) if Phase.LOAD in v.phases else None
    return RunCost(service_key(case), engine_model(case), start, load, case.load.requests)


def run_costs(ws: Workspace) -> list[RunCost]:
    """The cost facts of the workspace's newest finished runs (succeeded or partial), oldest first."""
    out: list[RunCost] = []
    with open_index(ws) as idx:
        rows = [r for r in idx.recent(MAX_RUNS) if r.state in ("succeeded", "partial") and not r.live]
        for row in rows:
            sig = f"{_VERSION}:{row.sig}"
            body = idx.derived("cost", row.run_id, sig)
            if body is not None:
                got = orjson.loads(body)
                out += [RunCost(**got)] if got else []
                continue
            fact = _facts_of(ws, row.run_id)
            idx.put_derived("cost", row.run_id, sig, orjson.dumps(asdict(fact) if fact else None))
            out += [fact] if fact else []
    return out


def expected_runs(camp: Campaign, points: dict[str, tuple[str, int]], base: tuple[str, int]) -> list[tuple[str, int]]:
    """The runs a campaign is expected to make before settle repeats, in the order the planner keeps (an
    identity's points together), as (service identity, N): every point `repeats.runs` times (grid); about
    log2 of the line per setting of the other axes (knee); max_points proposals (tpe); every screen (halving).
    points: each frozen point's (identity, N); base: the base's (a proposed point's identity is its service
    axes' values)."""
    runs = camp.repeats.runs
    svc = service_axes(camp.axes)

    def ident(values: dict[str, Scalar]) -> str:
        return base[0] + repr(sorted((a.path, repr(values.get(a.path))) for a in svc))

    s = camp.search
    if isinstance(s, TpeSearch):  # each proposal a run; a start per service identity it tries, at most
        total = s.max_points or 1
        idents = int(min(total, math.prod(a.size() for a in svc))) if svc else 1
        return [(f"{base[0]}#{i * idents // total}", base[1]) for i in range(total)]
    if isinstance(s, HalvingSearch):
        alive = space_of(camp.axes, camp.constraints)
        screens_n = screens(s.screen_requests or base[1], s.eta, base[1])
        out: list[tuple[str, int]] = []
        for n in screens_n:
            out += sorted(((ident(v), n) for v in alive), key=lambda r: r[0])
            alive = alive[: max(1, -(-len(alive) // s.eta))]
        return out
    chosen = list(camp.points)
    if s.kind == "knee" and s.knee:
        groups: dict[str, list[str]] = {}
        for p in camp.points:
            rest = repr(sorted((k, repr(v)) for k, v in p.values.items() if k != s.knee))
            groups.setdefault(rest, []).append(p.case_id)
        keep = {c for line in groups.values() for c in line[: math.ceil(math.log2(len(line) + 1))]}
        chosen = [p for p in camp.points if p.case_id in keep]
    order = {k: i for i, k in reversed(list(enumerate(points[p.case_id][0] for p in chosen)))}
    ordered = sorted(chosen, key=lambda p: order[points[p.case_id][0]])
    return [points[p.case_id] for p in ordered for _ in range(runs)]


def said_estimate(est: Estimate, costs: Costs, repeats: int, budget: Budget) -> str:
    """'estimate: 6 measurements (+ up to 8 repeats), 2 starts, 0.5 min (measured: start 6.1 s (3 starts), 1.7
    s/request (4 runs)); budget 3 measurements: it ends there'."""
    more = f" (+ up to {repeats} repeats)" if repeats else ""
    text = (
        f"estimate: {est.measurements} measurements{more}, {est.starts} start(s), {est.minutes:.1f} min "
        f"({costs.said()})"
    )
    caps = [
        (budget.measurements, est.measurements, "measurements"),
        (budget.starts, est.starts, "starts"),
        (budget.minutes, est.minutes, "min"),
    ]
    given = [(cap, need, unit) for cap, need, unit in caps if cap is not None]
    if not given:
        return text
    short = [
        f"{need:.1f} {unit} > {cap:g}" if unit == "min" else f"{need:g} {unit} > {cap:g}"
        for cap, need, unit in given
        if need > cap
    ]
    said = ", ".join(f"{cap:g} {unit}" for cap, _, unit in given)
    ends = f": it ends at the budget ({'; '.join(short)})" if short else ": within it"
    return f"{text}; budget {said}{ends}"
