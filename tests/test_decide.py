"""decide(): keep / close / insufficient, with the missing evidence listed and three separate facts."""

from __future__ import annotations

from typing import Any

from caseledger.case.model import Case
from caseledger.metrics import Result, compute_result
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
