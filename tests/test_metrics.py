"""Metrics from raw records: every figure checked against a hand computation, windows, spec decode, CLI."""

from __future__ import annotations

import hashlib
import math
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import orjson
import pytest

import caseledger.metrics as metrics
from caseledger.case.model import Case
from caseledger.metrics import (
    Distribution,
    NotObserved,
    Ratio,
    Result,
    Throughput,
    compute_result,
    latest_result,
    read_raw,
    write_result,
)
from caseledger.metrics.__main__ import main
from caseledger.metrics._spec import WHOLE_ONLY_NO_COUNTS
from caseledger.outcome.figures import brief, window_figures
from caseledger.records import RawRecord

MS = 1_000_000  # ns per ms
T0 = 7_000_000_000_000  # an arbitrary monotonic origin: figures must not depend on it


def make_case(**over: Any) -> Case:
    data: dict[str, Any] = {
        "scenario": "hand",
        "target": {"endpoints": [{"base_url": "http://127.0.0.1:9/v1", "model": "m"}], "cards": 2},
        "load": {"requests": 6, "concurrency": 6},
        "cache": {"min_hit_ratio": 0.6},
    }
    for k, v in over.items():
        data[k] = v
    return Case.model_validate(data)


def rec(
    i: int,
    send: float,
    chunks: list[float],
    end: float,
    *,
    toks: list[int | None] | None = None,
    comp: int | None = None,
    prompt: int | None = 100,
    cached: int | None = None,
    body: int | None = 90,
    chat: int | None = 100,
    ok: bool = True,
    error_class: Any = None,
) -> RawRecord:
    """A raw record with times given in ms after T0."""
    return {
        "i": i,
        "entry": i,
        "route": 0,
        "send_ns": T0 + round(send * MS),
        "chunk_ns": [T0 + round(c * MS) for c in chunks],
        "chunk_tokens": toks if toks is not None else [None] * len(chunks),
        "end_ns": T0 + round(end * MS),
        "status": 200 if ok else 500,
        "ok": ok,
        "error": None if ok else "HTTP 500: internal error",
        "error_class": error_class,
        "prompt_tokens": prompt,
        "completion_tokens": comp,
        "cached_tokens": cached,
        "finish_reason": "length" if ok else None,
        "input_tokens_body": body,
        "input_tokens_chat": chat,
    }


# The hand-made raw file (times in ms after T0):
#   R0 ok   send 0  chunks 10 12 14 16 (1 token each)         end 16.5   usage 100 -> 4, cached 64
#   R1 ok   send 1  chunks 21 25 29 (1, 1, 2 tokens)           end 29.5   usage 100 -> 4, cached 96
#   R2 ok   send 2  chunk 30 (1 token): one output token      end 31     usage 200 -> 1, cached 128
#   R3 FAIL send 3  no chunk, HTTP 500                         end 40
#   R4 ok   send 5  chunks 15 18 (tokens unknown, 2 == usage)  end 18.25  usage prompt null (chat 100) -> 2, cached 0
#   R5 ok   send 6  chunks 20 24 (tokens unknown, 2 != usage 3) end 24.5  usage 100 -> 3, cached 32
def hand_records() -> list[RawRecord]:
    return [
        rec(0, 0, [10, 12, 14, 16], 16.5, toks=[1, 1, 1, 1], comp=4, cached=64),
        rec(1, 1, [21, 25, 29], 29.5, toks=[1, 1, 2], comp=4, cached=96),
        rec(2, 2, [30], 31, toks=[1], comp=1, prompt=200, cached=128, body=190, chat=200),
        rec(3, 3, [], 40, ok=False, prompt=None, error_class="http"),
        rec(4, 5, [15, 18], 18.25, comp=2, prompt=None, cached=0),
        rec(5, 6, [20, 24], 24.5, comp=3, cached=32),
    ]


def linear_percentile(values: list[float], q: float) -> float:
    """Textbook linear interpolation between closest ranks (numpy's default method)."""
    xs = sorted(values)
    h = (len(xs) - 1) * q / 100
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (h - lo)


def check_dist(d: Distribution | NotObserved, values: list[float], unit: str) -> None:
    """count/min/max/mean exact; percentiles to 1e-12 (numpy's lerp may differ in the last bit)."""
    assert isinstance(d, Distribution), d
    assert d.unit == unit
    assert d.count == len(values)
    assert d.min == min(values)
    assert d.max == max(values)
    assert d.mean == sum(values) / len(values)
    for q in (50, 75, 90, 99):
        assert getattr(d, f"p{q}") == pytest.approx(linear_percentile(values, q), abs=1e-12), q


def check_rate(t: Throughput | NotObserved, numerator: float, duration_s: float, cards: int = 2) -> None:
    assert isinstance(t, Throughput), t
    assert t.numerator == numerator
    assert t.duration_s == duration_s
    assert t.value == numerator / duration_s
    assert t.per_card == numerator / duration_s / cards
    assert t.cards == cards


@pytest.fixture(scope="module")
def hand() -> Result:
    return compute_result(make_case(), hand_records())


def test_latency_figures_match_the_hand_computation(hand: Result) -> None:
    lat = hand.windows.whole.latency
    # TTFT = first content chunk - send (R3 failed: excluded)
    check_dist(lat.ttft, [10 - 0, 21 - 1, 30 - 2, 15 - 5, 20 - 6], "ms")
    # E2E = end - send
    e2e = {0: 16.5 - 0, 1: 29.5 - 1, 2: 31.0 - 2, 4: 18.25 - 5, 5: 24.5 - 6}
    check_dist(lat.e2e, list(e2e.values()), "ms")
    # TPOT = (E2E - TTFT) / (completion - 1); R2 has one output token: undefined, not 0
    tpot = [(e2e[0] - 10) / 3, (e2e[1] - 20) / 3, (e2e[4] - 10) / 1, (e2e[5] - 14) / 2]
    check_dist(lat.tpot, tpot, "ms")
    # ITL: gaps between content chunks of one request, pooled
    check_dist(lat.itl, [2, 2, 2, 4, 4, 3, 4], "ms")
    # token-aware: R1's last gap (4 ms) carried 2 tokens -> 2 ms twice; R4 derived (2 chunks == 2 tokens);
    # R5 excluded (2 chunks, 3 tokens, no chunk_tokens)
    check_dist(lat.itl_token_aware, [2, 2, 2, 4, 2, 2, 3], "ms")
    # per step: no two chunks of a request here are under 1 ms apart, so every chunk is its own step
    check_dist(lat.itl_step, [2, 2, 2, 4, 4, 3, 4], "ms")


def test_chunks_of_one_verify_step_are_one_step_gap() -> None:
    """Speculative decoding streams a verify step's accepted tokens together: ITL per chunk reads the tens of
    microseconds between them, ITL per step the gaps between the steps."""
    records = [
        rec(0, 0, [10, 10.05, 10.1, 410, 410.03, 900], 900.5, toks=[1] * 6, comp=6),
        rec(1, 1, [20, 20.04, 520, 520.02], 520.5, toks=[1] * 4, comp=4),
    ]
    whole = compute_result(make_case(load={"requests": 2, "concurrency": 2}), records).windows.whole
    lat = whole.latency
    check_dist(lat.itl, [0.05, 0.05, 399.9, 0.03, 489.97, 0.04, 499.96, 0.02], "ms")
    check_dist(lat.itl_step, [399.9, 489.97, 499.96], "ms")
    # the plain answer's line puts both side by side, and says how many gaps were merged
    assert "ITL per step p50/p99 490/499.8 ms (5 of 8 chunk gaps < 1 ms merged)" in brief(window_figures(whole))
    burst_only = [rec(0, 0, [10, 10.05, 10.1], 10.5, toks=[1] * 3, comp=3)]
    lat = compute_result(make_case(load={"requests": 1, "concurrency": 1}), burst_only).windows.whole.latency
    assert isinstance(lat.itl_step, NotObserved) and "every chunk gap < 1 ms" in lat.itl_step.reason, lat.itl_step


def test_failed_and_one_token_requests_are_explained_not_zeroed(hand: Result) -> None:
    whole = hand.windows.whole
    assert (hand.requests, hand.ok, hand.failed) == (6, 5, 1)
    assert hand.failures.by_class == {"http": 1}
    assert hand.failures.first_error == {"http": "HTTP 500: internal error"}
    assert "excluded from latency" in hand.failures.note
    assert whole.failed_by_class == {"http": 1}
    notes = " ".join(whole.notes)
    assert "1 successful request(s) with one output token have no TPOT" in notes
    assert "1 successful request(s) excluded from token-aware ITL" in notes
    assert "1 failed request(s)" in notes


def test_token_figures_match_the_hand_computation(hand: Result) -> None:
    tok = hand.windows.whole.tokens
    check_dist(tok.input_body, [90, 90, 190, 90, 90], "tokens")
    check_dist(tok.input_chat, [100, 100, 200, 100, 100], "tokens")
    check_dist(tok.prompt, [100, 100, 200, 100], "tokens")  # R4's server usage had no prompt_tokens
    check_dist(tok.output, [4, 4, 1, 2, 3], "tokens")


def test_whole_window_and_throughput_per_card(hand: Result) -> None:
    w = hand.windows.whole
    duration = (40 * MS) / 1e9  # first send (R0 at 0) to last end (R3 at 40 ms)
    assert (w.start_s, w.end_s, w.duration_s) == (0.0, 0.04, duration)
    assert (w.requests, w.ok, w.failed, w.cards) == (6, 5, 1, 2)
    assert w.meets_min_requests and w.meets_min_duration
    check_rate(w.throughput.request, 5, duration)
    check_rate(w.throughput.output, 4 + 4 + 1 + 2 + 3, duration)
    prompt = 100 + 100 + 200 + 100 + 100  # R4 falls back to input_tokens_chat
    check_rate(w.throughput.input, prompt, duration)
    check_rate(w.throughput.total, prompt + 14, duration)
    assert w.throughput.output.text == "14 tok / 0.0400 s = 350.0000 tok/s; / 2 cards = 175.0000 tok/s/card"  # type: ignore[union-attr]
    # concurrency integral by hand (ms x requests): 1+2+3+4*2+5+6*10.5+5*1.75+4*6.25+3*5+2*1.5+1*9 = 142.75
    assert w.mean_concurrency == 142.75 / 40
    assert w.peak_concurrency == 6
    assert hand.concurrency.c == [1, 2, 3, 4, 5, 6, 5, 4, 3, 2, 1, 0]
    assert hand.concurrency.t_s[:3] == [0.0, 0.001, 0.002]


def test_prefix_cache_figures(hand: Result) -> None:
    cache = hand.windows.whole.cache
    assert cache.denominator.startswith("chat-template prompt tokens")
    assert cache.requests_with_cached_tokens == 5
    check_dist(cache.cached_tokens, [64, 96, 128, 0, 32], "tokens")
    ratios = [64 / 100, 96 / 100, 128 / 200, 0 / 100, 32 / 100]
    check_dist(cache.hit_ratio, ratios, "ratio")
    assert cache.min_hit_ratio == 0.6
    assert cache.share_meeting_min == 3 / 5
    duration = 0.04
    check_rate(cache.nominal_input_throughput, 600, duration)
    check_rate(
        cache.uncached_input_throughput, (100 - 64) + (100 - 96) + (200 - 128) + (100 - 0) + (100 - 32), duration
    )


def test_definitions_are_written_into_the_result(hand: Result) -> None:
    for key in (
        "ttft",
        "e2e",
        "tpot",
        "itl",
        "itl_token_aware",
        "itl_step",
        "output_throughput",
        "per_card",
        "window_native_aisbench",
        "window_native_sglang",
        "spec_acceptance_length",
    ):
        assert hand.definitions[key]
    schema = Result.model_json_schema()
    assert "Time to first content chunk" in orjson.dumps(schema).decode()


def test_not_observed_serializes_with_value_and_reason() -> None:
    r = compute_result(make_case(), [rec(0, 0, [5], 6, comp=1)])
    dumped = r.model_dump(mode="json")
    assert dumped["windows"]["whole"]["latency"]["tpot"] == {
        "value": "NOT_OBSERVED",
        "reason": "no successful request with >= 2 output tokens (usage.completion_tokens)",
    }
    assert Result.model_validate_json(orjson.dumps(dumped)) == r


def test_missing_usage_makes_throughput_not_observed_never_zero() -> None:
    r = compute_result(make_case(), [rec(0, 0, [5, 6], 7, comp=None), rec(1, 0, [5, 6], 8, comp=2)])
    out = r.windows.whole.throughput.output
    assert isinstance(out, NotObserved)
    assert out.reason == "1 of 2 credited successful requests lack usage.completion_tokens"
    empty = compute_result(make_case(), [])
    assert isinstance(empty.windows.whole.latency.ttft, NotObserved)
    assert not empty.windows.whole.found and not empty.windows.native.found


def test_every_figure_names_its_window(hand: Result) -> None:
    for name in ("whole", "native"):
        w = getattr(hand.windows, name)
        assert w.name == name
        assert w.cards == 2
        assert w.duration_s is not None


# ------------------------------------------------------------------------------------------ windows


def closed_loop() -> list[RawRecord]:
    """Concurrency 2, closed loop: two sends at 0, each end immediately followed by the next send."""
    spans = [(0, 10), (0, 12), (10, 20), (12, 25), (20, 30), (25, 31)]
    return [rec(i, s, [e - 1], e, toks=[1], comp=1) for i, (s, e) in enumerate(spans)]


def test_aisbench_window_starts_at_second_request_reaching_peak_and_ends_when_peak_is_left() -> None:
    r = compute_result(make_case(load={"requests": 6, "concurrency": 2}), closed_loop(), rule="aisbench")
    n = r.windows.native
    # peak 2 is reached by the second send at 0, then by sends at 10, 12, 20, 25; the second of those is at
    # 10 ms; concurrency last equals 2 from 25 ms until R4 ends at 30 ms
    assert (n.rule, n.found, n.start_s, n.end_s) == ("aisbench", True, 0.01, 0.03)
    assert n.requests == 4  # sends at 10, 12, 20, 25 start inside [10, 30]
    assert n.params["peak_concurrency"] == 2 and n.params["requests_reaching_peak"] == 5
    check_rate(n.throughput.request, 4, (20 * MS) / 1e9)
    assert isinstance(n.spec_decode.acceptance_length, NotObserved)
    assert n.spec_decode.acceptance_length.reason == WHOLE_ONLY_NO_COUNTS


def plateau() -> list[RawRecord]:
    """Three long requests (0-100 ms), spikes to 4 at 10-12 and 50-60; chunks to credit by timestamp."""
    return [
        rec(0, 0, [5, 55, 95], 100, toks=[1, 1, 1], comp=3),
        rec(1, 0, [99], 100, toks=[1], comp=1),
        rec(2, 0, [99], 100, toks=[1], comp=1),
        rec(3, 10, [11], 12, toks=[1], comp=1),
        rec(4, 50, [52, 58], 60, toks=[2, 3], comp=5),
    ]


def test_sglang_window_is_the_longest_span_at_ratio_of_peak() -> None:
    case = make_case(load={"requests": 5, "concurrency": 4})
    full = compute_result(case, plateau(), rule="sglang", ratio=1.0).windows.native
    # concurrency 4 holds 10-12 and 50-60: the longest is 50-60
    assert (full.start_s, full.end_s, full.params["threshold"]) == (0.05, 0.06, 4)
    assert full.requests == 1  # only R4 starts inside
    # output tokens by chunk timestamp inside [50, 60]: R0's chunk at 55 (1) + R4's chunks (2 + 3)
    check_rate(full.throughput.output, 1 + 2 + 3, (10 * MS) / 1e9)
    broad = compute_result(case, plateau(), rule="sglang", ratio=0.75).windows.native
    assert (broad.start_s, broad.end_s, broad.params["threshold"]) == (0.0, 0.1, 3)
    assert broad.requests == 5


def test_aisbench_rule_on_the_plateau_and_params_recorded() -> None:
    r = compute_result(make_case(load={"requests": 5, "concurrency": 4}), plateau())
    n = r.windows.native
    assert (n.start_s, n.end_s, n.requests) == (0.05, 0.06, 1)
    assert r.params.native_rule == "aisbench" and r.params_key == "aisbench"
    s = compute_result(make_case(), plateau(), rule="sglang", ratio=0.9)
    assert s.params_key == "sglang-r0.9" and s.params.native_ratio == 0.9


def test_native_rules_and_ratio_bounds_are_one_spelling(capsys: pytest.CaptureFixture[str]) -> None:
    assert metrics.NATIVE_RULES == get_args(metrics.NativeRule) == ("aisbench", "sglang")
    assert get_args(metrics.WindowRule) == ("whole", *metrics.NATIVE_RULES)
    case = make_case(load={"requests": 5, "concurrency": 4})
    assert compute_result(case, plateau(), rule="sglang", ratio=metrics.RATIO_MAX).params.native_ratio == 1.0
    for bad in (metrics.RATIO_MIN_EXCLUSIVE, metrics.RATIO_MAX + 0.01):
        with pytest.raises(ValueError, match=r"outside \(0, 1\]"):
            compute_result(case, plateau(), rule="sglang", ratio=bad)
    with pytest.raises(ValueError, match="known: aisbench, sglang"):
        compute_result(case, plateau(), rule="whole")
    # the CLI spells the rules itself (`caseledger --help` must not import numpy): the two must agree
    from caseledger.cli import _parser

    with pytest.raises(SystemExit):
        _parser().parse_args(["reprocess", "--help"])
    assert "{" + ",".join(metrics.NATIVE_RULES) + "}" in capsys.readouterr().out


def test_window_minimums_come_from_the_case() -> None:
    case = make_case(measurement={"native": {"min_requests": 5, "min_duration_s": 0.015}})
    n = compute_result(case, closed_loop()).windows.native
    assert (n.min_requests, n.meets_min_requests) == (5, False)
    assert (n.min_duration_s, n.meets_min_duration) == (0.015, True)


# ------------------------------------------------------------------------------------------ spec decode

BEFORE = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 500
vllm:spec_decode_num_drafts_total{engine="1",model_name="m, with {braces}"} 500
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 10
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 20
"""
AFTER = """vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 60000
vllm:spec_decode_num_drafts_total{engine="1",model_name="m, with {braces}"} 54463
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 541907
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 680798
"""


SEED_LOAD = {"requests": 6, "concurrency": 6, "max_tokens": 1024}  # the records' 1024 tokens are within max_tokens


def seed_run() -> list[RawRecord]:
    """640 requests x 1024 output tokens = 655360 (the seeds' 128K C90 run)."""
    return [rec(i, i, [i + 1], i + 2, toks=[1024], comp=1024) for i in range(640)]


def test_acceptance_length_with_the_seed_numbers() -> None:
    r = compute_result(make_case(load=SEED_LOAD), seed_run(), metrics_before=BEFORE, metrics_after=AFTER)
    spec = r.windows.whole.spec_decode
    assert spec.source == "vllm"  # auto picked by the names present
    al = spec.acceptance_length
    assert isinstance(al, Ratio)
    assert al.text == "655360 / 113463 = 5.7760"
    assert (al.numerator, al.denominator, al.value) == (655360, 113463, 655360 / 113463)
    assert isinstance(spec.acceptance_rate, Ratio)
    assert spec.acceptance_rate.text == f"541897 / 680778 = {541897 / 680778:.4f}"
    assert isinstance(spec.acceptance_length_counters, Ratio)
    assert spec.acceptance_length_counters.value == 1 + 541897 / 113463
    native = r.windows.native.spec_decode
    assert isinstance(native.acceptance_length, NotObserved)
    assert native.acceptance_length.reason == WHOLE_ONLY_NO_COUNTS


def test_a_missing_counter_is_not_observed_with_its_name() -> None:
    strip = [ln for ln in AFTER.splitlines() if "draft_tokens" not in ln]
    r = compute_result(make_case(load=SEED_LOAD), seed_run(), metrics_before=BEFORE, metrics_after="\n".join(strip))
    spec = r.windows.whole.spec_decode
    assert isinstance(spec.acceptance_length, Ratio)  # AL is still known
    rate = spec.acceptance_rate
    assert isinstance(rate, NotObserved)
    assert rate.reason == "counter vllm:spec_decode_num_draft_tokens_total missing from one snapshot"


def test_spec_decode_sglang_and_absent_snapshots() -> None:
    before = 'sglang:spec_verify_calls_total{model_name="m"} 100\nsglang:spec_verify_calls_total_created 1.7e9\n'
    after = 'sglang:spec_verify_calls_total{model_name="m"} 113563\n'
    spec = compute_result(
        make_case(load=SEED_LOAD), seed_run(), metrics_before=before, metrics_after=after
    ).windows.whole.spec_decode
    assert spec.source == "sglang"
    assert isinstance(spec.acceptance_length, Ratio) and spec.acceptance_length.text == "655360 / 113463 = 5.7760"
    assert isinstance(spec.acceptance_rate, NotObserved)
    assert "no cumulative accepted/draft token counters" in spec.acceptance_rate.reason
    none = compute_result(make_case(load=SEED_LOAD), seed_run()).windows.whole.spec_decode
    assert isinstance(none.acceptance_length, NotObserved)
    assert "load/metrics_before.txt, load/metrics_after.txt absent" in none.acceptance_length.reason


def test_parse_prometheus_sums_label_sets_and_skips_comments() -> None:
    assert metrics.parse_prometheus(BEFORE)["vllm:spec_decode_num_drafts_total"] == 1000
    assert metrics.parse_prometheus('a 1\n# x\nb{l="x y"} 2 1700000000\nbad line\n') == {"a": 1.0, "b": 2.0}


# ------------------------------------------------------------------------------------------ files and CLI


def write_run(root: Path, records: list[RawRecord], tail: bytes = b"") -> Path:
    run = root / "r-0123456789ab"
    (run / "load").mkdir(parents=True)
    case = make_case().filled()
    (run / "case.json").write_bytes(orjson.dumps(case.canonical(), option=orjson.OPT_SORT_KEYS))
    (run / "load" / "raw.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records) + tail)
    (run / "load" / "anchor.json").write_bytes(b'{"wall_utc": "2026-11-02T10:00:00+00:00", "mono_ns": %d}' % T0)
    (run / "load" / "metrics_before.txt").write_text(BEFORE)
    (run / "load" / "metrics_after.txt").write_text(AFTER)
    return run


def test_torn_last_line_is_tolerated_and_reported(tmp_path: Path) -> None:
    run = write_run(tmp_path, hand_records(), tail=b'{"i": 6, "entry": 6, "send_')
    cols, src = read_raw(run / "load" / "raw.jsonl")
    assert (cols.n, src.torn_tail, src.bad_lines) == (6, True, 0)
    assert src.sha256 == hashlib.sha256((run / "load" / "raw.jsonl").read_bytes()).hexdigest()
    r = compute_result(make_case(), cols, source=src)
    assert r.inputs.torn_tail and "torn" in r.notes[0]
    assert r.windows.whole.latency == compute_result(make_case(), hand_records()).windows.whole.latency


@pytest.mark.integration
def test_cli_writes_results_with_raw_sha_and_never_overwrites(tmp_path: Path) -> None:
    run = write_run(tmp_path, hand_records())
    raw_sha = hashlib.sha256((run / "load" / "raw.jsonl").read_bytes()).hexdigest()
    # the real entry point, in a fresh interpreter, checking it imports no network or model library
    probe = (
        "import sys, caseledger.metrics.__main__ as m; rc = m.main(sys.argv[1:]); "
        "bad = [x for x in ('mcp', 'httpx', 'httpx2', 'transformers') if x in sys.modules]; "
        "sys.exit(rc or (3 if bad else 0))"
    )
    done = subprocess.run([sys.executable, "-c", probe, str(run)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1
    out = orjson.loads(lines[0])
    assert (out["raw_sha256"], out["requests"], out["ok"], out["failed"], out["reused"]) == (raw_sha, 6, 5, 1, False)
    first = Path(out["result"])
    assert first.parent.parent.parent.name == metrics.PROCESSOR_VERSION
    assert first.parent.parent.name == "aisbench"
    saved = Result.model_validate_json(first.read_bytes())
    assert saved.inputs.raw_sha256 == raw_sha
    assert saved.windows.whole.start_utc == "2026-11-02T10:00:00.000+00:00"
    env = orjson.loads((first.parent / "env.json").read_bytes())
    assert {"executable", "sys_path", "caseledger_version", "argv", "cwd"} <= set(env)
    before = first.read_bytes(), first.stat().st_mtime_ns

    # same inputs and params: same directory, nothing rewritten
    assert main([str(run)]) == 0
    assert (first.read_bytes(), first.stat().st_mtime_ns) == before
    # another native rule: a separate directory; the first result is untouched
    done2 = subprocess.run(
        [sys.executable, "-m", "caseledger.metrics", str(run), "--rule", "sglang", "--ratio", "0.5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done2.returncode == 0, done2.stderr
    second = Path(orjson.loads(done2.stdout)["result"])
    assert second.parent.parent.name == "sglang-r0.5" and second != first
    assert (first.read_bytes(), first.stat().st_mtime_ns) == before
    # more raw data: new inputs key, old result kept
    with (run / "load" / "raw.jsonl").open("ab") as f:
        f.write(orjson.dumps(rec(6, 7, [9], 10, comp=1)) + b"\n")
    assert main([str(run)]) == 0
    assert len(list((run / "results").glob("*/*/*/result.json"))) == 3
    assert (first.read_bytes(), first.stat().st_mtime_ns) == before
    # latest_result: newest for the case's default parameters (aisbench)
    latest = latest_result(run)
    assert latest is not None and latest.params_key == "aisbench" and latest.requests == 7


def test_write_result_refuses_different_content_under_the_same_key(tmp_path: Path) -> None:
    r = compute_result(make_case(), hand_records())
    path = write_result(tmp_path, r)
    assert write_result(tmp_path, r) == path
    forged = r.model_copy(update={"notes": ["changed without a version bump"]})
    with pytest.raises(metrics.ResultConflict, match="PROCESSOR_VERSION"):
        write_result(tmp_path, forged)


def test_cli_failure_exits_nonzero_with_the_error_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr()
    assert err.out == "" and "no case.json" in err.err


def test_all_is_sorted_and_complete() -> None:
    public = {n for n in dir(metrics) if not n.startswith("_")} - {"annotations"}
    modules = {n for n in public if type(getattr(metrics, n)).__name__ == "module"}
    assert set(metrics.__all__) == public - modules
    key = [(not n.isupper(), not n[0].isupper(), n) for n in metrics.__all__]
    assert key == sorted(key)


def test_a_percentile_pooled_over_runs_has_an_interval_that_resamples_runs_too() -> None:
    """Two runs of 16 requests whose TPOT differ by 10 ms: the pooled p99 is the percentile of all 32 requests,
    and its interval (runs, then requests, resampled) is wider than one that treats the 32 as one run -- the
    run-to-run spread is part of it. A rate is not pooled."""
    import numpy as np

    from caseledger.metrics import Interval, NotObserved, interval, pooled

    rng = np.random.default_rng(7)
    a, b = rng.normal(50.0, 1.0, 16), rng.normal(60.0, 1.0, 16)
    iv = pooled("tpot_p99", [{"tpot": a}, {"tpot": b}])
    assert isinstance(iv, Interval) and iv.requests == 32
    assert iv.point == pytest.approx(float(np.percentile(np.concatenate([a, b]), 99)))
    flat = interval("tpot_p99", iv.point, {"tpot": np.concatenate([a, b])})
    assert isinstance(flat, Interval) and iv.low < flat.low - 5.0 and iv.high >= flat.high - 0.5, (iv, flat)
    one = pooled("tpot_p99", [{"tpot": a}])  # one run: the requests' own bootstrap
    assert isinstance(one, Interval) and one.high - one.low < iv.high - iv.low
    assert isinstance(pooled("output_throughput", [{"tpot": a}]), NotObserved)
    assert isinstance(pooled("tpot_p99", [{"tpot": np.array([np.nan])}]), NotObserved)


@pytest.mark.parametrize("seed", range(4))
def test_the_pooled_bootstraps_row_percentile_is_numpys_nanpercentile_bit_for_bit(seed: int) -> None:
    """The pooled interval's per-resample percentile (rows padded with NaN) is computed with one sort; it must give
    what np.nanpercentile(axis=1) gives, to the last bit: ties, a single value, NaN in any place, an all-NaN row."""
    import warnings

    import numpy as np

    from caseledger.metrics._noise import row_percentile

    rng = np.random.default_rng(seed)
    for _ in range(80):
        v = rng.lognormal(size=(int(rng.integers(1, 20)), int(rng.integers(1, 30)))) * 10.0 ** int(rng.integers(-3, 4))
        if rng.random() < 0.3:
            v = np.round(v, 1)  # ties
        v[rng.random(v.shape) < rng.random()] = np.nan
        for q in (0, 37.5, 50, 90, 99, 99.9, 100):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # numpy's "All-NaN slice"
                want = np.nanpercentile(v, q, axis=1)
            assert np.array_equal(row_percentile(v, q), want, equal_nan=True), (v, q)
