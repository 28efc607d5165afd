"""One registry names every decision metric and limit (caseledger/case/metrics.py): the schema's names agree
with it, and every entry resolves to a number on a result computed by the real processor from raw records."""

from __future__ import annotations

from typing import get_args

import orjson
import pytest

from caseledger.case.metrics import LIMITS, METRICS, LimitName, PrimaryMetric
from caseledger.case.model import Case, Decision, Limits
from caseledger.case.schema import case_schema
from caseledger.metrics import NotObserved, Result, compute_result
from caseledger.records import RawRecord
from caseledger.views.scenario import ScenarioRow

MS = 1_000_000
N, OUT = 64, 32  # requests, output tokens each
SLOW = 8  # the last wave: twice the time to first chunk and between chunks, so each p99 differs from its p50


def _case() -> Case:
    return Case.model_validate(
        {
            "scenario": "reg",
            "target": {"endpoints": [{"base_url": "http://127.0.0.1:9/v1", "model": "m"}], "cards": 2},
            "load": {"requests": N, "concurrency": 8, "max_tokens": OUT},
            "measurement": {"whole": {"min_requests": 8}},
            "decision": {"primary_metric": "goodput", "goodput": {"tpot_ms": 15}},
        }
    )


def _records() -> list[RawRecord]:
    """N requests in waves of 8, each 100 ms to its first chunk, then a chunk of one token every 10 ms; the last
    wave (SLOW requests, 1/8 of them) 200 ms, then every 20 ms."""
    out: list[RawRecord] = []
    for i in range(N):
        send = (i // 8) * 1000.0
        slow = 2 if i >= N - SLOW else 1
        chunks = [send + slow * (100 + 10 * k) for k in range(OUT)]
        out.append(
            {
                "i": i,
                "entry": i,
                "route": 0,
                "send_ns": round(send * MS),
                "chunk_ns": [round(c * MS) for c in chunks],
                "chunk_tokens": [1] * OUT,
                "end_ns": round((chunks[-1] + 1) * MS),
                "status": 200,
                "ok": True,
                "error": None,
                "error_class": None,
                "prompt_tokens": 128,
                "completion_tokens": OUT,
                "cached_tokens": 0,
                "finish_reason": "length",
                "input_tokens_body": 128,
                "input_tokens_chat": 128,
            }
        )
    return out


@pytest.fixture(scope="module")
def result() -> Result:
    return compute_result(_case(), _records())


def test_the_schema_names_are_the_registry_names() -> None:
    assert get_args(PrimaryMetric) == tuple(METRICS)
    assert set(get_args(LimitName)) == set(LIMITS) == set(Limits.model_fields)
    assert {f"{m.figure}_{m.stat}_ms" for m in LIMITS.values()} == set(LIMITS)  # a limit bounds its own figure
    schema = orjson.loads(case_schema())
    decision = schema["$defs"]["Decision"]["properties"]["primary_metric"]
    assert decision["enum"] == list(METRICS)
    assert Decision().primary_metric in METRICS
    with pytest.raises(ValueError, match="primary_metric"):
        Decision.model_validate({"primary_metric": "tpot_p95"})


def test_the_scenario_row_has_a_column_per_limit_in_the_tables_order() -> None:
    """The scenario table shows every limited percentile, after the metric, each once, in the table's order."""
    fields = list(ScenarioRow.model_fields)
    start = fields.index("metric") + 1
    assert fields[start : start + len(LIMITS)] == list(LIMITS)
    assert [f for f in fields if f.endswith("_ms")] == list(LIMITS)
    for name, m in LIMITS.items():
        assert ScenarioRow.model_fields[name].description == f"{m.label} (ms); null: NOT_OBSERVED", name
    row = ScenarioRow.model_validate(
        {
            **dict.fromkeys(("swept", "run_id", "metric", "decision", "settle"), None),
            **{name: float(i) for i, name in enumerate(LIMITS, 1)},
            **{"case_id": "c-1", "change": "baseline", "runs": 1, "state": "succeeded", "limits": [], "best": False},
        }
    )
    printed = [v for vs in row.percentiles() for v in vs if v is not None]  # by figure, then statistic
    assert sorted(printed) == [row.ms(name) for name in LIMITS] == [float(i) for i in range(1, len(LIMITS) + 1)]
    with pytest.raises(KeyError, match=r"ttft_p95_ms is no limit of caseledger\.case\.metrics\.TABLE"):
        row.ms("ttft_p95_ms")


def test_every_registered_metric_resolves_on_a_real_result(result: Result) -> None:
    w = result.windows.whole
    for m in [*METRICS.values(), *LIMITS.values()]:
        v = w.value(m)
        assert not isinstance(v, NotObserved), (m.name, v)
        assert v > 0, m.name
    # the figures as the records make them, independently of the registry
    duration_s = w.duration_s
    assert duration_s is not None
    assert w.number(METRICS["output_throughput"]) == pytest.approx(N * OUT / duration_s)
    assert w.number(METRICS["output_throughput_per_card"]) == pytest.approx(N * OUT / duration_s / 2)
    assert w.number(METRICS["request_throughput"]) == pytest.approx(N / duration_s)
    assert w.number(METRICS["goodput"]) == pytest.approx((N - SLOW) / duration_s)  # the slow TPOTs miss 15 ms
    fast, slow = {"ttft": 100.0, "itl": 10.0}, {"ttft": 200.0, "itl": 20.0}
    for d in (fast, slow):  # the end is 1 ms after the last chunk
        d["tpot"] = (d["itl"] * (OUT - 1) + 1) / (OUT - 1)
        d["e2e"] = d["ttft"] + d["itl"] * (OUT - 1) + 1
    for m in [*METRICS.values(), *LIMITS.values()]:  # a percentile by its name (figure_pNN), not its entry
        figure, _, rest = m.name.partition("_")
        stat = rest[:3]
        if stat in ("p50", "p99"):
            assert w.number(m) == pytest.approx((fast if stat == "p50" else slow)[figure]), m.name


def test_directions_follow_the_figures() -> None:
    for m in METRICS.values():
        assert m.higher_is_better == (m.figure in ("output", "request", "goodput")), m.name
        assert m.unit == "ms" or m.higher_is_better
    assert all(not m.higher_is_better and m.unit == "ms" for m in LIMITS.values())


def test_each_percentile_interval_resamples_its_own_figure_and_percentile() -> None:
    """The bootstrap interval of ttft_p99 resamples TTFT at p99 (not p50, not TPOT): over spread-out samples,
    each figure on its own scale, the interval sits around its point (a wrong percentile lands far from it)."""
    import numpy as np

    from caseledger.case.metrics import TABLE
    from caseledger.metrics._models import Interval
    from caseledger.metrics._noise import interval

    base = np.linspace(1.0, 1000.0, 400)
    samples = {"ttft": base, "tpot": base * 0.01 + 5.0, "e2e": base * 3.0 + 2000.0}
    for metric in (m.name for m in TABLE if m.kind == "percentile" and m.sample):
        figure, pct = metric.split("_")
        point = float(np.percentile(samples[figure], float(pct[1:])))
        iv = interval(metric, point, samples)
        assert isinstance(iv, Interval), (metric, iv)
        assert abs((iv.low + iv.high) / 2 - point) / point < 0.15, (metric, iv)  # centred on its own point
