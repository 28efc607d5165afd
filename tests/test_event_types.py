"""Typed events (caseledger/ledger/event_types.py): a ledger written before the models reads and its views answer
as they did; every model round-trips through its log; a wrong field fails at its writer, naming it; a line of
no known type reads as UnknownEvent and is ignored."""

from __future__ import annotations

import shutil
import typing
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import BaseModel, ValidationError

from caseledger.campaign.store import events_file, host_refusals, waiting_on
from caseledger.case.phases import Phase
from caseledger.errors import FailureClass
from caseledger.ledger import event_types as et
from caseledger.ledger.events import append_driver_event, append_event, read_driver_events, read_events
from caseledger.ledger.state import PhaseState, fold
from caseledger.run.campaign_driver import stamp
from caseledger.tools import status_any, summarize
from caseledger.workspace import Workspace

OLD = Path(__file__).parent / "data" / "ledger_v1"
RUN, CAMPAIGN = "r-0000e7e7", "g-0000000000e7"  # the ids every_type/ is read under


def _old_workspace(tmp_path: Path) -> Workspace:
    shutil.copytree(OLD / "ledger", tmp_path / "ws" / "ledger")
    return Workspace(tmp_path / "ws")


def _every_type(tmp_path: Path) -> Workspace:
    ws = Workspace(tmp_path / "every")
    paths = ws.run(RUN)
    paths.root.mkdir(parents=True)
    shutil.copy(OLD / "every_type" / "run_events.jsonl", paths.events)
    events_file(ws, CAMPAIGN).parent.mkdir(parents=True)
    shutil.copy(OLD / "every_type" / "driver_events.jsonl", events_file(ws, CAMPAIGN))
    return ws


def _expected() -> dict[str, Any]:  # JSON: expected.json
    out: dict[str, Any] = orjson.loads((OLD / "expected.json").read_bytes())
    return out


RUN_FIELDS = ("state", "phase", "phase_state", "phases", "failure_class", "load_ended", "load_attempts", "decision")
RUN_FIELDS += ("torn", "resume_runs", "blocker", "owner_alive")


def test_an_old_ledger_reads_and_every_view_answers_as_before(tmp_path: Path) -> None:
    """What the views derive from the events (phase states and attempts, the campaign's progress and driver, the
    time ledger from the events' clocks) is what they answered before, on a ledger written before."""
    ws = _old_workspace(tmp_path)
    want = _expected()["answers"]
    for rid, fields in want["status"].items():
        got = status_any(ws, rid).model_dump(mode="json")
        assert {k: got[k] for k in RUN_FIELDS} == fields, rid
    gid = next(p.name for p in (ws.ledger / "campaigns").iterdir())
    g = status_any(ws, gid).model_dump(mode="json")
    rows = [{k: r[k] for k in ("label", "status", "run_ids")} for r in g["rows"]]
    keys = ("complete", "winner", "progress", "driver_alive", "waiting")
    assert {"rows": rows, **{k: g[k] for k in keys}} == want["campaign"]
    runs = summarize(ws, sorted(want["time_ledger"])).runs
    assert {r.run_id: r.time_ledger for r in runs} == want["time_ledger"]


def _old_lines(name: str) -> list[tuple[Path, dict[str, Any]]]:  # JSON: the lines of every old log of a kind
    files = (
        [OLD / "every_type" / "run_events.jsonl", *sorted((OLD / "ledger" / "runs").glob("*/events.jsonl"))]
        if name == "run"
        else [
            OLD / "every_type" / "driver_events.jsonl",
            *sorted((OLD / "ledger" / "campaigns").glob("*/events.jsonl")),
        ]
    )
    return [(f, orjson.loads(line)) for f in files for line in f.read_bytes().splitlines()]


def test_every_old_line_reads_as_its_type_and_writes_back_the_same_line() -> None:
    for f, line in _old_lines("run"):
        ev = et.parse_run_event(line)
        assert not isinstance(ev, et.UnknownEvent), (f.name, line, ev)
        assert type(ev).model_fields["type"].default == line["type"]
        assert et.run_json(ev) == line
        assert list(et.run_json(ev)) == list(line)  # the keys in the order they were written
    for f, line in _old_lines("driver"):
        dv = et.parse_driver_event(line)
        assert not isinstance(dv, et.UnknownEvent), (f.name, line, dv)
        assert et.driver_json(dv, line["utc"]) == line


def _folded(ws: Workspace, run_id: str, mono: bool) -> dict[str, Any]:  # JSON: each phase's folded view
    from caseledger.ledger.state import _fold_events  # the events' fold alone, before any evidence is checked

    keys = ["state", "attempt", "failure_class", "error", "data", "evidence", "started_utc", "ended_utc"]
    keys += ["started_mono", "ended_mono"] if mono else []
    phases = _fold_events(read_events(ws.run(run_id)).events)
    return {p.value: {k: getattr(v, k) for k in keys} for p, v in phases.items()}


def test_the_old_events_fold_and_the_driver_reads_as_before(tmp_path: Path) -> None:
    want = _expected()
    old = _old_workspace(tmp_path)
    for rid, phases in want["folds"].items():
        assert _folded(old, rid, mono=True) == phases, rid
    ws = _every_type(tmp_path)
    assert _folded(ws, RUN, mono=False) == want["every_type"]["phases"]
    assert waiting_on(ws, CAMPAIGN) == want["every_type"]["waiting_on"]
    assert host_refusals(ws, CAMPAIGN) == want["every_type"]["host_refusals"]
    assert stamp(ws, CAMPAIGN)[2] == want["every_type"]["stamp_news"]


# one of each model, as its writers build it: a new model without a sample here fails the test below
RUN_SAMPLES: list[et.RunEvent] = [
    et.RunCreated(data=et.RunCreatedData(case_id="c-000000000001", plan={"preflight": "run"})),
    et.ControllerStarted(data=et.PidData(pid=42)),
    et.PhaseStarted(phase=Phase.LOAD, attempt=2),
    et.PhaseEnded(
        phase=Phase.LOAD,
        attempt=2,
        error="cut",
        data=et.PhaseEndedData.model_validate({"outcome": "failed", "failure_class": "service", "sent": 3}),
    ),
    et.RunEnded(data=et.OutcomeData(outcome="succeeded")),
    et.StopAsked(data=et.StopAskedData(by="caseledger target stop")),
    et.Resumed(
        data=et.ResumedData(
            from_phase=Phase.LOAD, runs=[Phase.LOAD], redo=[Phase.LOAD], kept=[Phase.PREFLIGHT], client_alive=True
        )
    ),
    et.StartedQueuedRun(data=et.RunIdData(run_id="r-00000002")),
    et.LoadClientStarted(phase=Phase.LOAD, attempt=1, data=et.LoadClientStartedData(pid=7, armed=False)),
    et.LoadClientStopped(phase=Phase.LOAD, data=et.LoadClientStoppedData(pid=None)),
    et.LoadClientContinued(phase=Phase.LOAD, data=et.LoadClientContinuedData(stopped_s=0.5)),
    et.LoadEndedEarly(phase=Phase.LOAD, data=et.WhyData(why="the service died")),
    et.HostQuietWait(
        phase=Phase.LOAD, data=et.HostQuietWaitData(waited_s=1.0, quiet=False, other_share=0.4, top=["pid 1 cc1 40%"])
    ),
    et.LoadArmedEnded(phase=Phase.LOAD, attempt=1, data=et.LoadArmedEndedData(processes=[{"k": 0}])),
]
DRIVER_SAMPLES: list[et.DriverEvent] = [
    et.DriverStarted(pid=42),
    et.DriverEnded(outcome="complete"),
    et.Waiting(why="paused", fix="caseledger authorize auto"),
    et.PointRefused(case_id="c-1", error="no"),
    et.PointStarted(case_id="c-1", run_id="r-1", label="C=1", target="t0", why="grid point"),
    et.PointEnded(case_id="c-1", run_id="r-1", state="succeeded"),
    et.PointResumed(case_id="c-1", run_id="r-1", label="C=1"),
    et.ResumeRefused(run_id="r-1", error="no"),
    et.HostRefused(case_id="c-1", label="C=1", target=None, error="not allowed", fix=None),
    et.TargetRefused(target="t1", why="unreachable"),
    et.SearchEnded(points=3, why="over budget", budget={"measurements": 3}),
    et.PointProposed(case_id="c-2", label="C=2", why="tpe"),
    et.DiskWaited(seconds=2.5, free_bytes_at_start=1024),
]


def _members(union: Any) -> set[type[BaseModel]]:
    return set(typing.get_args(union))


def test_every_event_model_round_trips_through_its_log(ws: Workspace) -> None:
    assert {type(e) for e in RUN_SAMPLES} == _members(et.RunEvent)
    assert {type(e) for e in DRIVER_SAMPLES} == _members(et.DriverEvent)
    paths = ws.run("r-0000abcd")
    paths.root.mkdir(parents=True)
    written = [append_event(ws, paths, e, owner="test") for e in RUN_SAMPLES]
    read = read_events(paths).events
    assert read == written and [e.seq for e in read] == list(range(1, len(RUN_SAMPLES) + 1))
    for sample, back in zip(RUN_SAMPLES, read, strict=True):
        assert back.model_dump(include={"type", "phase", "attempt", "error", "data"}) == sample.model_dump(
            include={"type", "phase", "attempt", "error", "data"}
        )
    path = events_file(ws, "g-00000000abcd")
    path.parent.mkdir(parents=True)
    for d in DRIVER_SAMPLES:
        append_driver_event(path, d)
    back_d = read_driver_events(path)
    assert [b.model_dump(exclude={"utc"}) for b in back_d] == [d.model_dump(exclude={"utc"}) for d in DRIVER_SAMPLES]
    assert all(not isinstance(b, et.UnknownEvent) and b.utc for b in back_d)


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: et.PhaseStarted(phase=Phase.LOAD, atempt=1), "atempt"),
        (lambda: et.PhaseStarted(phase="lod", attempt=1), "phase"),
        (lambda: et.ControllerStarted(data=et.PidData(pdi=4)), "pdi"),
        (lambda: et.PidData(pid="four"), "pid"),
        (lambda: et.PhaseEndedData(outcome="fine"), "outcome"),
        (lambda: et.PhaseEndedData(failure_class="flaky"), "failure_class"),
        (lambda: et.Waiting(why="paused", fixx="x"), "fixx"),
        (lambda: et.SearchEnded(why="done"), "points"),
    ],
)
def test_an_event_with_a_wrong_field_is_refused_naming_it_and_writes_nothing(
    ws: Workspace, build: Any, field: str
) -> None:
    paths = ws.run("r-0000abcd")
    paths.root.mkdir(parents=True)
    with pytest.raises(ValidationError) as e:
        append_event(ws, paths, build())
    assert field in {str(x) for err in e.value.errors() for x in err["loc"]}, e.value
    assert field in str(e.value)
    assert read_events(paths).events == [] and not paths.events.exists()


def test_a_line_of_no_known_type_reads_as_unknown_and_is_ignored(tmp_path: Path) -> None:
    old = _old_workspace(tmp_path)
    rid = sorted(p.name for p in old.runs_dir.iterdir())[0]
    paths = old.run(rid)
    before = fold(old, rid)
    lines = [
        {"seq": 90, "type": "a_later_kind", "phase": "load", "data": {}},  # of a later version
        {"seq": 91, "type": "phase_started", "phase": "load", "attempt": "first"},  # a field not accepted
        {"type": "phase_ended", "phase": "decide"},  # no seq, no data
        [1, 2],  # not an object
    ]
    with paths.events.open("ab") as f:
        f.write(b"".join(orjson.dumps(x) + b"\n" for x in lines) + b'{"seq": 95, "type": "phase_sta')
    log = read_events(paths)
    unknown = [e for e in log.events if isinstance(e, et.UnknownEvent)]
    assert [(u.type, u.seq) for u in unknown] == [
        ("a_later_kind", 90),
        ("phase_started", 91),
        ("phase_ended", 0),
        ("", 0),
    ]
    assert "attempt" in unknown[1].problem and unknown[0].line == lines[0] and log.torn_tail
    after = fold(old, rid)
    assert after.phases == before.phases and after.state == before.state  # ignored by the views
    ev = append_event(old, paths, et.RunEnded(data=et.OutcomeData(outcome="succeeded")))
    assert ev.seq == 92  # after the highest seq read, whatever its line's type
    driver = events_file(old, next(p.name for p in (old.ledger / "campaigns").iterdir()))
    with driver.open("ab") as f:
        f.write(b'{"utc": "x", "type": "waiting"}\n{"utc": "x", "type": "a_later_kind", "why": "w"}\n')
    tail = read_driver_events(driver)[-2:]
    assert [(type(t), t.type) for t in tail] == [(et.UnknownEvent, "waiting"), (et.UnknownEvent, "a_later_kind")]
    assert waiting_on(old, driver.parent.name) is None


def test_a_phase_end_keeps_its_evidence_keys_and_only_the_set_ones(ws: Workspace) -> None:
    paths = ws.run("r-0000abcd")
    paths.root.mkdir(parents=True)
    data = et.PhaseEndedData.model_validate({"outcome": "done", "sent": 8, "clock": {"rounds": 9}})
    append_event(ws, paths, et.PhaseEnded(phase=Phase.LOAD, attempt=1, data=data))
    append_event(ws, paths, et.PhaseEnded(phase=Phase.WARMUP, attempt=1, data=et.PhaseEndedData(fix=None)))
    line1, line2 = (orjson.loads(x) for x in paths.events.read_bytes().splitlines())
    assert line1["data"] == {"outcome": "done", "sent": 8, "clock": {"rounds": 9}}
    assert line2["data"] == {"fix": None}  # the outcome left out as its writer left it (read: done)
    ev = read_events(paths).events[1]
    assert isinstance(ev, et.PhaseEnded) and ev.data.outcome == PhaseState.DONE and ev.data.failure_class is None
    assert et.PhaseEndedData(failure_class="disk").failure_class == FailureClass.DISK
