"""Runs against real processes on loopback: controller, load client, reference target, leases, faults."""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from caseledger import ledger, procs
from caseledger.case.phases import PHASES, Phase
from caseledger.errors import TargetHeld
from caseledger.ledger.event_types import (
    PhaseEnded,
    PhaseStarted,
    RunCreated,
    RunCreatedData,
    StopAsked,
    StopAskedData,
    data_json,
)
from caseledger.ledger.events import read_events
from caseledger.ledger.runs import scan_runs
from caseledger.ledger.state import fold
from caseledger.tools import freeze_case, phase_status, resume, start_run
from caseledger.workspace import Workspace
from tests.conftest import free_port, ref_draft, reference_targets, start_with_fault, stats
from tests.helpers import slow_draft, wait_state

pytestmark = pytest.mark.integration

_STOP = StopAsked(data=StopAskedData(by="caseledger target stop"))


def test_full_run_then_hot_child_reuses_the_service(ws: Workspace, stop_services: None) -> None:
    port = free_port()
    base = freeze_case(ws, draft=ref_draft(port))
    r1 = start_run(ws, base.case_id, wait=True)
    assert r1.preflight == "passed" and r1.state == "succeeded", r1.text()
    events = read_events(ws.run(r1.run_id)).events
    for phase in PHASES:
        started = [e for e in events if isinstance(e, PhaseStarted) and e.phase == phase]
        ended = [e for e in events if isinstance(e, PhaseEnded) and e.phase == phase]
        assert len(started) == 1 and len(ended) == 1, phase
        assert ended[0].outputs["evidence"], phase  # sha256 of the evidence file
        assert ws.run(r1.run_id).phase_file(phase).exists()
    s1 = stats(port)
    assert s1["by_phase"]["load"] == 8 and s1["by_phase"]["warmup"] == 2

    child = freeze_case(ws, draft=ref_draft(port, load={"requests": 8, "concurrency": 4}), parent=base.case_id)
    r2 = start_run(ws, child.case_id, wait=True)
    assert r2.state == "succeeded", r2.text()
    v = fold(ws, r2.run_id)
    assert v.phases["service"].state.value == "reused"
    assert v.phases["warmup"].state.value == "reused" and v.phases["route_verify"].state.value == "reused"
    s2 = stats(port)
    assert s2["pid"] == s1["pid"] and s2["started_at"] == s1["started_at"]  # not restarted
    assert s2["by_phase"]["warmup"] == 2 and s2["by_phase"]["route_verify"] == 1  # not repeated
    assert s2["by_phase"]["load"] == 16
    st = orjson.loads((ws.services_dir / f"{v.meta.target_key}.json").read_bytes())
    assert st["starts"] == 1


@pytest.mark.processes
def test_killed_controller_leaves_load_running_and_resume_finishes(
    ws: Workspace, stop_services: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    case = freeze_case(ws, draft=slow_draft(port))
    r = start_with_fault(monkeypatch, "controller:exit_during=load", ws, case.case_id)
    s = wait_state(ws, r.run_id, lambda s: not s.owner_alive)
    assert s.client_alive, s.text()  # the load client outlives its controller
    assert s.state == "running" and s.load_ended == "no"
    assert f"resume(run_id='{r.run_id}') re-attaches" in s.next_call
    with pytest.raises(TargetHeld):  # the lease stays with the run while its client runs
        other = freeze_case(ws, draft=slow_draft(port, note="other"))
        start_run(ws, other.case_id)
    res = resume(ws, r.run_id, wait=True)
    assert res.reattached and res.state == "succeeded", res.text()
    assert "preflight" in res.kept and "service" in res.kept
    assert stats(port)["by_phase"]["load"] == 8  # exactly N formal requests, none re-sent
    ev = read_events(ws.run(r.run_id)).events
    assert len([e for e in ev if e.type == "load_client_started"]) == 1


@pytest.mark.processes
def test_killed_load_client_keeps_records_and_never_claims_success(
    ws: Workspace, stop_services: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    case = freeze_case(ws, draft=slow_draft(port))
    r = start_with_fault(monkeypatch, "load:exit_after=3", ws, case.case_id, wait=True)
    s = phase_status(ws, r.run_id)
    assert s.state in ("end_unknown", "failed") and s.state != "succeeded"
    assert s.failure_class == "end_unknown"
    assert s.done == 3 and s.sent >= 3 and s.load_ended in ("unknown", "no")
    lines = ws.run(r.run_id).raw.read_bytes().splitlines()
    assert len(lines) == 3 and all(orjson.loads(x)["ok"] for x in lines)
    assert "resume" in s.next_call and len(s.text().encode()) < 600
    served = stats(port)["by_phase"]["load"]
    # resume keeps what finished and re-sends nothing: the run ends 'partial', never 'succeeded'
    res = resume(ws, r.run_id, wait=True)
    assert res.state == "partial", res.text()
    s = phase_status(ws, r.run_id)
    assert s.load_ended == "partial" and s.results_extracted and s.decision == "insufficient"
    assert s.done == 3 and stats(port)["by_phase"]["load"] == served
    assert f"start_run(case_id='{case.case_id}')" in s.next_call


def test_effective_argv_mismatch_fails_in_service_before_load(
    ws: Workspace, stop_services: None, tmp_path: Path
) -> None:
    port = free_port()
    wrapper = tmp_path / "serve.sh"
    # a launcher that appends an override: the seeds' "DP16 in the script, DP4 at the end" incident
    wrapper.write_text(
        f'#!/bin/sh\nexec {sys.executable} -m caseledger.target serve "$@" --config-json \'{{"slots": 1}}\'\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    argv = [str(wrapper), "--host", "{host}", "--port", "{port}", "--model", "ref-model"]
    case = freeze_case(ws, draft=ref_draft(port, service={"adapter": "command", "argv": argv}))
    r = start_run(ws, case.case_id, wait=True)
    s = phase_status(ws, r.run_id)
    assert s.state == "failed" and s.phase == "service" and s.failure_class == "service"
    assert "--config-json" in (s.blocker or "")
    raw = ws.run(r.run_id).raw
    assert s.sent == 0 and (not raw.exists() or raw.stat().st_size == 0)
    assert not ws.run(r.run_id).load_anchor.exists()  # the armed client never reached its first send
    wait_state(ws, r.run_id, lambda s: not s.client_alive, timeout=20)  # and it exits with its controller


@pytest.mark.processes
def test_second_start_on_a_held_target_fails_at_once(ws: Workspace, stop_services: None) -> None:
    port = free_port()
    a = freeze_case(ws, draft=slow_draft(port))
    b = freeze_case(ws, draft=slow_draft(port, load={"requests": 8, "concurrency": 4}))
    r1 = start_run(ws, a.case_id)
    t0 = time.monotonic()
    with pytest.raises(TargetHeld) as e:
        start_run(ws, b.case_id)
    assert time.monotonic() - t0 < 5  # refused, never queued
    assert r1.run_id in str(e.value) and "pid" in str(e.value) and "phase_status" in e.value.fix
    assert len(list(ws.runs_dir.iterdir())) == 1  # the refused start wrote no run
    wait_state(ws, r1.run_id, lambda s: s.state == "succeeded", timeout=90)
    assert stats(port)["by_phase"]["load"] == 8


@pytest.mark.processes
def test_preflight_that_opens_a_socket_fails_and_sends_nothing(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with reference_targets({"plain": {}}, tmp_path) as served:
        port = served["plain"].port
        case = freeze_case(ws, draft=ref_draft(port, service={"adapter": "external"}))
        r = start_with_fault(monkeypatch, "preflight:connect", ws, case.case_id)
        assert r.preflight == "failed"
        assert "PermissionError" in (r.preflight_error or "") or "forbids" in (r.preflight_error or "")
        s = wait_state(ws, r.run_id, lambda s: not s.owner_alive)
        assert s.failure_class == "before_model" and s.sent == 0
        assert stats(port)["requests_total"] == 0
        lease = ledger.read_lease(ws, fold(ws, r.run_id).meta.target_key)
        assert lease is not None and not lease.live()  # released: a before_model failure holds nothing


def test_torn_event_line_is_tolerated_and_reported(ws: Workspace) -> None:
    from caseledger.workspace import RunPaths

    paths = RunPaths(ws.runs_dir / "r-00000001")
    paths.root.mkdir(parents=True)
    ledger.append_event(ws, paths, RunCreated(data=RunCreatedData(case_id="c-000000000001")))
    with paths.events.open("ab") as f:
        f.write(b'{"seq": 2, "type": "phase_sta')
    log = read_events(paths)
    assert log.torn_tail and len(log.events) == 1
    ev = ledger.append_event(ws, paths, _STOP)
    assert ev.seq == 2
    log = read_events(paths)
    assert [e.type for e in log.events] == ["run_created", "stop_asked"] and log.bad_lines == 1


def test_stale_fence_is_refused(ws: Workspace) -> None:
    from caseledger.errors import FenceRejected
    from caseledger.workspace import RunPaths

    paths = RunPaths(ws.runs_dir / "r-00000002")
    paths.root.mkdir(parents=True)
    dead = {"pid": 2**22 + 7, "start_time": 1, "host": procs.me()["host"]}  # a controller that died
    a = ledger.acquire(ws, "t-abc", "r-00000002", owner=dead)
    b = ledger.acquire(ws, "t-abc", "r-00000002", owner=None, same_run_ok=True)
    assert b.fence == a.fence + 1
    with pytest.raises(FenceRejected):
        ledger.append_event(ws, paths, _STOP, fence=a.fence, target="t-abc")
    with pytest.raises(FenceRejected):
        ledger.renew(ws, "t-abc", "r-00000002", a.fence)
    ledger.append_event(ws, paths, _STOP, fence=b.fence, target="t-abc")
    assert os.path.getsize(paths.events) > 0


def test_prefix_cache_truth_on_a_warm_service(ws: Workspace, stop_services: None) -> None:
    """Seed + check reach the target; a repeat on the warm service does not over-hit (per-run salt)."""
    from caseledger.metrics import latest_result

    port = free_port()
    draft = ref_draft(
        port,
        dataset={
            "source": "prefix_cache",
            "input_tokens": 1024,
            "output_tokens": 4,
            "prefix_ratio": 0.9,
            "block_size": 16,
            "prefix_groups": 2,
        },
        load={"requests": 8, "concurrency": 2},
        cache={"min_hit_ratio": 0.9},
    )
    case = freeze_case(ws, draft=draft)
    ratios = []
    for _ in range(2):
        r = start_run(ws, case.case_id, wait=True)
        assert r.state == "succeeded", r.text()
        check = orjson.loads(ws.run(r.run_id).phase_file("cache_prepare").read_bytes())["check"]
        assert min(check["hit_ratios"]) >= 0.9
        res = latest_result(ws.run(r.run_id).root)
        assert res is not None
        cache = res.windows.whole.cache
        assert cache.share_meeting_min == 1.0
        ratios.append((cache.hit_ratio.min, cache.hit_ratio.max))  # type: ignore[union-attr]
    assert ratios[1] == ratios[0]  # the second run on the warm service hits exactly as much, not more
    assert ratios[0][1] < 0.95  # the unique part is recomputed: no hit on a salted suffix


@pytest.mark.processes
def test_queued_case_starts_when_the_target_frees(ws: Workspace, stop_services: None) -> None:
    port = free_port()
    a = freeze_case(ws, draft=slow_draft(port))
    b = freeze_case(ws, draft=slow_draft(port, load={"requests": 8, "concurrency": 4}), parent=a.case_id)
    r1 = start_run(ws, a.case_id)
    q = start_run(ws, b.case_id, queue=True)
    assert q.state == "queued" and q.queue_position == 1 and q.run_id is None and q.preflight == "passed"
    assert b.case_id in phase_status(ws, r1.run_id).text()  # the queue is visible, nothing waits silently
    assert "queue t-" in ws.handoff.read_text()
    wait_state(ws, r1.run_id, lambda s: s.state == "succeeded", timeout=90)

    def run_ids() -> list[str]:
        return [m.run_id for m in scan_runs(ws).metas]

    deadline = time.monotonic() + 60
    while len(run_ids()) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    r2 = run_ids()[-1]
    assert fold(ws, r2).case_id == b.case_id
    s = wait_state(ws, r2, lambda s: s.state == "succeeded", timeout=90)
    assert s.phases["service"] == "reused" and stats(port)["by_phase"]["load"] == 16
    assert "queue t-" not in ws.handoff.read_text()


@pytest.mark.processes
def test_preflight_runs_in_the_process_spawned_ahead_and_a_resume_runs_a_fresh_one(
    ws: Workspace, stop_services: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    case = freeze_case(ws, draft=ref_draft(port))
    r = start_with_fault(monkeypatch, "controller:exit_before=service", ws, case.case_id, wait=True)
    paths = ws.run(r.run_id)
    first = orjson.loads(paths.phase_file("preflight").read_bytes())
    ahead = orjson.loads(paths.preflight_ahead_pid.read_bytes())
    assert first["checks"]["process"] == "spawned ahead, handed the run"  # a clean interpreter, not ours
    assert first["checks"]["sockets"] == "forbidden (audit hook)" and first["checks"]["case_reload"] == case.case_id
    assert ahead["pid"] != orjson.loads(paths.controller_pid.read_bytes())["pid"]
    # the controller died before service: resume runs what is left; a re-run preflight would be fresh
    res = resume(ws, r.run_id, wait=True)
    assert res.state == "succeeded", res.text()
    assert stats(port)["by_phase"]["load"] == 8


# The keys each phase's evidence had when the phases built plain dicts (a real run of this draft, recorded
# before the evidence became models): stored ledgers and their readers depend on them. Dotted: nested keys;
# `[]`: the keys of a list's items.
OLD_EVIDENCE_KEYS = {
    "preflight": ["checks", "checks.case_reload", "checks.collector", "checks.dataset_sha256", "checks.disk_free_mib",
                  "checks.load_plan_requests", "checks.process", "checks.sockets", "outcome", "requests_sent"],
    "service": ["effective_argv", "engine", "env", "identity", "intended_argv", "model_files", "outcome", "pid", "plan",
                "starts", "verified_by"],
    "warmup": ["latency_sum_s", "ok", "outcome", "requests", "wall_s"],
    "route_verify": ["outcome", "routes", "routes[].base_url", "routes[].models", "routes[].ok", "routes[].route",
                     "routes[].tokens", "routes[].tokens.compared", "routes[].tokens.planned_chat",
                     "routes[].tokens.server_prompt", "wall_s"],
    "cache_prepare": ["check", "check.cached_tokens", "check.denominator", "check.hit_ratios", "check.latency_sum_s",
                      "check.prompt_tokens", "check.requests", "check.wall_s", "mode", "outcome", "seed",
                      "seed.latency_sum_s", "seed.ok", "seed.requests", "seed.wall_s", "target_ratio"],
    "load": ["client_timing", "client_timing.anchor_uncertainty_ns", "client_timing.first_wave",
             "client_timing.launch_spread_us", "client_timing.line", "done", "failed", "metrics_read_by", "ok",
             "outcome", "planned", "raw_sha256", "reattached", "sent"],
    "confirm_end": ["all_accounted", "client_gone", "end_file", "outcome", "planned", "raw_sha256", "records", "sent"],
    "postprocess": ["env", "outcome", "raw_sha256", "requests", "result"],
    "decide": ["baseline", "decision", "missing", "outcome"],
}  # fmt: skip


def _key_paths(v: Any, pre: str = "") -> list[str]:
    out: list[str] = []
    if isinstance(v, dict):
        for k, x in v.items():
            out.append(pre + k)
            if pre + k != "env":  # the environment shown: its variables are the host's, not the shape's
                out += _key_paths(x, f"{pre}{k}.")
    elif isinstance(v, list) and v and isinstance(v[0], dict):
        out += _key_paths(v[0], pre[:-1] + "[].")
    return out


def test_phase_evidence_round_trips_through_its_model_with_the_keys_it_always_had(
    ws: Workspace, stop_services: None
) -> None:
    from caseledger.ledger import evidence as ev

    models: dict[str, type[ev.Evidence] | type[ev.ServiceRecord]] = {
        "preflight": ev.PreflightEvidence,
        "service": ev.ServiceRecord,
        "warmup": ev.WarmupEvidence,
        "route_verify": ev.RouteVerifyEvidence,
        "cache_prepare": ev.CachePrepareEvidence,
        "load": ev.LoadEvidence,
        "confirm_end": ev.ConfirmEndEvidence,
        "postprocess": ev.PostprocessEvidence,
        "decide": ev.DecideEvidence,
    }
    port = free_port()
    draft = ref_draft(
        port,
        dataset={"source": "prefix_cache", "input_tokens": 1024, "output_tokens": 4, "prefix_ratio": 0.9,
                 "block_size": 16, "prefix_groups": 2},
        cache={"min_hit_ratio": 0.9},
    )  # fmt: skip
    r = start_run(ws, freeze_case(ws, draft=draft).case_id, wait=True)
    assert r.state == "succeeded", r.text()
    ended = {e.phase: data_json(e) for e in read_events(ws.run(r.run_id)).events if isinstance(e, PhaseEnded)}
    assert list(ended) == list(models)
    for phase, model in models.items():
        file = orjson.loads(ws.run(r.run_id).phase_file(phase).read_bytes())
        assert file["phase"] == phase and file["error"] is None and file["outcome"] == "done", file
        data = {k: v for k, v in file.items() if k not in ("phase", "attempt", "error")}
        assert data == ended[phase], phase  # the file and the end event carry the same evidence
        assert sorted(_key_paths(data)) == OLD_EVIDENCE_KEYS[phase], phase
        body = data if "outcome" in model.model_fields else {k: v for k, v in data.items() if k != "outcome"}
        assert model.model_validate(body).evidence() == body, phase  # read back and written again: unchanged


def test_the_summary_reads_phase_files_through_their_models_and_names_the_file_and_field_it_cannot_read(
    ws: Workspace, stop_services: None
) -> None:
    from caseledger.errors import EvidenceInvalid
    from caseledger.ledger.evidence import CachePrepareEvidence, LoadEvidence, read_evidence
    from caseledger.ledger.runs import load_run
    from caseledger.outcome import summary
    from caseledger.tools import summarize

    draft = ref_draft(
        free_port(),
        dataset={"source": "prefix_cache", "input_tokens": 1024, "output_tokens": 4, "prefix_ratio": 0.9,
                 "block_size": 16, "prefix_groups": 2},
        cache={"min_hit_ratio": 0.9},
    )  # fmt: skip
    r = start_run(ws, freeze_case(ws, draft=draft).case_id, wait=True)
    assert r.state == "succeeded", r.text()
    paths = ws.run(r.run_id)
    cp, load = read_evidence(paths, "cache_prepare"), read_evidence(paths, "load")
    assert isinstance(cp, CachePrepareEvidence) and cp.seed is not None
    assert isinstance(load, LoadEvidence) and load.client_timing
    # what the report shows of them is the models' values
    assert summarize(ws, run_ids=[r.run_id]).runs[0].results_extracted
    tl = orjson.loads(paths.report_json.read_bytes())["time_ledger"]
    assert tl["cache_check"] == {"requests": cp.check.requests, "wall_s": cp.check.wall_s,
                                 "latency_sum_s": cp.check.latency_sum_s}  # fmt: skip
    assert tl["cache_seed"]["requests"] == cp.seed.requests
    assert load.client_timing["line"] in paths.report_md.read_text()

    def write(phase: str, body: dict[str, Any]) -> None:
        paths.phase_file(phase).write_bytes(orjson.dumps(body))

    good = {p: orjson.loads(paths.phase_file(p).read_bytes()) for p in ("load", "cache_prepare")}
    # an unknown key (a dict reader would have read no client timing, silently): the report's writer (the decide
    # phase, reprocess_raw) reads it; summarize, a reader, renders no report
    write("load", {("client_timings" if k == "client_timing" else k): v for k, v in good["load"].items()})
    with pytest.raises(EvidenceInvalid) as e:
        run = load_run(ws, r.run_id)
        summary.write_reports(run, summary.load_result(run))
    assert f"ledger/runs/{r.run_id}/phases/load.json does not read as LoadEvidence: " in e.value.message
    assert "client_timings: Extra inputs are not permitted" in e.value.message
    assert (e.value.run_id, e.value.phase) == (r.run_id, "load") and "events.jsonl" in e.value.fix
    write("load", good["load"])
    # a wrong type in a nested field
    write("cache_prepare", {**good["cache_prepare"], "check": {**good["cache_prepare"]["check"], "requests": "eight"}})
    with pytest.raises(EvidenceInvalid) as e:
        summarize(ws, run_ids=[r.run_id])
    assert (
        f"ledger/runs/{r.run_id}/phases/cache_prepare.json does not read as CachePrepareEvidence: " in e.value.message
    )
    assert "check.requests: Input should be a valid integer" in e.value.message
    # the fix holds: restored from its phase_ended event, the file reads again and the report is unchanged
    ended = [e for e in read_events(paths).events if isinstance(e, PhaseEnded) and e.phase == Phase.CACHE_PREPARE]
    write("cache_prepare", {"phase": "cache_prepare", "attempt": ended[-1].attempt, "error": None,
                            **data_json(ended[-1])})  # fmt: skip
    assert summarize(ws, run_ids=[r.run_id]).runs[0].results_extracted
    assert orjson.loads(paths.report_json.read_bytes())["time_ledger"] == tl
