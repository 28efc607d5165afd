"""The load client on load hosts with several client processes, and on two load hosts at once: one merged load
copied back per process, a host cut, a process or the controller killed, armed processes whose controller died
before the go, a full disk; resume counts every request once. The load hosts: tests/load_hosts.py."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from caseledger.errors import CaseInvalid
from caseledger.ledger.event_types import LoadArmedEnded, LoadClientStarted
from caseledger.ledger.events import read_events
from caseledger.ledger.leases import read_lease
from caseledger.ledger.state import fold
from caseledger.records import read_records
from caseledger.tools import freeze_case, phase_status, resume, start_run
from caseledger.workspace import Workspace
from tests.conftest import free_port, ref_draft, start_with_fault
from tests.helpers import wait_until
from tests.load_hosts import (
    LoadHost,
    client_starts,
    draft,
    evidence,
    namespace_host,
    raw_lines,
    remote_load_dir,
    stats,
)

pytestmark = pytest.mark.processes  # hosts, links and leases: the runs here keep real processes


@pytest.fixture(scope="module")
def second_load_host(tmp_path_factory: pytest.TempPathFactory, load_host: LoadHost) -> Iterator[LoadHost]:
    """Another load host beside load_host; its clients reach the target where load_host's do."""
    with namespace_host(tmp_path_factory.mktemp("loadhost2"), "b", (3, 4), target=load_host.here) as lh:
        yield lh


# ------------------------------------------------------------------ several client processes on load hosts
def part_starts(lh: LoadHost, run_id: str, k: int) -> int:
    """How many clients began process k's share of this run's formal load on this load host."""
    log = remote_load_dir(lh, run_id) / f"p{k}" / "client.log"
    if not log.exists():
        return 0
    return sum(f"load: run {run_id} (process {k} of" in line for line in log.read_text().splitlines())


def shared_draft(lh: LoadHost, port: int, n: int, slow: bool = False, **load: Any) -> dict[str, Any]:
    d = draft(lh, port, n, slow=slow)
    d["load"] = {**d["load"], **load}
    return d


@pytest.mark.ssh
@pytest.mark.integration
def test_two_processes_on_a_load_host_run_one_merged_load_copied_back_per_process(
    ws: Workspace, load_host: LoadHost, services_stopped: None
) -> None:
    lh, port, n = load_host, free_port(), 24
    case = freeze_case(ws, draft=shared_draft(lh, port, n, concurrency=5, processes=2, rate=200))
    r = start_run(ws, case.case_id, wait=True)
    assert r.state == "succeeded", r.text()
    paths = ws.run(r.run_id)
    recs = read_records(paths.raw).records
    assert sorted(x["i"] for x in recs) == list(range(n))
    assert [x["send_ns"] for x in recs] == sorted(x["send_ns"] for x in recs)  # one stream, in send order
    assert stats(lh, port)["by_phase"]["load"] == n  # counted once at the target
    parts = paths.load_parts()
    assert [len(read_records(p.raw).records) for p in parts] == [15, 9]  # C=5 split 3 + 2, dealt as locally
    for k, part in enumerate(parts):  # each process's intent log and raw records came back byte for byte, sealed
        there = remote_load_dir(lh, r.run_id) / f"p{k}"
        assert part.raw.read_bytes() == (there / "raw.jsonl").read_bytes()
        assert part.load_sent.read_bytes() == (there / "sent.log").read_bytes()
        assert orjson.loads(part.load_end.read_bytes()) == orjson.loads((there / "end.json").read_bytes())
        assert part_starts(lh, r.run_id, k) == 1
        assert orjson.loads(part.load_clock.read_bytes())["before"]["rounds"] == 9
    end = orjson.loads(paths.load_end.read_bytes())
    assert (end["planned"], end["sent"], end["done"], len(end["processes"])) == (n, n, n, 2)
    ev = evidence(ws, r.run_id, "load")
    assert ev["reattached"] is False and [h["processes"] for h in ev["hosts"]] == [[0, 1]]
    assert ev["hosts"][0]["host"] == f"{lh.sshd.user}@{lh.sshd.host}:{lh.sshd.port}"
    assert [p["offset_ns"] for p in ev["processes"]] == [
        orjson.loads(p.load_clock.read_bytes())["before"]["offset_ns"] for p in parts
    ]
    # one schedule for both processes: the due times of the dealt-out rate schedule span the load as one
    scheds = sorted(x["sched_ns"] for x in recs)
    assert scheds[-1] - scheds[0] > 0.05e9
    started = [e for e in read_events(paths).events if isinstance(e, LoadClientStarted)]
    assert len(started) == 1 and len(started[0].data.pids or []) == 2
    confirm = evidence(ws, r.run_id, "confirm_end")
    assert confirm["all_accounted"] is True and confirm["processes"] == 2


def test_load_hosts_are_one_spelling_and_bad_ones_are_refused_naming_the_field(ws: Workspace) -> None:
    base = ref_draft(18001)
    login = {"host": "10.0.0.7", "user": "bench", "key_path": "/keys/id", "known_hosts": "/k"}
    other = {**login, "host": "10.0.0.8"}

    def refused(load: dict[str, Any]) -> str:
        with pytest.raises(CaseInvalid) as e:
            freeze_case(ws, draft={**base, "load": {**base["load"], "concurrency": 4, **load}})
        return str(e.value)

    # several processes on one load host are allowed now; its canonical form is unchanged for one
    one = freeze_case(ws, draft={**base, "load": {**base["load"], "host": login}})
    again = freeze_case(ws, draft={**base, "load": {**base["load"], "host": login, "processes": 1, "hosts": None}})
    assert one.case_id == again.case_id and "hosts" not in orjson.loads(Path(one.path).read_bytes())["load"]
    two = freeze_case(ws, draft={**base, "load": {**base["load"], "host": login, "processes": 2}})
    assert two.case_id != one.case_id
    hosts = freeze_case(
        ws, draft={**base, "load": {**base["load"], "concurrency": 4, "hosts": [{**login, "processes": 2}, other]}}
    )
    stored = orjson.loads(Path(hosts.path).read_bytes())["load"]
    assert [h["processes"] for h in stored["hosts"]] == [2, 1] and "host" not in stored
    assert "load.host and load.hosts are both set" in refused({"host": login, "hosts": [login, other]})
    msg = refused({"hosts": [login]})
    assert "load.hosts has 1 entry" in msg and "use load.host" in msg
    msg = refused({"hosts": [login, {**login, "processes": 2}]})
    assert "load.hosts[1] repeats load.hosts[0]" in msg and "processes 3" in msg
    msg = refused({"hosts": [login, other], "processes": 2})
    assert "load.processes 2 with load.hosts" in msg and "remove load.processes" in msg
    msg = refused({"hosts": [{**login, "processes": 3}, {**other, "processes": 2}]})
    assert "the processes of load.hosts 5 > load.concurrency 4" in msg
    assert "load.processes 5 > load.concurrency 4" in refused({"host": login, "processes": 5})
    assert "load.hosts[].known_hosts is null" in refused({"hosts": [{**login, "known_hosts": None}, other]})


@pytest.fixture
def both_stopped(ws: Workspace, load_host: LoadHost, second_load_host: LoadHost) -> Iterator[None]:
    yield
    from caseledger import services  # lazy: as conftest's stop_services

    services.stop_all(ws)
    for lh in (load_host, second_load_host):
        with contextlib.suppress(subprocess.CalledProcessError):
            lh.restore()
        for pid in lh.clients():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def two_hosts_draft(a: LoadHost, b: LoadHost, port: int, n: int, slow: bool = False, **load: Any) -> dict[str, Any]:
    d = draft(a, port, n, slow=slow)
    d["load"] = {"requests": n, "concurrency": 2, "hosts": [a.block(), b.block()], **load}
    return d


@pytest.mark.ssh
@pytest.mark.integration
def test_two_load_hosts_run_one_load_dealt_over_every_process_of_both(
    ws: Workspace, load_host: LoadHost, second_load_host: LoadHost, both_stopped: None
) -> None:
    a, b, port, n = load_host, second_load_host, free_port(), 24
    d = two_hosts_draft(a, b, port, n, concurrency=6, rate=200)
    d["load"]["hosts"][0]["processes"] = 2
    r = start_run(ws, freeze_case(ws, draft=d).case_id, wait=True)
    assert r.state == "succeeded", r.text()
    paths = ws.run(r.run_id)
    pre = evidence(ws, r.run_id, "preflight")["checks"]["load_host"]["hosts"]
    assert [h["host"] for h in pre] == [f"{x.sshd.user}@{x.sshd.host}:{x.sshd.port}" for x in (a, b)]
    recs = read_records(paths.raw).records
    assert sorted(x["i"] for x in recs) == list(range(n)) and stats(a, port)["by_phase"]["load"] == n
    assert [x["send_ns"] for x in recs] == sorted(x["send_ns"] for x in recs)
    assert [len(read_records(p.raw).records) for p in paths.load_parts()] == [8, 8, 8]  # C=6: 2 slots each
    # processes 0 and 1 ran on the first host, 2 on the second: each host holds only its own processes' files
    for lh, ks in ((a, [0, 1]), (b, [2])):
        there = remote_load_dir(lh, r.run_id)
        assert sorted(p.name for p in there.iterdir() if p.is_dir()) == [f"p{k}" for k in ks]
        for k in ks:
            assert (there / f"p{k}" / "raw.jsonl").read_bytes() == paths.load_part(k).raw.read_bytes()
            assert part_starts(lh, r.run_id, k) == 1
    ev = evidence(ws, r.run_id, "load")
    assert [h["processes"] for h in ev["hosts"]] == [[0, 1], [2]] and ev["done"] == n
    assert all(h["clock"]["before"]["rounds"] == 9 for h in ev["hosts"])
    assert evidence(ws, r.run_id, "confirm_end")["all_accounted"] is True


@pytest.mark.ssh
@pytest.mark.integration
def test_one_of_two_load_hosts_cut_mid_load_is_end_unknown_then_resume_counts_every_request_once(
    ws: Workspace, load_host: LoadHost, second_load_host: LoadHost, both_stopped: None
) -> None:
    a, b, port, n = load_host, second_load_host, free_port(), 40
    r = start_run(ws, freeze_case(ws, draft=two_hosts_draft(a, b, port, n, slow=True)).case_id)
    paths = ws.run(r.run_id)
    wait_until(lambda: raw_lines(paths.load_part(1).raw) >= 2, what="records of the second host arrive")
    b.cut()
    try:
        wait_until(lambda: not fold(ws, r.run_id).controller_alive, 120, "the controller gives the second host up")
        s = phase_status(ws, r.run_id)
        assert s.failure_class == "end_unknown" and s.phase == "load", s.text()
        assert s.state != "succeeded" and s.load_ended != "yes", s.text()
        assert b.sshd.host in (s.blocker or "") and "resume" in s.next_call and not s.next_resends_requests
        assert not paths.load_end.exists()  # no merged end file: the load is not claimed to have ended
        assert paths.load_part(0).load_end.exists()  # the first host was followed to its end meanwhile
        key = fold(ws, r.run_id).meta.target_key
        lease = read_lease(ws, key or "")
        assert lease is not None and lease.run_id == r.run_id and lease.live(now=lease.expires + 3600)
        there = remote_load_dir(b, r.run_id) / "p1"
        wait_until(lambda: (there / "end.json").exists(), what="the cut host's client ends")
        assert raw_lines(paths.load_part(1).raw) < n // 2 == raw_lines(there / "raw.jsonl")
    finally:
        b.restore()
    res = resume(ws, r.run_id, wait=True)
    assert res.state == "succeeded", res.text()
    ev = evidence(ws, r.run_id, "load")
    assert ev["reattached"] is True and ev["done"] == ev["ok"] == n
    recs = read_records(paths.raw).records
    assert sorted(x["i"] for x in recs) == list(range(n))  # merged: every request once
    assert stats(a, port)["by_phase"]["load"] == n  # N formal requests counted once at the target
    assert part_starts(a, r.run_id, 0) == 1 and part_starts(b, r.run_id, 1) == 1
    assert paths.load_part(1).raw.read_bytes() == (remote_load_dir(b, r.run_id) / "p1" / "raw.jsonl").read_bytes()


@pytest.mark.ssh
@pytest.mark.integration
def test_one_of_two_processes_killed_on_a_load_host_then_resume_merges_nothing_twice_nothing_resent(
    ws: Workspace, load_host: LoadHost, services_stopped: None
) -> None:
    lh, port, n = load_host, free_port(), 16
    r = start_run(ws, freeze_case(ws, draft=shared_draft(lh, port, n, slow=True, processes=2)).case_id)
    paths = ws.run(r.run_id)
    p1 = paths.load_part(1)
    wait_until(lambda: raw_lines(p1.raw) >= 1, what="a record of process 1 arrives")
    os.kill(int(orjson.loads(p1.load_pid.read_bytes())["pid"]), signal.SIGKILL)  # shared pid space; the code asks SSH
    wait_until(lambda: not fold(ws, r.run_id).controller_alive, 120, "the controller ends")
    s = phase_status(ws, r.run_id)
    assert s.failure_class == "end_unknown" and s.phase == "load", s.text()
    assert "exited without an end file" in (s.blocker or "") and not s.next_resends_requests, s.text()
    served = stats(lh, port)["by_phase"]["load"]
    assert raw_lines(paths.load_part(0).raw) == n // 2  # the other process finished its share
    res = resume(ws, r.run_id, wait=True)
    s2 = phase_status(ws, r.run_id)
    assert res.state == "partial" == s2.state and s2.load_ended == "partial", s2.text()
    assert stats(lh, port)["by_phase"]["load"] == served  # nothing re-sent
    recs = read_records(paths.raw).records
    assert len(recs) == s2.done == len({x["i"] for x in recs})  # merged, nothing duplicated
    # the killed process may have sent its whole share before the kill landed (its first record is seen here only
    # after the follow copies it): what it did not finish is lost, never re-sent
    assert s2.done <= served <= s2.sent <= n and s2.done < n, s2.text()
    part = orjson.loads(paths.load_partial.read_bytes())
    assert part["done"] + part["in_flight_lost"] + part["never_sent"] == n  # every request accounted for
    assert part_starts(lh, r.run_id, 0) == 1 and part_starts(lh, r.run_id, 1) == 1


@pytest.mark.ssh
@pytest.mark.integration
def test_controller_killed_under_two_processes_on_a_load_host_then_resume_reattaches_to_both(
    ws: Workspace, load_host: LoadHost, services_stopped: None
) -> None:
    lh, port, n = load_host, free_port(), 24
    r = start_run(ws, freeze_case(ws, draft=shared_draft(lh, port, n, slow=True, processes=2)).case_id)
    paths = ws.run(r.run_id)
    wait_until(lambda: all(raw_lines(paths.load_part(k).raw) for k in (0, 1)), what="records of both processes arrive")
    os.kill(int(orjson.loads(paths.controller_pid.read_bytes())["pid"]), signal.SIGKILL)
    wait_until(lambda: not fold(ws, r.run_id).controller_alive, what="the controller is gone")
    s = phase_status(ws, r.run_id)
    assert s.failure_class == "end_unknown" and s.phase == "load" and not s.next_resends_requests, s.text()
    assert not paths.load_end.exists()
    res = resume(ws, r.run_id, wait=True)
    assert res.state == "succeeded", res.text()
    ev = evidence(ws, r.run_id, "load")
    assert ev["reattached"] is True and ev["done"] == ev["ok"] == n
    recs = read_records(paths.raw).records
    assert sorted(x["i"] for x in recs) == list(range(n)) and stats(lh, port)["by_phase"]["load"] == n
    assert part_starts(lh, r.run_id, 0) == 1 and part_starts(lh, r.run_id, 1) == 1
    for k in (0, 1):  # each local copy equals its process's file there (re-attach checked the prefix)
        there = remote_load_dir(lh, r.run_id) / f"p{k}" / "raw.jsonl"
        assert paths.load_part(k).raw.read_bytes() == there.read_bytes()


def run_clients(lh: LoadHost, run_id: str) -> list[int]:
    """This run's load clients still running on the load host (shared pid space; the code under test asks SSH)."""
    out = []
    for pid in lh.clients():
        with contextlib.suppress(OSError):
            if run_id.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
    return out


@pytest.mark.ssh
@pytest.mark.integration
def test_armed_processes_on_a_load_host_give_up_once_the_controller_dies_before_the_go_then_resume_starts_afresh(
    ws: Workspace, load_host: LoadHost, services_stopped: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from caseledger.run.remote.hosts import ARMED_SLACK_ENV

    slack = 6.0  # the default 30 s covers a starved controller; the bound is the same rule at any slack
    monkeypatch.setenv(ARMED_SLACK_ENV, f"{slack:g}")
    lh, port, n = load_host, free_port(), 12
    case = freeze_case(ws, draft=shared_draft(lh, port, n, processes=2))
    # the controller dies with both processes ready and armed there, before it writes any go
    r = start_with_fault(monkeypatch, "controller:exit_during=remote_armed", ws, case.case_id, wait=True)
    died = time.monotonic()
    paths, there = ws.run(r.run_id), remote_load_dir(lh, r.run_id)
    assert not paths.load_go.exists() and not (there / "go").exists()
    assert all((there / f"p{k}" / "ready").exists() for k in (0, 1))
    assert len(run_clients(lh, r.run_id)) == 2  # armed: waiting for a go that will never come
    bound = 2.0 + slack  # the case's load.host.reconnect_s + the slack
    wait_until(lambda: not run_clients(lh, r.run_id), bound + 20, "the armed processes give up")
    assert time.monotonic() - died > bound - 3  # not before the bound (the controller's last heartbeat ~ its death)
    for k in (0, 1):
        rec = orjson.loads((there / f"p{k}" / "not_started.json").read_bytes())
        assert rec["exit"] == "not_started" and rec["code"] == 2 and rec["sent"] == 0
        assert "no heartbeat from the controller" in rec["reason"], rec
        last = (there / f"p{k}" / "client.log").read_text().strip().splitlines()[-1]
        assert "not started, nothing sent" in last and "exit 2" in last, last
        assert not (there / f"p{k}" / "anchor.json").exists() and part_starts(lh, r.run_id, k) == 0
    assert stats(lh, port)["by_phase"].get("load", 0) == 0  # nothing was sent
    s = phase_status(ws, r.run_id)
    assert s.phase == "load" and s.state != "succeeded" and s.sent == 0 and not s.next_resends_requests, s.text()
    res = resume(ws, r.run_id, wait=True)  # aborts what is left of the armed start, starts both afresh
    assert res.state == "succeeded", res.text()
    assert stats(lh, port)["by_phase"]["load"] == n  # counted once at the target
    assert sorted(x["i"] for x in read_records(paths.raw).records) == list(range(n))
    assert part_starts(lh, r.run_id, 0) == 1 and part_starts(lh, r.run_id, 1) == 1
    old = list(there.parent.glob("load.superseded-*"))  # the given-up attempt, set aside there with its records
    assert len(old) == 1 and all((old[0] / f"p{k}" / "not_started.json").exists() for k in (0, 1))
    ended = [e for e in read_events(paths).events if isinstance(e, LoadArmedEnded)]
    assert len(ended) == 1 and [p["exit"] for p in ended[0].data.processes] == ["not_started"] * 2


@pytest.fixture
def small_disk_host(tmp_path: Path, ws: Workspace) -> Iterator[LoadHost]:
    """A load host whose workdir is a 16 MB tmpfs, mounted before its sshd starts (the namespace's sshd sees the
    mounts of that moment: / is private here), so the test fills the disk the load host writes to."""
    root = tmp_path / "smallhost"
    work = root / "work"
    work.mkdir(parents=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(work)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"no tmpfs mount on this machine ({r.stderr.decode().strip()[:80]}): needs root")
    try:
        with namespace_host(root, "d", (5, 6)) as lh:
            try:
                yield lh
            finally:
                from caseledger import services  # lazy: as conftest's stop_services

                services.stop_all(ws)
                for pid in lh.clients():
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
    finally:
        subprocess.run(["umount", "-l", str(work)], capture_output=True)


@pytest.mark.ssh
@pytest.mark.integration
@pytest.mark.parametrize("processes", [1, 2])
def test_a_full_disk_on_the_load_host_fails_the_load_disk_with_nothing_sent_then_resume_sends_it_once(
    ws: Workspace, small_disk_host: LoadHost, monkeypatch: pytest.MonkeyPatch, processes: int
) -> None:
    from caseledger.faults import FILLER, fill_disk

    lh, port, n = small_disk_host, free_port(), 8
    case = freeze_case(ws, draft=shared_draft(lh, port, n, processes=processes))
    # preflight passes there (16 MB free); the controller stops right before the load, the disk there fills
    r = start_with_fault(monkeypatch, "controller:exit_before=load", ws, case.case_id, wait=True)
    fill_disk(lh.workdir)
    res = resume(ws, r.run_id, wait=True)
    s = phase_status(ws, r.run_id)
    assert res.state == "failed" and s.failure_class == "disk" and s.phase == "load", s.text()
    where = f"{lh.sshd.user}@{lh.sshd.host}:{lh.sshd.port}"
    msg = evidence(ws, r.run_id, "load")["error"]
    assert f"disk full on load host {where}" in msg and "MB for the raw records at" in msg, msg
    assert str(lh.workdir) in msg and "no formal request was sent" in msg, msg
    assert f"free disk space on load host {where}, under its workdir" in s.next_call, s.text()
    assert stats(lh, port)["by_phase"].get("load", 0) == 0 and s.sent == 0  # nothing sent
    assert not run_clients(lh, r.run_id)  # no client was started there
    (lh.workdir / FILLER).unlink()
    res = resume(ws, r.run_id, wait=True)
    assert res.state == "succeeded", res.text()
    assert stats(lh, port)["by_phase"]["load"] == n  # sent once
    starts = [client_starts(lh, r.run_id)] if processes == 1 else [part_starts(lh, r.run_id, k) for k in (0, 1)]
    assert starts == [1] * processes
