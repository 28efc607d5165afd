"""A campaign over a pool of targets: points in parallel on targets declared equivalent, one owner each, one answer.

The pure parts (a pool refused by field, the spread within and between targets, the drift rule per target) run
in-process; the pool itself runs as a user would: the detached driver starting points on two real reference
targets at once, each target counting its owners (the load client names its run in every request)."""

from __future__ import annotations

import itertools
import os
import signal
import time
from dataclasses import replace
from typing import Any

import pytest

from caseledger.campaign import planner, pool
from caseledger.campaign.model import GridSearch, Repeats, TpeSearch
from caseledger.campaign.store import driver_events, load_campaign
from caseledger.campaign.view import CampaignView, campaign_view
from caseledger.case.phases import Phase
from caseledger.case.store import load_case
from caseledger.errors import CaseInvalid
from caseledger.ledger.event_types import PointStarted, TargetRefused, UnknownEvent
from caseledger.ledger.events import read_events
from caseledger.ledger.runs import scan_runs
from caseledger.tools import freeze_any, start_any
from caseledger.tools.campaigns import CampaignFrozen
from caseledger.workspace import Workspace
from tests.conftest import (
    KNEE_TARGET,
    assert_one_answer,
    free_port,
    knee_base,
    reference_targets,
    stats,
)
from tests.helpers import until_complete


def _url(port: int) -> str:
    return f"http://127.0.0.1:{port}/v1"


def _pool_campaign(ports: list[int], values: list[int], **over: Any) -> dict[str, Any]:
    base = knee_base(ports[0], "pool", 32)
    # the pool's targets share this host's two cores: each run's window sees the other's load as foreign CPU,
    # as on any shared host (declared, as a person would)
    base["measurement"] = {"evidence": {"max_other_cpu_share": 1.0}}
    body: dict[str, Any] = {
        "name": "pool-c",
        "base": base,
        "axes": [{"path": "load.concurrency", "values": values}],
        "search": {"kind": "grid"},
        "repeats": {"runs": 1, "settle_runs": 1, "budget": 0},
        # a control moving less than 25% is no drift here: the suite's other workers share these cores
        "decision": {"primary_metric": "output_throughput", "limits": {"tpot_p99_ms": 11.0}, "min_effect": 0.25},
        "pool": [{"name": f"t{i}", "set": {"target.endpoints.0.base_url": _url(p)}} for i, p in enumerate(ports)],
        **over,
    }
    return {"campaign": body}


# ------------------------------------------------------------------------------------------- refused drafts


@pytest.mark.parametrize(
    ("pool_", "named"),
    [
        ([{"name": "a", "set": {}}], "one target is no pool"),
        ([{"name": "a", "set": {}}, {"name": "a", "set": {"target.endpoints.0.base_url": _url(18002)}}], "twice"),
        ([{"name": "a", "set": {}}, {"name": "b", "set": {"target.cards": 2}}], "is an axis too"),
        ([{"name": "a", "set": {}}, {"name": "b", "set": {"dataset.seed": 2}}], "not a path under target."),
        ([{"name": "a", "set": {}}, {"name": "b", "set": {}}], "pool targets 'a' and 'b' reach the same endpoints"),
        ([{"name": "a", "set": {}}, {"name": "b", "set": {"target.nope": 1}}], "pool target 'b'"),
    ],
)
def test_a_bad_pool_names_the_field_and_writes_nothing(ws: Workspace, pool_: list[Any], named: str) -> None:
    draft = _pool_campaign([18001, 18002], [1, 2], pool=pool_)
    draft["campaign"]["axes"].append({"path": "target.cards", "values": [1, 2]})
    with pytest.raises(CaseInvalid) as e:
        freeze_any(ws, draft=draft)
    assert named in e.value.message, e.value.message
    assert not ws.campaigns_dir.exists() and not list(ws.frozen_dir.glob("c-*.json"))


def test_a_pool_freezes_each_point_once_per_target_and_its_id_covers_the_pool(ws: Workspace) -> None:
    a = freeze_any(ws, draft=_pool_campaign([18001, 18002], [1, 2]))
    assert isinstance(a, CampaignFrozen)
    camp = load_campaign(ws, a.campaign_id)
    assert [t.name for t in camp.pool] == ["t0", "t1"] and len(camp.points) == 2
    for p in camp.points:
        assert sorted(p.on) == ["t0", "t1"] and p.case_id == p.on["t0"] and len(set(p.case_ids)) == 2
        assert camp.point(p.on["t1"]) is p and p.target_of(p.on["t1"]) == "t1"
    t1 = load_case(ws, camp.points[0].on["t1"])  # what the base derived from its endpoint follows the target's
    assert t1.target.metrics_url == "http://127.0.0.1:18002/metrics", t1.target
    assert t1.service.health_url == "http://127.0.0.1:18002/health", t1.service
    other = freeze_any(ws, draft=_pool_campaign([18001, 18003], [1, 2]))
    assert isinstance(other, CampaignFrozen) and other.campaign_id != a.campaign_id  # another pool, another id
    alone = _pool_campaign([18001], [1, 2])
    del alone["campaign"]["pool"]
    single = freeze_any(ws, draft=alone)
    assert isinstance(single, CampaignFrozen) and single.campaign_id not in (a.campaign_id, other.campaign_id)
    assert all(not p.on for p in load_campaign(ws, single.campaign_id).points)


# ------------------------------------------------------------------------------------------- pure parts


def test_spread_within_and_between_targets() -> None:
    within, between = pool.spread([100.0, 102.0, 90.0, 92.0], ["a", "a", "b", "b"])
    assert within == pytest.approx(1.0 / 96.0) and between == pytest.approx(5.0 / 96.0)  # means 101 and 91
    assert pool.spread([100.0, 90.0], ["a", "a"]) == (pytest.approx(5.0 / 95.0), None)
    assert pool.spread([100.0], ["a"]) == (None, None)


def _timed(metric: list[float], targets: list[str]) -> planner.PointObs:
    return planner.PointObs(
        case_id="c-000000000001",
        label="C=1",
        values={"load.concurrency": 1},
        service_key="s",
        metric=metric,
        interval_rel=0.01,
        limits={},
        bad_runs=0,
        when=[f"2026-12-05T00:00:0{k}Z" for k in range(len(metric))],
        run_rel=[0.01] * len(metric),
        targets=targets,
    )


def test_a_control_on_another_target_is_no_drift_but_the_same_target_moving_is() -> None:
    grid, reps = GridSearch(), Repeats(runs=1)
    # 2x apart on two targets of a pool: their levels differ, nothing drifted
    assert planner.standing([_timed([100.0, 50.0, 51.0], ["a", "b", "b"])], grid, reps, True, "s", 0.02).cut is None
    # the same numbers on one target: a drift, confirmed by the next run
    moved = planner.standing([_timed([100.0, 50.0, 51.0], ["a", "a", "a"])], grid, reps, True, "s", 0.02)
    assert moved.cut == "2026-12-05T00:00:01Z" and "(on a)" in moved.notes[0], moved.notes


# ------------------------------------------------------------------------------------------- the real pool


def _spans(port: int) -> list[tuple[float, float, str]]:
    """The runs this target served, as it counted them: (first, last request arrival, run id), oldest first."""
    return sorted((v["first"], v["last"], rid) for rid, v in stats(port)["by_run"].items())


def _window(ws: Workspace, run_id: str) -> tuple[float, float]:
    """The run's load phase on the monotonic clock: (started, ended)."""
    ev = [e for e in read_events(ws.run(run_id)).events if not isinstance(e, UnknownEvent) and e.phase == Phase.LOAD]
    return min(e.mono_ns for e in ev) / 1e9, max(e.mono_ns for e in ev) / 1e9


@pytest.mark.quiet  # two campaigns' worth of processes at once: in pass 1 they crowd the others' windows
@pytest.mark.processes  # the detached driver starting points on two targets at once: real processes are the point
@pytest.mark.integration
def test_a_pool_of_two_runs_points_in_parallel_one_owner_each_and_gives_one_answer(
    ws: Workspace, stop_services: None
) -> None:
    ports = [free_port(), free_port()]
    values = [1, 2, 4, 6, 8, 12]
    f = freeze_any(ws, draft=_pool_campaign(ports, values))
    assert isinstance(f, CampaignFrozen), f
    start_any(ws, f.campaign_id)
    view: CampaignView = until_complete(ws, f.campaign_id, 300.0)
    text = view.text()
    # every point measured once, on one target (the control again, on its own target); both targets used, and
    # the answer as on one target
    assert all((r.runs == 1 or r.case_id in view.controls) and len(set(r.on)) == 1 for r in view.rows), text
    assert {r.on[0] for r in view.rows} == {"t0", "t1"}, text
    assert view.winner == f.points["C=4"], text  # TPOT ~ 4 + 1.5 (C - 1) ms: C=4 meets 11, C=6 breaks it
    assert "noise seen:" in view.answer and len(view.pool) == 2, text
    assert_one_answer(ws, f.campaign_id)
    runs = scan_runs(ws).metas
    assert len(runs) == sum(r.runs for r in view.rows), text  # every run valid, none repeated by a failure
    # counted at the targets: each served its runs one after the other (no two owners), 32 formal requests each
    for port in ports:
        spans = _spans(port)
        assert spans and not [(a, b) for a, b in itertools.pairwise(spans) if a[1] > b[0]], spans
        assert stats(port)["by_phase"]["load"] == 32 * len(spans), stats(port)
    assert sum(len(_spans(p)) for p in ports) == len(runs)
    # and the two targets measured at the same time: some formal windows overlap
    windows = {m.run_id: _window(ws, m.run_id) for m in runs}
    on = {rid: r.on[0] for r in view.rows for rid in r.run_ids}
    overlap = [
        (a, b)
        for a, b in itertools.combinations(windows, 2)
        if on[a] != on[b] and windows[a][0] < windows[b][1] and windows[b][0] < windows[a][1]
    ]
    assert overlap, windows
    started = [e for e in driver_events(ws, f.campaign_id) if isinstance(e, PointStarted)]
    assert {e.target for e in started} == {"t0", "t1"} and len(started) == len(runs), started


@pytest.mark.quiet  # two campaigns' worth of processes at once: in pass 1 they crowd the others' windows
@pytest.mark.processes  # a target killed for good mid-point: the other target finishes the campaign
@pytest.mark.integration
def test_a_target_that_goes_away_mid_point_leaves_its_points_to_the_other_and_none_is_measured_twice(
    ws: Workspace, stop_services: None, tmp_path: Any
) -> None:
    slow = {**KNEE_TARGET, "decode_step_s": 0.01}  # 16 requests at C=2: a load of ~1.5 s, to be killed in
    with reference_targets({"t0": slow, "t1": slow}, tmp_path / "targets") as served:
        ports = [served[n].port for n in ("t0", "t1")]
        draft = _pool_campaign(
            ports, [1, 2, 3, 4], decision={"primary_metric": "output_throughput", "min_effect": 0.25}
        )
        draft["campaign"]["base"]["service"] = {"adapter": "external"}
        draft["campaign"]["base"]["load"]["requests"] = 16
        f = freeze_any(ws, draft=draft)
        assert isinstance(f, CampaignFrozen), f
        start_any(ws, f.campaign_id)
        deadline = time.monotonic() + 60
        while stats(ports[1])["by_phase"].get("load", 0) == 0:  # t1's first point is in its formal window
            assert time.monotonic() < deadline, campaign_view(ws, f.campaign_id).text()
            time.sleep(0.05)
        os.kill(served["t1"].proc.pid, signal.SIGKILL)
        served["t1"].proc.wait()
        view: CampaignView = until_complete(ws, f.campaign_id, 300.0)
    text = view.text()
    # every point has its one valid run (the control also its control runs): none measured twice
    assert all(r.runs == 1 or r.case_id in view.controls for r in view.rows), text
    assert [r for r in view.rows if r.on == ["t1"]] == [], text  # t1's point was finished on t0
    assert "t1: " in "\n".join(view.pool), view.pool
    assert view.winner is not None, text


@pytest.mark.quiet  # two campaigns' worth of processes at once: in pass 1 they crowd the others' windows
@pytest.mark.processes  # the identity a target's live service shows, read back from its process
@pytest.mark.integration
def test_a_target_whose_measured_identity_differs_is_refused_with_the_difference_and_counts_for_nothing(
    ws: Workspace, stop_services: None
) -> None:
    ports = [free_port(), free_port()]
    draft = _pool_campaign(ports, [1, 2, 4])
    # declared equivalent, yet t1's engine decodes twice as slowly: its live process says so
    draft["campaign"]["pool"][1]["set"]["service.reference.decode_step_s"] = 0.008
    f = freeze_any(ws, draft=draft)
    assert isinstance(f, CampaignFrozen), f
    start_any(ws, f.campaign_id)
    view: CampaignView = until_complete(ws, f.campaign_id, 300.0)
    text = view.text()
    said = "\n".join(view.pool)
    assert "t1: " in said and "refused: its measured identity differs from t0's" in said, said
    assert "decode_step_s" in said, said  # the difference itself: the argv read back from t1's process
    assert all(r.runs >= 1 and set(r.on) == {"t0"} for r in view.rows), text  # t1's runs count for no point
    refused = [e for e in driver_events(ws, f.campaign_id) if isinstance(e, TargetRefused)]
    assert [e.target for e in refused] == ["t1"], refused
    assert view.winner == f.points["C=4"], text


def test_a_refusal_names_where_two_long_values_differ() -> None:
    a = '{"block_size":16,"cache_blocks":4096,"decode_step_s":0.004,"slots":64,"prefill_tokens_per_s":200000}'
    b = a.replace("0.004", "0.008")
    x, y = pool.where_they_differ(a, b)
    assert "decode_step_s" in x and "0.004" in x and "0.008" in y and len(x) < len(a), (x, y)
    assert pool.where_they_differ("vllm 0.11", "vllm 0.12") == ("vllm 0.11", "vllm 0.12")


@pytest.mark.quiet  # two campaigns' worth of processes at once: in pass 1 they crowd the others' windows
@pytest.mark.processes  # a proposing search over a pool: each free target asks the strategy for its own point
@pytest.mark.integration
def test_a_search_over_a_pool_proposes_a_point_for_each_free_target_and_measures_none_twice(
    ws: Workspace, stop_services: None
) -> None:
    ports = [free_port(), free_port()]
    draft = _pool_campaign(ports, list(range(1, 17)), search={"kind": "tpe", "max_points": 6, "seed": 0})
    f = freeze_any(ws, draft=draft)
    assert isinstance(f, CampaignFrozen), f
    start_any(ws, f.campaign_id)
    view: CampaignView = until_complete(ws, f.campaign_id, 300.0)
    text = view.text()
    assert len(view.rows) == 6 and len({r.label for r in view.rows}) == 6, text  # six points, each proposed once
    assert all(r.runs == 1 or r.case_id in view.controls for r in view.rows), text
    proposed = [e for e in driver_events(ws, f.campaign_id) if e.type == "point_proposed"]
    assert len(proposed) == 6, proposed
    # a proposal was made while another point ran on the other target: the targets measured side by side
    started = [e for e in driver_events(ws, f.campaign_id) if isinstance(e, PointStarted)]
    assert {e.target for e in started} == {"t0", "t1"}, started
    for port in ports:
        spans = _spans(port)
        assert not [(a, b) for a, b in itertools.pairwise(spans) if a[1] > b[0]], spans


def test_a_control_run_goes_back_to_a_target_it_ran_on_while_that_one_is_healthy() -> None:
    from caseledger.run.campaign_driver import _for_target

    ctl = replace(_timed([100.0], ["a"]), case_id="c-00000000000c")
    other = replace(_timed([], []), case_id="c-00000000000d")
    wanted = [(ctl.case_id, "control: C=1 again after 4 runs"), (other.case_id, "grid point")]
    assert _for_target(wanted, [ctl, other], "b", ["a", "b"]) == [wanted[1]]  # b never ran the control
    assert _for_target(wanted, [ctl, other], "a", ["a", "b"]) == wanted
    assert _for_target(wanted, [ctl, other], "b", ["b"]) == wanted  # a is down or refused: b may run it


def test_a_point_in_flight_on_another_target_is_a_pending_trial_to_tpe() -> None:
    """Proposing for a free target while another measures: the point in flight is told to TPE as running (its
    constant liar), so the proposal moves away from it; told nothing, TPE proposes right beside it (seed 0)."""
    from caseledger.campaign.model import Axis
    from caseledger.campaign.search import Observed, tpe

    axes = [Axis(path="load.concurrency", low=1, high=64)]
    search = TpeSearch(kind="tpe", max_points=40, seed=0)
    done = [
        Observed(values={"load.concurrency": c}, value=float(c if c <= 20 else 40 - c), meets=True, breach=0.0)
        for c in (1, 3, 4, 6, 8, 14, 16, 24, 28, 32, 48, 64)
    ]

    def ask(running: bool) -> int:
        pending = Observed(values={"load.concurrency": 22}, value=None, meets=None, breach=0.0, running=running)
        got = tpe(axes, search, True, [*done, pending])
        assert got is not None
        return int(got.values["load.concurrency"])

    told, untold = ask(True), ask(False)
    assert abs(untold - 22) <= 2 and abs(told - 22) > abs(untold - 22), (told, untold)
