"""Freezing and loading campaigns: the base case and every point frozen as cases, the campaign under its hash.

ledger/campaigns/<g-id>/
  campaign.json   what it measures (base case id, axes), read-only: its hash is the id
  points.json     every point: its axis values, label and case id
  policy.jsonl    how it is asked (search, repeats, budget, name, note), one line per change: the last one holds
  driver.json     the driver process (pid, start time) and when it first started: the campaign's clock
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from caseledger import datasets
from caseledger.campaign.model import (
    AutoSearch,
    Axis,
    Budget,
    CampaignDraft,
    HalvingSearch,
    PoolTarget,
    Repeats,
    Scalar,
    Search,
    apply_axis,
    label_of,
    stored_search,
)
from caseledger.campaign.search import Price, Space, choose
from caseledger.case.decision import Decision
from caseledger.case.model import LINEAGE_FIELDS, Case
from caseledger.case.store import (
    case_id_of,
    explain,
    load_case,
    record_decision,
    scenario_decision,
    store,
    validate,
)
from caseledger.case.target import health_url_of, origin
from caseledger.errors import CaseInvalid, NotFound
from caseledger.ledger.event_types import (
    DriverEnded,
    DriverEvent,
    DriverStarted,
    HostRefused,
    PointResumed,
    PointStarted,
    UnknownEvent,
    Waiting,
)
from caseledger.ledger.events import read_driver_events
from caseledger.ledger.leases import target_key
from caseledger.records import read_jsonl
from caseledger.workspace import (
    Workspace,
    atomic_write,
    canonical_json,
    check_id,
    read_json_or_none,
    sha256_bytes,
    utc_now,
    write_json,
)


@dataclass(frozen=True)
class Point:
    values: dict[str, Scalar]  # axis path -> value
    label: str  # 'C=8' or '-np=2 C=8'
    case_id: str  # its case (on a pool: on its first target)
    why: str = ""  # a proposed point: who proposed it and why (a grid's points: empty)
    on: dict[str, str] = field(default_factory=dict)  # a pool's: target name -> the point's case there

    @property
    def case_ids(self) -> list[str]:
        """Its cases: one per target of the pool, else the one."""
        return list(self.on.values()) or [self.case_id]

    def target_of(self, case_id: str) -> str:
        """The pool target a case of this point runs on ('' without a pool)."""
        return next((t for t, c in self.on.items() if c == case_id), "")


@dataclass(frozen=True)
class Campaign:
    campaign_id: str
    name: str
    scenario: str
    base_case: str
    search: Search
    repeats: Repeats
    note: str
    points: list[Point]
    decision: Decision  # the scenario's current decision: the campaign's objective and limits
    axes: list[Axis]
    constraints: list[str] = field(default_factory=list)  # relations every point keeps (model.allowed)
    pool: list[PoolTarget] = field(default_factory=list)  # targets declared equivalent (none: the base's)
    budget: Budget = field(default_factory=Budget)  # what it may spend (campaign/budget.py)
    auto: str = ""  # search kind auto: what it chose at the first freeze, and why (kept by every later freeze)

    def describe(self) -> str:
        """The search in a few words, auto's choice and why first."""
        return (f"{self.auto}; " if self.auto else "") + self.search.describe(len(self.points))

    def point(self, case_id: str) -> Point | None:
        """The point one of whose cases this is (on any target of the pool)."""
        return next((p for p in self.points if p.case_id == case_id or case_id in p.on.values()), None)


@dataclass(frozen=True)
class Frozen:
    campaign: Campaign
    created: bool
    decision_before: Decision | None  # the scenario decision this freeze replaced (None: unchanged)
    policy_changed: bool


def _dir(ws: Workspace, campaign_id: str) -> Path:
    return ws.campaigns_dir / check_id(campaign_id, "campaign_id", "g")


def is_campaign_draft(obj: dict[str, Any]) -> bool:  # JSON: a draft as parsed
    return "campaign" in obj


def freeze_campaign(
    ws: Workspace,
    obj: dict[str, Any],  # JSON: a draft as parsed
    source: str,
    price: Callable[[Case], Price] | None = None,
) -> Frozen:
    """Validate a campaign draft ({"campaign": {...}}), freeze its base case and every point (cases whose lineage
    names the campaign), store the campaign under its hash; record its decision as the scenario's. CaseInvalid
    naming the field and the fix; nothing is written for an invalid draft. price: what a start and a request of
    the base's service cost (search kind auto chooses by them; None: assumed figures)."""
    body = obj.get("campaign")
    extra = sorted(set(obj) - {"campaign", "$schema"})
    if not isinstance(body, dict) or extra:
        raise CaseInvalid(
            f"{source} is not a valid campaign: "
            + (f"unknown top-level field(s) {extra}" if extra else "'campaign' must be an object"),
            'write {"campaign": {"name", "base" or "base_case", "axes", ...}}; nothing was written',
        )
    try:
        draft = CampaignDraft.model_validate(body)
    except ValidationError as e:
        raise explain(e, source, "campaign") from None
    base = _base(ws, draft, source)
    axes = [a.model_dump(mode="json", exclude_defaults=True) for a in draft.axes]
    # the id: what is measured (base and axes); a search that proposes points adds how it proposes them
    ident: dict[str, Any] = {"base_case": case_id_of(base), "axes": axes}  # JSON: campaign.json's hashed part
    if draft.constraints:  # part of the space (absent: the ids campaigns had before constraints)
        ident["constraints"] = draft.constraints
    if draft.search.proposes:
        ident["search"] = draft.search.identity()
    if draft.pool:  # where it is measured (absent: the ids campaigns on one target had before pools)
        ident["pool"] = [t.model_dump(mode="json") for t in draft.pool]
    gid = "g-" + sha256_bytes(canonical_json(ident))[:12]
    draft, auto = _auto(ws, gid, draft, base, price)
    # every point validated before anything is written: a bad axis value names its point and field
    cases = [_point_case(ws, base, draft.axes, values, source, draft.pool) for values in draft.combos()]
    _check_pool_keys(ws, base, draft.pool, source)
    if draft.search.proposes:  # points come later: the first proposal checks the axis paths now
        _check_paths(base, draft.axes, source)
    screen = draft.search.screen_requests if isinstance(draft.search, HalvingSearch) else None
    if screen is not None and screen >= base.load.requests:
        raise CaseInvalid(
            f"{source} is not a valid campaign: search.screen_requests {screen} is not below the base's "
            f"load.requests {base.load.requests}",
            "set search.screen_requests below the base's N (e.g. a quarter of it); nothing was written",
        )
    datasets.check_generation(ws, _named(cases), source)  # every point's dataset, before the first is generated
    base_id, _ = store(ws, base, source)
    points = [_store_point(ws, gid, base_id, values, label, case) for values, label, case in cases]
    d = _dir(ws, gid)
    created = not (d / "campaign.json").is_file()
    if created:
        d.mkdir(parents=True, exist_ok=True)
        atomic_write(
            d / "campaign.json",
            canonical_json(
                {
                    "campaign_id": gid,
                    "base_case": base_id,
                    "axes": axes,
                    "scenario": base.scenario,
                    **({"constraints": draft.constraints} if draft.constraints else {}),
                    **({"pool": ident["pool"]} if draft.pool else {}),
                }
            )
            + b"\n",
            mode=0o444,
        )
        _write_points(d, points)
    policy = {**draft.policy(), **({"auto": auto} if auto else {})}
    past = _policies(ws, gid)
    changed = not past or _same_shape(past[-1]) != policy
    if changed:
        with (d / "policy.jsonl").open("ab") as f:
            f.write(orjson.dumps({"utc": utc_now(), **policy}) + b"\n")
    before = (
        record_decision(ws, base.scenario, draft.decision, f"campaign {gid}") if draft.decision is not None else None
    )
    return Frozen(campaign=load_campaign(ws, gid), created=created, decision_before=before, policy_changed=changed)


def _point_case(
    ws: Workspace, base: Case, axes: list[Axis], values: dict[str, Scalar], source: str, pool: list[PoolTarget]
) -> tuple[dict[str, Scalar], str, dict[str, Case]]:
    """(values, label, the point's case per pool target ('' without a pool), pinned): the base with the target's
    fields and each axis value applied; CaseInvalid naming the point, the target and the field."""
    label = label_of(axes, values)
    out: dict[str, Case] = {}
    for t in pool or [PoolTarget(name="base")]:
        data = copy.deepcopy({k: v for k, v in base.canonical().items() if k not in LINEAGE_FIELDS})
        where = f"campaign point {label}" + (f" on pool target '{t.name}'" if pool else "")
        _derive_again(data, base)  # a point (or a pool's target) on another endpoint has its own URLs
        try:
            for path, value in [*t.set.items(), *values.items()]:
                apply_axis(data, path, value)
        except ValueError as e:
            what = f"pool target '{t.name}': {e}".replace("campaign.axes path", "set path") if pool else str(e)
            raise CaseInvalid(
                f"{source} is not a valid campaign: {what}", "fix the path; nothing was written"
            ) from None
        out[t.name if pool else ""] = datasets.pin(ws, validate(data, where))
    return values, label, out


def _named(points: list[tuple[dict[str, Scalar], str, dict[str, Case]]]) -> list[tuple[str, Case]]:
    """Each point's case on each target, by what an answer calls it ("point 'C=8' on pool target 'node-b'")."""
    return [
        (f"point '{label}'" + (f" on pool target '{t}'" if t else ""), case)
        for _, label, cases in points
        for t, case in cases.items()
    ]


def _derive_again(data: dict[str, Any], base: Case) -> None:  # JSON: a case draft, edited in place
    """The fields the base derived from its first endpoint (metrics and health URL) derived again from the point's
    own (filled again as validate fills them: the same URLs, the same id, while the endpoint is the base's)."""
    first = base.target.endpoints[0].base_url
    if data["target"].get("metrics_url") == origin(first) + "/metrics":
        data["target"]["metrics_url"] = None
    if data["service"].get("health_url") == health_url_of(first):
        data["service"]["health_url"] = None


def _check_pool_keys(ws: Workspace, base: Case, pool: list[PoolTarget], source: str) -> None:
    """A pool's targets are different servers: two that reach the same endpoints (one lease key) are refused."""
    if not pool:
        return
    seen: dict[str, str] = {}
    for name, case in _point_case(ws, base, [], {}, source, pool)[2].items():
        key = target_key(case.canonical())
        if key in seen:
            raise CaseInvalid(
                f"{source} is not a valid campaign: pool targets '{seen[key]}' and '{name}' reach the same "
                f"endpoints ({', '.join(e.base_url for e in case.target.endpoints)})",
                "give each pool target its own endpoint in set (e.g. target.endpoints.0.base_url); nothing was written",
            )
        seen[key] = name


def _check_paths(base: Case, axes: list[Axis], source: str) -> None:
    """Each axis path leads to a field of the base (its lowest value applied), before a proposal needs it."""
    data = copy.deepcopy(base.canonical())
    for a in axes:
        try:
            apply_axis(data, a.path, a.values[0] if a.values else (a.low if a.low is not None else 0))
        except ValueError as e:
            raise CaseInvalid(
                f"{source} is not a valid campaign: {e}", "fix the axis path; nothing was written"
            ) from None


def _store_point(
    ws: Workspace, gid: str, base_id: str, values: dict[str, Scalar], label: str, cases: dict[str, Case], why: str = ""
) -> Point:
    on: dict[str, str] = {}
    for name, case in cases.items():
        pid = case_id_of(case)
        if pid != base_id:
            note = f"campaign {gid}: {label}" + (f" on {name}" if name else "")
            case = case.model_copy(update={"parent": base_id, "note": note})
        datasets.materialize(ws, case)
        store(ws, case, f"campaign {gid}")
        on[name] = pid
    first = next(iter(on.values()))
    return Point(values=values, label=label, case_id=first, why=why, on=on if "" not in on else {})


def _write_points(d: Path, points: list[Point]) -> None:
    write_json(
        d / "points.json",
        [
            {
                "values": p.values,
                "label": p.label,
                "case_id": p.case_id,
                **({"why": p.why} if p.why else {}),
                **({"on": p.on} if p.on else {}),
            }
            for p in points
        ],
    )


def add_point(ws: Workspace, camp: Campaign, values: dict[str, Scalar], why: str) -> Point:
    """Freeze a proposed point (the base with these values) and record it in points.json with why it was
    proposed. The caller (the campaign's one driver, under its lock) never proposes a point twice."""
    base = load_case(ws, camp.base_case)
    source = f"campaign {camp.campaign_id}"
    got = _point_case(ws, base, camp.axes, values, source, camp.pool)
    datasets.check_generation(ws, _named([got]), source)
    _, label, cases = got
    point = _store_point(ws, camp.campaign_id, camp.base_case, values, label, cases, why)
    _write_points(_dir(ws, camp.campaign_id), [*camp.points, point])
    return point


def startable_cases(ws: Workspace, camp: Campaign) -> list[tuple[str, Case]]:
    """What a start of the campaign may make caseledger start, as far as it can be named before its driver runs
    (run/admission/admit.py checks each against the host's policy), by what an answer calls it: every frozen point on
    each target of its pool; and for a search that proposes its points, the base and the base with each listed axis
    value (on each target). An axis value that is no valid case alone is left to the proposal that uses it."""
    out: list[tuple[str, Case]] = []

    def on(t: str) -> str:
        return f" on pool target '{t}'" if t else ""

    for p in camp.points:
        for t, cid in p.on.items() if p.on else [("", p.case_id)]:
            out.append((f"point '{p.label}'{on(t)}", load_case(ws, cid)))
    if camp.search.proposes:
        base, source = load_case(ws, camp.base_case), f"campaign {camp.campaign_id}"
        tried: list[tuple[list[Axis], dict[str, Scalar]]] = [([], {})]
        tried += [([a], {a.path: v}) for a in camp.axes for v in a.values or []]
        for axes, values in tried:
            try:
                _, label, cases = _point_case(ws, base, axes, values, source, camp.pool)
            except CaseInvalid:
                continue
            said = f"axis value '{label}'" if label else "base case"
            out += [(f"{said}{on(t)}", c) for t, c in cases.items()]
    return out


def _base(ws: Workspace, draft: CampaignDraft, source: str) -> Case:
    if draft.base_case is not None:
        return load_case(ws, draft.base_case)
    assert isinstance(draft.base, dict)  # a case id given as base is base_case (CampaignDraft._base_by_id)
    base = dict(draft.base)
    if draft.decision is not None:
        base["decision"] = draft.decision.model_dump(mode="json")
    return datasets.pin(ws, validate(base, f"{source} campaign.base"))


def _auto(
    ws: Workspace, gid: str, draft: CampaignDraft, base: Case, price: Callable[[Case], Price] | None
) -> tuple[CampaignDraft, str]:
    """The draft with search kind auto replaced by its choice, and why ('' for another kind): the choice this
    campaign recorded at its first freeze (a resume continues the same strategy), else chosen now."""
    if not isinstance(draft.search, AutoSearch):
        return draft, ""
    past = _policies(ws, gid)
    if past and past[-1].get("auto"):
        search, why = stored_search(past[-1]["search"]), str(past[-1]["auto"])
    else:
        d = draft.decision or base.decision
        space = Space(
            axes=draft.axes,
            constraints=draft.constraints,
            limits=bool(d is not None and d.limits.bounds()),
            requests=base.load.requests,
            runs=draft.repeats.runs,
            repeats=draft.repeats.budget,
        )
        search, why = choose(space, draft.budget, price(base) if price else Price(), draft.search.seed)
    data = draft.model_dump(mode="json", exclude_none=True)
    return CampaignDraft.model_validate({**data, "search": search.model_dump(mode="json")}), why


def _same_shape(policy: dict[str, Any]) -> dict[str, Any]:  # JSON: a policy.jsonl line
    """A recorded policy as one written now: its search with only its kind's fields (see stored_search)."""
    if not isinstance(policy.get("search"), dict):
        return policy
    return {**policy, "search": stored_search(policy["search"]).model_dump(mode="json")}


def _policies(ws: Workspace, gid: str) -> list[dict[str, Any]]:  # JSON: policy.jsonl lines as parsed
    return [
        {k: v for k, v in r.items() if k != "utc"}
        for r in read_jsonl(_dir(ws, gid) / "policy.jsonl").items
        if isinstance(r, dict)
    ]


def load_campaign(ws: Workspace, campaign_id: str) -> Campaign:
    """A frozen campaign with its latest policy and the scenario's current decision; NotFound naming the fix."""
    d = _dir(ws, campaign_id)
    ident = read_json_or_none(d / "campaign.json")
    points = read_json_or_none(d / "points.json")
    policies = _policies(ws, campaign_id)
    if not isinstance(ident, dict) or not isinstance(points, list) or not policies:
        raise NotFound(
            f"campaign '{campaign_id}' is not frozen in {ws.campaigns_dir}",
            "freeze_case(draft={'campaign': {...}}) returns its id",
        )
    policy = policies[-1]
    scenario = str(ident["scenario"])
    return Campaign(
        campaign_id=campaign_id,
        name=str(policy["name"]),
        scenario=scenario,
        base_case=str(ident["base_case"]),
        search=stored_search(policy["search"]),
        repeats=Repeats.model_validate(policy["repeats"]),
        note=str(policy.get("note", "")),
        points=[
            Point(
                values=dict(p["values"]),
                label=str(p["label"]),
                case_id=str(p["case_id"]),
                why=str(p.get("why", "")),
                on={str(k): str(v) for k, v in (p.get("on") or {}).items()},
            )
            for p in points
        ],
        decision=scenario_decision(ws, scenario) or load_case(ws, str(ident["base_case"])).decision,
        axes=[Axis.model_validate(a) for a in ident["axes"]],
        constraints=[str(c) for c in ident.get("constraints") or []],
        pool=[PoolTarget.model_validate(t) for t in ident.get("pool") or []],
        budget=_budget(policy),
        auto=str(policy.get("auto", "")),
    )


def _budget(policy: dict[str, Any]) -> Budget:  # JSON: a policy.jsonl line
    """The policy's budget; a policy written before campaign.budget: its search's max_starts and max_minutes."""
    if "budget" in policy:
        return Budget.model_validate(policy["budget"])
    search = policy.get("search") or {}
    return Budget(starts=search.get("max_starts"), minutes=search.get("max_minutes"))


def all_campaigns(ws: Workspace) -> list[str]:
    """Ids of every frozen campaign, oldest first."""
    d = ws.campaigns_dir
    if not d.is_dir():
        return []
    found = [p for p in d.glob("g-*") if (p / "campaign.json").is_file()]
    return [p.name for p in sorted(found, key=lambda p: (p / "campaign.json").stat().st_mtime)]


def scenario_campaigns(ws: Workspace, scenario: str) -> list[str]:
    """Ids of the campaigns of a scenario, oldest first (the newest owns the scenario's answer)."""
    out = []
    for gid in all_campaigns(ws):
        ident = read_json_or_none(_dir(ws, gid) / "campaign.json")
        if isinstance(ident, dict) and ident.get("scenario") == scenario:
            out.append(gid)
    return out


def campaign_files(ws: Workspace, campaign_id: str) -> list[Path]:
    """The files a campaign's answer is read from besides its runs: its declaration, points, policies and the
    driver's events (a search that ended)."""
    d = _dir(ws, campaign_id)
    return [d / "campaign.json", d / "points.json", d / "policy.jsonl", events_file(ws, campaign_id)]


def campaign_of(ws: Workspace, case_id: str) -> str | None:
    """The newest campaign one of whose points is this case, or None."""
    for gid in reversed(all_campaigns(ws)):
        points = read_json_or_none(_dir(ws, gid) / "points.json") or []
        if any(
            isinstance(p, dict) and (p.get("case_id") == case_id or case_id in (p.get("on") or {}).values())
            for p in points
        ):
            return gid
    return None


def driver_file(ws: Workspace, campaign_id: str) -> Path:
    return _dir(ws, campaign_id) / "driver.json"


def driver_lock(ws: Workspace, campaign_id: str) -> Path:
    return _dir(ws, campaign_id) / "driver.lock"


def events_file(ws: Workspace, campaign_id: str) -> Path:
    return _dir(ws, campaign_id) / "events.jsonl"


def driver_events(ws: Workspace, campaign_id: str) -> list[DriverEvent | UnknownEvent]:
    """The driver's events (driver_started/ended, point_started/ended/resumed, waiting, *_refused), oldest first."""
    return read_driver_events(events_file(ws, campaign_id))


def waiting_on(ws: Workspace, campaign_id: str) -> str | None:
    """Why the driver waits now, with the fix where the refusal named one: its last 'waiting' event when no point
    started or driver started after it."""
    why = None
    for e in driver_events(ws, campaign_id):
        if isinstance(e, Waiting):
            why = e.why + (f"; fix: {e.fix}" if e.fix else "")
        elif isinstance(e, PointStarted | PointResumed | DriverStarted | DriverEnded):
            why = None
    return why


def host_refusals(ws: Workspace, campaign_id: str) -> dict[str, str]:
    """Case id -> the host's refusal of it (its policy's words and fix, or caseledger's environment's), as the
    campaign's current driver recorded it: no look starts that case again. A new start of the campaign (after a
    person changed the policy) checks every point again before its driver starts, so only the refusals since the
    latest driver_started count."""
    out: dict[str, str] = {}
    for e in driver_events(ws, campaign_id):
        if isinstance(e, DriverStarted):
            out = {}
        elif isinstance(e, HostRefused):
            out[e.case_id] = (e.error or "refused") + (f"; fix: {e.fix}" if e.fix else "")
    return out
