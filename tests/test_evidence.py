"""Evidence you can trust: a lying server is never believed, a failed load fails with its cause, stopped
processes and busy hosts are seen. Real runs on loopback targets, counted at the target."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from caseledger import procs
from caseledger.case.model import Case
from caseledger.errors import CaseledgerError
from caseledger.ledger.event_types import HostQuietWait, LoadEndedEarly
from caseledger.ledger.events import read_events
from caseledger.metrics import NotObserved, Throughput, columns_from_records, compute_result
from caseledger.metrics._checks import check_counts
from caseledger.records import RawRecord, read_records
from caseledger.tools import freeze_case, phase_status, resume, start_run
from caseledger.workspace import Workspace, read_json
from tests.conftest import external_draft, free_port, ref_draft, stats
from tests.helpers import cell, service_pid, settled, wait_until
from tests.misbehaving import misbehaving

pytestmark = pytest.mark.integration


def decision(ws: Workspace, run_id: str) -> dict[str, Any]:
    return dict(read_json(ws.run(run_id).decision))


def _rec(
    i: int,
    chunks: int,
    comp: int | None,
    prompt: int | None = 10,
    cached: int | None = 0,
    toks: list[int | None] | None = None,
    accepted: int | None = None,
) -> RawRecord:
    return RawRecord(
        i=i,
        entry=i,
        route=0,
        send_ns=i * 10**6,
        chunk_ns=[i * 10**6 + k + 1 for k in range(chunks)],
        chunk_tokens=toks if toks is not None else [None] * chunks,
        end_ns=i * 10**6 + chunks + 2,
        status=200,
        ok=True,
        error=None,
        error_class=None,
        prompt_tokens=prompt,
        completion_tokens=comp,
        cached_tokens=cached,
        finish_reason="length",
        input_tokens_body=8,
        input_tokens_chat=10,
        spec_accepted_tokens=accepted,
    )


# ------------------------------------------------------------------------------------------ the rules, pure


@pytest.mark.parametrize(
    ("rec", "reason"),
    [
        (_rec(0, 16, 99999), "completion_tokens > max_tokens 16"),
        (_rec(0, 16, 15), "completion_tokens < content chunks"),
        (_rec(0, 2, 12), "completion_tokens > 4 x content chunks (+ accepted drafts + 1)"),
        (_rec(0, 4, 4, prompt=10, cached=11), "cached_tokens > prompt_tokens"),
        (_rec(0, 4, 4, prompt=0, cached=0), "prompt_tokens <= 0"),
        (_rec(0, 2, 4, toks=[3, 3]), "completion_tokens < the token counts streamed with its chunks"),
    ],
)
def test_each_count_rule_marks_the_request_invalid_with_its_reason(rec: RawRecord, reason: str) -> None:
    v = check_counts(columns_from_records([rec]), 16, False, 0.0, None, None)
    assert v.invalid.tolist() == [True] and v.reasons == [reason]
    # the first rule it breaks is its reason; every rule it breaks is counted
    assert v.summary.by_reason[reason] == 1 and v.summary.examples[0].startswith(f"request 0: {reason}")


@pytest.mark.parametrize(
    "rec",
    [
        _rec(0, 16, 16),  # one token per chunk
        _rec(0, 4, 16, accepted=12),  # speculative decoding: the accepted drafts ride in the chunks
        _rec(0, 5, 8),  # a few multi-byte characters sent whole
        _rec(0, 2, 12, toks=[6, 6]),  # continuous usage says so itself
        _rec(0, 4, 4, prompt=None, cached=None),  # nothing reported is nothing contradicted
    ],
)
def test_honest_counts_pass(rec: RawRecord) -> None:
    v = check_counts(columns_from_records([rec]), 16, False, 0.0, None, None)
    assert not v.invalid.any(), v.reasons


def test_speculative_counters_without_per_request_counts_lift_the_per_chunk_bound() -> None:
    cols = columns_from_records([_rec(0, 2, 12)])
    assert check_counts(cols, 16, True, 0.0, None, None).invalid.tolist() == [False]


def test_generated_token_counter_disagreement_is_shown() -> None:
    before, after = "vllm:generation_tokens_total 100\n", "vllm:generation_tokens_total 140\n"
    v = check_counts(columns_from_records([_rec(0, 16, 16), _rec(1, 16, 16)]), 16, False, 0.0, before, after)
    (c,) = v.summary.counters
    assert (c.delta, c.per_request_sum, c.agrees) == (40.0, 32.0, False) and "differ by +8" in c.text


def _case(**over: Any) -> Case:
    ep = {"base_url": "http://127.0.0.1:9/v1", "model": "m"}
    d: dict[str, Any] = {
        "scenario": "s",
        "target": {"endpoints": [ep]},
        "load": {"requests": 4, "concurrency": 2, "max_tokens": 16},
    }
    d.update(over)
    return Case.model_validate(d)


def test_invalid_requests_leave_every_figure_and_a_window_past_the_share_has_none() -> None:
    recs = [_rec(i, 16, 16) for i in range(3)] + [_rec(3, 16, 99999)]
    strict = compute_result(_case(), recs)
    w = strict.windows.whole
    assert w.invalid == 1 and w.ok == 3 and w.failed == 0
    assert isinstance(w.throughput.output, NotObserved) and "fail the checks" in w.throughput.output.reason
    lenient = compute_result(_case(measurement={"evidence": {"max_invalid_share": 0.5}}), recs).windows.whole
    assert isinstance(lenient.throughput.output, Throughput)
    assert lenient.throughput.output.numerator == 48  # the invalid request's 99999 tokens are in no figure
    assert lenient.invalid == 1


def test_stalls_and_contention_distort_a_window() -> None:
    recs = [_rec(i, 16, 16) for i in range(4)]
    recs[-1]["end_ns"] = 3 * 10**9  # the stall held the last request: the window spans it
    stall = [{"start_ns": 1 * 10**6, "end_ns": 1 * 10**6 + 2 * 10**9}]
    r = compute_result(_case(), recs, stalls=stall)
    assert any("load client stalled 2.0 s" in d for d in r.windows.whole.distorted), r.windows.whole.distorted
    busy = [
        {
            "mono_ns": 2 * 10**6,
            "dt_ns": 10**6,
            "total": 200,
            "busy": 190,
            "steal": 0,
            "ours": 30,
            "client": 10,
            "cores": 2,
            "load1": 3.0,
        }
    ]
    r = compute_result(_case(), recs, host=busy)
    assert any("other processes used 80% of the host's 2 core(s)" in d for d in r.windows.whole.distorted)
    clean = compute_result(_case(), recs, host=[{**busy[0], "busy": 40}]).windows.whole
    assert clean.distorted == []


# ------------------------------------------------------------------------------------ real runs, real targets


def test_a_lying_server_is_never_a_baseline_and_its_requests_are_named(
    ws: Workspace, fault_matrix: dict[str, dict[str, bool]]
) -> None:
    with cell(fault_matrix, "server lies in usage") as c, misbehaving("lie") as (port, target):
        case = freeze_case(ws, draft=external_draft(port, load={"requests": 8, "concurrency": 4, "max_tokens": 16}))
        r = start_run(ws, case.case_id, wait=True, timeout_s=120)
        c.check("count", target.counts["load"] == 8, target.counts)
        d = decision(ws, r.run_id)
        c.check("decide", d["outcome"] == "insufficient" and phase_status(ws, r.run_id).decision == "insufficient", d)
        c.check(
            "next",
            any("fail the checks" in m and "completion_tokens > max_tokens 16" in m for m in d["missing"]),
            d["missing"],
        )
        report = ws.run(r.run_id).report_md.read_text()
        c.check(
            "report",
            "8 of 8 successful responses invalid" in report
            and "completion_tokens > max_tokens 16" in report
            and "cached_tokens > prompt_tokens" in report,
            report,
        )
        result = read_json(next(ws.run(r.run_id).root.glob("results/*/*/*/result.json")))
        whole = result["windows"]["whole"]
        c.check(
            "figures",
            whole["throughput"]["output"]["value"] == "NOT_OBSERVED"
            and whole["invalid"] == 8
            and whole["cache"]["hit_ratio"]["value"] == "NOT_OBSERVED",
            whole["throughput"]["output"],
        )


def test_the_same_server_answering_honestly_is_a_baseline(ws: Workspace) -> None:
    with misbehaving("honest") as (port, _):
        case = freeze_case(ws, draft=external_draft(port, load={"requests": 8, "concurrency": 4, "max_tokens": 16}))
        r = start_run(ws, case.case_id, wait=True, timeout_s=120)
    d = decision(ws, r.run_id)
    assert d["outcome"] == "baseline", d
    assert "0 of 8 successful responses invalid" in ws.run(r.run_id).report_md.read_text()


@pytest.mark.parametrize(
    ("mode", "cls", "next_words"),
    [
        ("http:503", "overload", "wait for the target to drain"),
        ("http:429", "overload", "lower load.rate or load.concurrency"),
        ("http:400", "hot_entry", "freeze_case(draft with the rejected parameter fixed"),
        ("http:500", "service", "resume(run_id="),
        ("timeout", "service", "resume(run_id="),
        ("reset", "service", "resume(run_id="),
        ("badjson", "service", "resume(run_id="),
        ("badutf8", "service", "resume(run_id="),
    ],
)
def test_a_load_where_every_request_failed_fails_with_its_class(
    ws: Workspace, mode: str, cls: str, next_words: str, fault_matrix: dict[str, dict[str, bool]]
) -> None:
    with cell(fault_matrix, f"every request fails: {mode}") as c, misbehaving(mode) as (port, target):
        draft = external_draft(port, load={"requests": 8, "concurrency": 4, "max_tokens": 4, "timeout_s": 1.0})
        case = freeze_case(ws, draft=draft)
        r = start_run(ws, case.case_id, wait=True, timeout_s=120)
        s = phase_status(ws, r.run_id)
        c.check("count", target.counts["load"] == 8, target.counts)
        c.check("class", s.state == "failed" and s.failure_class == cls and s.phase == "load", s.text())
        c.check(
            "svc", "8 of 8 failed" in (s.blocker or "") and "load.max_failed_share 0" in (s.blocker or ""), s.text()
        )
        c.check("next", next_words in s.next_call and s.next_resends_requests, s.next_call)


def test_failures_within_the_declared_share_are_data_not_a_failed_run(ws: Workspace) -> None:
    with misbehaving("http:500") as (port, _):
        draft = external_draft(port, load={"requests": 8, "concurrency": 4, "max_tokens": 4, "max_failed_share": 1.0})
        r = start_run(ws, freeze_case(ws, draft=draft).case_id, wait=True, timeout_s=120)
    s = phase_status(ws, r.run_id)
    assert s.state == "succeeded" and s.decision == "insufficient", s.text()


def _slow_ref(port: int, **load: Any) -> dict[str, Any]:
    return ref_draft(
        port,
        service={
            "adapter": "reference",
            "reference": {
                "prefill_tokens_per_s": 200000,
                "decode_step_s": 0.05,
                "decode_step_per_seq_s": 0.0,
                "slots": 8,
            },
        },
        dataset={"source": "synthetic", "input_tokens": 64, "output_tokens": 16},
        load={"requests": 40, "concurrency": 4, **load},
    )


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0] == b"T"


def _wait_sent(ws: Workspace, run_id: str, n: int) -> None:
    wait_until(lambda: phase_status(ws, run_id).done >= n, 60, f"{n} formal requests done")


@pytest.mark.processes
def test_a_stopped_service_reads_stopped_and_resume_restarts_it_without_a_backlog(
    ws: Workspace, stop_services: None, fault_matrix: dict[str, dict[str, bool]]
) -> None:
    port = free_port()
    case = freeze_case(ws, draft=_slow_ref(port, timeout_s=2.0))
    with cell(fault_matrix, "service SIGSTOPped mid-load") as c:
        r = start_run(ws, case.case_id)
        assert r.run_id is not None
        _wait_sent(ws, r.run_id, 4)
        old = service_pid(ws, r.run_id)
        os.kill(old, signal.SIGSTOP)
        wait_until(lambda: _stopped(old), 5, "the kernel to stop the engine")
        try:
            s = phase_status(ws, r.run_id)  # the first status call after the stop
            c.check(
                "svc",
                s.service_alive is False and any("stopped" in g for g in s.service_gone) and "SIGCONT" in s.next_call,
                s.text(),
            )
            s = settled(ws, r.run_id)
            c.check("class", s.state == "failed" and s.failure_class == "service", s.text())
            c.check("plan", s.next_restarts_service and s.resume_runs[:1] == ["service"], s.text())
            # the controller ended the load once the engine had been stopped 5 s: not every queued request
            # waited out its timeout in turn
            early = [e for e in read_events(ws.run(r.run_id)).events if isinstance(e, LoadEndedEarly)]
            c.check("early", len(early) == 1 and "stopped (SIGSTOP)" in early[0].data.why and s.sent < 40, early)
            res = resume(ws, r.run_id, wait=True)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(old, signal.SIGCONT)
        s2 = phase_status(ws, r.run_id)
        c.check("state", res.state == "succeeded" == s2.state, s2.text())
        new = stats(port)  # a fresh engine got the whole load once; the stopped one, with its backlog, is gone
        c.check("count", new["pid"] != old and new["by_phase"].get("load") == 40, new)
        c.check("once", wait_until(lambda: not os.path.exists(f"/proc/{old}"), 10, "the stopped engine gone"))


@pytest.mark.processes
def test_a_stopped_load_client_distorts_the_window_and_the_decision_names_it(
    ws: Workspace, stop_services: None, fault_matrix: dict[str, dict[str, bool]]
) -> None:
    port = free_port()
    case = freeze_case(ws, draft=_slow_ref(port))
    with cell(fault_matrix, "load client SIGSTOPped 3 s") as c:
        r = start_run(ws, case.case_id)
        assert r.run_id is not None
        _wait_sent(ws, r.run_id, 4)
        client = int(read_json(ws.run(r.run_id).load_pid)["pid"])
        os.kill(client, signal.SIGSTOP)
        try:
            wait_until(lambda: "STOPPED" in phase_status(ws, r.run_id).text(), 10, "the stopped client in status")
            c.check("svc", True)
            time.sleep(3.0)  # the stall itself
        finally:
            os.kill(client, signal.SIGCONT)
        s = settled(ws, r.run_id)
        c.check("state", s.state == "succeeded", s.text())
        d = decision(ws, r.run_id)
        c.check("decide", d["outcome"] == "insufficient" and any("load client stalled" in m for m in d["missing"]), d)
        stalls = read_records(ws.run(r.run_id).load_stalls).records
        c.check("raw", any((x["end_ns"] - x["start_ns"]) / 1e9 >= 2.9 for x in stalls), stalls)  # type: ignore
        events = ws.run(r.run_id).events.read_text()
        c.check("next", "load_client_stopped" in events and "load_client_continued" in events)


@pytest.mark.processes
def test_a_stopped_controller_is_named_with_its_pid_and_the_one_thing_to_do(
    ws: Workspace, stop_services: None, fault_matrix: dict[str, dict[str, bool]]
) -> None:
    """A SIGSTOPped controller never fails the run by itself and resume waits for it: the status names it with its
    pid and says `kill -CONT PID`; continued, the run ends with every request sent once."""
    port = free_port()
    case = freeze_case(ws, draft=_slow_ref(port))
    with cell(fault_matrix, "controller SIGSTOPped mid-load") as c:
        r = start_run(ws, case.case_id)
        assert r.run_id is not None
        _wait_sent(ws, r.run_id, 4)
        ctl = int(read_json(ws.run(r.run_id).controller_pid)["pid"])
        os.kill(ctl, signal.SIGSTOP)
        try:
            wait_until(lambda: phase_status(ws, r.run_id).owner_stopped, 10, "the stopped controller in status")
            s = phase_status(ws, r.run_id)
            c.check("svc", "controller stopped (SIGSTOP)" in (s.blocker or "") and f"pid {ctl}" in (s.blocker or ""))
            c.check("next", s.next_call.startswith(f"kill -CONT {ctl}") and "resume" not in s.next_call, s.next_call)
            with pytest.raises(CaseledgerError, match="still has a live controller"):
                resume(ws, r.run_id)
        finally:
            os.kill(ctl, signal.SIGCONT)
        s = settled(ws, r.run_id)
        c.check("state", s.state == "succeeded", s.text())
        c.check("count", stats(port)["by_phase"].get("load") == s.planned == s.sent_all, stats(port))


def test_caseledgers_own_processes_import_numpy_without_a_thread_per_core() -> None:
    """The collector, the controller's decide and a preflight spawned ahead import numpy: in the environment
    caseledger gives its own processes, that starts no BLAS thread pool on the host the run measures."""
    probe = "import numpy, pathlib; print(pathlib.Path('/proc/self/status').read_text())"

    def threads(env: dict[str, str]) -> tuple[list[int], str]:
        """The Threads: count of a fresh interpreter that imported numpy in `env`, and its stderr."""
        p = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
        return [int(x.split()[1]) for x in p.stdout.splitlines() if x.startswith("Threads:")], p.stderr[-500:]

    mine = threads(procs.child_env())
    assert mine[0] == [1], mine
    if (os.cpu_count() or 1) > 1:  # the default it replaces: one thread per core
        theirs = threads({k: v for k, v in procs.child_env().items() if k not in procs.OWN_PROCESS_ENV})
        assert theirs[0] != [1], theirs


@pytest.mark.processes  # the host is sampled while a detached client loads
@pytest.mark.quiet  # the hog is the only other process: another test's CPU would be named too
def test_a_cpu_hog_on_the_load_host_is_named_in_the_report_and_the_decision(
    ws: Workspace, stop_services: None, fault_matrix: dict[str, dict[str, bool]]
) -> None:
    port = free_port()
    case = freeze_case(ws, draft=_slow_ref(port, requests=24))
    with cell(fault_matrix, "CPU hog on the load host") as c:
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
        try:
            r = start_run(ws, case.case_id, wait=True, timeout_s=120)
        finally:
            for h in hogs:
                h.kill()
                h.wait()
        assert r.run_id is not None
        d = decision(ws, r.run_id)
        c.check("decide", d["outcome"] == "insufficient" and any("contended host" in m for m in d["missing"]), d)
        report = ws.run(r.run_id).report_md.read_text()
        c.check("report", "other processes used" in report and "repeat on a quiet host" in report, report)
        named = [f"pid {h.pid} python" for h in hogs]  # the hogs by pid and command (and their share)
        c.check("named", any(n in m for n in named for m in d["missing"]), (named, d["missing"]))
        samples = read_records(ws.run(r.run_id).load_host).records
        share = np.sum([x["busy"] - x["ours"] for x in samples]) / np.sum([x["total"] for x in samples])  # type: ignore
        c.check("count", share > 0.5, share)
        from caseledger.tools import summarize  # lazy: only here the scenario view is read

        got = summarize(ws, [], scenario="ref-test")
        view = got.scenario
        row = view.rows[0] if view is not None else None
        c.check("next", row is not None and row.runs == 0 and not row.best, row)  # a distorted run is no repeat
        # the scenario view, its next call and HANDOFF.md say why it is insufficient, naming who took the host
        c.check("why", row is not None and row.why is not None and any(n in row.why for n in named), row)
        c.check("quiet", "again on a quiet host" in got.next_call and "start_run" in got.next_call, got.next_call)
        c.check("handoff", "other processes used" in ws.handoff.read_text(), ws.handoff.read_text())


def test_a_verdict_is_decided_again_when_the_baseline_is_re_run(ws: Workspace) -> None:
    """The decide phase records a verdict against the baseline of that moment; the scenario view and summarize
    decide again from the results on disk now, so a baseline re-run on a quieter host re-decides its children."""
    from caseledger.tools import summarize  # lazy: only this test reads the scenario view

    with misbehaving("honest") as (port, target):
        load = {"requests": 8, "concurrency": 4, "max_tokens": 4}
        base = freeze_case(ws, draft=external_draft(port, load=load))
        target.delay_s = 0.2  # the baseline measured on a slow (busy) target
        b1 = start_run(ws, base.case_id, wait=True, timeout_s=120)
        child = freeze_case(ws, draft=external_draft(port, load={**load, "requests": 12}), parent=base.case_id)
        target.delay_s = 0.05
        k = start_run(ws, child.case_id, wait=True, timeout_s=120)
        assert decision(ws, k.run_id)["outcome"] == "keep", decision(ws, k.run_id)  # 4x faster than that baseline
        target.delay_s = 0.0  # the baseline again, on a quiet target: far faster than the child
        b2 = start_run(ws, base.case_id, wait=True, timeout_s=120)
    assert b1.state == b2.state == "succeeded"
    assert decision(ws, k.run_id)["outcome"] == "keep"  # what the decide phase recorded then
    row = next(
        r
        for r in summarize(ws, [], scenario="ref-test").scenario.rows  # type: ignore[union-attr]
        if r.case_id == child.case_id
    )
    assert row.decision != "keep", row  # decided now: no longer better than its baseline's latest run
    (again,) = summarize(ws, [k.run_id]).runs
    assert again.decision == row.decision != "keep", again
    baseline_ref = summarize_decision_ref(ws, k.run_id)
    assert baseline_ref == f"{base.case_id}@{b2.run_id}", baseline_ref  # against the baseline's latest run


def summarize_decision_ref(ws: Workspace, run_id: str) -> str | None:
    from caseledger.ledger.runs import load_run  # lazy: only the re-decision test needs the run object
    from caseledger.outcome import summary

    run = load_run(ws, run_id)
    return summary.current_decision(run, summary.load_result(run)).baseline_ref


def test_repeats_show_mean_spread_and_how_often_each_limit_was_met(ws: Workspace) -> None:
    from caseledger.tools import summarize  # lazy: only this test reads the scenario view

    with misbehaving("honest") as (port, target):
        draft = external_draft(
            port, load={"requests": 8, "concurrency": 4, "max_tokens": 4}, decision={"limits": {"e2e_p99_ms": 150}}
        )
        case = freeze_case(ws, draft=draft)
        target.delay_s = 0.0
        assert start_run(ws, case.case_id, wait=True, timeout_s=120).state == "succeeded"
        target.delay_s = 0.3  # the same case again, on a slower target: the limit breaks this time
        assert start_run(ws, case.case_id, wait=True, timeout_s=120).state == "succeeded"
    view = summarize(ws, [], scenario="ref-test")
    assert view.scenario is not None
    (row,) = view.scenario.rows
    assert row.runs == 2 and row.limits_met == {"e2e_p99_ms": "1/2"}, row
    assert row.metric_mean is not None and row.metric_spread_rel is not None and row.metric_spread_rel > 0.2, row
    assert row.requests == 8
    text = view.text()
    assert "over 2 runs" in text and "met e2e_p99_ms 1/2 runs" in text and "n=8" in text, text


def test_two_active_scenarios_both_appear_in_the_handoff(ws: Workspace) -> None:
    with misbehaving("honest") as (port, _):
        a = freeze_case(ws, draft=external_draft(port, scenario="scen-a", load={"requests": 4, "concurrency": 2}))
        ra = start_run(ws, a.case_id, wait=True, timeout_s=120)
        b = freeze_case(ws, draft=external_draft(port, scenario="scen-b", load={"requests": 4, "concurrency": 2}))
        rb = start_run(ws, b.case_id, wait=True, timeout_s=120)
    text = ws.handoff.read_text()
    assert "scenario scen-b: 1 case(s)" in text, text  # the latest, with its rows
    assert f"also active: scenario scen-a: latest {ra.run_id} succeeded -> baseline" in text, text
    assert f"latest run: {rb.run_id}" in text and len(text.encode()) <= 1024, text


def _failed(i: int, status: int | None, kind: str, error: str) -> RawRecord:
    r = _rec(i, 0, None)
    r.update(ok=False, status=status, error_class=kind, error=error)  # type: ignore[typeddict-item]
    return r


@pytest.mark.processes
def test_failure_causes_and_the_share_decide_the_class() -> None:
    from caseledger.errors import PhaseFailed
    from caseledger.run.load.failures import check_failures  # lazy: the run stage, for this pure check only

    ok = [_rec(i, 4, 4) for i in range(6)]
    case = _case()
    check_failures(case, ok)  # nothing failed: nothing to say
    # requests the client was told to stop (SIGTERM) are not the target's failures
    check_failures(case, [*ok, _failed(6, None, "client", "cancelled"), _failed(7, None, "client", "cancelled")])
    mixed = [
        *ok,
        _failed(6, 503, "http", "HTTP 503: busy"),
        _failed(7, 429, "http", "HTTP 429: slow down"),
        _failed(8, None, "timeout", "no complete response"),
    ]
    with pytest.raises(PhaseFailed) as e:
        check_failures(case, mixed)
    assert e.value.failure_class == "overload" and "3 of 9 failed" in e.value.message, e.value.message
    assert "HTTP 503=1" in e.value.message and "timeout=1" in e.value.message
    lenient = _case(load={"requests": 4, "concurrency": 2, "max_tokens": 16, "max_failed_share": 0.5})
    check_failures(lenient, mixed)  # a third failed: within the declared share, data not a failed load
    with pytest.raises(PhaseFailed) as e:
        check_failures(case, [*ok, _failed(6, None, "client", "TypeError: a bug")])
    assert e.value.failure_class == "internal"


def test_each_request_is_checked_against_the_max_tokens_it_asked() -> None:
    """A file line or trace row asks its own length: the record keeps it and the check uses it, where the case
    has no single bound (None) or a looser one; records without it fall back to the case's bound."""
    own = [_rec(0, 6, 6), _rec(1, 3, 3), _rec(2, 16, 16)]
    own[0]["max_tokens"], own[1]["max_tokens"] = 4, 3
    v = check_counts(columns_from_records(own), None, False, 0.0, None, None)
    assert v.reasons == ["completion_tokens > max_tokens 4", None, None]
    v = check_counts(columns_from_records(own), 5, False, 0.0, None, None)  # the record's own 4 wins over 5
    assert v.reasons == ["completion_tokens > max_tokens 4", None, "completion_tokens > max_tokens 5"]
    assert v.summary.by_reason == {"completion_tokens > max_tokens 4": 1, "completion_tokens > max_tokens 5": 1}


@pytest.mark.integration  # real processes on this host, sampled from /proc
@pytest.mark.quiet
def test_caseledger_of_this_workspace_counts_as_ours_and_the_other_processes_are_named(tmp_path: Path) -> None:
    """A process running caseledger for this workspace (an MCP server answering status calls) is the
    measurement's own; a busy process beside it is 'other' and named by pid and command."""
    from caseledger import procs

    root = tmp_path / "ws"
    root.mkdir()
    spin = "while True: pass"
    own = subprocess.Popen([sys.executable, "-c", spin, "caseledger", "mcp", "--workspace", str(root)])
    other = subprocess.Popen([sys.executable, "-c", spin])
    try:
        pids = procs.caseledger_pids(root)
        assert own.pid in pids and other.pid not in pids and os.getpid() not in pids, pids
        sampler = procs.CpuSampler(pids)
        sampler.sample(set(), None)
        time.sleep(1.0)
        x = sampler.sample(set(), None)
        assert x is not None
        top = [pid for pid, _, _ in x["top"]]
        assert other.pid in top and own.pid not in top, x
        assert x["ours"] > 0.25 * x["total"] / x["cores"], x  # the own spinner's CPU (about one core) is ours
    finally:
        for p in (own, other):
            p.kill()
            p.wait()


@pytest.mark.integration
@pytest.mark.quiet  # the wait ends when the host is quiet: another test's load would prolong it
def test_a_run_waits_bounded_for_a_quiet_host_and_records_what_it_saw(
    ws: Workspace, stop_services: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CASELEDGER_QUIET_WAIT_S: before the formal load the run waits, at most that long, for other processes to
    leave the host; the wait is an event with the share and the processes that took it. A quiet host costs about
    QUIET_SPAN_S; a busy one the whole bound, then the load runs and its window is judged as ever."""
    from caseledger.run.load.watch import QUIET_SPAN_S

    monkeypatch.setenv("CASELEDGER_QUIET_WAIT_S", "4")
    case = freeze_case(ws, draft=ref_draft(free_port(), load={"requests": 8, "concurrency": 2}))

    def waited(run_id: str) -> dict[str, Any]:
        (e,) = [e for e in read_events(ws.run(run_id)).events if isinstance(e, HostQuietWait)]
        return e.data.model_dump()

    quiet = start_run(ws, case.case_id, wait=True, timeout_s=120)
    assert quiet.run_id is not None and quiet.state == "succeeded", quiet.text()
    q = waited(quiet.run_id)
    assert q["quiet"] and QUIET_SPAN_S <= q["waited_s"] < 4.0, q
    spin = "while True: pass"  # in sessions of their own: not this process's (the inline controller's) session
    hogs = [subprocess.Popen([sys.executable, "-c", spin], start_new_session=True) for _ in range(os.cpu_count() or 2)]
    try:
        busy = start_run(ws, case.case_id, wait=True, timeout_s=120)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert busy.run_id is not None
    b = waited(busy.run_id)
    assert not b["quiet"] and b["waited_s"] >= 4.0 and b["other_share"] > 0.5, b
    assert any(f"pid {h.pid} python" in t for h in hogs for t in b["top"]), b
