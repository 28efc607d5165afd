"""The campaign planner, pure, against simulated points: its bisection count, the exhaustive grid's winner, the
leader and runner-up repeated until settled, ties, limits within their noise, the live service's points first,
the control measured again around the others."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import Any

import pytest

from caseledger.campaign import drift, planner
from caseledger.campaign.model import GridSearch, KneeSearch, Repeats, Search


def _obs(
    c: int, metric: list[float], tpot: list[float], bound: float, half: float = 0.05, interval: float = 0.01
) -> planner.PointObs:
    return planner.PointObs(
        case_id=f"c-{c:012x}",
        label=f"C={c}",
        values={"load.concurrency": c},
        service_key="s",
        metric=metric,
        interval_rel=interval if metric else None,
        limits={"tpot_p99_ms": planner.LimitObs(bound=bound, values=tpot, half_width=half if tpot else None)},
        bad_runs=0,
    )


def _simulate(
    cs: list[int], tpot_of: Any, tok_s_of: Any, bound: float, search: Search, repeats: Repeats, noise: Any = None
) -> tuple[planner.Standing, dict[int, int]]:
    """Run the planner to the end, 'measuring' each next point from the given functions; (last plan, runs per C)."""
    runs: dict[int, list[tuple[float, float]]] = {c: [] for c in cs}
    for _ in range(200):
        obs = [_obs(c, [m for m, _ in runs[c]], [t for _, t in runs[c]], bound) for c in cs]
        pl = planner.standing(obs, search, repeats, higher=True, live_service="s")
        if not pl.next:
            return pl, {c: len(v) for c, v in runs.items()}
        cid = pl.next[0][0]
        c = int(cid[2:], 16)
        k = len(runs[c])
        runs[c].append((tok_s_of(c) * (1 + (noise(c, k) if noise else 0.0)), tpot_of(c)))
    raise AssertionError("the planner never finished")


KNEE = KneeSearch(kind="knee", axis="load.concurrency", monotone=True)


@pytest.mark.parametrize("n", [2, 3, 5, 6, 8, 13, 32, 64])
def test_knee_bisection_measures_at_most_log2_points_plus_two_and_finds_the_grid_winner(n: int) -> None:
    cs = list(range(1, n + 1))
    for knee in range(0, n + 1):  # every position of the knee, including none and all meeting
        bound = 10.0

        def tpot(c: int, knee: int = knee) -> float:
            return 5.0 if c <= knee else 20.0

        pl, runs = _simulate(cs, tpot, lambda c: 100.0 * c, bound, KNEE, Repeats(runs=1, budget=0))
        measured = sum(1 for v in runs.values() if v)
        assert measured <= math.ceil(math.log2(n)) + 2, (n, knee, runs)
        grid_winner = max((c for c in cs if tpot(c) <= bound), default=None)  # the exhaustive grid's answer
        won = int(pl.leader[2:], 16) if pl.leader else None
        assert won == grid_winner, (n, knee, runs)
        for cid, why in pl.skipped.items():  # every skipped point says which measured point implies it
            c = int(cid[2:], 16)
            assert ("meets every limit" in why) == (c <= knee) and "monotone" in why


def test_the_leader_and_runner_up_are_repeated_until_settled_and_a_close_pair_is_a_declared_tie() -> None:
    cs = [1, 2, 4]
    grid = GridSearch()
    # C=2 and C=4 within 1% of each other, run-to-run noise +-3%: a tie after settle_runs each
    wobble = [0.03, -0.03, 0.02, -0.02, 0.01]
    pl, runs = _simulate(
        cs,
        lambda c: 5.0,
        lambda c: {1: 50.0, 2: 100.0, 4: 101.0}[c],
        10.0,
        grid,
        Repeats(runs=1, settle_runs=3, budget=10),
        noise=lambda c, k: wobble[k % 5],
    )
    assert pl.tie and not pl.settled and {pl.leader, pl.runner_up} == {f"c-{2:012x}", f"c-{4:012x}"}
    assert runs == {1: 1, 2: 3, 4: 3}, runs  # only the pair the answer rests on was repeated
    # far apart: one repeat each measures the run-to-run noise, then the winner is settled
    pl, runs = _simulate(
        cs,
        lambda c: 5.0,
        lambda c: {1: 50.0, 2: 100.0, 4: 200.0}[c],
        10.0,
        grid,
        Repeats(runs=1, settle_runs=3, budget=10),
        noise=lambda c, k: wobble[k % 5],
    )
    assert pl.settled and not pl.tie and pl.leader == f"c-{4:012x}" and runs == {1: 1, 2: 2, 4: 2}, runs
    # no budget: no repeat at all, and the answer does not claim to be settled by run-to-run noise it never saw
    pl, runs = _simulate(
        cs,
        lambda c: 5.0,
        lambda c: {1: 50.0, 2: 100.0, 4: 101.0}[c],
        10.0,
        grid,
        Repeats(runs=1, settle_runs=3, budget=0),
    )
    assert runs == {1: 1, 2: 1, 4: 1} and pl.tie  # 1% apart within a +-1.4% within-run noise


def test_a_limit_verdict_within_its_noise_is_repeated_and_a_given_up_point_is_no_evidence() -> None:
    near = _obs(4, [400.0], [9.98], 10.0, half=0.1)  # 9.98 +- 0.1 against 10: not settled
    far = _obs(2, [200.0], [6.0], 10.0)
    pl = planner.standing(
        [far, near], GridSearch(), Repeats(runs=1, settle_runs=3, budget=5), higher=True, live_service="s"
    )
    assert any(cid == near.case_id and "within its noise" in why for cid, why in pl.next), pl.next
    gone = planner.PointObs(
        case_id="c-000000000008",
        label="C=8",
        values={"load.concurrency": 8},
        service_key="s",
        metric=[],
        interval_rel=None,
        limits={},
        bad_runs=3,
        last_problem="distorted: busy",
    )
    pl = planner.standing([far, gone], KNEE, Repeats(max_attempts=3), higher=True, live_service="s")
    assert "distorted: busy" in pl.given_up[gone.case_id] and gone.case_id not in pl.skipped


def test_a_noise_never_measured_reads_unknown_never_zero() -> None:
    one = replace(_obs(4, [100.0], [5.0], 10.0), interval_rel=None)  # one run, no within-run interval
    assert one.noise_measured is None and one.noise_rel == 0.0
    assert planner.pm(None) == "±?" and planner.pm(0.0002) == "±<0.1%" and planner.pm(0.0123) == "±1.2%"
    two = replace(_obs(4, [100.0, 104.0], [5.0, 5.0], 10.0), interval_rel=None)
    assert planner.pm(two.noise_measured) == "±2.0%"


def test_points_of_the_live_service_run_first() -> None:
    a = planner.PointObs(
        case_id="c-00000000000a",
        label="np=1",
        values={"x": 1},
        service_key="A",
        metric=[],
        interval_rel=None,
        limits={},
        bad_runs=0,
    )
    b = planner.PointObs(
        case_id="c-00000000000b",
        label="np=2",
        values={"x": 2},
        service_key="B",
        metric=[],
        interval_rel=None,
        limits={},
        bad_runs=0,
    )
    assert [c for c, _ in planner.standing([a, b], GridSearch(), Repeats(), True, live_service="B").next] == [
        b.case_id,
        a.case_id,
    ]


def test_a_limit_pooled_over_runs_whose_interval_straddles_the_bound_is_uncertain_then_said_so() -> None:
    """The issue's case: TPOT p99 per run 53.9, 59.2, 62.3 against 60. The mean of the per-run p99s meets it; the
    pooled p99's interval straddles it: uncertain, repeated up to settle_runs, then the answer says so."""
    from caseledger.campaign.view import _answer

    lo = planner.LimitObs(
        bound=60.0, values=[53.9, 59.2, 62.3], half_width=None, pooled=58.0, low=52.0, high=66.0, requests=48
    )
    assert lo.verdict == "uncertain" and not lo.settled and lo.met == "2/3", lo
    assert lo.said() == "58 [52, 66] pooled over 48 requests in 3 run(s) <= 60: uncertain (met in 2/3 runs)"
    assert replace(lo, high=59.0).verdict == "meets" and replace(lo, low=61.0, pooled=63.0).verdict == "breaks"

    def point(runs: int) -> planner.PointObs:
        return replace(
            _obs(4, [400.0] * runs, [59.0] * runs, 60.0), limits={"tpot_p99_ms": replace(lo, values=lo.values[:runs])}
        )

    reps = Repeats(runs=1, settle_runs=3, budget=5)
    pl = planner.standing([point(2)], GridSearch(), reps, higher=True, live_service="s")
    assert [c for c, why in pl.next if "tpot_p99_ms" in why] == [point(2).case_id], pl.next
    done = point(3)
    pl = planner.standing([done], GridSearch(), reps, higher=True, live_service="s")
    assert not pl.next and pl.leader == done.case_id, pl
    answer, winner, _ = _answer(pl, {done.case_id: done}, True, "output_throughput", True)
    assert winner == done.case_id and "uncertain: C=4 tpot_p99_ms met in 2/3 runs" in answer, answer


@pytest.mark.parametrize(
    ("keys", "level"),
    [
        ({1: "A", 2: "B"}, {1: 100.0, 2: 100.5}),
        ({1: "A", 2: "A", 3: "B", 4: "B"}, {1: 100.0, 2: 80.0, 3: 100.5, 4: 70.0}),
    ],
)
def test_a_tie_across_two_service_identities_starts_each_identity_once(
    keys: dict[int, str], level: dict[int, float]
) -> None:
    """Points of two service identities, the best of each within noise of the other: the leader so far is
    repeated before the campaign leaves its service, the other's repeats run while it is live -- never back and
    forth (each switch is a service start): starts = identities."""
    runs: dict[int, list[float]] = {c: [] for c in keys}
    order: list[str] = []
    wobble = [0.03, -0.03, 0.02, -0.02]
    for _ in range(50):
        obs = [
            replace(_obs(c, runs[c], [5.0] * len(runs[c]), 10.0), service_key=keys[c], label=f"np={c}") for c in keys
        ]
        pl = planner.standing(
            obs, GridSearch(), Repeats(runs=1, settle_runs=3, budget=10), True, order[-1] if order else None
        )
        if not pl.next:
            break
        c = int(pl.next[0][0][2:], 16)
        order.append(keys[c])
        runs[c].append(level[c] * (1 + wobble[len(runs[c]) % 4]))
    starts = 1 + sum(1 for x, y in itertools.pairwise(order) if x != y)
    assert pl.tie and starts == 2, order  # A A A ..., B B B ...
    tied = [c for c in keys if level[c] >= 100.0]
    assert [len(runs[c]) for c in tied] == [3, 3] and all(len(runs[c]) <= 2 for c in keys if c not in tied), runs


def test_a_search_about_to_leave_a_service_first_repeats_what_it_owes_there() -> None:
    """A proposing search (tpe) runs no repeats while it proposes; but before its next point starts another
    service, the live service's leader (and a runner-up within noise on it) is repeated up to settle_runs, so the
    settle after the search needs no second start of it."""
    a1 = replace(_obs(1, [100.0], [5.0], 10.0), service_key="A")
    a2 = replace(_obs(2, [99.0], [5.0], 10.0), service_key="A")
    b1 = replace(_obs(3, [60.0], [5.0], 10.0), service_key="B")
    repeats = Repeats(runs=1, settle_runs=3, budget=10)
    owed = planner.before_leaving([a1, a2, b1], repeats, True, "A")
    assert {cid for cid, _ in owed} == {a1.case_id, a2.case_id}, owed  # leader and runner-up, both on A
    assert all(why.startswith("repeat") for _, why in owed)
    assert planner.before_leaving([a1, a2, b1], repeats, True, "B") == []  # nothing of the answer lives on B
    settled = [replace(a1, metric=[100.0, 100.2, 99.9]), replace(a2, metric=[99.0, 99.1, 98.9]), b1]
    assert planner.before_leaving(settled, repeats, True, "A") == []  # settle_runs reached: it may leave


def _timed(c: int, metric: list[float], when: list[int], rel: float = 0.01) -> planner.PointObs:
    """A point whose valid runs were created at the given seconds (the planner orders runs by these times)."""
    return planner.PointObs(
        case_id=f"c-{c:012x}",
        label=f"C={c}",
        values={"load.concurrency": c},
        service_key="s",
        metric=metric,
        interval_rel=rel,
        limits={},
        bad_runs=0,
        when=[f"2026-12-05T07:00:{t:02d}.000Z" for t in when],
        run_rel=[rel] * len(metric),
    )


def test_the_control_is_measured_again_between_and_after_the_others_and_a_drift_crowns_no_winner() -> None:
    grid, reps = GridSearch(), Repeats(runs=1, settle_runs=3, budget=10)
    first = _timed(1, [100.0], [0])
    others = [_timed(c, [100.0 + c], [c]) for c in range(2, 6)]  # four runs of other points since the control's
    pl = planner.standing([first, *others], grid, reps, True, "s", min_effect=0.02)
    assert pl.controls == [first.case_id] and pl.next[0][0] == first.case_id and "again after 4 runs" in pl.next[0][1]
    # nothing else wanted (no repeat budget): the control's last run closes the campaign, after the others
    a, b = _timed(1, [100.0], [0]), _timed(2, [300.0, 301.0], [1, 2])
    pl = planner.standing([a, b], grid, Repeats(runs=1, budget=0), True, "s", min_effect=0.02)
    assert [c for c, _ in pl.next] == [a.case_id] and "again before leaving its service" in pl.next[0][1]
    # measured again, within its noise: settled, no control run wanted now
    a = _timed(1, [100.0, 100.5], [0, 3])
    pl = planner.standing([a, b], grid, reps, True, "s", min_effect=0.02)
    assert pl.cut is None and pl.settled and pl.leader == b.case_id and not pl.next
    # the control moved -50%: suspected, measured once more at once before anything else
    a = _timed(1, [100.0, 50.0], [0, 3])
    pl = planner.standing([a, b], grid, reps, True, "s", min_effect=0.02)
    assert pl.cut is None and pl.next[0][0] == a.case_id and "measured once more to confirm" in pl.next[0][1]
    # confirmed: the runs before the change are set aside, and every point without a run since is measured again
    a = _timed(1, [100.0, 50.0, 50.5], [0, 3, 4])
    pl = planner.standing([a, b], grid, reps, True, "s", min_effect=0.02)
    assert pl.cut == "2026-12-05T07:00:03.000Z" and pl.drift is None, pl
    assert [c for c, _ in pl.next] == [b.case_id] and "the target changed at 2026-12-05T07:00:03" in pl.notes[0]
    kept = drift.set_aside([a, b], pl.cut)
    assert kept[0].metric == [50.0, 50.5] and kept[1].metric == []
    # a cold first run that the next ones do not confirm twice is noise, not a change
    noisy = _timed(1, [100.0, 60.0, 99.0], [0, 3, 4])
    assert planner.standing([noisy, b], grid, reps, True, "s", 0.02).cut is None
    # a second confirmed change: the target keeps drifting, nothing more runs, no winner
    a = _timed(1, [100.0, 50.0, 50.5, 25.0, 25.5], [0, 3, 4, 7, 8])
    b2 = _timed(2, [300.0, 150.0], [1, 5])
    pl = planner.standing([a, b2], grid, reps, True, "s", min_effect=0.02)
    assert pl.drift is not None and "and again" in pl.drift and not pl.next and pl.leader is None, pl
    # a change within min_effect, or within the runs' own noise, is no change
    assert planner.standing([_timed(1, [100.0, 98.5, 98.4], [0, 3, 4]), b], grid, reps, True, "s", 0.02).cut is None
    loud = _timed(1, [100.0, 92.0, 92.5], [0, 3, 4], rel=0.08)
    assert planner.standing([loud, b], grid, reps, True, "s", 0.02).cut is None
    # per service identity: a control each; the control of another identity does not need its service again
    other = replace(_timed(3, [80.0], [6]), service_key="t")
    pl = planner.standing([_timed(1, [100.0], [0]), _timed(2, [90.0], [1]), other], grid, Repeats(budget=0), True, "t")
    assert set(pl.controls) == {f"c-{1:012x}", other.case_id} and not pl.next, pl.next
    # without run times (older observations) there is no control
    assert planner.standing([_obs(1, [100.0], [5.0], 10.0)], grid, reps, True, "s").controls == []
