"""The launcher seam (services/launch.py): one health wait for local and SSH launchers, on real processes.

A local child that exits before health fails the wait at once with its log's last line (secrets masked) and
the log's path; one that becomes healthy passes and keeps running; one that never does is stopped when the
time runs out. Each launcher's probe schedule holds: locally the process is polled on every pass, over SSH
(a real sshd on loopback) about once a second while health is asked every pass. The recorded service state
written by the previous code loads and rewrites unchanged."""

from __future__ import annotations

import http.server
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from caseledger import procs, redact
from caseledger.case.model import SSH
from caseledger.errors import PhaseFailed
from caseledger.services import remote
from caseledger.services.identity import Unit
from caseledger.services.launch import LocalLauncher, SshLauncher, wait_health
from caseledger.services.live import read_state, state_path
from caseledger.workspace import Workspace, write_json
from tests.conftest import free_port
from tests.sshd import Sshd, loopback_sshd

STATES = Path(__file__).parent / "data" / "service_state"


def unit(port: int, timeout_s: float = 30.0) -> Unit:
    return Unit("", "service", (), {}, None, (0,), f"http://127.0.0.1:{port}/health", timeout_s)


class HealthServer:
    """A health endpoint on loopback that answers 503 until `ready_after_s` has passed, then 200; counts probes."""

    def __init__(self, ready_after_s: float) -> None:
        self.hits = 0
        self.ready_at = time.monotonic() + ready_after_s
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.hits += 1
                code = 200 if time.monotonic() >= outer.ready_at else 503
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def health() -> Iterator[HealthServer]:
    s = HealthServer(ready_after_s=3.0)
    yield s
    s.close()


class CountingLocal(LocalLauncher):
    """The real local launcher, its liveness probes counted."""

    probes = 0

    def exit_status(self) -> str | None:
        self.probes += 1
        return super().exit_status()


class CountingSsh(SshLauncher):
    """The real SSH launcher, its liveness probes (each an SSH exec) counted."""

    probes = 0

    def exit_status(self) -> str | None:
        self.probes += 1
        return super().exit_status()


def local(ws: Workspace, name: str = "t-x") -> LocalLauncher:
    return LocalLauncher(ws.root, "the service", ws.services_dir / f"{name}.log")


SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.mark.integration
def test_local_child_that_exits_before_health_fails_at_once_naming_its_last_log_line_and_the_log(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAUNCH_TEST_TOKEN", "tok-5d1f0c9a7e")
    redact.remember(["LAUNCH_TEST_TOKEN"])
    lc = local(ws)
    script = "import sys; print('loading'); print('bad --flag, token tok-5d1f0c9a7e', flush=True); sys.exit(3)"
    lc.spawn([sys.executable, "-c", script], {})
    t0 = time.monotonic()
    with pytest.raises(PhaseFailed) as e:
        wait_health(lc, unit(free_port(), timeout_s=60))
    assert time.monotonic() - t0 < 10  # the exit ends the wait, not the 60 s timeout
    assert e.value.message.startswith("the service exited with code 3 before health: bad --flag, token ")
    assert "tok-5d1f0c9a7e" not in e.value.message
    assert e.value.fix == f"read {ws.services_dir / 't-x.log'}; fix the case's service and resume"


@pytest.mark.integration
def test_local_child_that_becomes_healthy_passes_and_keeps_running(ws: Workspace, health: HealthServer) -> None:
    lc = CountingLocal(ws.root, "the service", ws.services_dir / "t-x.log")
    ref = lc.spawn(SLEEPER, {})
    try:
        t0 = time.monotonic()
        wait_health(lc, unit(health.port))
        assert 2.5 < time.monotonic() - t0 < 10
        # polled on every pass: one probe after each health answer but the last (a 200 returns at once)
        assert lc.probes == health.hits - 1 >= 5, (lc.probes, health.hits)
        assert procs.alive(ref) and lc.exit_status() is None
    finally:
        lc.kill()
    assert not procs.alive(ref)


@pytest.mark.integration
def test_local_child_that_never_answers_is_stopped_when_time_runs_out(ws: Workspace) -> None:
    lc = local(ws)
    ref = lc.spawn(SLEEPER, {})
    port = free_port()
    with pytest.raises(PhaseFailed) as e:
        wait_health(lc, unit(port, timeout_s=1.5))
    assert e.value.message == f"the service not healthy at http://127.0.0.1:{port}/health after 1.5s"
    assert e.value.fix == f"raise the health timeout or read {ws.services_dir / 't-x.log'}"
    assert not procs.alive(ref) and lc.exit_status() is not None


@pytest.mark.integration
def test_local_argv_that_cannot_start_names_argv0_and_the_fix(ws: Workspace) -> None:
    with pytest.raises(PhaseFailed) as e:
        local(ws).spawn([str(ws.root / "no-such-engine")], {})
    assert "cannot start the service: argv[0]" in e.value.message and "no-such-engine" in e.value.message
    assert e.value.fix == "fix service.argv in a new case"


def test_a_launcher_refuses_questions_before_it_spawned(ws: Workspace) -> None:
    with pytest.raises(RuntimeError, match="spawn"):
        local(ws).kill()


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    yield from loopback_sshd(tmp_path_factory)


@pytest.fixture
def ssh_log() -> Iterator[str]:
    log = remote.log_path(f"t-launch-{time.monotonic_ns()}")
    yield log
    Path(log).unlink(missing_ok=True)  # the "remote" /tmp is this machine's


@pytest.mark.ssh
@pytest.mark.integration
def test_ssh_child_that_becomes_healthy_is_probed_about_once_a_second(
    sshd: Sshd, health: HealthServer, ssh_log: str
) -> None:
    sl = CountingSsh(SSH(**sshd.ssh()), ssh_log)
    ref = sl.spawn(SLEEPER, {})
    try:
        wait_health(sl, unit(health.port))
        # about 3 s of waiting: probes at ~0.5, ~1.5, ~2.5 s (each an SSH exec), health on every pass
        assert 1 <= sl.probes <= 4 and health.hits >= 2 * sl.probes + 1, (sl.probes, health.hits)
        assert sl.exit_status() is None
    finally:
        sl.kill()
    assert not remote.Remote(SSH(**sshd.ssh())).alive(ref)


@pytest.mark.ssh
@pytest.mark.integration
def test_ssh_child_that_exits_before_health_fails_naming_its_last_log_line_and_the_remote_log(
    sshd: Sshd, ssh_log: str
) -> None:
    sl = SshLauncher(SSH(**sshd.ssh()), ssh_log)
    sl.spawn([sys.executable, "-c", "import sys; print('cannot bind', flush=True); sys.exit(1)"], {})
    t0 = time.monotonic()
    with pytest.raises(PhaseFailed) as e:
        wait_health(sl, unit(free_port(), timeout_s=60))
    assert time.monotonic() - t0 < 15
    assert e.value.message == f"the service on {sshd.host} exited before health: cannot bind"
    assert e.value.fix == f"read {sshd.user}@{sshd.host}:{ssh_log}; fix the case's service and resume"


@pytest.mark.parametrize("name", sorted(p.stem for p in STATES.glob("*.json")))
def test_state_file_written_by_the_previous_code_loads_and_rewrites_unchanged(ws: Workspace, name: str) -> None:
    raw = (STATES / f"{name}.json").read_bytes()
    ws.services_dir.mkdir(parents=True, exist_ok=True)
    state_path(ws, "t-old").write_bytes(raw)
    st = read_state(ws, "t-old")
    assert st == orjson.loads(raw) and st  # nothing dropped, nothing coerced
    proc = st.get("proc")
    assert proc is None or (type(proc["pid"]) is int and type(proc["start_time"]) is int and proc["host"])
    write_json(state_path(ws, "t-new"), st)
    assert state_path(ws, "t-new").read_bytes() == raw


def test_state_with_a_key_the_model_does_not_know_keeps_it_and_a_malformed_proc_reads_as_none(ws: Workspace) -> None:
    base = orjson.loads((STATES / "local.json").read_bytes())
    ws.services_dir.mkdir(parents=True, exist_ok=True)
    write_json(state_path(ws, "t-a"), {**base, "later_field": {"kept": True}})
    assert read_state(ws, "t-a")["later_field"] == {"kept": True}  # type: ignore[typeddict-item]
    write_json(state_path(ws, "t-b"), {**base, "proc": {"pid": "not-a-pid"}})
    assert read_state(ws, "t-b") == {}
