"""The target's lease kept on its SSH host (target.lease_host / service.ssh), against a real OpenSSH sshd.

Controllers with different host lease directories (CASELEDGER_HOST_DIR: different machines, or containers with
different /run) must still see one owner of a target whose lease lives on its SSH host. The sshd runs on this
machine, so the lease host's directory is a local temporary directory the tests can read (and, to simulate
another controller host taking the lease over, write through the same SSH script a controller uses).
Without sshd these tests skip, unless CASELEDGER_REQUIRE_SSH=1 makes that a failure.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from caseledger import procs
from caseledger.case.model import Case
from caseledger.case.store import load_case
from caseledger.errors import FenceRejected, RemoteError, TargetHeld
from caseledger.ledger import authorization
from caseledger.ledger.leases import Lease, target_key
from caseledger.run import lease as run_lease
from caseledger.services import lease_host
from caseledger.tools import freeze_case, phase_status, start_run
from caseledger.workspace import Workspace, read_json_or_none
from tests.conftest import free_port, ref_draft, reference_targets, stats
from tests.helpers import wait_until
from tests.sshd import Sshd, loopback_sshd

pytestmark = pytest.mark.processes  # hosts, links and leases: the runs here keep real processes

N = 8
FAST = {"prefill_tokens_per_s": 200000, "decode_step_s": 0.002, "decode_step_per_seq_s": 0.0002, "slots": 8}
SLOW = {"prefill_tokens_per_s": 200000, "decode_step_s": 0.05, "decode_step_per_seq_s": 0.0, "slots": 8}
TRIALS = 10  # each trial is a whole run (2-3 s) racing from two processes


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    yield from loopback_sshd(tmp_path_factory)


def workspace(root: Path) -> Workspace:
    w = Workspace(root)
    (w.root / "cases").mkdir(parents=True)
    authorization.set_mode(w, "auto")
    return w


def leased_draft(port: int, sshd: Sshd, lease_dir: Path, **over: Any) -> dict[str, Any]:
    """An external reference target whose lease lives on the sshd's host, in lease_dir."""
    d = ref_draft(port, service={"adapter": "external"}, **over)
    d["target"] = {**d["target"], "lease_host": sshd.ssh(dir=str(lease_dir))}
    return d


def lease_file(lease_dir: Path, key: str) -> tuple[int, str, int]:
    """(fence, run id, expiry ms) from the lease file's header on the lease host."""
    head = (lease_dir / f"{key}.lease").read_text().splitlines()[0].split()
    return int(head[0]), head[1], int(head[2])


def test_host_dirs_see_each_other_only_when_the_lease_lives_on_the_ssh_host(
    tmp_path: Path, sshd: Sshd, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()  # nothing is sent: leases only
    ws_a, ws_b = workspace(tmp_path / "a"), workspace(tmp_path / "b")
    dirs = {"a": tmp_path / "host-a", "b": tmp_path / "host-b"}

    def on(host: str) -> None:
        monkeypatch.setenv("CASELEDGER_HOST_DIR", str(dirs[host]))

    local = Case.model_validate(ref_draft(port, service={"adapter": "external"}))
    leased = Case.model_validate(leased_draft(port, sshd, tmp_path / "lease-host"))
    key = target_key(local.canonical())
    assert key == target_key(leased.canonical())  # the same target either way
    # control: with host-local leases, two host directories both take the target (what the lease host fixes)
    on("a")
    assert run_lease.acquire(ws_a, local, key, "r-a0", owner=None).fence == 1
    on("b")
    assert run_lease.acquire(ws_b, local, key, "r-b0", owner=None).fence == 1
    run_lease.release(ws_b, local, key, "r-b0", 1)
    on("a")
    run_lease.release(ws_a, local, key, "r-a0", 1)
    # on the lease host: one owner, seen from the other host directory, with the holder named
    on("a")
    la = run_lease.acquire(ws_a, leased, key, "r-a1", owner=None)
    on("b")
    with pytest.raises(TargetHeld, match=r"held by run r-a1 in workspace .*lease on lease host .*@127\.0\.0\.1:"):
        run_lease.acquire(ws_b, leased, key, "r-b1", owner=None)
    on("a")
    run_lease.renew(ws_a, leased, key, "r-a1", la.fence, owner=procs.me())
    run_lease.release(ws_a, leased, key, "r-a1", la.fence)
    on("b")
    lb = run_lease.acquire(ws_b, leased, key, "r-b1", owner=None)
    assert lb.fence == la.fence + 1 == lease_file(tmp_path / "lease-host", key)[0]
    on("a")  # the stale owner's renewal is refused, and its host's mirror now carries the newer fence
    with pytest.raises(FenceRejected, match="no longer held by run r-a1"):
        run_lease.renew(ws_a, leased, key, "r-a1", la.fence)
    mirror = read_json_or_none(dirs["a"] / f"{key}.json")
    assert mirror is not None and mirror["fence"] == lb.fence and mirror["run_id"] == "r-b1"


def test_a_lapsed_lease_on_the_lease_host_is_taken_over_with_a_larger_fence(
    tmp_path: Path, sshd: Sshd, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = workspace(tmp_path / "w")
    lease_dir = tmp_path / "lease-host"
    case = Case.model_validate(leased_draft(free_port(), sshd, lease_dir))
    key = target_key(case.canonical())
    dead = {"pid": 2**22 + 7, "start_time": 1, "host": procs.me()["host"]}  # a controller that died, never released
    first = run_lease.acquire(ws, case, key, "r-old", owner=dead)
    fence, run, _ = lease_file(lease_dir, key)
    assert (fence, run) == (first.fence, "r-old")
    with pytest.raises(TargetHeld, match="held by run r-old"):  # not yet expired
        run_lease.acquire(ws, case, key, "r-new", owner=None)
    path = lease_dir / f"{key}.lease"
    _, body = path.read_text().split("\n", 1)
    path.write_text(f"{fence} r-old {int(time.time() * 1000) - 1}\n{body}")  # its expiry passes, unrenewed
    took = run_lease.acquire(ws, case, key, "r-new", owner=None)
    assert took.fence == first.fence + 1 and lease_file(lease_dir, key)[:2] == (took.fence, "r-new")


def test_an_unreachable_lease_host_refuses_start_naming_it_and_starts_nothing(tmp_path: Path) -> None:
    ws = workspace(tmp_path / "w")
    (tmp_path / "k").write_text("not a key")
    dead_port = free_port()  # nothing listens there
    d = ref_draft(free_port(), service={"adapter": "external"})
    d["target"]["lease_host"] = {
        "host": "127.0.0.1",
        "port": dead_port,
        "user": "nobody",
        "key_path": str(tmp_path / "k"),
        "accept_unknown_host_key": True,
    }
    cid = freeze_case(ws, draft=d).case_id
    with pytest.raises(RemoteError) as e:
        start_run(ws, cid)
    assert f"127.0.0.1:{dead_port}" in e.value.message and "target.lease_host" in e.value.message
    assert "Nothing was started" in (e.value.fix or "")
    assert not ws.runs_dir.exists() or not list(ws.runs_dir.iterdir())


def test_a_bad_lease_host_is_refused_at_freeze_naming_the_field(tmp_path: Path) -> None:
    d = ref_draft(free_port())
    d["target"]["lease_host"] = {
        "host": "h",
        "user": "u",
        "key_path": "/k",
        "dir": "relative/dir",
        "known_hosts": "/kh",
    }
    with pytest.raises(ValueError, match=r"target\.lease_host\.dir"):
        Case.model_validate(d)
    d["target"]["lease_host"] = {"host": "h", "user": "u", "key_path": "/k"}
    with pytest.raises(ValueError, match=r"target\.lease_host\.known_hosts is null"):
        Case.model_validate(d)


class Racer:
    """A start_run process with its own host lease directory (tests/lease_racer.py)."""

    def __init__(self, ws: Workspace, case_id: str, host_dir: Path, log: Path) -> None:
        env = {**os.environ, "CASELEDGER_HOST_DIR": str(host_dir)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.lease_racer", str(ws.root), case_id],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log.open("ab"),
            env=env,
            cwd=Path(__file__).parent.parent,
            text=True,
        )
        assert self.readline() == "ready"

    def readline(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def result(self) -> dict[str, Any]:
        return dict(orjson.loads(self.readline()))

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


def test_two_controller_hosts_racing_one_target_give_exactly_one_load_in_each_of_10_trials(
    tmp_path: Path, sshd: Sshd
) -> None:
    with reference_targets({"t": FAST}, tmp_path / "targets") as served:
        port = served["t"].port
        draft = leased_draft(port, sshd, tmp_path / "lease-host")
        racers = []
        try:
            for name in ("a", "b"):
                w = workspace(tmp_path / name)
                racers.append(
                    Racer(
                        w,
                        freeze_case(w, draft=draft).case_id,
                        tmp_path / f"host-{name}",
                        tmp_path / f"racer-{name}.log",
                    )
                )
            fences = []
            for trial in range(TRIALS):
                before = int(stats(port)["by_phase"].get("load", 0))
                for r in racers:
                    r.go()
                out = [r.result() for r in racers]
                won = [o for o in out if o["ok"]]
                lost = [o for o in out if not o["ok"]]
                assert len(won) == 1 and won[0]["state"] == "succeeded", f"trial {trial}: {out}"
                held = lost[0]["error"] == "TargetHeld" and "in workspace" in lost[0]["message"]
                assert held, f"trial {trial}: {out}"
                assert int(stats(port)["by_phase"].get("load", 0)) - before == N, f"trial {trial}: {out}"
                fences.append(
                    lease_file(tmp_path / "lease-host", target_key(Case.model_validate(draft).canonical()))[0]
                )
            assert fences == sorted(set(fences)), fences  # strictly increasing across both hosts
        finally:
            for r in racers:
                r.close()


def sshd_processes(sshd: Sshd) -> list[int]:
    """The sshd listener and every process under it (the per-connection sessions)."""
    kids: dict[int, list[int]] = {}
    for st in Path("/proc").glob("[0-9]*/stat"):
        try:
            data = st.read_bytes()
        except OSError:
            continue
        ppid = int(data[data.rfind(b")") + 2 :].split()[1])
        kids.setdefault(ppid, []).append(int(st.parent.name))
    out, todo = [], [sshd.pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def slow_run(
    tmp_path: Path, sshd: Sshd, monkeypatch: pytest.MonkeyPatch, served: dict[str, Any]
) -> tuple[Workspace, str, int, str]:
    """A 40-request load (about 8 s) on a target leased on the sshd's host, started and sending."""
    port = served["t"].port
    monkeypatch.setenv("CASELEDGER_LEASE_S", "6")  # the controller renews every 2 s
    ws = workspace(tmp_path / "w")
    draft = leased_draft(
        port, sshd, tmp_path / "lease-host", load={"requests": 40, "concurrency": 2}, warmup={"requests": 0}
    )
    r = start_run(ws, freeze_case(ws, draft=draft).case_id)
    assert r.run_id is not None
    try:
        wait_until(lambda: int(stats(port)["by_phase"].get("load", 0)) >= 2, 60, "the formal load to begin")
    except AssertionError:
        log = ws.run(r.run_id).controller_log
        tail = log.read_text()[-800:] if log.exists() else ""
        raise AssertionError(phase_status(ws, r.run_id).text() + tail) from None
    return ws, r.run_id, port, target_key(Case.model_validate(draft).canonical())


def assert_stopped(ws: Workspace, run_id: str, port: int) -> float:
    """The controller and its load client are gone, and the target sees no more of this run's requests; the
    time the load client was first seen gone."""
    paths = ws.run(run_id)
    wait_until(lambda: not procs.alive(read_json_or_none(paths.controller_pid)), 20, "the controller to stop")
    wait_until(lambda: not procs.alive(read_json_or_none(paths.load_pid)), 10, "the load client to stop")
    gone_at = time.time()
    count = int(stats(port)["by_phase"].get("load", 0))
    time.sleep(1.0)
    assert int(stats(port)["by_phase"].get("load", 0)) == count < 40
    assert "lost the target's lease, stopping the load" in paths.controller_log.read_text()
    return gone_at


def test_a_fenced_stale_controller_stops_its_load(tmp_path: Path, sshd: Sshd, monkeypatch: pytest.MonkeyPatch) -> None:
    with reference_targets({"t": SLOW}, tmp_path / "targets") as served:
        ws, run_id, port, key = slow_run(tmp_path, sshd, monkeypatch, served)
        lease_dir = tmp_path / "lease-host"
        case = load_case(ws, phase_status(ws, run_id).case_id)
        assert case.target.lease_host is not None
        # another controller host takes the target over (as after a lapse it judged): a larger fence. It takes
        # exactly the lease it read; a renewal in between changes the expiry, so it reads again
        for _ in range(20):
            fence, run, exp = lease_file(lease_dir, key)
            assert run == run_id
            ans = lease_host.operate(
                case.target.lease_host,
                "acquire",
                key,
                Lease(key, "r-other", None, 0, 0.0),
                seen=f"{fence}:{exp}",
                lease_s=60,
            )
            if ans.status == 0:
                break
        assert ans.status == 0 and lease_file(lease_dir, key)[:2] == (fence + 1, "r-other")
        assert_stopped(ws, run_id, port)
        assert "no longer held by run" in ws.run(run_id).controller_log.read_text()


def test_a_controller_that_cannot_reach_the_lease_host_stops_before_its_lease_expires(
    tmp_path: Path, sshd: Sshd, monkeypatch: pytest.MonkeyPatch
) -> None:
    with reference_targets({"t": SLOW}, tmp_path / "targets") as served:
        ws, run_id, port, key = slow_run(tmp_path, sshd, monkeypatch, served)
        frozen = sshd_processes(sshd)
        try:
            for p in frozen:  # the lease host stops answering (its sshd and sessions are stopped, not closed)
                with contextlib.suppress(ProcessLookupError):  # a session's short-lived command may be gone
                    os.kill(p, signal.SIGSTOP)
            gone_at = assert_stopped(ws, run_id, port)
        finally:
            for p in frozen:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGCONT)
        _, run, expires_ms = lease_file(tmp_path / "lease-host", key)
        # the lease it last renewed was still valid when its load had already stopped
        assert run == run_id and gone_at < expires_ms / 1000.0, (gone_at, expires_ms / 1000.0)
