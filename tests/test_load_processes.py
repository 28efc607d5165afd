"""load.processes > 1 (issue 27): a formal load dealt to several client processes, each with its own files under
load/p<k>/, merged into one raw stream; counts at the reference target; one process SIGKILLed mid-load."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import orjson
import pytest

from caseledger.case.model import Case
from caseledger.errors import CaseInvalid
from caseledger.ledger.event_types import LoadClientStarted
from caseledger.ledger.events import read_events
from caseledger.load.parts import part_schedule, slot_owners, split_concurrency
from caseledger.load.schedule import RequestSpec, Schedule
from caseledger.metrics import latest_result
from caseledger.records import read_records
from caseledger.tools import freeze_case, phase_status, reprocess_raw, resume, start_run
from caseledger.workspace import Workspace
from tests.conftest import free_port, ref_draft
from tests.helpers import by_phase, slow_draft, wait_until


def _spec(i: int, session: int | None = None, turn: int | None = None) -> RequestSpec:
    return RequestSpec(
        i=i, entry=i, route=0, offset_s=i / 10, url="http://x/v1", body=b"{}", session=session, turn=turn
    )


def _plan(n: int, c: int, p: int, sessions: tuple[tuple[int, ...], ...] | None = None) -> Schedule:
    specs = tuple(_spec(i, *((s, t) if sessions else (None, None))) for i, (s, t) in enumerate(_turns(n, sessions)))
    return Schedule(specs, c, 10.0, None, "poisson", 10.0, 0, 1 << 20, sessions=sessions, processes=p)


def _turns(n: int, sessions: tuple[tuple[int, ...], ...] | None) -> list[tuple[int | None, int | None]]:
    if sessions is None:
        return [(None, None)] * n
    at = {k: (j, t) for j, turns in enumerate(sessions) for t, k in enumerate(turns)}
    return [at[k] for k in range(n)]


# ------------------------------------------------------------------------------------------------ dealing


def test_concurrency_is_split_as_evenly_as_it_goes() -> None:
    assert split_concurrency(5, 2) == [3, 2]
    assert split_concurrency(64, 2) == [32, 32]
    assert slot_owners(5, 2) == [0, 0, 0, 1, 1]
    with pytest.raises(ValueError, match=r"load\.processes 3 .*load\.concurrency \(2\)"):
        split_concurrency(2, 3)


def test_every_request_goes_to_exactly_one_process_with_its_schedule() -> None:
    plan = _plan(23, 5, 2)
    parts = [part_schedule(plan, k) for k in range(2)]
    assert [p.concurrency for p in parts] == [3, 2]
    dealt = sorted(s.i for p in parts for s in p.specs)
    assert dealt == list(range(23))
    for p in parts:  # plan order and the one schedule's offsets are kept in each share
        assert [s.i for s in p.specs] == sorted(s.i for s in p.specs)
        assert all(s.offset_s == plan.specs[s.i].offset_s for s in p.specs)
    assert len(parts[0].specs) == 15 and len(parts[1].specs) == 8  # in proportion to the slots: 3/5 and 2/5


def test_a_conversation_stays_in_one_process() -> None:
    sessions = ((0, 2, 4), (1, 3), (5,), (6, 7))
    plan = _plan(8, 2, 2, sessions)
    parts = [part_schedule(plan, k) for k in range(2)]
    for p in parts:
        assert p.sessions is not None
        for turns in p.sessions:
            assert len({p.specs[k].session for k in turns}) == 1
            assert [p.specs[k].turn for k in turns] == sorted(p.specs[k].turn or 0 for k in turns)
    owner = {p.specs[k].session: n for n, p in enumerate(parts) for turns in p.sessions or () for k in turns}
    assert owner == {0: 0, 1: 1, 2: 0, 3: 1}
    assert sorted(s.i for p in parts for s in p.specs) == list(range(8))


def test_processes_one_keeps_the_case_id_and_fewer_slots_than_processes_is_refused(ws: Workspace) -> None:
    port = free_port()
    plain = freeze_case(ws, draft=ref_draft(port))
    explicit = freeze_case(ws, draft=ref_draft(port, load={"requests": 8, "concurrency": 2, "processes": 1}))
    assert plain.case_id == explicit.case_id
    two = freeze_case(ws, draft=ref_draft(port, load={"requests": 8, "concurrency": 2, "processes": 2}))
    assert two.case_id != plain.case_id
    assert "processes" not in Case.model_validate(ref_draft(port)).model_dump()["load"]
    before = sorted(p.name for p in ws.root.rglob("*"))
    with pytest.raises(CaseInvalid) as e:
        freeze_case(ws, draft=ref_draft(port, load={"requests": 8, "concurrency": 2, "processes": 3}))
    assert "load.processes 3 > load.concurrency 2" in str(e.value)
    assert sorted(p.name for p in ws.root.rglob("*")) == before  # a refused freeze writes nothing


# ------------------------------------------------------------------------------------------- real processes


@pytest.mark.integration
@pytest.mark.processes  # load.processes > 1: P armed client processes and one go
def test_two_processes_run_one_merged_load(ws: Workspace, stop_services: None) -> None:
    port = free_port()
    case = freeze_case(ws, draft=ref_draft(port, load={"requests": 24, "concurrency": 5, "processes": 2, "rate": 200}))
    r = start_run(ws, case.case_id, wait=True)
    assert r.run_id is not None
    s = phase_status(ws, r.run_id)
    assert s.state == "succeeded", s.text()
    assert by_phase(port) == 24 == s.sent == s.done
    paths = ws.run(r.run_id)
    recs = read_records(paths.raw).records
    assert sorted(x["i"] for x in recs) == list(range(24))
    assert [x["send_ns"] for x in recs] == sorted(x["send_ns"] for x in recs)  # one stream, in send order
    end = orjson.loads(paths.load_end.read_bytes())
    assert (end["planned"], end["sent"], end["done"], len(end["processes"])) == (24, 24, 24, 2)
    shares = [len(read_records(p.raw).records) for p in paths.load_parts()]
    assert shares == [15, 9]  # C=5 split 3 + 2: requests dealt in proportion
    # the rate's one schedule on one clock: every record's due time is the common start plus its offset
    scheds = sorted(x["sched_ns"] for x in recs)
    assert scheds[-1] - scheds[0] > 0.05e9
    started = [e for e in read_events(paths).events if isinstance(e, LoadClientStarted)]
    assert len(started) == 1 and len(started[0].data.pids or []) == 2
    first = latest_result(paths.root)
    assert first is not None
    again = reprocess_raw(ws, r.run_id)
    assert again.requests == 24 and by_phase(port) == 24
    second = latest_result(paths.root)
    assert second is not None and second.windows.whole == first.windows.whole


@pytest.mark.integration
@pytest.mark.processes  # load.processes > 1: P armed client processes and one go
def test_one_of_two_processes_killed_mid_load_then_resume_merges(ws: Workspace, stop_services: None) -> None:
    port = free_port()
    case = freeze_case(ws, draft=slow_draft(port, 24, load={"processes": 2}))
    r = start_run(ws, case.case_id)
    assert r.run_id is not None
    paths = ws.run(r.run_id)
    p1 = paths.load_part(1)
    wait_until(lambda: p1.raw.exists() and len(read_records(p1.raw).records) >= 1, 60, "a record of process 1")
    os.kill(int(orjson.loads(p1.load_pid.read_bytes())["pid"]), signal.SIGKILL)

    def settled() -> Any:
        st = phase_status(ws, r.run_id or "")
        return st if st.state not in ("running", "created") and not st.owner_alive else None

    s = wait_until(settled, 90, "the run to settle")
    assert s.failure_class == "end_unknown" and s.phase == "load", s.text()
    assert not s.next_resends_requests
    served = by_phase(port)
    assert s.done <= served <= s.sent < 8, (served, s.sent, s.done)
    assert len(read_records(paths.load_part(0).raw).records) == 4  # the other process finished its share

    res = resume(ws, r.run_id, wait=True)
    s2 = phase_status(ws, r.run_id)
    assert res.state == "partial" == s2.state and s2.load_ended == "partial", s2.text()
    assert by_phase(port) == served  # nothing re-sent
    recs = read_records(paths.raw).records
    assert len(recs) == s2.done == len({x["i"] for x in recs})  # merged, nothing duplicated
    assert s2.done <= served <= s2.sent
    started = [e for e in read_events(paths).events if e.type == "load_client_started"]
    assert len(started) == 1


def _rec(i: int, send: int) -> dict[str, Any]:
    return {"i": i, "send_ns": send, "chunk_ns": [send + 10, send + 20], "end_ns": send + 30, "ok": True}


def test_merge_puts_every_process_on_process_0s_clock(tmp_path: Any) -> None:
    from caseledger.load.parts import merge
    from caseledger.workspace import RunPaths, write_json

    paths = RunPaths(tmp_path / "r-00000001")
    parts = [paths.load_part(k) for k in range(2)]
    anchors = [
        {"wall_ns": 1_000_000, "mono_ns": 500, "boot_id": "a"},  # process 0: wall = mono + 999,500
        {"wall_ns": 1_000_000, "mono_ns": 100, "boot_id": "b"},  # another boot: wall = mono + 999,900
    ]
    for part, anchor, recs in zip(parts, anchors, [[_rec(0, 1000), _rec(2, 3000)], [_rec(1, 1500)]], strict=True):
        part.load_dir.mkdir(parents=True)
        write_json(part.load_anchor, anchor)
        part.raw.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs) + b'{"torn')  # a killed writer's tail
        part.load_sent.write_bytes(b"".join(b"%d\n" % r["i"] for r in recs))
    got = merge(paths, parts, "digest")
    recs = read_records(paths.raw).records
    assert [(r["i"], r["send_ns"]) for r in recs] == [(0, 1000), (1, 1900), (2, 3000)]  # send order, one clock
    assert recs[1]["chunk_ns"] == [1910, 1920] and recs[1]["end_ns"] == 1930
    assert got.records == 3 and [p["shift_ns"] for p in got.per_part] == [0, 400]
    assert paths.load_sent.read_bytes().count(b"\n") == 3
    assert not paths.load_end.exists()  # no end file of either process: the merged load has none either


def test_merge_maps_a_load_hosts_clock_through_its_measured_offset(tmp_path: Any) -> None:
    from caseledger.load.parts import merge
    from caseledger.workspace import RunPaths, write_json

    paths = RunPaths(tmp_path / "r-00000002")
    parts = [paths.load_part(k) for k in range(2)]
    anchors = [
        {"wall_ns": 1_000_000, "mono_ns": 500, "boot_id": "a"},  # host A: wall = mono + 999,500
        {"wall_ns": 1_000_000, "mono_ns": 100, "boot_id": "b"},  # host B: wall = mono + 999,900
    ]
    # host B's wall clock runs 300 ns ahead of the controller's, host A's 50 ns behind
    offsets = [-50, 300]
    for part, anchor, off, recs in zip(parts, anchors, offsets, [[_rec(0, 1000)], [_rec(1, 1500)]], strict=True):
        part.load_dir.mkdir(parents=True)
        write_json(part.load_anchor, anchor)
        write_json(part.load_clock, {"host": "h", "before": {"offset_ns": off}, "after": {"offset_ns": off + 7}})
        part.raw.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
        end = {"planned": 1, "sent": 1, "done": 1, "ok": 1, "failed": 0, "first_send_ns": recs[0]["send_ns"]}
        write_json(part.load_end, {**end, "last_end_ns": recs[0]["end_ns"], "wall_start_utc": "a", "wall_end_utc": "b"})
    got = merge(paths, parts, "digest")
    # B's send at mono 1500 is controller wall 1500 + 999,900 - 300; on A's clock: that - 999,500 - 50 = 1550
    recs = read_records(paths.raw).records
    assert [(r["i"], r["send_ns"]) for r in recs] == [(0, 1000), (1, 1550)]
    assert [p["shift_ns"] for p in got.per_part] == [0, 50]
    assert [p["offset_ns"] for p in got.per_part] == [-50, 300]  # the one measured before the load
    end = orjson.loads(paths.load_end.read_bytes())
    assert end["done"] == 2 and end["last_end_ns"] == 1580


# ------------------------------------------------------------------------------------------------ the armed wait


def test_an_armed_client_on_a_load_host_waits_while_the_heartbeat_changes_and_gives_up_once_it_stops(
    tmp_path: Any,
) -> None:
    import threading

    from caseledger import procs
    from caseledger.load.__main__ import wait_for_go
    from caseledger.workspace import PartPaths, write_json

    part = PartPaths(tmp_path / "run", 1)
    part.load_dir.mkdir(parents=True)
    # a dead pid named as the controller's: on a load host it means nothing, so only the heartbeat counts
    write_json(part.controller_pid, {**procs.me(), "pid": 999999999})
    stop = threading.Event()

    def beat() -> None:  # the controller's readiness polls, every 0.1 s for 1 s
        for _ in range(10):
            part.load_heartbeat.touch()
            time.sleep(0.1)
        stop.set()

    got: list[str | None] = []
    t0 = time.monotonic()
    threading.Thread(target=beat, daemon=True).start()
    waiter = threading.Thread(target=lambda: got.append(wait_for_go(part, heartbeat_s=0.4)), daemon=True)
    waiter.start()
    waiter.join(timeout=6.0)  # a wait that never ends fails here instead of hanging the suite
    assert got, "the armed wait did not end without a heartbeat"
    why, waited = got[0], time.monotonic() - t0
    assert stop.is_set() and 1.3 < waited < 3.0  # the beats kept it waiting; 0.4 s after the last one it gave up
    assert why is not None and "no heartbeat from the controller" in why and "0.4 s" in why
    part.load_go.write_bytes(b"{}")  # a go before the bound: it starts (the heartbeat's age is not checked then)
    assert wait_for_go(part, heartbeat_s=0.4) is None


@pytest.mark.integration  # a real process stands for the controller that died
def test_an_armed_client_whose_controller_died_follows_the_resumes_controller_and_starts_on_its_go(
    tmp_path: Any,
) -> None:
    """The controller that armed a client is killed; a resume's controller writes controller.pid and keeps the
    client (still alive) instead of arming a second: the client waits for the new controller's go, not ending
    as if nobody owned the run (seen once in CI under load: the load then ended unknown with 0 sent)."""
    import subprocess
    import sys
    import threading

    from caseledger import procs
    from caseledger.load.__main__ import wait_for_go
    from caseledger.workspace import PartPaths, write_json

    part = PartPaths(tmp_path / "run", 0)
    part.load_dir.mkdir(parents=True)
    first = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        write_json(part.controller_pid, {**procs.me(), "pid": first.pid, "start_time": procs.start_time(first.pid)})
        got: list[str | None] = []
        waiter = threading.Thread(target=lambda: got.append(wait_for_go(part)), daemon=True)
        waiter.start()
        time.sleep(0.2)
        write_json(part.controller_pid, procs.me())  # the resume's controller (alive) took the run over
        first.kill()
        first.wait()
        time.sleep(0.3)
        assert not got, got  # its first controller is dead, the run's is not: still waiting
        part.load_go.write_bytes(b"{}")
        waiter.join(timeout=5.0)
        assert got == [None], got
    finally:
        first.kill()
        first.wait()


def test_an_armed_client_here_still_ends_when_the_controller_pid_is_dead_and_ignores_the_heartbeat(
    tmp_path: Any,
) -> None:
    from caseledger import procs
    from caseledger.load.__main__ import wait_for_go
    from caseledger.workspace import PartPaths, write_json

    part = PartPaths(tmp_path / "run", 0)
    part.load_dir.mkdir(parents=True)
    write_json(part.controller_pid, {**procs.me(), "pid": 999999999})  # this host, a pid that does not run
    t0 = time.monotonic()
    assert wait_for_go(part) == "the controller died"  # no heartbeat bound: the pid check, as before
    assert time.monotonic() - t0 < 1.0
    write_json(part.controller_pid, procs.me())  # a live controller: only go or abort end the wait
    part.load_abort.touch()
    assert wait_for_go(part) == "the controller aborted the load"
