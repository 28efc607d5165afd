"""Folding: evidence outranks status strings; old failures stay in the log but not in the current state."""

from __future__ import annotations

import orjson

from caseledger import ledger
from caseledger.case.phases import PHASES, Phase
from caseledger.errors import FailureClass
from caseledger.ledger.event_types import PhaseEnded, PhaseEndedData, PhaseStarted
from caseledger.ledger.state import PhaseState, RunState, fold
from caseledger.workspace import RunPaths, Workspace, write_json


def make_run(ws: Workspace, rid: str = "r-0000aaaa", planned: int = 4) -> RunPaths:
    paths = ws.run(rid)
    paths.root.mkdir(parents=True)
    write_json(
        paths.run_json,
        {
            "run_id": rid,
            "case_id": "c-000000000000",
            "scenario": "s",
            "planned": planned,
            "target_key": "t-x",
            "workspace": str(ws.root),
            "plan": [],
            "controller_spawned": True,
        },
    )
    # a controller that is certainly gone: pid 1's start time never matches this
    write_json(paths.controller_pid, {"pid": 1, "start_time": 123456789, "host": None})
    return paths


def phases_done(ws: Workspace, paths: RunPaths, upto: str) -> None:
    for p in PHASES[: PHASES.index(upto)]:
        ledger.append_event(ws, paths, PhaseStarted(phase=p, attempt=1))
        ledger.append_event(ws, paths, PhaseEnded(phase=p, attempt=1, data=PhaseEndedData(outcome=PhaseState.DONE)))


def test_end_file_outranks_a_stale_running_load(ws: Workspace) -> None:
    paths = make_run(ws)
    phases_done(ws, paths, "load")
    ledger.append_event(ws, paths, PhaseStarted(phase=Phase.LOAD, attempt=1))  # then the controller died
    paths.load_dir.mkdir()
    paths.raw.write_bytes(b"".join(orjson.dumps({"i": i, "ok": True}) + b"\n" for i in range(4)))
    write_json(paths.load_end, {"planned": 4, "sent": 4, "done": 4, "ok": 4, "failed": 0})
    v = fold(ws, paths.run_id)
    assert v.phases["load"].state == PhaseState.DONE
    assert v.load_ended == "yes" and v.counts.done == 4
    assert v.state == RunState.END_UNKNOWN and v.current == "confirm_end"
    assert "resume(run_id='r-0000aaaa')" in v.next_call and not v.next_resends_requests


def test_running_phase_of_a_dead_controller_is_unknown_not_running(ws: Workspace) -> None:
    paths = make_run(ws)
    phases_done(ws, paths, "warmup")
    ledger.append_event(ws, paths, PhaseStarted(phase=Phase.WARMUP, attempt=1))
    v = fold(ws, paths.run_id)
    assert v.phases["warmup"].state == PhaseState.UNKNOWN and v.state == RunState.END_UNKNOWN


def test_results_on_disk_outrank_an_old_postprocess_failure(ws: Workspace) -> None:
    paths = make_run(ws)
    phases_done(ws, paths, "postprocess")
    ledger.append_event(ws, paths, PhaseStarted(phase=Phase.POSTPROCESS, attempt=1))
    ledger.append_event(
        ws,
        paths,
        PhaseEnded(
            phase=Phase.POSTPROCESS,
            attempt=1,
            error="ImportError: x",
            data=PhaseEndedData(outcome=PhaseState.FAILED, failure_class=FailureClass.COLLECT),
        ),
    )
    assert fold(ws, paths.run_id).failure_class == "collect"
    (paths.results / "v1" / "aisbench" / "k").mkdir(parents=True)
    (paths.results / "v1" / "aisbench" / "k" / "result.json").write_text("{}")
    v = fold(ws, paths.run_id)
    assert v.phases["postprocess"].state == PhaseState.DONE and v.results_extracted
    ended = [e for e in ledger.read_events(paths).events if isinstance(e, PhaseEnded)]
    kinds = [e.data.outcome for e in ended if e.phase == Phase.POSTPROCESS]
    assert "failed" in kinds  # history is kept


def test_a_later_attempt_supersedes_an_earlier_failure(ws: Workspace) -> None:
    paths = make_run(ws)
    phases_done(ws, paths, "service")
    ledger.append_event(ws, paths, PhaseStarted(phase=Phase.SERVICE, attempt=1))
    ledger.append_event(
        ws,
        paths,
        PhaseEnded(
            phase=Phase.SERVICE,
            attempt=1,
            error="health",
            data=PhaseEndedData(outcome=PhaseState.FAILED, failure_class=FailureClass.SERVICE),
        ),
    )
    ledger.append_event(ws, paths, PhaseStarted(phase=Phase.SERVICE, attempt=2))
    ledger.append_event(
        ws, paths, PhaseEnded(phase=Phase.SERVICE, attempt=2, data=PhaseEndedData(outcome=PhaseState.DONE))
    )
    v = fold(ws, paths.run_id)
    assert v.phases["service"].state == PhaseState.DONE and v.phases["service"].attempt == 2
    assert v.state == RunState.END_UNKNOWN and v.current == "warmup"  # the next phase, not the old failure
