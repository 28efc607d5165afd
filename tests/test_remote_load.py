"""The load client on another host (load.host), one client process a host: a remote load completes, a cut link, a
killed controller, client or service ends it unknown and resume recovers every record; the load host's counters.
The load host is a network namespace with its own sshd (tests/load_hosts.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from caseledger.errors import CaseInvalid, TargetHeld
from caseledger.ledger.leases import read_lease
from caseledger.ledger.state import fold
from caseledger.tools import freeze_case, phase_status, resume, start_run
from caseledger.workspace import Workspace
from tests.conftest import free_port, ref_draft, start_with_fault
from tests.helpers import wait_until
from tests.load_hosts import (
    LoadHost,
    client_starts,
    draft,
    evidence,
    raw_lines,
    remote_load_dir,
    start_slow,
    stats,
)

pytestmark = pytest.mark.processes  # hosts, links and leases: the runs here keep real processes


@pytest.mark.ssh
@pytest.mark.integration
def test_remote_load_completes_with_the_local_shape_and_the_report_states_the_clock_offset(
    ws: Workspace, load_host: LoadHost, services_stopped: None
) -> None:
    lh, port, n = load_host, free_port(), 12
    case = freeze_case(ws, draft=draft(lh, port, n))
    r = start_run(ws, case.case_id, wait=True)
    assert r.state == "succeeded", r.text()
    paths = ws.run(r.run_id)
    pre = evidence(ws, r.run_id, "preflight")["checks"]["load_host"]
    assert pre["caseledger"]["digest"] and pre["preflight"]["sockets"].startswith("forbidden")
    assert pre["preflight"]["dataset_sha256"] and pre["preflight"]["load_plan_requests"] == n
    assert sorted(pre["files"]["copied"]) == ["case.json", "entries.jsonl", "identity.json", "run.json"]
    ev = evidence(ws, r.run_id, "load")
    assert ev["done"] == ev["ok"] == n and ev["host"] == f"{lh.sshd.user}@{lh.sshd.host}:{lh.sshd.port}"
    assert ev["reattached"] is False and ev["sealed_sha256"]["raw.jsonl"] == ev["raw_sha256"]
    clock = ev["clock"]["before"]
    # one machine, one clock: the measured offset lies within its own uncertainty (plus a little scheduling)
    assert clock["rounds"] == 9 and 0 < clock["uncertainty_ns"] < 50_000_000
    assert abs(clock["offset_ns"]) <= clock["uncertainty_ns"] + 5_000_000
    # the raw records were written by the client on the load host, and copied here byte for byte
    remote = remote_load_dir(lh, r.run_id)
    assert (remote / "raw.jsonl").read_bytes() == paths.raw.read_bytes() and raw_lines(paths.raw) == n
    # the client's stall record comes back with the raw data (on the same, remote, clock)
    assert paths.load_stalls.exists() and paths.load_stalls.read_bytes() == (remote / "stalls.jsonl").read_bytes()
    assert client_starts(lh, r.run_id) == 1
    assert stats(lh, port)["by_phase"]["load"] == n
    report = paths.report_md.read_text()
    assert "clock offset" in report and " ms ± " in report and "load host" in report
    body = orjson.loads(paths.report_json.read_bytes())["load_host"]
    assert body["clock"]["before"] == clock
    assert sorted(body["metrics_read_by"]) == ["metrics_after", "metrics_before"]
    assert all(who.startswith("controller") for who in body["metrics_read_by"].values())

    # a local run of the same load: the same record fields, the same result files
    local = freeze_case(ws, draft={**draft(lh, port, n), "load": {"requests": n, "concurrency": 2}})
    r2 = start_run(ws, local.case_id, wait=True)
    assert r2.state == "succeeded", r2.text()
    p2 = ws.run(r2.run_id)
    assert stats(lh, port)["by_phase"]["load"] == 2 * n
    keys = {tuple(sorted(orjson.loads(line))) for line in paths.raw.read_bytes().splitlines()}
    assert keys == {tuple(sorted(orjson.loads(line))) for line in p2.raw.read_bytes().splitlines()}
    shape = sorted(str(p.relative_to(paths.results)).count("/") for p in paths.results.rglob("*.json"))
    assert shape == sorted(str(p.relative_to(p2.results)).count("/") for p in p2.results.rglob("*.json"))
    assert "clock offset" not in p2.report_md.read_text()

    # the key is referenced by path; its content is nowhere under ledger/
    body = [ln for ln in lh.sshd.key_path.read_bytes().splitlines() if ln and not ln.startswith(b"-----")]
    files = [p for p in ws.ledger.rglob("*") if p.is_file()]
    assert any(str(lh.sshd.key_path).encode() in p.read_bytes() for p in files)
    assert [str(p) for p in files for s in [*body, b"".join(body)] if s in p.read_bytes()] == []


@pytest.mark.ssh
@pytest.mark.integration
def test_cut_link_mid_load_is_end_unknown_with_the_lease_kept_then_resume_recovers_every_record(
    ws: Workspace, load_host: LoadHost, services_stopped: None
) -> None:
    lh, port, n = load_host, free_port(), 40
    r, paths = start_slow(ws, lh, port, n)
    lh.cut()
    try:
        # a poll in flight times out (5 s), then reconnects fail for load.host.reconnect_s (2 s)
        wait_until(lambda: not fold(ws, r.run_id).controller_alive, 120, "the controller gives the load host up")
        s = phase_status(ws, r.run_id)
        assert s.failure_class == "end_unknown" and s.phase == "load", s.text()
        assert "resume" in s.next_call and "second client" in s.next_call, s.next_call
        key = fold(ws, r.run_id).meta.target_key
        lease = read_lease(ws, key or "")
        assert lease is not None and lease.run_id == r.run_id and lease.live()
        # ... and past its expiry too: the client on the load host may still run (only SSH can tell)
        assert lease.live(now=lease.expires + 3600) and lease.extra_procs[0]["host"] == lh.sshd.host
        other = freeze_case(ws, draft=draft(lh, port, 4))
        with pytest.raises(TargetHeld):
            start_run(ws, other.case_id)
        # the client on the load host goes on and finishes, unseen from here
        remote = remote_load_dir(lh, r.run_id)
        wait_until(lambda: (remote / "end.json").exists(), what="the remote client ends")
        assert raw_lines(remote / "raw.jsonl") == n and raw_lines(paths.raw) < n
        assert not paths.load_end.exists()
        # a resume while the link is still down gives up again after load.host.reconnect_s, lease still kept
        resume(ws, r.run_id, wait=True)
        s = phase_status(ws, r.run_id)
        assert s.failure_class == "end_unknown" and s.phase == "load", s.text()
        lease = read_lease(ws, key or "")
        assert lease is not None and lease.run_id == r.run_id and lease.live(now=lease.expires + 3600)
    finally:
        lh.restore()
    res = resume(ws, r.run_id, wait=True)
    assert res.state == "succeeded", res.text()
    ev = evidence(ws, r.run_id, "load")
    assert ev["reattached"] is True and ev["done"] == ev["ok"] == n
    assert raw_lines(paths.raw) == n and paths.raw.read_bytes() == (remote / "raw.jsonl").read_bytes()
    assert stats(lh, port)["by_phase"]["load"] == n  # exactly N formal requests reached the target
    assert client_starts(lh, r.run_id) == 1


@pytest.mark.ssh
@pytest.mark.integration
def test_controller_killed_during_a_remote_load_then_resume_reattaches_without_a_second_client(
    ws: Workspace, load_host: LoadHost, services_stopped: None
) -> None:
    lh, port, n = load_host, free_port(), 40
    r, paths = start_slow(ws, lh, port, n)
    ctl = orjson.loads(paths.controller_pid.read_bytes())
    os.kill(int(ctl["pid"]), signal.SIGKILL)
    wait_until(lambda: not fold(ws, r.run_id).controller_alive, what="the controller is gone")
    s = phase_status(ws, r.run_id)
    assert s.failure_class == "end_unknown" and s.phase == "load", s.text()
    assert raw_lines(paths.raw) < n
    res = resume(ws, r.run_id, wait=True)
    assert res.state == "succeeded", res.text()
    ev = evidence(ws, r.run_id, "load")
    assert ev["reattached"] is True and ev["done"] == n and raw_lines(paths.raw) == n
    assert ev["clock"]["before"]["rounds"] == 9  # measured by the first controller, kept by the second
    assert stats(lh, port)["by_phase"]["load"] == n
    assert client_starts(lh, r.run_id) == 1


@pytest.mark.ssh
@pytest.mark.integration
def test_controller_dead_between_the_remote_launch_and_its_pid_then_resume_finds_the_client_by_its_pid_file(
    ws: Workspace, load_host: LoadHost, services_stopped: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    lh, port, n = load_host, free_port(), 20
    case = freeze_case(ws, draft=draft(lh, port, n, slow=True))
    r = start_with_fault(monkeypatch, "controller:exit_during=remote_launch", ws, case.case_id, wait=True)
    paths = ws.run(r.run_id)
    rec = orjson.loads(paths.load_remote.read_bytes())
    assert rec["state"] == "launching" and "pid" not in rec  # the launch's answer never got recorded
    s = phase_status(ws, r.run_id)
    assert s.failure_class == "end_unknown" and s.phase == "load", s.text()
    res = resume(ws, r.run_id, wait=True)
    assert res.state == "succeeded", res.text()
    ev = evidence(ws, r.run_id, "load")
    assert ev["reattached"] is True and ev["done"] == n and raw_lines(paths.raw) == n
    rec = orjson.loads(paths.load_remote.read_bytes())
    assert rec["state"] == "launched" and rec["pid"] == ev["remote"]["pid"]
    assert ev["clock"]["before"]["rounds"] == 9  # measured before the launch, kept through the controller's death
    assert stats(lh, port)["by_phase"]["load"] == n and client_starts(lh, r.run_id) == 1


def test_load_host_unset_keeps_case_ids_and_a_bad_one_is_refused_naming_the_field(ws: Workspace) -> None:
    base = ref_draft(18001)
    plain = freeze_case(ws, draft=base)
    explicit = freeze_case(ws, draft={**base, "load": {**base["load"], "host": None}})
    assert explicit.case_id == plain.case_id  # an unset load.host is not in the canonical JSON
    assert "host" not in orjson.loads(Path(plain.path).read_bytes())["load"]
    login = {"host": "10.0.0.7", "user": "bench", "key_path": "/keys/id_ed25519"}
    with pytest.raises(CaseInvalid) as e:
        freeze_case(ws, draft={**base, "load": {**base["load"], "host": login}})
    assert "load.host" in str(e.value) and "accept_unknown_host_key" in str(e.value)
    with pytest.raises(CaseInvalid) as e:
        freeze_case(
            ws,
            draft={**base, "load": {**base["load"], "host": {**login, "known_hosts": "/k", "workdir": "relative/dir"}}},
        )
    assert "load.host.workdir" in str(e.value)
    ok = freeze_case(ws, draft={**base, "load": {**base["load"], "host": {**login, "known_hosts": "/k"}}})
    assert ok.case_id != plain.case_id
    stored = orjson.loads(Path(ok.path).read_bytes())["load"]["host"]
    assert stored == {
        **login,
        "port": 22,
        "known_hosts": "/k",
        "accept_unknown_host_key": False,
        "python": "python3",
        "workdir": "/tmp/caseledger-load",
        "reconnect_s": 60.0,
    }


@pytest.mark.ssh
@pytest.mark.integration
def test_remote_client_killed_mid_load_ends_partial_on_resume_and_nothing_is_sent_again(
    ws: Workspace, load_host: LoadHost, services_stopped: None
) -> None:
    lh, port, n = load_host, free_port(), 40
    r, paths = start_slow(ws, lh, port, n)
    pid = int(orjson.loads(paths.load_pid.read_bytes())["pid"])
    os.kill(pid, signal.SIGKILL)  # the test sees the load host's processes (shared pid space); the code does not
    wait_until(lambda: not fold(ws, r.run_id).controller_alive, what="the controller ends")
    s = phase_status(ws, r.run_id)
    assert s.failure_class == "end_unknown" and s.phase == "load", s.text()
    assert "exited without an end file" in (s.blocker or "") and "start_run(" in s.next_call, s.text()
    counted = stats(lh, port)["by_phase"]["load"]
    sent = (remote_load_dir(lh, r.run_id) / "sent.log").read_bytes().count(b"\n")
    done = raw_lines(paths.raw)
    assert done < n and done <= counted <= sent  # in-flight requests at the kill reached the target unrecorded
    res = resume(ws, r.run_id, wait=True)
    assert res.state == "partial", res.text()
    part = orjson.loads(paths.load_partial.read_bytes())
    assert part["done"] == done and part["never_sent"] == n - sent
    assert stats(lh, port)["by_phase"]["load"] == counted and client_starts(lh, r.run_id) == 1  # nothing re-sent


@pytest.mark.ssh
@pytest.mark.integration
def test_counters_only_the_load_host_reaches_are_read_there_and_the_report_says_which_host_read_them(
    ws: Workspace, load_host: LoadHost, services_stopped: None, tmp_path: Path
) -> None:
    lh = load_host
    if lh.ns is None:
        pytest.skip("needs the namespace: a /metrics only the load host reaches (its own loopback)")
    port, mport = free_port(), free_port()
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "metrics").write_text("# TYPE caseledger_probe counter\ncaseledger_probe_total 7\n")
    url = f"http://127.0.0.1:{mport}/metrics"  # the load host's loopback: nothing listens there on this side
    srv = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            lh.ns,
            sys.executable,
            "-m",
            "http.server",
            str(mport),
            "--bind",
            "127.0.0.1",
            "--directory",
            str(tmp_path / "m"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        probe = [
            "ip",
            "netns",
            "exec",
            lh.ns,
            sys.executable,
            "-c",
            "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)",
            url,
        ]
        wait_until(
            lambda: subprocess.run(probe, capture_output=True).returncode == 0, what="the load host's /metrics answers"
        )
        d = draft(lh, port, 4)
        d["target"]["metrics_url"] = url
        r = start_run(ws, freeze_case(ws, draft=d).case_id, wait=True)
        assert r.state == "succeeded", r.text()
        paths = ws.run(r.run_id)
        for f in (paths.metrics_before, paths.metrics_after):
            assert "caseledger_probe_total 7" in f.read_text() and not f.with_suffix(".missing").exists()
        who = f"load host ({lh.sshd.user}@{lh.sshd.host}:{lh.sshd.port})"
        assert evidence(ws, r.run_id, "load")["metrics_read_by"] == who
        assert f"| /metrics counters before the load read by | {who} |" in paths.report_md.read_text()
    finally:
        srv.terminate()
        srv.wait(10)


@pytest.mark.ssh
@pytest.mark.integration
def test_service_killed_under_a_remote_load_sends_it_again_from_a_fresh_remote_directory_after_resume(
    ws: Workspace, load_host: LoadHost, services_stopped: None
) -> None:
    lh, port, n = load_host, free_port(), 20
    r, paths = start_slow(ws, lh, port, n, records=2)
    key = fold(ws, r.run_id).meta.target_key
    old = int(orjson.loads((ws.services_dir / f"{key}.json").read_bytes())["proc"]["pid"])
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: not fold(ws, r.run_id).controller_alive, what="the controller ends")
    s = phase_status(ws, r.run_id)
    assert s.failure_class == "service" and s.phase == "load" and s.next_resends_requests, s.text()
    res = resume(ws, r.run_id, wait=True)
    assert res.state == "succeeded", res.text()
    # the rejected attempt is kept aside on both hosts; the new one ran from a fresh remote load directory
    assert (paths.load_attempt_dir(1) / "superseded.json").exists()
    assert (paths.load_attempt_dir(1) / "remote.json").exists() and raw_lines(paths.load_attempt_dir(1) / "raw.jsonl")
    aside = list(remote_load_dir(lh, r.run_id).parent.glob("load.superseded-*"))
    assert len(aside) == 1 and (aside[0] / "end.json").exists()
    st = stats(lh, port)
    assert st["pid"] != old and st["by_phase"]["load"] == n and raw_lines(paths.raw) == n
    assert client_starts(lh, r.run_id) == 1 and evidence(ws, r.run_id, "load")["reattached"] is False
