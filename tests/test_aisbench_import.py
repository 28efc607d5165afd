"""AISBench perf output -> raw records, AISBench's own summary, and the known definition differences."""

from __future__ import annotations

from pathlib import Path

import pytest

from caseledger.case.model import Case
from caseledger.importers import DIFFERENCES, AisbenchImportError, read_aisbench
from caseledger.metrics import Distribution, compute_result
from tests.helpers import make_perf_dir


def test_records_follow_the_time_points(tmp_path: Path) -> None:
    imp = read_aisbench(make_perf_dir(tmp_path))
    assert imp.dataset == "gsm8k"
    assert [r["entry"] for r in imp.records] == [10, 11, 12, 13]  # ordered by send time
    assert [r["i"] for r in imp.records] == [0, 1, 2, 3]
    r0 = imp.records[0]
    assert r0["send_ns"] == 1_000_000_000_000
    assert r0["chunk_ns"] == [1_000_125_000_000, 1_000_250_000_000, 1_000_375_000_000, 1_000_500_000_000]
    assert r0["end_ns"] == 1_000_500_000_000
    assert (r0["ok"], r0["prompt_tokens"], r0["completion_tokens"], r0["cached_tokens"]) == (True, 120, 3, None)
    assert r0["chunk_tokens"] == [None] * 4
    failed = imp.records[3]
    assert (failed["ok"], failed["error_class"], failed["error"]) == (False, "timeout", "Request timed out")
    assert failed["completion_tokens"] is None
    assert len(imp.skipped) == 1 and "numpy_store row 99 missing" in imp.skipped[0]


def test_summary_figures_are_parsed(tmp_path: Path) -> None:
    s = read_aisbench(make_perf_dir(tmp_path)).summary
    assert s.common["Benchmark Duration"]["total"].value == 900.0
    assert s.common["Benchmark Duration"]["total"].unit == "ms"
    assert s.common["Total Requests"]["total"].value == 4
    ttft = s.stats["TTFT"]["total"]
    assert (ttft["P99"].value, ttft["P99"].unit, ttft["N"].value) == (248.75, "ms", 3)
    assert s.stats["OutputTokenThroughput"]["total"]["Average"].unit == "token/s"


def test_imported_records_go_through_the_same_metrics(tmp_path: Path) -> None:
    imp = read_aisbench(make_perf_dir(tmp_path, tmp_db=True))  # the tmp/ fallback location
    case = Case.model_validate(
        {
            "scenario": "ais",
            "target": {"endpoints": [{"base_url": "http://127.0.0.1:9/v1", "model": "m"}]},
            "load": {"requests": 4, "concurrency": 4},
        }
    )
    r = compute_result(case, imp.records, chunks_are_content=False)  # AISBench times every SSE line
    ttft = r.windows.whole.latency.ttft
    assert isinstance(ttft, Distribution)
    # AISBench's TTFT = tp[1] - tp[0] (here: the role-only line), in ms
    assert sorted([125.0, 187.5, 250.0]) == [ttft.min, ttft.p50, ttft.max]
    assert r.failures.by_class == {"timeout": 1}
    # request 11: 3 SSE lines after the send, 1 output token -> no TPOT (AISBench would record 0)
    assert "one output token" in " ".join(r.windows.whole.notes)


def test_definition_differences_are_listed(tmp_path: Path) -> None:
    imp = read_aisbench(make_perf_dir(tmp_path))
    text = " ".join(imp.differences)
    assert imp.differences == DIFFERENCES
    for needle in ("role-only and usage-only", "pooled over all requests", "TPOT is 0", "stable stage"):
        assert needle in text


def test_not_an_aisbench_dir_names_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(AisbenchImportError, match="performances/<model_abbr>/"):
        read_aisbench(tmp_path)


def test_import_makes_a_run_that_summarize_and_reprocess_can_use(tmp_path: Path) -> None:
    from caseledger.cli import main
    from caseledger.tools import phase_status, reprocess_raw, summarize
    from caseledger.workspace import Workspace

    perf = make_perf_dir(tmp_path / "ais")
    ws = Workspace(tmp_path / "ws")
    assert main(["import", "aisbench", str(perf), "--workspace", str(ws.root)]) == 0
    (rid,) = [p.name for p in ws.runs_dir.iterdir()]
    s = phase_status(ws, rid)
    assert s.state == "succeeded" and s.results_extracted and s.load_ended == "yes"
    assert s.phases["load"] == "skipped" and s.phases["postprocess"] == "done"
    n = len(read_aisbench(perf).records)
    summ = summarize(ws, [rid])
    assert summ.runs[0].whole is not None and summ.runs[0].whole.requests == n
    again = reprocess_raw(ws, rid, rule="sglang")
    assert again.requests == n
