"""The search kinds as one family: every strategy of the registry passes the same contract (the same observations
give the same proposal, a resume continues identically, nothing is measured twice, the budget holds, it ends);
`Search` is a union per kind in which every kind refuses another kind's field by name, and still reads the
policies frozen before it; and kind auto chooses its strategy from the space, the costs and the budget, says why,
and keeps its choice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from caseledger.campaign.budget import Account
from caseledger.campaign.model import (
    KINDS,
    AutoSearch,
    Axis,
    Budget,
    CampaignDraft,
    GridSearch,
    HalvingSearch,
    KneeSearch,
    Search,
    TpeSearch,
)
from caseledger.campaign.search import REQUESTS, STRATEGIES, Observed, Price, Space, choose, key
from caseledger.campaign.store import freeze_campaign, load_campaign
from caseledger.tools import freeze_any
from caseledger.workspace import Workspace
from tests.conftest import ref_draft

SLOTS = Axis(path="service.reference.slots", values=[1, 2, 4, 8])
C = Axis(path="load.concurrency", values=[1, 2, 4, 8, 16, 32])
AXES = [SLOTS, C]
FULL = 16  # the base's N (halving's last screen)

# A value for each search field a strategy needs (a kind takes those of its fields named here), and the knee on C a
# kind with an axis may add. The family is read from the registry: a new strategy joins it with no edit here; one
# with a field of its own fails at collection, naming the field to give a value here.
SETTINGS: dict[str, Any] = {"max_points": 12, "seed": 1, "screen_requests": 4, "eta": 2}
ON_C: dict[str, Any] = {"axis": C.path, "monotone": True}


def accepted(search: dict[str, Any]) -> Search | None:
    """The search as a campaign over AXES accepts it (base N = FULL, a TPOT limit); None: refused."""
    body = {
        "name": "n",
        "base": {"scenario": "s", "load": {"requests": FULL}},
        "axes": [a.model_dump(exclude_defaults=True) for a in AXES],
        "search": search,
        "decision": {"primary_metric": "output_throughput", "limits": {"tpot_p99_ms": 10}},
    }
    try:
        return CampaignDraft.model_validate(body).search
    except ValueError:
        return None


def family() -> dict[str, Search]:
    """Every strategy of the registry as a campaign accepts it, and with a knee on C where its kind takes one:
    'tpe' and 'tpe+knee'; 'knee' (a knee needs its axis)."""
    out: dict[str, Search] = {}
    for kind in STRATEGIES:
        fields = KINDS[kind].model_fields
        plain = {"kind": kind, **{f: v for f, v in SETTINGS.items() if f in fields}}
        found = [s for v in ([plain, {**plain, **ON_C}] if "axis" in fields else [plain]) if (s := accepted(v))]
        unset = sorted(set(fields) - {"kind", *SETTINGS, *ON_C})
        assert found, f"search kind {kind!r}: no campaign accepts it; give a value to its field(s) {unset} in SETTINGS"
        out |= {kind if n == 0 else f"{kind}+knee": s for n, s in enumerate(found)}
    return out


FAMILY = family()


def measure(values: dict[str, Any]) -> Observed:
    """A service of `slots` serves up to 2 x slots concurrent requests within the limit; throughput grows with C."""
    s, c = int(values[SLOTS.path]), int(values[C.path])
    tpot = 10.0 * c / (2 * s)
    n = int(values.get(REQUESTS, FULL))
    return Observed(
        values=values,
        value=c * 100.0 / (1 + 0.1 * s) + n * 0.01,
        meets=tpot <= 10.0,
        breach=max(0.0, tpot / 10.0 - 1),
        label=f"s={s} C={c}",
        service_key=f"s{s}",
    )


def drive(search: Search, observed: list[Observed], acct: Account | None = None) -> list[Observed]:
    """A driver in small: propose, book the run against the budget (a start where the identity changes), measure."""
    propose = STRATEGIES[search.kind]
    while (search.cap is None or len(observed) < search.cap) and len(observed) < 200:  # a space of 24 (x screens)
        live = observed[-1].service_key if observed else None
        p = propose(AXES, search, True, observed, live, [], full_requests=FULL)
        if p is None:
            break
        ob = measure(p.values)
        if acct is not None and acct.take(start=ob.service_key != live) is not None:
            break
        observed.append(ob)
    return observed


def _from_ledger(observed: list[Observed]) -> list[Observed]:
    """The observations as a resumed driver reads them: new objects, values through JSON."""
    return [Observed(**{**ob.__dict__, "values": json.loads(json.dumps(ob.values))}) for ob in observed]


@pytest.mark.parametrize("kind", FAMILY)
def test_every_strategy_gives_the_same_proposal_for_the_same_observations(kind: str) -> None:
    search = FAMILY[kind]
    seen = drive(search, [])[:5]
    propose = STRATEGIES[search.kind]
    a = propose(AXES, search, True, seen, seen[-1].service_key, [], full_requests=FULL)
    b = propose(AXES, search, True, _from_ledger(seen), seen[-1].service_key, [], full_requests=FULL)
    assert a is not None and a == b


@pytest.mark.parametrize("kind", FAMILY)
def test_every_strategy_resumed_continues_as_if_never_stopped_and_measures_nothing_twice(kind: str) -> None:
    search = FAMILY[kind]
    whole = drive(search, [])
    keys = [key(o.values) for o in whole]
    assert len(keys) == len(set(keys)), keys  # nothing measured twice
    assert any(o.meets for o in whole)  # and it found a point within the limit
    for stop in (1, 3, len(whole) // 2):
        resumed = drive(search, _from_ledger(whole[:stop]))
        assert [key(o.values) for o in resumed] == keys, (kind, stop)


@pytest.mark.parametrize("kind", FAMILY)
def test_every_strategy_stays_within_a_budget_of_measurements_and_starts(kind: str) -> None:
    acct = Account(Budget(measurements=7, starts=2))
    got = drive(FAMILY[kind], [], acct)
    order = [o.service_key for o in got]
    starts = sum(1 for i, k in enumerate(order) if i == 0 or k != order[i - 1])
    assert 0 < len(got) <= 7 and starts <= 2 and acct.measurements == len(got) and acct.starts == starts


@pytest.mark.parametrize("kind", KINDS)
def test_a_kind_refuses_another_kinds_field_by_name_and_the_fix(kind: str) -> None:
    base = {"scenario": "s"}
    axes = [a.model_dump(exclude_defaults=True) for a in AXES]
    own = KINDS[kind].model_fields
    foreign = sorted({f for c in KINDS.values() for f in c.model_fields} - set(own))
    assert foreign, kind  # every kind lacks a field another kind has: there is something to refuse
    for field in foreign:
        with pytest.raises(ValueError) as e:
            CampaignDraft.model_validate({"name": "n", "base": base, "axes": axes, "search": {"kind": kind, field: 2}})
        said = str(e.value)
        assert f"campaign.search.{field} is not a field of kind '{kind}'" in said and "drop it" in said, said
        takes = [k for k, c in KINDS.items() if field in c.model_fields]
        assert f"or use kind {' or '.join(repr(k) for k in takes)}" in said, said
    with pytest.raises(ValueError, match=r"moved to campaign\.budget\.starts"):
        CampaignDraft.model_validate(
            {"name": "n", "base": base, "axes": axes, "search": {"kind": kind, "max_starts": 2}}
        )


@pytest.mark.parametrize("kind", FAMILY)
def test_every_strategy_ends_by_itself_or_at_its_cap(kind: str) -> None:
    """Asked again once its last point is measured, a strategy proposes nothing, or its cap holds it (tpe)."""
    search = FAMILY[kind]
    whole = drive(search, [])
    assert 0 < len(whole) < 200, (kind, len(whole))  # ended, not stopped by drive's guard
    again = STRATEGIES[search.kind](AXES, search, True, whole, whole[-1].service_key, [], full_requests=FULL)
    assert again is None or len(whole) == search.cap, (kind, again)


def test_campaigns_frozen_before_the_kinds_keep_their_ids_and_load_their_policies(ws: Workspace) -> None:
    """tests/data/campaign-policies-before-kinds.json: a campaign of each kind as the code before this family froze
    it (its id, and its policy line, which carried every kind's fields)."""
    before = json.loads((Path(__file__).parent / "data" / "campaign-policies-before-kinds.json").read_text())
    for kind, old in before.items():
        f = freeze_any(ws, draft={"campaign": old["draft"]})
        assert f.campaign_id == old["campaign_id"], kind  # type: ignore[union-attr]
        policy = ws.campaigns_dir / old["campaign_id"] / "policy.jsonl"
        policy.write_text(json.dumps({"utc": "2026-01-01T00:00:00Z", **old["policy"]}) + "\n")
        camp = load_campaign(ws, old["campaign_id"])
        assert (
            camp.search.kind == kind
            and camp.search.model_dump(mode="json", exclude_none=True).items() <= old["policy"]["search"].items()
        )
        again = freeze_any(ws, draft={"campaign": old["draft"]})
        assert not again.created and not again.policy_changed, kind  # type: ignore[union-attr]


PRICE = Price(start_s=6.0, request_s=28.0 / 16, said="measured")
LIMITS = Space(axes=AXES, constraints=[], limits=True, requests=16)


def test_auto_chooses_by_the_space_the_costs_and_the_budget_and_says_why() -> None:
    flags = [
        Axis(path="service.argv[-np]", values=[1, 2, 4, 8]),
        Axis(path="service.argv[-b]", values=[512, 1024, 2048]),
        Axis(path="service.argv[-ub]", values=[128, 256, 512]),
        Axis(path="load.concurrency", values=[1, 2, 4, 8, 16]),
    ]
    s, why = choose(Space(axes=flags, constraints=[], limits=True, requests=16), Budget(measurements=25), PRICE)
    assert isinstance(s, TpeSearch) and s.axis == C.path and s.max_points == 21, s  # 4 of 25 kept for settle runs
    assert why.startswith(
        "auto: tpe with a knee on load.concurrency per proposed identity: 36 identities × 5 C > budget 25 "
        "measurements; 21 proposed"
    ) and why.endswith("a start costs 6 s, a run 28 s (measured)"), why
    assert choose(Space(axes=flags, constraints=[], limits=True, requests=16), Budget(measurements=25), PRICE) == (
        s,
        why,
    )  # deterministic
    # only load axes vary: a knee, when its bisections fit
    knee, why = choose(Space(axes=[C], constraints=[], limits=True, requests=16), Budget(measurements=4), PRICE)
    assert isinstance(knee, KneeSearch) and knee.monotone and "only load axes vary" in why, why
    # the whole space fits: a grid
    assert isinstance(choose(LIMITS, Budget(measurements=24), PRICE)[0], GridSearch)
    # starts cheap against a run, no limit to bisect to, minutes the grid would pass: halving's screens fit
    free = Space(axes=AXES, constraints=[], limits=False, requests=16)
    cheap = Price(start_s=1.0, request_s=1.0, said="measured")
    h, why = choose(free, Budget(minutes=4), cheap)
    assert isinstance(h, HalvingSearch) and h.screen_requests == 2 and "a start costs 0.062 run(s)" in why, why
    # the same space when a start costs ten runs: tpe, which stays on a started service for as many points
    dear = Price(start_s=160.0, request_s=1.0, said="measured")
    t, why = choose(free, Budget(measurements=12), dear)
    assert isinstance(t, TpeSearch) and t.neighbours is not None and t.neighbours > 3, (t, why)
    assert "before another start (a start costs 10 runs)" in why, why


def test_a_draft_without_a_kind_gets_auto_when_its_budget_is_smaller_than_the_grid() -> None:
    base = {"scenario": "s"}
    axes = [a.model_dump(exclude_defaults=True) for a in AXES]
    small = CampaignDraft.model_validate({"name": "n", "base": base, "axes": axes, "budget": {"measurements": 10}})
    assert isinstance(small.search, AutoSearch) and small.combos() == []
    few_starts = CampaignDraft.model_validate({"name": "n", "base": base, "axes": axes, "budget": {"starts": 2}})
    assert isinstance(few_starts.search, AutoSearch)
    enough = CampaignDraft.model_validate({"name": "n", "base": base, "axes": axes, "budget": {"measurements": 30}})
    assert isinstance(enough.search, GridSearch) and len(enough.combos()) == 24
    given = CampaignDraft.model_validate(
        {"name": "n", "base": base, "axes": axes, "budget": {"measurements": 10}, "search": {"kind": "grid"}}
    )
    assert isinstance(given.search, GridSearch)  # an explicit kind stays as given


def test_auto_says_why_at_freeze_and_keeps_its_choice_when_frozen_again(ws: Workspace) -> None:
    """Frozen again once the workspace's costs would choose otherwise (cheap starts: the grid fits), the campaign
    keeps the strategy it chose first: a resume continues the same search."""
    draft = {
        "name": "auto",
        "base": ref_draft(18012, scenario="auto", load={"requests": 8}),
        "axes": [{"path": "service.reference.slots", "values": [2, 4]}, C.model_dump(exclude_defaults=True)],
        "search": {"kind": "auto"},  # a budget in minutes alone does not make auto the default (costs are the freeze's)
        "budget": {"minutes": 1.5},
        "decision": {"primary_metric": "output_throughput", "limits": {"tpot_p99_ms": 50}},
    }
    f = freeze_any(ws, draft={"campaign": draft})
    text = f.text()
    assert "auto: tpe with a knee on load.concurrency per proposed identity: 2 identities × 6 C" in text, text
    assert "a start costs 30 s, a run 8 s (assumed)" in text, text
    camp = load_campaign(ws, f.campaign_id)  # type: ignore[union-attr]
    assert isinstance(camp.search, TpeSearch) and camp.search.axis == C.path and camp.auto in text
    cheap = Price(start_s=0.5, request_s=0.1, said="measured")
    assert isinstance(choose(LIMITS, Budget(minutes=1.5), cheap)[0], GridSearch)  # what it would choose now
    again = freeze_campaign(ws, {"campaign": draft}, "draft", price=lambda _: cheap)
    assert again.campaign.campaign_id == camp.campaign_id and not again.policy_changed
    assert again.campaign.search == camp.search and again.campaign.auto == camp.auto
