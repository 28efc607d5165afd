"""Reports: every figure with its window, NOT_OBSERVED with reasons, whole vs whole and native vs native."""

from __future__ import annotations

import builtins
import sys
from typing import Any

import orjson
import pytest

from caseledger.ledger.runs import RunMeta
from caseledger.metrics import Result, compute_result
from caseledger.outcome.decide import decide
from caseledger.outcome.plots import PlotPoint, render_pareto, render_png
from caseledger.outcome.report import (
    render_run_md,
    render_side_by_side,
    report_json,
)
from tests.helpers import SPEC_AFTER, SPEC_BEFORE, report_case, report_records


@pytest.fixture(scope="module")
def res() -> Result:
    return compute_result(report_case(), report_records(), metrics_before=SPEC_BEFORE, metrics_after=SPEC_AFTER)


def test_run_report_is_complete(res: Result) -> None:
    c = report_case()
    d = decide(c, res, None, None, load_ended=True)
    ledger = {"service": {"seconds": 12.5, "action": "reuse"}, "load": {"seconds": 300.0, "action": "run"}}
    md = render_run_md({"run_id": "r-7f3a", "case_id": "c-0123456789ab"}, res, d, ledger)
    assert md.startswith("# Run r-7f3a")
    head = md.encode()[:2048].decode(errors="ignore")  # the headline figures in the first 2 KB
    assert "## Headline" in head and "- decision: insufficient" in head, head
    assert "- whole (whole): " in head and " ok in " in head and "tok/s" in head and "TTFT p50/p99" in head, head
    assert "- native (" in head and "E2E p50/p99" in head, head
    for needle in (
        "| load ended | yes |",
        "| results extracted | yes |",
        "| enough to decide | no |",
        "insufficient",
        "### Window `whole`",
        "### Window `native`",
        "TTFT",
        "TPOT",
        "ITL (token-aware)",
        "E2E",
        "output token throughput",
        "tok/s/card",
        "| http | 1 | HTTP 500 |",
        "chat-template prompt tokens",
        "uncached (recomputed) input throughput",
        f"654336 / 113463 = {654336 / 113463:.4f}",
        "NOT_OBSERVED (counters cover the whole run; the engine gave no per-request counts)",
        "## Time ledger",
        "| service | 12.5000 | reuse |",
        "## Definitions",
        "| tpot |",
    ):
        assert needle in md, needle
    # the strict rate has no draft-token counter: shown as NOT_OBSERVED with the reason
    assert "NOT_OBSERVED (counter vllm:spec_decode_num_draft_tokens_total missing from both snapshots)" in md


def test_report_without_decision_or_ledger(res: Result) -> None:
    md = render_run_md({}, res, None, None)
    assert "No decision recorded." in md and "No time ledger given." in md


def test_side_by_side_never_mixes_windows(res: Result) -> None:
    other = compute_result(report_case(), report_records(step_ms=0.5), rule="sglang", ratio=0.9)
    text = render_side_by_side([("r-aaaa", "c-1", res), ("r-bbbb", "c-2", other)])
    whole, native = text.split("## native vs native")
    assert whole.startswith("## whole vs whole")
    assert "| metric | r-aaaa (c-1) | r-bbbb (c-2) |" in whole
    assert f"| output tok/s/card | {res.windows.whole.throughput.output.per_card:.4f} |" in whole  # type: ignore[union-attr]
    assert "different rules (aisbench, sglang r=0.9)" in native
    native_value = res.windows.native.throughput.output.per_card  # type: ignore[union-attr]
    assert f"{native_value:.4f}" in native


def test_report_json_round_trips(res: Result) -> None:
    doc = report_json(RunMeta(run_id="r-7f3a", case_id="c-000000000000", workspace="/w"), res, None, {"load": 300.0})
    data = orjson.loads(orjson.dumps(doc))
    assert Result.model_validate(data["result"]) == res
    assert data["headline"]["whole"]["AL counters"] == 639 * 1024 / 113463  # the failed request's tokens are excluded
    assert data["headline"]["native"]["AL counters"] == "NOT_OBSERVED"


def test_plots_are_optional(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    for loaded in [m for m in sys.modules if m.startswith("matplotlib")]:  # imported by an earlier test
        monkeypatch.delitem(sys.modules, loaded)
    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    assert render_pareto("t", []) is None
    assert render_png("t", "m", "x", [], {}, {}) is None


def test_decision_png_draws_metric_limits_and_cdfs() -> None:
    points = [
        PlotPoint(
            label=f"C={c}",
            x=float(c),
            metric=100.0 * c,
            figures={"tpot_p99_ms": 4.0 * c},
            breaks=4.0 * c > 10,
            best=c == 2,
        )
        for c in (1, 2, 4)
    ]
    png = render_png(
        "scenario s",
        "output_throughput (whole)",
        "load.concurrency",
        points,
        {"tpot_p99_ms": 10.0},
        {"C=1": {"ttft": [1.0, 2.0], "tpot": [3.0, float("nan")]}},
    )
    assert png is not None and png.startswith(b"\x89PNG") and len(png) < 200_000


def test_runs_that_met_the_cache_at_another_warmth_are_flagged_when_compared() -> None:
    """A baseline whose first wave met a cold cache (its first 64 requests 0 cached) against a warm candidate:
    the decision says warmth differs, on which window it rests and what the other window does; alike runs: not."""
    c = report_case()
    warm = compute_result(c, report_records())
    cold_rows = [{**r, "cached_tokens": 0 if r["i"] < 128 else r["cached_tokens"]} for r in report_records()]
    cold = compute_result(c, cold_rows)  # type: ignore[arg-type]
    d = decide(c, warm, cold, "r-base", load_ended=True)
    assert d.warmth is not None and "warmth differs" in d.warmth and d.warmth in d.reason, d.reason
    assert "rests on the whole window, the native window compares them again without the ramp" in d.warmth
    alike = decide(c, warm, warm, "r-base", load_ended=True)
    assert alike.warmth is None and "warmth" not in alike.reason
