"""Settle runs go where they can change the answer, host contention counts as noise, and the answer says what it
rests on: the points that may still win, the resolution reached and whether anything beats the base (the planner
and campaign/resolution.py, pure)."""

from __future__ import annotations

from dataclasses import replace

from caseledger.campaign import planner, resolution
from caseledger.campaign.model import GridSearch, Repeats

REPS = Repeats(runs=1, settle_runs=3, budget=8)


def point(
    c: int, metric: list[float], tpot: float = 50.0, others: float | None = None, uncertain: bool = False
) -> planner.PointObs:
    n = len(metric)
    limit = (
        planner.LimitObs(60.0, [55.0, 62.0, 63.0][:n], None, pooled=61.0, low=52.0, high=66.0, requests=16 * n)
        if uncertain
        else planner.LimitObs(60.0, [tpot] * n, None, pooled=tpot, low=tpot - 2, high=tpot + 2, requests=16 * n)
    )
    return planner.PointObs(
        case_id=f"c-{c:012x}",
        label=f"C={c}",
        values={"load.concurrency": c},
        service_key="s",
        metric=metric,
        interval_rel=0.02 if metric else None,
        limits={"tpot_p99_ms": limit},
        bad_runs=0,
        others=[others] * n,
    )


def test_a_better_point_whose_limit_is_uncertain_gets_the_settle_runs_and_a_loser_gets_none() -> None:
    lead = point(2, [100.0, 101.0])
    better = point(8, [130.0], uncertain=True)  # its pooled TPOT p99 61 [52, 66] against 60: uncertain
    loser = point(1, [60.0], uncertain=True)  # uncertain too, but slower than the leader: it cannot win
    pl = planner.standing([lead, better, loser], GridSearch(), REPS, higher=True, live_service="s")
    assert pl.challengers == [better.case_id], pl
    wanted = dict(pl.next)
    assert better.case_id in wanted and "would lead but tpot_p99_ms met in" in wanted[better.case_id], pl.next
    assert loser.case_id not in wanted, pl.next
    said = resolution.could_change(pl, {p.case_id: p for p in (lead, better, loser)}, REPS)
    assert said.startswith("; could change it: C=8 (130, better; tpot_p99_ms met in 1/1 runs): 2 more run(s)"), said


def test_a_gain_that_coincides_with_host_contention_is_measured_again_and_judged_with_it() -> None:
    quiet, busy = point(4, [110.0, 111.0], others=0.0), point(2, [100.0, 100.5], others=0.30)
    pl = planner.standing([quiet, busy], GridSearch(), REPS, higher=True, live_service="s")
    assert not pl.settled and dict(pl.next).get(busy.case_id, "").startswith("repeat: C=2's runs saw 30%"), pl.next
    assert pl.noise_rel is not None and pl.noise_rel > 0.15 > (pl.gap_rel or 0), pl  # widened past the 10% gap
    same = planner.standing(
        [quiet, replace(busy, others=[0.0, 0.0])], GridSearch(), REPS, higher=True, live_service="s"
    )
    assert same.settled and not same.next, same  # the same figures under like contention: a winner


def test_the_answer_says_when_no_setting_beats_the_base_beyond_noise_and_what_resolving_would_cost() -> None:
    base = point(4, [100.0, 92.0])
    lead = point(8, [103.0, 97.0])
    by_id = {p.case_id: p for p in (base, lead)}
    pl = planner.standing([base, lead], GridSearch(), Repeats(runs=1, settle_runs=2, budget=0), True, "s", 0.02)
    assert pl.leader == lead.case_id and pl.tie, pl
    said = resolution.versus_base(pl, by_id, base.case_id, True)
    assert said.startswith("; no setting beats the base C=4 beyond noise (leader +4.2% vs ±"), said
    res = resolution.resolution(pl, by_id, {base.case_id: 32, lead.case_id: 32}, 0.02)
    assert "leader and runner-up within ±" in res and "; to resolve 4.2% needs about " in res, res
    assert resolution.versus_base(pl, by_id, lead.case_id, True) == ""  # the base is the leader: nothing to say
    clear = {base.case_id: base, lead.case_id: point(8, [150.0, 151.0])}
    assert resolution.versus_base(pl, clear, base.case_id, True) == ""


def test_one_word_per_point_from_one_rule() -> None:
    from caseledger.campaign.view import point_verdict

    args = {"winner": "c-a", "tie": ["c-t1", "c-t2"], "unsettled": []}
    assert point_verdict("c-a", 2, False, **args) == "winner"
    assert point_verdict("c-t1", 2, True, **args) == "tie"
    assert point_verdict("c-x", 0, False, **args) == "not measured"
    assert point_verdict("c-x", 1, True, **args) == "uncertain"  # a limit straddles its bound: not "breaks"
    assert point_verdict("c-x", 3, False, **args) == "loses"
    lead, second = {"winner": None, "tie": [], "unsettled": ["c-a", "c-b"]}, ["c-a", "c-b"]
    assert [point_verdict(c, 1, False, **lead) for c in second] == ["uncertain"] * 2  # leader, runner-up: unsettled
    assert point_verdict("c-c", 1, False, **lead) == "loses"


def test_the_cli_says_its_next_calls_as_commands() -> None:
    from caseledger.ledger.calls import as_cli

    said = as_cli(
        "next: start_run(case_id='c-1a') or phase_status(run_id='g-2b', wait_s=600); summarize(run_ids=['r-1', 'r-2']);"
        " freeze_case(path='cases/x.json', parent='c-1a'); resume(run_id='r-3'); reprocess_raw(run_id='r-4');"
        " summarize(scenario='s-1'); start_run(case_id='c-5', preflight_only=True)"
    )
    assert said == (
        "next: caseledger run c-1a --wait or caseledger status g-2b --wait 600; caseledger summarize r-1 r-2;"
        " caseledger freeze cases/x.json --parent c-1a; caseledger resume r-3 --wait; caseledger reprocess r-4;"
        " caseledger summarize --scenario s-1; caseledger run c-5 --preflight-only"
    ), said
