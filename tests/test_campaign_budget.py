"""A campaign's budget and the costs it is weighed with: the budget holds for every search kind (a run that would
pass it is not started), the campaign ends with what it has and says what it did not test; costs are learned
from the ledger's runs and the freeze says what the campaign is expected to spend."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from caseledger.campaign.budget import Account, untested
from caseledger.campaign.costs import Costs, Figure, RunCost, estimate, learn, said_estimate
from caseledger.campaign.model import Axis, Budget, CampaignDraft
from caseledger.campaign.store import load_campaign
from caseledger.ledger.runs import scan_runs
from caseledger.tools import freeze_any, start_any
from caseledger.tools.campaigns import CampaignFrozen
from caseledger.workspace import Workspace
from tests.conftest import free_port, ref_draft
from tests.helpers import until_complete


def test_a_run_that_would_pass_any_part_of_the_budget_is_refused_and_nothing_is_booked() -> None:
    acct = Account(Budget(measurements=3, starts=1, minutes=10.0))
    assert acct.take(start=True, minutes=2.0) is None
    assert acct.take(start=False, minutes=2.0) is None
    # a second start passes the budget of starts; a run on the running service does not
    assert acct.take(start=True, minutes=1.0) == "its budget of 1 service start(s) is spent (1)"
    assert (acct.measurements, acct.starts, acct.minutes) == (2, 1, 4.0)  # the refused run booked nothing
    # minutes: a run whose estimate would pass them is refused before they are spent
    assert acct.refusal(start=False, minutes=7.0) == (
        "its next run (about 7.0 min) would pass its budget of 10 minute(s) (4.0 spent)"
    )
    assert acct.take(start=False, minutes=1.0) is None
    assert acct.take(start=False) == "its budget of 3 measurement(s) is spent (3)"
    assert acct.exhausted() == "its budget of 3 measurement(s) is spent (3)"
    assert acct.said() == "budget: 3/3 measurements, 1/1 starts, 5.0/10 min (left: 0 measurements, 0 starts, 5.0 min)"
    assert Account(Budget()).said() is None and Account(Budget()).take(start=True, minutes=1e9) is None


def test_the_untested_part_of_the_space_is_named_compactly() -> None:
    axes = [
        Axis(path="service.argv[-np]", values=[2, 4]),
        Axis(path="load.concurrency", values=[1, 2, 4]),
    ]
    measured: list[dict[str, Any]] = [
        {"service.argv[-np]": 2, "load.concurrency": 1},
        {"service.argv[-np]": 2, "load.concurrency": 2, "load.requests": 4},  # a screen counts as tested
    ]
    assert untested(axes, [], measured) == (
        "4 of 6 points never measured: -np=2 C=4, -np=4 C=1, -np=4 C=2, -np=4 C=4; never tried: -np=4; C=4"
    )
    every = [{"service.argv[-np]": n, "load.concurrency": c} for n in (2, 4) for c in (1, 2, 4)]
    assert untested(axes, [], every) is None
    wide = [Axis(path="load.concurrency", low=1, high=10_000)]
    assert untested(wide, [], measured[:1]) == "1 point(s) of 10000 points measured"


def _fact(key: str, start: float | None, load: float | None, n: int = 10, em: str = "llamacpp/m") -> RunCost:
    return RunCost(service_key=key, engine_model=em, start_s=start, load_s=load, requests=n)


def test_costs_come_from_the_identitys_own_runs_then_its_engine_and_model_then_are_assumed() -> None:
    facts = [
        _fact("a", 6.0, 17.0),
        _fact("a", None, 16.0),  # reused its service: no start figure
        _fact("a", 6.4, 18.0),
        _fact("b", 20.0, 50.0),  # same engine and model, another identity
        _fact("z", 99.0, 990.0, em="vllm/other"),
    ]
    own = learn(facts, "a", "llamacpp/m")
    assert (own.start.value, own.start.n, own.request.value, own.request.n) == (6.2, 2, 1.7, 3)
    assert own.said() == "measured: start 6.2 s (2 starts), 1.7 s/request (3 runs)"
    kin = learn(facts, "new", "llamacpp/m")
    assert (kin.start.value, kin.start.n, kin.request.value, kin.request.n) == (6.4, 3, 1.75, 4)
    assert kin.said() == (
        "measured: start 6.4 s (3 starts, the same engine and model), 1.8 s/request (4 runs, the same engine and model)"
    )
    none = learn(facts, "new", "sglang/x")
    assert none.start.n == 0 and none.said().startswith("no runs yet: assumed start 30 s, 1 s/request")


def test_an_estimate_counts_a_start_per_identity_change_and_says_where_the_budget_ends_it() -> None:
    c = Costs(start=Figure(6.0, 3, "this service"), request=Figure(1.5, 4, "this service"))
    est = estimate([("a", 10), ("a", 10), ("b", 20)], lambda _: c)
    assert (est.measurements, est.starts) == (3, 2)
    assert est.minutes == pytest.approx((2 * 6.0 + 40 * 1.5) / 60)
    said = said_estimate(est, c, 8, Budget(measurements=2))
    assert said.startswith("estimate: 3 measurements (+ up to 8 repeats), 2 start(s), 1.2 min (measured: start")
    assert said.endswith("; budget 2 measurements: it ends at the budget (3 measurements > 2)")
    assert said_estimate(est, c, 0, Budget(starts=5)).endswith("; budget 5 starts: within it")


def _grid(port: int, budget: dict[str, Any]) -> dict[str, Any]:
    base = ref_draft(port, scenario="budget-grid", load={"requests": 8, "concurrency": 1})
    return {
        "campaign": {
            "name": "budget-grid",
            "base": base,
            "axes": [
                {"path": "service.reference.slots", "values": [4, 8]},
                {"path": "load.concurrency", "values": [1, 2, 4]},
            ],
            "search": {"kind": "grid"},  # a grid, said so: without a kind, a budget below the grid is auto
            "repeats": {"runs": 1, "settle_runs": 2, "budget": 4},
            "budget": budget,
            "decision": {"primary_metric": "output_throughput", "min_effect": 0.5},
        }
    }


def test_a_budget_on_search_moved_is_refused_naming_the_new_field_and_an_old_policy_still_reads(
    ws: Workspace,
) -> None:
    d = _grid(18001, {})["campaign"]
    with pytest.raises(ValueError, match=r'search.max_minutes moved to campaign.budget.minutes .*"budget": '):
        CampaignDraft.model_validate({**d, "search": {"kind": "grid", "max_minutes": 5}})
    f = freeze_any(ws, draft={"campaign": {**d, "search": {"kind": "grid"}, "budget": {"measurements": 3}}})
    assert isinstance(f, CampaignFrozen) and f.created
    assert "estimate: 6 measurements (+ up to 4 repeats), 2 start(s)" in f.text(), f.text()
    assert "no runs yet: assumed" in f.text() and "it ends at the budget (6 measurements > 3)" in f.text()
    assert load_campaign(ws, f.campaign_id).budget == Budget(measurements=3)
    # a policy written before campaign.budget: its search's max_starts is the budget of starts
    policy = ws.campaigns_dir / f.campaign_id / "policy.jsonl"
    old = {"utc": "2025-01-01T00:00:00.000Z", "name": "budget-grid", "note": "", "repeats": d["repeats"]}
    old["search"] = {"kind": "tpe", "max_points": 4, "max_starts": 2, "seed": 0, "monotone": False}
    policy.write_bytes(policy.read_bytes() + orjson.dumps(old) + b"\n")
    assert load_campaign(ws, f.campaign_id).budget == Budget(starts=2)


@pytest.mark.integration
def test_a_grid_stops_at_its_budget_of_measurements_and_says_what_it_did_not_test(
    ws: Workspace, stop_services: None
) -> None:
    """A grid of 6 points with a budget of 3 measurements on the reference target: 3 runs, never a fourth; its
    status shows the budget spent and left and the points never measured; frozen again with a larger budget it
    goes on where it ended."""
    from caseledger.ledger import authorization

    authorization.set_mode(ws, "auto")
    port = free_port()
    f = freeze_any(ws, draft=_grid(port, {"measurements": 3}))
    assert isinstance(f, CampaignFrozen), f.text()
    start_any(ws, f.campaign_id)
    view = until_complete(ws, f.campaign_id, 300)
    assert len(scan_runs(ws).metas) == 3 and view.progress["runs"] == 3, view.text()
    assert view.progress["sent"] == 3 * 8
    assert view.budget is not None and view.budget.startswith("budget: 3/3 measurements (left: 0 measurements)")
    assert view.budget_end == "its budget of 3 measurement(s) is spent (3)", view.text()
    assert view.untested is not None and view.untested.startswith("3 of 6 points never measured: "), view.text()
    assert sum(r.status == "over_budget" for r in view.rows) >= 1, view.text()
    text = view.text()
    assert "ended at the budget: its budget of 3 measurement(s)" in text and "untested: 3 of 6 points" in text
    from caseledger.campaign.store import driver_file
    from caseledger.workspace import read_json_or_none

    outcome = (read_json_or_none(driver_file(ws, f.campaign_id)) or {}).get("outcome", "")
    assert outcome.startswith("complete at its budget: its budget of 3 measurement(s)"), outcome
    # the costs its runs measured are what the next freeze estimates with; a larger budget goes on
    again = freeze_any(ws, draft=_grid(port, {"measurements": 4}))
    assert isinstance(again, CampaignFrozen) and again.campaign_id == f.campaign_id
    # one identity measured (which one: the planner's order), started once: the base's own or its kin's figures
    assert "measured: start " in again.estimate and "(1 start" in again.estimate, again.estimate
    assert "(3 runs" in again.estimate, again.estimate
    print(view.text())  # pytest -s: what it ends with
    start_any(ws, f.campaign_id)
    view = until_complete(ws, f.campaign_id, 300)
    assert len(scan_runs(ws).metas) == 4 and view.budget_end is not None, view.text()
