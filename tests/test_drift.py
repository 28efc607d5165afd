"""The drift rule on a shared host (campaign/drift.py): the noise floor learned from the control's own runs, the
host's CPU contention during them, a change in the last control confirmed before any winner, and a second
confirmed change inconclusive.

The rule is tested pure over simulated campaigns (the planner run to its end, each run 'measured' with ±10% host
noise, the target slowed 2x where a test says); the whole path on the real reference target slowed twice by
SIGUSR1 is a cell of the fault matrix."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from dataclasses import replace
from typing import Any

import pytest

from caseledger.campaign import drift, planner
from caseledger.campaign.model import GridSearch, Repeats
from caseledger.campaign.view import CampaignView, campaign_view
from caseledger.ledger import authorization
from caseledger.ledger.runs import scan_runs
from caseledger.tools import freeze_any, start_any
from caseledger.tools.campaigns import CampaignFrozen
from caseledger.workspace import Workspace, read_json_or_none
from tests.conftest import assert_one_answer, free_port, knee_base, stats
from tests.helpers import cell, until_complete

GRID, REPEATS = GridSearch(), Repeats()  # the defaults: one run a point, settle up to 3, 8 repeats


def _at(t: int) -> str:
    return f"2026-12-05T07:{t // 60:02d}:{t % 60:02d}.000Z"


def _point(c: int, runs: list[tuple[float, int, float | None]]) -> planner.PointObs:
    """Point c (label seed=c) with its valid runs: (objective, the second it was created at, other CPU share)."""
    return planner.PointObs(
        case_id=f"c-{c:012x}",
        label=f"seed={c}",
        values={"dataset.seed": c},
        service_key="s",
        metric=[m for m, _, _ in runs],
        interval_rel=0.01 if runs else None,
        limits={},
        bad_runs=0,
        when=[_at(t) for _, t, _ in runs],
        run_rel=[0.01] * len(runs),
        others=[o for _, _, o in runs],
    )


def _campaign(seed: int, slow_at: tuple[int, ...] = (), points: int = 4) -> planner.Standing:
    """A grid of identical points planned to its end: each run measures 100 tok/s ±10% (uniform host noise),
    halved from the run numbers in `slow_at` on (the target slowed 2x)."""
    rng = random.Random(seed)
    runs: dict[int, list[tuple[float, int, float | None]]] = {c: [] for c in range(1, points + 1)}
    level = 100.0
    for t in range(200):
        pl = planner.standing([_point(c, r) for c, r in runs.items()], GRID, REPEATS, True, "s", min_effect=0.02)
        if not pl.next:
            return pl
        level /= 2 if t in slow_at else 1
        runs[int(pl.next[0][0][2:], 16)].append((level * rng.uniform(0.9, 1.1), t, None))
    raise AssertionError("the planner never finished")


@pytest.mark.fast
def test_identical_points_under_10pct_host_noise_confirm_no_drift() -> None:
    plans = [_campaign(seed) for seed in range(20)]
    clean = [pl for pl in plans if pl.cut is None and pl.drift is None and pl.suspect is None]
    assert len(clean) >= 19, [pl.notes for pl in plans if pl not in clean]
    assert all(not pl.next and pl.controls for pl in plans)


@pytest.mark.fast
def test_a_2x_change_under_10pct_host_noise_is_found_and_sets_the_runs_before_it_aside() -> None:
    for seed in range(20):
        pl = _campaign(seed, slow_at=(2,))
        assert pl.cut is not None and pl.drift is None and pl.suspect is None, (seed, pl.notes)
        (note,) = [n for n in pl.notes if "the target changed at" in n]
        assert "moved -" in note and "confirmed by its next run" in note and "set aside" in note, note


@pytest.mark.fast
def test_a_second_confirmed_change_is_inconclusive_never_a_winner() -> None:
    for seed in range(20):
        pl = _campaign(seed, slow_at=(1, 8))
        assert pl.drift is not None and "and again" in pl.drift and not pl.next, (seed, pl)
        assert (pl.blocked or "").startswith("inconclusive: the target keeps drifting"), pl.blocked


@pytest.mark.fast
def test_a_change_in_the_last_control_is_confirmed_before_any_winner() -> None:
    """Two identical points after one confirmed 2x change; the control's last run moved -50% again: it is
    measured once more before anything is named (the answer: drift unconfirmed), then it is a drift."""
    ctl = _point(1, [(100.0, 0, None), (50.0, 2, None), (50.5, 3, None), (49.8, 5, None), (25.0, 7, None)])
    other = _point(2, [(100.0, 1, None), (50.2, 4, None), (33.0, 6, None)])  # a winner by 'gap' across the drift
    pl = planner.standing([ctl, other], GRID, REPEATS, True, "s", min_effect=0.02)
    assert pl.cut == _at(2) and pl.drift is None and pl.suspect is not None, pl
    assert pl.next[0] == (ctl.case_id, f"control: {pl.suspect}; measured once more to confirm it"), pl.next
    assert (pl.blocked or "").startswith("drift unconfirmed: re-measure the control: the control seed=1 moved -"), pl
    assert (pl.suspect or "").endswith(f"in its run at {_at(7)}"), pl.suspect
    confirmed = replace(ctl, metric=[*ctl.metric, 25.3], when=[*ctl.when, _at(8)], run_rel=[0.01] * 6)
    pl = planner.standing([confirmed, other], GRID, REPEATS, True, "s", min_effect=0.02)
    assert pl.drift is not None and (pl.blocked or "").startswith("inconclusive: the target keeps drifting"), pl
    refuted = replace(ctl, metric=[*ctl.metric, 50.1], when=[*ctl.when, _at(8)], run_rel=[0.01] * 6)
    pl = planner.standing([refuted, other], GRID, REPEATS, True, "s", min_effect=0.02)
    assert pl.suspect is None and pl.blocked is None and pl.cut == _at(2), pl
    # before any confirmed change: the last control moved, nothing else wanted; still no winner
    alone = _point(1, [(100.0, 0, None), (100.5, 2, None), (50.0, 4, None)])
    pl = planner.standing([alone, _point(2, [(80.0, 1, None)])], GRID, Repeats(budget=0), True, "s", 0.02)
    assert pl.suspect is not None and pl.next == [
        (alone.case_id, f"control: {pl.suspect}; measured once more to confirm it")
    ]
    assert (pl.blocked or "").startswith("drift unconfirmed"), pl


@pytest.mark.fast
def test_a_control_run_under_other_contention_is_host_noise_not_drift() -> None:
    quiet, busy = 0.03, 0.45  # other processes' share of the host's CPU in a run
    b = _point(2, [(90.0, 1, quiet)])
    moved = [(100.0, 0, quiet), (60.0, 2, busy), (61.0, 3, busy)]
    pl = planner.standing([_point(1, moved), b], GRID, REPEATS, True, "s", min_effect=0.02)
    assert pl.cut is None and pl.suspect is None and pl.blocked is None, pl
    (note,) = pl.notes
    assert "the control seed=1 moved -40.0%" in note and "other processes took 45% of the host" in note, note
    assert "(in its earlier runs: 3%): host noise, not evidence of target drift" in note, note
    # the same moves under like contention: a change, confirmed
    alike = [(m, t, quiet) for m, t, _ in moved]
    assert planner.standing([_point(1, alike), b], GRID, REPEATS, True, "s", min_effect=0.02).cut == _at(2)
    # a suspected change whose next runs are all under other contention: asked again CONFIRM_TRIES times, then
    # the campaign stops asking and names no winner
    tried = _point(1, [(100.0, 0, quiet), (50.0, 2, quiet), (30.0, 3, busy)])
    pl = planner.standing([tried, b], GRID, REPEATS, True, "s", min_effect=0.02)
    assert pl.suspect is not None and pl.next[0][0] == tried.case_id, pl
    gave = _point(1, [(100.0, 0, quiet), (50.0, 2, quiet), (30.0, 3, busy), (31.0, 4, busy)])
    pl = planner.standing([gave, b], GRID, REPEATS, True, "s", min_effect=0.02)
    assert pl.suspect is not None and gave.case_id not in dict(pl.next) and pl.blocked, pl


@pytest.mark.fast
def test_the_noise_floor_is_learned_from_the_controls_own_repeats() -> None:
    b = _point(2, [(90.0, 1, None)])
    tight = [(100.0, 0, None), (100.4, 2, None), (99.8, 3, None), (100.2, 4, None)]
    # a quiet control (±0.3% over 4 runs): a 12% move, below the floor assumed before it had 3 runs, is a change
    pl = planner.standing([_point(1, [*tight, (88.0, 5, None), (88.4, 6, None)]), b], GRID, REPEATS, True, "s", 0.02)
    assert pl.cut == _at(5) and "the next of its 4 like runs (sd ±0.3%) within ±1.7% at 99%" in pl.notes[0], pl.notes
    # a loud one (±10%): the same 12% move is within the next run's 99% prediction interval from its runs
    loud = [(100.0, 0, None), (90.0, 2, None), (110.0, 3, None), (95.0, 4, None)]
    pl = planner.standing([_point(1, [*loud, (88.0, 5, None), (88.4, 6, None)]), b], GRID, REPEATS, True, "s", 0.02)
    assert pl.cut is None and pl.suspect is None, pl
    # with one run of its own, a 12% move is within the floor assumed for a shared host (±25%)
    pl = planner.standing(
        [_point(1, [(100.0, 0, None), (88.0, 2, None), (88.4, 3, None)]), b], GRID, REPEATS, True, "s"
    )
    assert pl.cut is None and pl.suspect is None, pl
    assert drift.HOST_FLOOR < 0.5  # a 2x change is always beyond the assumed floor


# ------------------------------------------------------------------------------------------- the real target


def _slow(ws: Workspace, campaign_id: str, slowed: list[int]) -> None:
    """SIGUSR1 the reference target (2x slower) after the first run, and again once the campaign has confirmed
    that first change (its answer notes it)."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(slowed) < 2:
        metas = scan_runs(ws).metas
        done = bool(metas) and read_json_or_none(ws.run(metas[0].run_id).phase_file("decide")) is not None
        if (not slowed and done) or (slowed and any("the target changed at" in n for n in _notes(ws, campaign_id))):
            st = read_json_or_none(next(ws.services_dir.glob("*.json")))
            assert st is not None
            os.kill(int(st["proc"]["pid"]), signal.SIGUSR1)
            slowed.append(len(metas))
        time.sleep(0.1)


def _notes(ws: Workspace, campaign_id: str) -> list[str]:
    return campaign_view(ws, campaign_id).notes


@pytest.mark.quiet  # the rule reads the host's contention: a pass of four workers at once is another test
@pytest.mark.integration
def test_a_target_that_slows_2x_twice_is_inconclusive_in_every_view(
    ws: Workspace, stop_services: None, fault_matrix: dict[str, dict[str, bool]]
) -> None:
    authorization.set_mode(ws, "auto")
    port = free_port()
    body: dict[str, Any] = {
        "name": "drift-twice",
        "base": knee_base(port, "drift-twice", 16),
        "axes": [{"path": "dataset.seed", "values": [1, 2, 3]}],
        "search": {"kind": "grid"},
        "repeats": {"runs": 1, "settle_runs": 2, "budget": 0},
        "decision": {"primary_metric": "output_throughput"},  # min_effect 0.02: the floor is the rule's own
    }
    f = freeze_any(ws, draft={"campaign": body})
    assert isinstance(f, CampaignFrozen)
    slowed: list[int] = []
    t = threading.Thread(target=_slow, args=(ws, f.campaign_id, slowed), daemon=True)
    t.start()
    with cell(fault_matrix, "target slows 2x twice mid-campaign") as c:
        start_any(ws, f.campaign_id)
        view: CampaignView = until_complete(ws, f.campaign_id, 300.0)
        t.join(5)
        c.check("slowed", len(slowed) == 2 and stats(port)["slowdown"] == 4.0, (slowed, view.text()))
        c.check("answer", view.answer.startswith("inconclusive: the target keeps drifting"), view.text())
        c.check("winner", view.winner is None and not view.tie, view.text())
        c.check("drift", view.drift is not None and "and again" in view.drift, view.drift)
        c.check("one", assert_one_answer(ws, f.campaign_id).startswith("inconclusive"), view.text())
