"""The impact table, the phases, and the delta -> plan derivation.

Every leaf field of the case belongs to one impact class (IMPACT below). The class decides which phases a
child case must run again and which reuse the parent's state. A test walks the model and fails when a field
has no class, so a new field cannot be added without choosing one.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from caseledger.case.bounds import SectionModel
from caseledger.case.decision import Decision
from caseledger.case.model import Case
from caseledger.case.phases import Phase
from caseledger.errors import FailureClass


class Impact(StrEnum):
    LOAD = "load"  # N / C / r / arrival and other per-request knobs: the hot path
    DATASET = "dataset"  # what is sent: data shape, tokenizer, cache construction
    SERVICE = "service"  # what serves: endpoints, engine argv, env, warmup after a start
    MEASUREMENT = "measurement"  # how raw data becomes figures: no new load needed


# The impact table. Keys are field paths; the longest matching prefix wins. Every leaf of Case must be
# covered (tests/test_case.py walks the model). 'parent', 'note' and '$schema' describe the case itself.
IMPACT: dict[str, Impact | None] = {
    "schema_": None,
    "parent": None,
    "note": None,
    "scenario": Impact.MEASUREMENT,
    "target.endpoints": Impact.SERVICE,
    "target.api": Impact.DATASET,
    "target.cards": Impact.MEASUREMENT,
    "target.metrics_url": Impact.MEASUREMENT,
    "target.api_key_env": Impact.LOAD,
    # checked at preflight against every request's prompt + max_tokens: a load-side check, the service is kept
    "target.context_tokens": Impact.LOAD,
    "target.lease_host": None,  # where the target's one owner is recorded: nothing measured changes with it
    "service": Impact.SERVICE,
    # where the service runs and how it is reached; a changed key or known_hosts re-runs the service phase,
    # which still reuses the live process when its identity (host, port, user, argv, env) is unchanged
    "service.ssh": Impact.SERVICE,
    # draft model, method and draft length fill argv placeholders: a change is a new argv, so a restart (the
    # draft model's file hash is part of the service identity too)
    "service.speculative": Impact.SERVICE,
    "dataset": Impact.DATASET,
    "load.requests": Impact.LOAD,
    "load.concurrency": Impact.LOAD,
    "load.rate": Impact.LOAD,
    "load.arrival": Impact.LOAD,
    "load.burstiness": Impact.LOAD,
    "load.time_scale": Impact.LOAD,
    "load.timeout_s": Impact.LOAD,
    "load.max_tokens": Impact.LOAD,
    "load.ignore_eos": Impact.LOAD,
    "load.salt": Impact.LOAD,
    "load.max_event_bytes": Impact.LOAD,
    # how many client processes share the formal load: where the client runs, not what the target serves
    "load.processes": Impact.LOAD,
    # where the load client runs (another host over SSH): a new load from there, the service is reused
    "load.host": Impact.LOAD,
    "load.hosts": Impact.LOAD,  # several load hosts, each with its client processes: likewise
    # whether the load phase fails on failed requests: decided at the end of a load, so a new load
    "load.max_failed_share": Impact.LOAD,
    "warmup": Impact.SERVICE,
    "cache": Impact.DATASET,
    "measurement": Impact.MEASUREMENT,
    "deadline": Impact.LOAD,
    "decision": Impact.MEASUREMENT,
    # limits and goodput's per-request limits only change how figures are judged (goodput is recomputed from the
    # raw data): a measurement-only child re-decides on the parent's raw data, no new load
    "decision.limits": Impact.MEASUREMENT,
    "decision.goodput": Impact.MEASUREMENT,
}


def impact_of(path: str) -> Impact | None:
    """The impact class of a dotted field path (longest matching prefix of IMPACT)."""
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in IMPACT:
            return IMPACT[key]
    raise KeyError(f"field '{path}' has no impact class: add it to caseledger.case.IMPACT")


# A postprocess collector that has not answered by then (stopped, stuck) is killed and the phase fails as `collect`
# (run/after_load.py); status names a stopped one at once, with this way out (ledger/advice.py).
COLLECT_TIMEOUT_S = 600.0

# The one phase -> failure-class table: the class of a phase that failed without saying its own class, or
# that was left open by an owner that died (DESIGN.md, Failure classes).
FAILURE_OF_PHASE: dict[Phase, FailureClass] = {
    Phase.PREFLIGHT: FailureClass.BEFORE_MODEL,
    Phase.SERVICE: FailureClass.SERVICE,
    Phase.WARMUP: FailureClass.SERVICE,
    Phase.ROUTE_VERIFY: FailureClass.SERVICE,
    Phase.CACHE_PREPARE: FailureClass.SERVICE,
    Phase.LOAD: FailureClass.END_UNKNOWN,
    Phase.CONFIRM_END: FailureClass.END_UNKNOWN,
    Phase.POSTPROCESS: FailureClass.COLLECT,
    Phase.DECIDE: FailureClass.COLLECT,
}


class PlanStep(SectionModel):
    phase: Phase
    action: Literal["run", "reuse", "check", "skip"]
    reason: str


class DeltaItem(SectionModel):
    path: str
    old: Any
    new: Any
    impact: Impact


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:  # JSON: leaves of a case dump
    """Leaf paths of a JSON value; lists are leaves (an argv is one value), except a list of objects each with
    its own unique "name" (service.components), whose items are keyed by name: a child changing decode's argv
    shows as service.components.decode.argv."""
    if isinstance(obj, dict):
        out: dict[str, Any] = {}  # JSON: leaves of a case dump
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else k))
        return out
    if not (isinstance(obj, list) and obj and all(isinstance(x, dict) for x in obj)):
        return {prefix: obj}
    names = [x.get("name") for x in obj]
    if all(isinstance(n, str) for n in names) and len(set(names)) == len(names):
        return flatten(
            {n: {k: v for k, v in x.items() if k != "name"} for n, x in zip(names, obj, strict=True)}, prefix
        )
    return {prefix: obj}


def argv_options(argv: list[str]) -> list[tuple[str, str | None]]:
    """Option/value pairs after the program part (tokens before the first '-' option are the program, a
    'python -m module' prefix included); a positional argument is ('', value)."""
    i = next(
        (n for n, a in enumerate(argv) if a.startswith("-") and a not in ("-m",) and n > 0 and argv[n - 1] != "-m"),
        len(argv),
    )
    out: list[tuple[str, str | None]] = []
    args = argv[i:]
    n = 0
    while n < len(args):
        a = args[n]
        if a.startswith("-"):
            if "=" in a:
                k, v = a.split("=", 1)
                out.append((k, v))
            elif n + 1 < len(args) and not args[n + 1].startswith("-"):
                out.append((a, args[n + 1]))
                n += 1
            else:
                out.append((a, None))
        else:
            out.append(("", a))
        n += 1
    return out


def argv_change(old: object, new: object) -> str | None:
    """A changed argv in the words of its flags ('-np 4→2', '--metrics added', '-fa removed'); None when either
    side is not an argv or no option differs (a repeated flag counts by its last value)."""
    if not (isinstance(old, list) and isinstance(new, list) and all(isinstance(x, str) for x in [*old, *new])):
        return None
    a, b = dict(argv_options(old)), dict(argv_options(new))

    def v(x: str | None) -> str:
        text = str(x)
        return text if len(text) <= 24 else text[:23] + "…"  # a label, not the value: the case holds it

    out = []
    for k in [*a, *(k for k in b if k not in a)]:
        name = k or "(positional)"
        if k not in b:
            out.append(f"{name} removed")
        elif k not in a:
            out.append(f"{name} {v(b[k])} added" if b[k] is not None else f"{name} added")
        elif a[k] != b[k]:
            out.append(f"{name} {v(a[k])}→{v(b[k])}")
    return ", ".join(out) or None


def delta(parent: Case | None, child: Case) -> list[DeltaItem]:
    if parent is None:
        return []
    a, b = flatten(parent.canonical()), flatten(child.canonical())
    items = []
    for path in sorted(set(a) | set(b)):
        imp = impact_of(path)
        if imp is None or a.get(path) == b.get(path):
            continue
        if path in DERIVED and all(x.get(path) == x.get(DERIVED[path]) for x in (a, b)):
            imp = impact_of(DERIVED[path])  # follows its source field (N640 means 640 entries)
        items.append(DeltaItem(path=path, old=a.get(path), new=b.get(path), impact=imp))
    return items


# Fields whose default follows another field; a change that only follows its source has the source's class.
DERIVED = {"dataset.entries": "load.requests", "load.max_tokens": "dataset.output_tokens"}


@dataclass(frozen=True)
class Live:
    """The target as start_run finds it: what a run's plan is derived from (read, never assumed)."""

    service: bool  # a live, verified service with this case's identity holds the target
    warm: bool  # that service instance was warmed and its routes verified since it started
    routes: bool = True  # ... and its routes' token counts were verified with this case's dataset (and tokenizer)


def plan(case: Case, changes: list[DeltaItem], has_parent: bool, live: Live | None = None) -> list[PlanStep]:
    """Which phases run and which are reused. The load follows the delta against the parent (a
    measurement-only child reprocesses the parent's raw data); service, warmup and routes follow the live
    state when it is known (start_run), else the delta (a preview at freeze)."""
    classes = {d.impact for d in changes}
    cache_target = case.cache.min_hit_ratio is not None
    warmup_needed = case.warmup.requests > 0
    steps: list[PlanStep] = [PlanStep(phase=Phase.PREFLIGHT, action="run", reason="always: fresh-process reload")]
    if has_parent and changes and classes <= {Impact.MEASUREMENT}:
        why = "measurement-only delta: no new load, reprocess the parent's raw data"
        steps += [
            PlanStep(phase=p, action="reuse", reason=why)
            for p in (Phase.SERVICE, Phase.WARMUP, Phase.ROUTE_VERIFY, Phase.CACHE_PREPARE)
        ]
        load_action, load_reason = "reuse", why
    else:
        svc: Literal["run", "reuse"]
        warm: Literal["run", "reuse"]
        if live is not None:
            svc = "reuse" if live.service else "run"
            svc_reason = (
                "a live service with this case's identity holds the target (verified)"
                if live.service
                else "no live service with this case's identity: start it"
            )
            warm = "reuse" if live.service and live.warm else "run"
            warm_reason = (
                "that service was warmed and its routes verified since it started"
                if warm == "reuse"
                else "the service is new or not yet warmed"
            )
            if warm == "reuse" and not live.routes:  # the token truth is the dataset's: checked again, no warmup
                routes, routes_reason = "run", "routes verified with another dataset: its token counts checked again"
            else:
                routes, routes_reason = warm, warm_reason
        elif not has_parent:
            svc, warm = "run", "run"
            svc_reason = warm_reason = "no parent: nothing to reuse (an equal live service is still reused)"
            routes, routes_reason = warm, warm_reason
        else:
            svc = warm = "run" if Impact.SERVICE in classes else "reuse"
            svc_reason = warm_reason = (
                "service fields changed" if svc == "run" else "service unchanged: reuse the live service"
            )
            routes, routes_reason = warm, warm_reason
            if Impact.DATASET in classes and routes == "reuse":
                routes, routes_reason = "run", "dataset changed: its token counts are verified before the load"
        steps += [
            PlanStep(phase=Phase.SERVICE, action=svc, reason=svc_reason),
            PlanStep(
                phase=Phase.WARMUP,
                action=warm if warmup_needed else "skip",
                reason=warm_reason if warmup_needed else "warmup.requests is 0",
            ),
            PlanStep(phase=Phase.ROUTE_VERIFY, action=routes, reason=routes_reason),
        ]
        if not cache_target:
            cache = PlanStep(
                phase=Phase.CACHE_PREPARE, action="skip", reason="no cache target (cache.min_hit_ratio null)"
            )
        elif svc == "run" or Impact.DATASET in classes or not has_parent:
            cache = PlanStep(
                phase=Phase.CACHE_PREPARE, action="run", reason="new service, new data or no parent: seed and check"
            )
        else:
            cache = PlanStep(phase=Phase.CACHE_PREPARE, action="check", reason="hot path: check, not re-seed")
        steps.append(cache)
        load_action = "run"
        load_reason = "dataset changed: formal load on the new data" if Impact.DATASET in classes else "formal load"
    steps += [
        PlanStep(phase=Phase.LOAD, action=load_action, reason=load_reason),
        PlanStep(phase=Phase.CONFIRM_END, action="run", reason="always: confirm the client and requests ended"),
        PlanStep(phase=Phase.POSTPROCESS, action="run", reason="always: fresh-process metrics from raw data"),
        PlanStep(phase=Phase.DECIDE, action="run", reason="always"),
    ]
    return steps


def decision_words(before: Decision, after: Decision) -> str:
    """'limits.tpot_p99_ms none->40, min_effect 0.02->0.05': the decision fields a freeze changed."""
    a, b = flatten(before.model_dump(mode="json")), flatten(after.model_dump(mode="json"))
    parts = [
        f"{k} {'none' if a.get(k) is None else a.get(k)}->{'none' if b.get(k) is None else b.get(k)}"
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k)
    ]
    return ", ".join(parts) or "unchanged"


def freeze_warnings(case: Case) -> list[str]:
    """What a freeze accepts but a person should hear before a run: a case that will measure something other than
    it seems to ask for. Warnings, not refusals: the case is valid and may be meant."""
    out: list[str] = []
    ratio = case.dataset.prefix_ratio
    if ratio > 0 and case.cache.min_hit_ratio is None:
        out.append(
            f"dataset.prefix_ratio is {ratio:g} but cache.min_hit_ratio is null: cache_prepare is skipped, so no "
            "route's prefixes are seeded and the first request of each prefix group on every cold slot misses the "
            f'cache (the measured hit ratio falls below {ratio:g}); set "cache": {{"min_hit_ratio": {ratio:g}}} to '
            "seed and check the cache before the formal load"
        )
    return out
