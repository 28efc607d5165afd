"""The report as data: summarize(run_ids=[...]) carries every figure report.md shows (ITL and E2E, tokens, rates,
prefix-cache hits with the requests below the target, AL with its formula and numbers, the windows), read from
the one place both views come from (outcome.figures); a NOT_OBSERVED reason is said once per section."""

from __future__ import annotations

from pathlib import Path

import pytest

from caseledger.metrics import Distribution, Result, compute_result
from caseledger.outcome.figures import brief, run_figures, window_figures
from caseledger.outcome.report import render_run_md
from caseledger.records import RawRecord
from caseledger.workspace import Workspace
from tests.helpers import SPEC_AFTER, SPEC_BEFORE, make_perf_dir, report_case, report_records

PER_REQUEST_REASON = "the engine gave no per-request draft counts"


def cold_every_fourth() -> list[RawRecord]:
    """The report tests' 640 requests (request 0 failed), every fourth one served with no cached token."""
    return [{**r, "cached_tokens": 0} if r["i"] % 4 == 0 else r for r in report_records()]


@pytest.fixture(scope="module")
def res() -> Result:
    return compute_result(report_case(), cold_every_fourth(), metrics_before=SPEC_BEFORE, metrics_after=SPEC_AFTER)


def test_a_not_observed_reason_is_said_once_per_window_section_in_report_md(res: Result) -> None:
    md = render_run_md({"run_id": "r-7f3a"}, res, None, None)
    whole, native = md.split("### Window `whole`")[1].split("### Window `native`")
    for section in (whole, native):
        # three per-request figures and the per-position one share the reason: one line names all four
        assert section.count(PER_REQUEST_REASON) == 1, section
        line = next(x for x in section.splitlines() if PER_REQUEST_REASON in x)
        assert line.startswith("NOT_OBSERVED (") and "AL, per-request counts; strict acceptance rate" in line
    assert native.count("counters cover the whole run") == 1


def test_the_figures_hold_what_report_md_shows_and_the_cache_misses_below_the_target(res: Result) -> None:
    fig = run_figures(res)
    md = render_run_md({"run_id": "r-7f3a"}, res, None, None)
    w = fig.whole
    assert (w.name, w.requests, w.ok, w.duration_s) == ("whole", 640, 639, res.windows.whole.duration_s)
    assert (fig.native.rule, fig.native.requests) == ("aisbench", res.windows.native.requests)
    assert w.latency.observed["itl"] == res.windows.whole.latency.itl
    assert w.latency.observed["e2e"] == res.windows.whole.latency.e2e
    al = w.spec_decode.ratios["al_counters"]
    assert (al.numerator, al.denominator) == (639 * 1024, 113463) and al.formula.startswith("output tokens /")
    assert f"| {al.formula} | {al.text} |" in md  # report.md shows the same formula and numbers
    # requests 4, 8, ... (request 0 failed) had no cache hit: 159 of the 639 hit ratios are below 0.9
    cache = w.cache
    assert (cache.min_hit_ratio, cache.below_min, cache.observed["hit_ratio"].count) == (0.9, 159, 639)
    assert "| requests below it | 159 of 639 |" in md
    assert cache.denominator.startswith("chat-template prompt tokens")
    (missing,) = [m for m in w.spec_decode.not_observed if PER_REQUEST_REASON in m.reason]
    assert missing.figures == [
        "al_per_request",
        "acceptance_rate_per_request",
        "al_accepted_per_request",
        "by_position_per_request",
    ]
    line = brief(w)
    assert f"AL {al.value:.4g} = 654336 / 113463" in line and "159 of 639 below 0.9" in line


def test_a_window_the_rule_did_not_find_says_its_reason_once_per_section() -> None:
    res = compute_result(report_case(), [])  # no raw records: neither rule finds a window
    w = res.windows.native
    assert not w.found
    f = window_figures(w)
    assert f.latency.observed == {} and len(f.latency.not_observed) == 1
    assert f.latency.not_observed[0].figures == ["ttft", "tpot", "itl", "itl_token_aware", "itl_step", "e2e"]
    assert brief(f) == f"no window: {w.reason}"
    md = render_run_md({}, res, None, None)
    native = md.split("### Window `native`")[1]
    # one line per section (the window's own, latency, tokens, throughput, cache, speculative decoding), never one
    # per figure (33 of them)
    assert native.count(f"no native window: {w.reason}") == native.count("NOT_OBSERVED (no native window") == 6


def test_summarize_answers_with_every_figure_at_four_digits_and_a_short_text(tmp_path: Path) -> None:
    from caseledger.cli import main
    from caseledger.tools import summarize

    ws = Workspace(tmp_path / "ws")
    assert main(["import", "aisbench", str(make_perf_dir(tmp_path / "ais")), "--workspace", str(ws.root)]) == 0
    (rid,) = [p.name for p in ws.runs_dir.iterdir()]
    answer = summarize(ws, [rid])
    (run,) = answer.runs
    assert run.figures is not None and run.whole is not None
    e2e = run.figures.whole.latency.observed["e2e"]
    assert isinstance(e2e, Distribution) and e2e.count == run.whole.ok
    from caseledger.metrics import latest_result

    exact = latest_result(ws.run(rid).root).windows.whole.latency.e2e
    assert isinstance(exact, Distribution)
    assert e2e.p99 == float(f"{exact.p99:.4g}") and e2e.mean == float(f"{exact.mean:.4g}")
    assert run.figures.whole.duration_s == run.whole.duration_s  # the headline and the figures agree
    text = answer.text()
    # the report's headline in the plain answer: both windows with counts and durations, E2E and ITL, and each
    # figure not observed named with its reason (a section observed nowhere once, by its name)
    w, n = run.figures.whole, run.figures.native
    assert f"whole (whole): {w.ok} of {w.requests} ok in " in text and f"native ({n.rule}): " in text, text
    assert "E2E p50/p99" in text and "NOT_OBSERVED: " in text and "speculative decoding (" in text, text
    assert len(text.splitlines()) <= 7 and len(text.encode()) < 2500, text
    assert run.figures.whole.spec_decode.ratios == {}
    assert run.figures.whole.spec_decode.not_observed  # AISBench records carry no draft counts: said why, once
