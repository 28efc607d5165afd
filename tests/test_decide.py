"""decide(): keep / close / insufficient, with the missing evidence listed and three separate facts."""

from __future__ import annotations

from typing import Any

import pytest

from caseledger.case.model import Case
from caseledger.metrics import Interval, Result, Throughput, compute_result
from caseledger.outcome.decide import DecisionRecord, decide
from caseledger.records import RawRecord

MS = 1_000_000


def case(**decision: Any) -> Case:
    return Case.model_validate(
        {
            "scenario": "dec",
            "target": {"endpoints": [{"base_url": "http://127.0.0.1:9/v1", "model": "m"}], "cards": 4},
            "load": {"requests": 8, "concurrency": 2},
            "measurement": {"whole": {"min_requests": 4}},
            "decision": decision,
        }
    )


def run(step_ms: float, n: int = 8, fail: int = 0, out_tokens: int = 10) -> list[RawRecord]:
    """Closed loop at concurrency 2; each request streams out_tokens chunks step_ms apart."""
    recs: list[RawRecord] = []
    for i in range(n):
        send = (i // 2) * (out_tokens + 1) * step_ms
        chunks = [send + (k + 1) * step_ms for k in range(out_tokens)]
        ok = i >= fail
        recs.append(
            {
                "i": i,
                "entry": i,
                "route": 0,
                "send_ns": round(send * MS),
                "chunk_ns": [round(c * MS) for c in chunks],
                "chunk_tokens": [1] * out_tokens,
                "end_ns": round(chunks[-1] * MS) + 1,
                "status": 200 if ok else 500,
                "ok": ok,
                "error": None if ok else "boom",
                "error_class": None if ok else "http",
                "prompt_tokens": 50,
                "completion_tokens": out_tokens if ok else None,
                "cached_tokens": None,
                "finish_reason": "length",
                "input_tokens_body": 40,
                "input_tokens_chat": 50,
            }
        )
    return recs


def result(c: Case, step_ms: float, **kw: Any) -> Result:
    return compute_result(c, run(step_ms, **kw))


def test_faster_candidate_is_kept_on_output_throughput_per_card() -> None:
    c = case()
    d = decide(c, result(c, 1.0), result(c, 2.0), "r-base", load_ended=True)
    assert d.outcome == "keep"
    assert (d.load_ended, d.results_extracted, d.enough_to_decide) == (True, True, True)
    assert d.direction == "higher_is_better" and d.primary_metric == "output_throughput_per_card"
    assert d.relative_improvement is not None and d.relative_improvement > 0.9
    assert d.missing == []


def test_small_effect_is_closed_and_latency_is_better_lower() -> None:
    c = case(primary_metric="tpot_p50", min_effect=0.05)
    d = decide(c, result(c, 0.99), result(c, 1.0), "r-base", load_ended=True)
    assert d.direction == "lower_is_better"
    assert d.relative_improvement is not None and 0 < d.relative_improvement < 0.05
    assert d.outcome == "close" and d.enough_to_decide
    worse = decide(c, result(c, 2.0), result(c, 1.0), "r-base", load_ended=True)
    assert worse.outcome == "close" and worse.relative_improvement is not None and worse.relative_improvement < 0


def test_named_baseline_without_result_is_insufficient_not_a_negative_result() -> None:
    c = case()
    d = decide(c, result(c, 1.0), None, "c-000000000000", load_ended=True)
    assert d.outcome == "insufficient"
    assert (d.load_ended, d.results_extracted, d.enough_to_decide) == (True, True, False)
    assert any(m.startswith("no baseline result") for m in d.missing)


def test_first_run_of_a_scenario_becomes_its_baseline() -> None:
    c = case()
    d = decide(c, result(c, 1.0), None, None, load_ended=True)
    assert d.outcome == "baseline" and d.missing == [] and "reference" in d.reason
    short = decide(c, result(c, 1.0), None, None, load_ended=False)  # its own evidence must still hold
    assert short.outcome == "insufficient"


def test_every_missing_piece_of_evidence_is_listed() -> None:
    c = case(primary_metric="ttft_p99", window="native")
    cand = compute_result(c, run(1.0, n=3, fail=1))  # too few requests, one failure
    d = decide(c, cand, result(c, 1.0), "r-base", load_ended=False)
    assert d.outcome == "insufficient" and not d.load_ended and d.results_extracted
    text = "\n".join(d.missing)
    assert "the formal load has not been confirmed ended" in text
    assert "candidate: 1 failed request(s) (http=1)" in text


def test_not_observed_metric_and_window_minimums_make_it_insufficient() -> None:
    c = case(primary_metric="tpot_p50")
    one_token = compute_result(c, run(1.0, out_tokens=1))
    d = decide(c, one_token, result(c, 1.0), "r-base", load_ended=True)
    assert d.outcome == "insufficient"
    assert any("tpot_p50 NOT_OBSERVED on the whole window" in m for m in d.missing)
    small = compute_result(c, run(1.0, n=2))
    d2 = decide(c, small, result(c, 1.0), "r-base", load_ended=True)
    assert any("below min_requests 4" in m for m in d2.missing)


def test_native_windows_with_different_rules_are_not_compared() -> None:
    c = case(window="native", primary_metric="output_throughput")
    cand = compute_result(c, run(1.0), rule="sglang", ratio=0.5)
    d = decide(c, cand, result(c, 2.0), "r-base", load_ended=True)
    assert any("native windows differ" in m for m in d.missing)


def test_decision_record_round_trips_as_json() -> None:
    c = case()
    d = decide(c, result(c, 1.0), result(c, 2.0), "r-base", load_ended=True)
    assert DecisionRecord.model_validate_json(d.model_dump_json()) == d


def test_no_candidate_result_keeps_the_three_facts_apart() -> None:
    d = decide(case(), None, None, None, load_ended=True)
    assert (d.load_ended, d.results_extracted, d.enough_to_decide, d.outcome) == (True, False, False, "insufficient")
    assert d.candidate is None
    assert any("reprocess_raw" in m for m in d.missing)


def jittered(step_ms: float, n: int = 16, spread: float = 0.5, seed: int = 1) -> list[RawRecord]:
    """Like run(), with each request's chunk gaps scaled by a random factor in [1 - spread, 1 + spread]."""
    import random

    rnd = random.Random(seed)
    out = run(step_ms, n=n)
    for rec in out:
        k = 1 + rnd.uniform(-spread, spread)
        send = rec["send_ns"]
        rec["chunk_ns"] = [send + round((c - send) * k) for c in rec["chunk_ns"]]
        rec["end_ns"] = rec["chunk_ns"][-1] + 1
    return out


def test_a_limit_breaker_is_closed_whatever_its_throughput() -> None:
    c = case(limits={"tpot_p99_ms": 1.5})
    d = decide(c, result(c, 2.0), result(c, 1.0), "c-base@r-base", load_ended=True)  # throughput halves
    assert d.outcome == "close" and d.reason.startswith("close (limit tpot_p99_ms 2 > 1.5)")
    faster = decide(c, result(c, 1.6), result(c, 4.0), "c-base@r-base", load_ended=True)  # 2.5x the throughput
    assert faster.outcome == "close" and "limit tpot_p99_ms" in faster.reason
    assert [(v.limit, v.verdict) for v in faster.limits] == [("tpot_p99_ms", "breaks")]
    first = decide(c, result(c, 2.0), None, None, load_ended=True)  # even the first of a scenario
    assert first.outcome == "close"


def test_a_candidate_within_limits_is_kept_over_a_baseline_that_breaks_them() -> None:
    c = case(limits={"tpot_p99_ms": 1.5})
    d = decide(c, result(c, 1.4), result(c, 2.0), "c-base@r-base", load_ended=True)
    assert d.outcome == "keep" and "baseline breaks tpot_p99_ms 2 > 1.5" in d.reason


def test_goodput_counts_requests_meeting_their_own_limits() -> None:
    c = case(primary_metric="goodput", goodput={"tpot_ms": 1.5})
    res = compute_result(c, run(1.0))
    gp = res.windows.whole.throughput.goodput
    rq = res.windows.whole.throughput.request
    assert isinstance(gp, Throughput) and isinstance(rq, Throughput) and gp.value == rq.value  # all good
    slow = compute_result(c, run(2.0))
    assert isinstance(slow.windows.whole.throughput.goodput, Throughput)
    assert slow.windows.whole.throughput.goodput.value == 0.0
    d = decide(c, compute_result(c, run(1.0)), compute_result(c, run(1.0, n=8)), "c-b@r-b", load_ended=True)
    assert d.primary_metric == "goodput" and d.direction == "higher_is_better"
    with pytest.raises(ValueError, match=r"needs decision\.goodput"):
        case(primary_metric="goodput")


def test_a_change_within_the_bootstrap_noise_is_insufficient_with_the_call_that_settles_it() -> None:
    c = case(primary_metric="tpot_p50")
    base = compute_result(c, jittered(1.0, seed=1))
    cand = compute_result(c, jittered(1.0, seed=2))  # the same service, other noise
    d = decide(c, cand, base, "c-000000000001@r-base", load_ended=True, candidate_case="c-000000000002")
    assert d.outcome == "insufficient" and d.noise is not None and d.noise.noise_rel > 0.05
    assert d.reason.startswith(f"insufficient (within noise ±{d.noise.noise_rel:.1%})")
    assert d.settle is not None and d.settle.startswith("start_run(case_id='c-000000000002') again")
    assert d.missing == []  # nothing is missing: the change is just too small to tell
    clear = decide(c, compute_result(c, jittered(0.5, seed=2)), base, "c-000000000001@r-base", load_ended=True)
    assert clear.outcome == "keep" and clear.noise is not None and clear.settle is None


def test_bootstrap_interval_is_seeded_and_repeats_add_their_spread() -> None:
    c = case(primary_metric="tpot_p50")
    a, b = compute_result(c, jittered(1.0, seed=3)), compute_result(c, jittered(1.0, seed=3))
    assert a.windows.whole.noise == b.windows.whole.noise  # deterministic
    iv = a.windows.whole.noise
    assert isinstance(iv, Interval) and iv.low <= iv.point <= iv.high and iv.metric == "tpot_p50"
    exact = compute_result(c, run(1.0))  # identical requests: no noise from the requests...
    repeat = compute_result(c, run(1.2))  # ...but a repeat of the baseline's case that differs by 20%
    d = decide(
        c, compute_result(c, run(0.95)), exact, "c-000000000001@r-base", load_ended=True, baseline_repeats=[repeat]
    )
    assert d.noise is not None and d.noise.baseline_runs == 2 and d.noise.baseline_spread_rel is not None
    assert abs(d.noise.noise_rel - 0.2 / 2 / 1.1) < 1e-6  # the baseline's spread: (1.2 - 1.0) / 2 / mean
    assert d.outcome == "insufficient" and "within noise" in d.reason  # +5% inside ±9.1%
    assert d.settle is not None and "start_run" in d.settle


def test_case_ids_without_limits_are_unchanged_by_the_new_fields() -> None:
    plain = case().canonical()["decision"]
    assert "limits" not in plain and "goodput" not in plain
