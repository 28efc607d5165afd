"""The load client on another host (load.host), against a real sshd in a network namespace.

The "load host" is a network namespace with two veth pairs to this machine: a control link that carries only SSH
(10.A.1.1 here, 10.A.1.2 there) and a data link to the reference target (10.A.2.1 here, where the target listens).
Cutting the control link (`ip link set <veth> down`) is the seeds' lost link: the controller loses the load host
while the load host keeps reaching the serving target. The namespace shares this machine's filesystem and pid
space, so a test can look at what the load host wrote and which processes run there; the code under test never
does: it reads everything over SSH (procs.alive answers False for another host).

Needs root, iproute2 and openssh-server; skipped with the reason otherwise (CASELEDGER_REQUIRE_SSH=1: failed).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest

from caseledger.errors import CaseInvalid, TargetHeld
from caseledger.ledger.event_types import LoadArmedEnded, LoadClientStarted
from caseledger.ledger.events import read_events
from caseledger.ledger.leases import read_lease
from caseledger.ledger.state import fold
from caseledger.records import read_records
from caseledger.tools import freeze_case, phase_status, resume, start_run
from caseledger.workspace import Workspace
from tests.conftest import free_port, ref_draft, start_with_fault
from tests.sshd import Sshd, running_sshd, sshd_binary

pytestmark = pytest.mark.processes  # hosts, links and leases: the runs here keep real processes


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@dataclass(frozen=True)
class LoadHost:
    ns: str | None  # the namespace; None: the loopback fallback (no namespaces on this machine)
    ctl: str | None  # this machine's end of the SSH link (cut it to lose the load host)
    here: str  # this machine's address on the data link (the reference target listens there)
    sshd: Sshd
    workdir: Path

    def cut(self) -> None:
        if self.ctl is not None:
            _sh("ip", "link", "set", self.ctl, "down")
            return
        # fallback: the listener stops answering and every SSH connection process is killed (the load client
        # runs in a session of its own and goes on)
        os.kill(self.sshd.pid, signal.SIGSTOP)
        for pid in _children(self.sshd.pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def restore(self) -> None:
        if self.ctl is not None:
            _sh("ip", "link", "set", self.ctl, "up")
        else:
            os.kill(self.sshd.pid, signal.SIGCONT)
        deadline = time.monotonic() + 15
        while True:
            with contextlib.suppress(OSError), socket.create_connection((self.sshd.host, self.sshd.port), timeout=1):
                return
            assert time.monotonic() < deadline, "the control link did not come back"
            time.sleep(0.1)

    def block(self, **over: Any) -> dict[str, Any]:
        """The case's load.host for this namespace host."""
        return {**self.sshd.ssh(), "python": sys.executable, "workdir": str(self.workdir), "reconnect_s": 2.0, **over}

    def clients(self) -> list[int]:
        """Load clients of this load host's runs still running (a failed test must not leave one behind)."""
        out = []
        for d in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                cmd = (d / "cmdline").read_bytes()
                if d.name.isdigit() and b"caseledger.load" in cmd and str(self.workdir).encode() in cmd:
                    out.append(int(d.name))
        return out


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (d / "stat").read_bytes()
            if d.name.isdigit() and int(stat[stat.rfind(b")") + 2 :].split()[1]) == pid:
                out.append(int(d.name))
    return out


def _skip(msg: str) -> None:
    if os.environ.get("CASELEDGER_REQUIRE_SSH") == "1":
        pytest.fail(f"CASELEDGER_REQUIRE_SSH=1 but {msg}")
    pytest.skip(msg)


NO_NETNS_ENV = "CASELEDGER_TEST_NO_NETNS"  # =1: use the loopback fallback even where namespaces work


def _no_netns() -> str | None:
    """Why namespaces cannot be used here, or None."""
    return (
        "network namespaces need root (ip netns add)"
        if os.geteuid() != 0
        else "iproute2 not installed (apt-get install -y iproute2)"
        if shutil.which("ip") is None
        else f"{NO_NETNS_ENV}=1"
        if os.environ.get(NO_NETNS_ENV) == "1"
        else None
    )


@contextlib.contextmanager
def namespace_host(
    root: Path, tag: str = "", nets: tuple[int, int] = (1, 2), target: str | None = None
) -> Iterator[LoadHost]:
    """A load host in a network namespace of its own (the loopback fallback where there is none): a control link
    (10.A.<nets[0]>.x) for SSH and a data link (10.A.<nets[1]>.x); target: an address of this machine on another
    host's data link that this one's clients must reach too (routed over its own data link)."""
    if sshd_binary() is None:
        _skip("sshd not installed (apt-get install -y openssh-server)")
    why = _no_netns()
    n = os.getpid() % 100_000
    a = 100 + os.getpid() % 100
    ns, ctl, ctl_ns, data, data_ns = (f"{x}{tag}{n}" for x in ("clns", "clc", "clcn", "cld", "cldn"))
    made: list[str] = []
    try:
        if why is None:
            try:
                _sh("ip", "netns", "add", ns)
                made.append("ns")
            except (subprocess.CalledProcessError, OSError) as e:
                why = f"cannot create a network namespace here ({e})"
        if why is not None:
            # said, not hidden: the link is then cut by stopping the loopback sshd and killing its connections
            print(f"\ntest_remote_load: no network namespace ({why}); load host = sshd on loopback", file=sys.stderr)
            with running_sshd(root / "sshd") as sshd:
                yield LoadHost(ns=None, ctl=None, here="127.0.0.1", sshd=sshd, workdir=root / "work")
            return
        for host_end, ns_end, net in ((ctl, ctl_ns, nets[0]), (data, data_ns, nets[1])):
            _sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end)
            made.append(host_end)
            _sh("ip", "link", "set", ns_end, "netns", ns)
            _sh("ip", "addr", "add", f"10.{a}.{net}.1/24", "dev", host_end)
            _sh("ip", "link", "set", host_end, "up")
            _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"10.{a}.{net}.2/24", "dev", ns_end)
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", ns_end, "up")
        _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        if target is not None and target != "127.0.0.1":
            _sh("ip", "netns", "exec", ns, "ip", "route", "add", f"{target}/32", "via", f"10.{a}.{nets[1]}.1")
        with running_sshd(root / "sshd", address=f"10.{a}.{nets[0]}.2", prefix=["ip", "netns", "exec", ns]) as sshd:
            yield LoadHost(ns=ns, ctl=ctl, here=target or f"10.{a}.{nets[1]}.1", sshd=sshd, workdir=root / "work")
    finally:
        for host_end in (ctl, data):
            if host_end in made:
                subprocess.run(["ip", "link", "del", host_end], capture_output=True, timeout=30)
        if "ns" in made:
            _kill_in_namespace(ns)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def load_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoadHost]:
    with namespace_host(tmp_path_factory.mktemp("loadhost")) as lh:
        yield lh


@pytest.fixture(scope="module")
def second_load_host(tmp_path_factory: pytest.TempPathFactory, load_host: LoadHost) -> Iterator[LoadHost]:
    """Another load host beside load_host; its clients reach the target where load_host's do."""
    with namespace_host(tmp_path_factory.mktemp("loadhost2"), "b", (3, 4), target=load_host.here) as lh:
        yield lh


def _kill_in_namespace(ns: str) -> None:
    """Whatever still runs in the namespace (a load client a failed test left behind)."""
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30).stdout
    for pid in out.split():
        with contextlib.suppress(OSError):
            os.kill(int(pid), signal.SIGKILL)


@pytest.fixture
def services_stopped(ws: Workspace, load_host: LoadHost) -> Iterator[None]:
    yield
    from caseledger import services  # lazy: as conftest's stop_services

    services.stop_all(ws)
    with contextlib.suppress(subprocess.CalledProcessError):
        load_host.restore()
    for pid in load_host.clients():  # a test that failed half-way must not leave a load client running
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def draft(lh: LoadHost, port: int, n: int, slow: bool = False, **host: Any) -> dict[str, Any]:
    ref = {
        "prefill_tokens_per_s": 200000,
        "decode_step_s": 0.02 if slow else 0.002,
        "decode_step_per_seq_s": 0.0,
        "slots": 8,
    }
    return ref_draft(
        port,
        target={"endpoints": [{"base_url": f"http://{lh.here}:{port}/v1", "model": "ref-model"}]},
        service={"adapter": "reference", "reference": ref},
        dataset={"source": "synthetic", "input_tokens": 64, "output_tokens": 16 if slow else 8},
        load={"requests": n, "concurrency": 2, "host": lh.block(**host)},
    )


def stats(lh: LoadHost, port: int) -> dict[str, Any]:
    return dict(httpx2.get(f"http://{lh.here}:{port}/stats", timeout=5).json())


def evidence(ws: Workspace, run_id: str, phase: str) -> dict[str, Any]:
    return dict(orjson.loads(ws.run(run_id).phase_file(phase).read_bytes()))


def raw_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def remote_load_dir(lh: LoadHost, run_id: str) -> Path:
    return lh.workdir / "ledger" / "runs" / run_id / "load"


def client_starts(lh: LoadHost, run_id: str) -> int:
    """How many load clients began this run's formal load on the load host (their log's start line)."""
    log = remote_load_dir(lh, run_id) / "client.log"
    return sum(f"load: run {run_id}:" in line for line in log.read_text().splitlines())


def start_slow(ws: Workspace, lh: LoadHost, port: int, n: int, records: int = 3) -> tuple[Any, Any]:
    """Start a slow n-request remote load and return (start result, run paths) once `records` records have
    been copied back from the load host."""
    case = freeze_case(ws, draft=draft(lh, port, n, slow=True))
    r = start_run(ws, case.case_id)
    paths = ws.run(r.run_id)
    wait_until("records arrive from the load host", lambda: raw_lines(paths.raw) >= records)
    return r, paths


def wait_until(what: str, cond: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


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
        wait_until("the controller gives the load host up", lambda: not fold(ws, r.run_id).controller_alive, 120)
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
        wait_until("the remote client ends", lambda: (remote / "end.json").exists())
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
    wait_until("the controller is gone", lambda: not fold(ws, r.run_id).controller_alive)
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
    wait_until("the controller ends", lambda: not fold(ws, r.run_id).controller_alive)
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
            "the load host's /metrics answers", lambda: subprocess.run(probe, capture_output=True).returncode == 0
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
    wait_until("the controller ends", lambda: not fold(ws, r.run_id).controller_alive)
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
    wait_until("records of the second host arrive", lambda: raw_lines(paths.load_part(1).raw) >= 2)
    b.cut()
    try:
        wait_until("the controller gives the second host up", lambda: not fold(ws, r.run_id).controller_alive, 120)
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
        wait_until("the cut host's client ends", lambda: (there / "end.json").exists())
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
    wait_until("a record of process 1 arrives", lambda: raw_lines(p1.raw) >= 1)
    os.kill(int(orjson.loads(p1.load_pid.read_bytes())["pid"]), signal.SIGKILL)  # shared pid space; the code asks SSH
    wait_until("the controller ends", lambda: not fold(ws, r.run_id).controller_alive, 120)
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
    wait_until("records of both processes arrive", lambda: all(raw_lines(paths.load_part(k).raw) for k in (0, 1)))
    os.kill(int(orjson.loads(paths.controller_pid.read_bytes())["pid"]), signal.SIGKILL)
    wait_until("the controller is gone", lambda: not fold(ws, r.run_id).controller_alive)
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
    from caseledger.run.remote_hosts import ARMED_SLACK_ENV

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
    wait_until("the armed processes give up", lambda: not run_clients(lh, r.run_id), bound + 20)
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
