"""The command adapter on a remote host over SSH, against a real OpenSSH sshd on loopback.

The sshd (tests/sshd.py) runs on this machine, so the "remote" service is also visible in the local /proc: the
tests use that to prove what the SSH path claims (the pid that serves, its environment shows the sshd session,
nothing left after stop). Without sshd these tests skip, unless CASELEDGER_REQUIRE_SSH=1 makes that a failure.
"""

from __future__ import annotations

import os
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from caseledger import procs, services
from caseledger.case.model import SSH
from caseledger.case.phases import PHASES
from caseledger.errors import CaseInvalid
from caseledger.ledger.state import fold
from caseledger.services import remote
from caseledger.tools import freeze_case, phase_status, start_run
from caseledger.workspace import Workspace, sha256_bytes, sha256_file
from tests.conftest import free_port, ref_draft, stats
from tests.helpers import ACCEL_DATA, target_argv
from tests.sshd import Sshd, generate_key, loopback_sshd, require_sshd, running_sshd

pytestmark = pytest.mark.processes  # hosts, links and leases: the runs here keep real processes


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    yield from loopback_sshd(tmp_path_factory)


def ssh_draft(port: int, ssh: dict[str, Any], argv: list[str] | None = None, **over: Any) -> dict[str, Any]:
    argv = argv or target_argv()
    service = {"adapter": "command", "argv": argv, "ssh": ssh, **over.pop("service", {})}
    return ref_draft(port, service=service, **over)


def evidence(ws: Workspace, run_id: str, phase: str) -> dict[str, Any]:
    return dict(orjson.loads(ws.run(run_id).phase_file(phase).read_bytes()))


def service_state(ws: Workspace, run_id: str) -> dict[str, Any]:
    key = fold(ws, run_id).meta.target_key
    return dict(orjson.loads((ws.services_dir / f"{key}.json").read_bytes()))


def assert_gone(sshd: Sshd, ref: dict[str, Any]) -> None:
    """Neither the remote view (over SSH) nor this machine's /proc shows the process running."""
    assert not remote.Remote(SSH(**sshd.ssh())).alive(ref)
    deadline = time.monotonic() + 10
    while procs.start_time(int(ref["pid"])) is not None and not procs.is_zombie(int(ref["pid"])):
        assert time.monotonic() < deadline, f"pid {ref['pid']} still runs"
        time.sleep(0.05)


@pytest.fixture
def stop_remote(ws: Workspace) -> Iterator[None]:
    yield
    services.stop_all(ws)
    for f in ws.services_dir.glob("*.json") if ws.services_dir.exists() else []:
        Path(remote.log_path(f.stem)).unlink(missing_ok=True)  # the "remote" /tmp is this machine's


@pytest.mark.ssh
@pytest.mark.integration
def test_remote_service_full_run_then_hot_child_reuses_the_same_remote_process(
    ws: Workspace, sshd: Sshd, stop_remote: None
) -> None:
    port = free_port()
    base = freeze_case(ws, draft=ssh_draft(port, sshd.ssh()))
    r1 = start_run(ws, base.case_id, wait=True)
    assert r1.state == "succeeded", r1.text()
    for phase in PHASES:
        assert evidence(ws, r1.run_id, phase)["outcome"] in ("done", "skipped"), phase
    ev = evidence(ws, r1.run_id, "service")
    intended = target_argv(port, "127.0.0.1")
    assert ev["outcome"] == "done" and ev["intended_argv"] == intended and ev["effective_argv"] == intended
    assert ev["host"] == "127.0.0.1" and ev["ssh"]["port"] == sshd.port and ev["ssh"]["user"] == sshd.user
    assert ev["host_key"].startswith("verified against") and "ssh" in ev["verified_by"]
    pid = int(ev["pid"])
    assert stats(port)["pid"] == pid  # the recorded remote pid is the process that answered the load
    # ... and it was started by the sshd session, not by the controller: its environment says so
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert any(e.startswith(b"SSH_CONNECTION=") and e.endswith(f" {sshd.port}".encode()) for e in environ)
    st = service_state(ws, r1.run_id)
    key = fold(ws, r1.run_id).meta.target_key
    assert st["proc"]["host"] == "127.0.0.1" and st["ssh"]["key_path"] == str(sshd.key_path)
    assert not procs.alive(st["proc"])  # the local check refuses another host ...
    assert services.live_service(ws, key) is not None  # ... liveness goes over SSH
    assert Path(remote.log_path(key)).exists() and not (ws.services_dir / f"{key}.log").exists()

    child = freeze_case(
        ws, draft=ssh_draft(port, sshd.ssh(), load={"requests": 8, "concurrency": 4}), parent=base.case_id
    )
    assert [d.path for d in child.delta] == ["load.concurrency"]
    r2 = start_run(ws, child.case_id, wait=True)
    assert r2.state == "succeeded", r2.text()
    v = fold(ws, r2.run_id)
    assert v.phases["service"].state.value == "reused" and v.phases["warmup"].state.value == "reused"
    ev2 = evidence(ws, r2.run_id, "service")
    assert ev2["pid"] == pid and ev2["effective_argv"] == intended and ev2["host"] == "127.0.0.1"
    assert service_state(ws, r2.run_id)["starts"] == 1
    s = stats(port)
    assert s["pid"] == pid and s["by_phase"]["load"] == 16 and s["by_phase"]["warmup"] == 2

    assert services.stop_all(ws) == [key]
    assert_gone(sshd, st["proc"])
    assert services.live_service(ws, key) is None


@pytest.mark.ssh
@pytest.mark.integration
def test_remote_launcher_that_appends_an_override_fails_in_service_naming_it(
    ws: Workspace, sshd: Sshd, stop_remote: None, tmp_path: Path
) -> None:
    port = free_port()
    wrapper = tmp_path / "serve.sh"  # the seeds' "DP16 in the script, DP4 at the end" incident, remotely
    wrapper.write_text(
        f'#!/bin/sh\nexec {sys.executable} -m caseledger.target serve "$@" --config-json \'{{"slots": 1}}\'\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    argv = [str(wrapper), "--host", "{host}", "--port", "{port}", "--model", "ref-model"]
    case = freeze_case(ws, draft=ssh_draft(port, sshd.ssh(), argv=argv))
    r = start_run(ws, case.case_id, wait=True)
    s = phase_status(ws, r.run_id)
    assert s.state == "failed" and s.phase == "service" and s.failure_class == "service"
    assert "--config-json" in (s.blocker or "") and "127.0.0.1" in (s.blocker or "")
    assert s.sent == 0 and not ws.run(r.run_id).load_anchor.exists()
    st = service_state(ws, r.run_id)
    assert "--config-json" in st["effective_argv"] and st["proc"]["host"] == "127.0.0.1"
    assert_gone(sshd, st["proc"])  # the mismatching remote process was stopped, not left serving


@pytest.mark.ssh
@pytest.mark.integration
@pytest.mark.parametrize("problem", ["missing_key_file", "closed_port", "unauthorized_key", "unknown_host_key"])
def test_unusable_ssh_login_refuses_the_start_naming_host_port_and_fix(
    ws: Workspace, sshd: Sshd, stop_remote: None, tmp_path: Path, problem: str
) -> None:
    """The target's lease lives on service.ssh's host: a login that cannot be used refuses start_run itself
    (no run, no lease, nothing sent), naming the login and the fix."""
    ssh_port = sshd.port
    over: dict[str, Any]
    if problem == "missing_key_file":
        over, says, fix = {"key_path": str(tmp_path / "no_such_key")}, "does not exist", "service.ssh.key_path"
    elif problem == "closed_port":
        ssh_port = free_port()
        over, says, fix = {"port": ssh_port}, "connection refused", "service.ssh.host/port"
    elif problem == "unauthorized_key":
        generate_key(tmp_path / "other_key")
        over, says, fix = {"key_path": str(tmp_path / "other_key")}, "refused user", "service.ssh.user/key_path"
    else:
        other = tmp_path / "known_hosts"  # lists another host key for this host and port
        other.write_text(f"[127.0.0.1]:{sshd.port} {generate_key(tmp_path / 'other_host_key')}\n")
        over, says, fix = {"known_hosts": str(other)}, "not verified", "ssh-keyscan"
    case = freeze_case(ws, draft=ssh_draft(free_port(), sshd.ssh(**over)))
    t0 = time.monotonic()
    with pytest.raises(remote.RemoteError) as e:
        start_run(ws, case.case_id, wait=True)
    assert f"127.0.0.1:{ssh_port}" in e.value.message and says in e.value.message, e.value.message
    assert "service.ssh" in e.value.message and fix in (e.value.fix or ""), e.value.fix
    assert not ws.runs_dir.exists() or not list(ws.runs_dir.iterdir())  # no run: nothing was sent
    assert time.monotonic() - t0 < 30  # a short connect timeout, not a hang


@pytest.mark.ssh
@pytest.mark.integration
def test_private_key_and_env_secrets_never_land_in_the_workspace(
    ws: Workspace, sshd: Sshd, stop_remote: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a run that succeeds without a known_hosts file (explicitly accepted and recorded), with a secret passed by
    # reference in service.env, and one refused login
    secret = "s3cret-" + os.urandom(8).hex()
    monkeypatch.setenv("CASELEDGER_TEST_TOKEN", secret)
    port = free_port()
    ok = freeze_case(
        ws,
        draft=ssh_draft(
            port,
            sshd.ssh(known_hosts=None, accept_unknown_host_key=True),
            service={"env": {"TOKEN": "${CASELEDGER_TEST_TOKEN}", "MODE": "a b"}},
        ),
    )
    r1 = start_run(ws, ok.case_id, wait=True)
    assert r1.state == "succeeded", r1.text()
    ev = evidence(ws, r1.run_id, "service")
    assert ev["host_key"].startswith("NOT verified") and ev["ssh"]["accept_unknown_host_key"] is True
    assert ev["env"] == {"TOKEN": "${CASELEDGER_TEST_TOKEN}", "MODE": "a b"}  # references, never values
    environ = Path(f"/proc/{ev['pid']}/environ").read_bytes().split(b"\0")
    assert f"TOKEN={secret}".encode() in environ and b"MODE=a b" in environ  # resolved on the remote side
    assert secret.encode() not in Path(f"/proc/{ev['pid']}/cmdline").read_bytes()
    generate_key(tmp_path / "other_key")
    bad = freeze_case(ws, draft=ssh_draft(free_port(), sshd.ssh(key_path=str(tmp_path / "other_key"))))
    with pytest.raises(remote.RemoteError, match="refused user"):  # the lease on service.ssh's host: no run
        start_run(ws, bad.case_id, wait=True)
    pid_ref = service_state(ws, r1.run_id)["proc"]
    services.stop_all(ws)
    assert_gone(sshd, pid_ref)

    secrets = [secret.encode()]
    for key in (sshd.key_path, tmp_path / "other_key"):
        body = [ln for ln in key.read_bytes().splitlines() if ln and not ln.startswith(b"-----")]
        secrets += [*body, b"".join(body)]
    files = [p for p in ws.root.rglob("*") if p.is_file()]
    assert len(files) > 20
    assert any(str(sshd.key_path).encode() in p.read_bytes() for p in files)  # the path is referenced ...
    leaks = [(str(p), s[:12]) for p in files for s in secrets if s in p.read_bytes()]
    assert leaks == []  # ... the content is nowhere


def test_ssh_login_without_known_hosts_needs_the_explicit_opt_in(ws: Workspace) -> None:
    ssh = {"host": "127.0.0.1", "user": "bench", "key_path": "~/.ssh/id_ed25519"}
    with pytest.raises(CaseInvalid) as e:
        freeze_case(ws, draft=ssh_draft(18001, ssh))
    assert "accept_unknown_host_key" in str(e.value)
    with pytest.raises(CaseInvalid) as e:
        freeze_case(
            ws,
            draft=ref_draft(18001, service={"adapter": "reference", "ssh": {**ssh, "port": 2222, "known_hosts": "/k"}}),
        )
    assert "adapter 'command'" in str(e.value)
    with pytest.raises(CaseInvalid) as e:
        freeze_case(ws, draft=ssh_draft(18001, {**ssh, "known_hosts": "/k", "key_path": "id_ed25519"}))
    assert "key_path" in str(e.value)
    c = freeze_case(ws, draft=ssh_draft(18001, {**ssh, "accept_unknown_host_key": True}))
    stored = orjson.loads(Path(c.path).read_bytes())
    assert stored["service"]["ssh"] == {**ssh, "port": 22, "known_hosts": None, "accept_unknown_host_key": True}


@pytest.mark.ssh
@pytest.mark.integration
def test_remote_component_files_and_env_are_read_back_over_ssh(
    ws: Workspace, sshd: Sshd, stop_remote: None, tmp_path: Path
) -> None:
    ports = (free_port(), free_port())
    exe = os.path.realpath(sys.executable)  # the interpreter maps its own binary while it serves

    def draft(files: list[dict[str, Any]]) -> dict[str, Any]:
        d = ref_draft(ports[0])
        d["target"]["endpoints"] = [{"base_url": f"http://127.0.0.1:{p}/v1", "model": "ref-model"} for p in ports]
        argv = target_argv(model="{model}")
        d["service"] = {
            "adapter": "command",
            "components": [
                {"name": "local", "argv": argv, "routes": [0]},
                {
                    "name": "far",
                    "argv": argv,
                    "routes": [1],
                    "ssh": sshd.ssh(),
                    "env": {"EXPERT_LAYOUT": "v2"},
                    "files": files,
                },
            ],
        }
        return d

    r = start_run(ws, freeze_case(ws, draft=draft([{"path": exe, "held": True}])).case_id, wait=True)
    assert r.state == "succeeded", r.text()
    far = next(c for c in evidence(ws, r.run_id, "service")["components"] if c["name"] == "far")
    assert far["host"] == "127.0.0.1" and far["files"] == [
        {"path": exe, "sha256": sha256_file(Path(exe)), "held": True}
    ]  # hashed over SSH (sha256sum there)
    assert far["env_sha256"] == {"EXPERT_LAYOUT": sha256_bytes(b"v2")[:12]}
    # the "remote" process is on this machine: its environment really holds the value whose hash was compared
    assert b"EXPERT_LAYOUT=v2" in Path(f"/proc/{far['pid']}/environ").read_bytes().split(b"\0")
    services.stop_all(ws)

    other = tmp_path / "layout.bin"  # declared, held by no process
    other.write_bytes(b"expert layout v3")
    r2 = start_run(ws, freeze_case(ws, draft=draft([{"path": str(other), "held": True}])).case_id, wait=True)
    s = phase_status(ws, r2.run_id)
    assert s.state == "failed" and s.phase == "service", s.text()
    err = evidence(ws, r2.run_id, "service")["error"]
    assert "component 'far'" in err and "on 127.0.0.1" in err and "not open or mapped" in err, err
    assert f"intended sha256 {sha256_file(other)[:16]}" in err, err
    assert s.sent == 0


@pytest.mark.ssh
@pytest.mark.integration
@pytest.mark.processes  # sampled by a detached controller while its client loads (an inline client returns first)
def test_a_service_over_ssh_has_its_hosts_devices_read_there_and_a_shared_one_distorts_the_window(
    ws: Workspace, stop_remote: None, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A service host reached over SSH whose PATH has nvidia-smi (the recorded outputs, with the service's own pid
    where the engine's workers were): its devices are read there during the window, each named by the host, the
    service's process is told from pid 4242 by its session on that host, and the shared device makes the window
    distorted. The outputs are recorded, not live: no accelerator exists here."""
    require_sshd()  # this test starts its own sshd (the "GPU host"), not the module's
    port = free_port()
    bin_dir = tmp_path / "gpu-host-bin"
    bin_dir.mkdir()
    tool = bin_dir / "nvidia-smi"
    tool.write_text(
        "#!/bin/sh\n"
        f'svc=$(pgrep -o -f -- "caseledger.target serve --host 127.0.0.1 --port {port} ")\n'
        'case "$1" in\n'
        f'  --query-gpu=*) cat "{ACCEL_DATA}/nvidia-smi-query-gpu.csv" ;;\n'
        f'  --query-compute-apps=*) sed -e "s/, 4121,/, $svc,/" -e "s/, 4187,/, $svc,/" '
        f'"{ACCEL_DATA}/nvidia-smi-query-compute-apps.csv" ;;\n'
        "  *) exit 2 ;;\n"
        "esac\n"
    )
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    config = '{"prefill_tokens_per_s": 200000, "decode_step_s": 0.05, "decode_step_per_seq_s": 0.0}'
    argv = [*target_argv(), "--config-json", config]
    path = {"PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin"}  # the "GPU host"'s sessions find its nvidia-smi
    with running_sshd(tmp_path_factory.mktemp("gpu-host"), setenv=path) as host:
        try:
            _read_there(ws, port, host, argv)
        finally:
            services.stop_all(ws)  # over this sshd, before it stops: the service on the "GPU host" goes with it


def _read_there(ws: Workspace, port: int, host: Sshd, argv: list[str]) -> None:
    """The run on the "GPU host" and what its evidence says (see the test above)."""
    draft = ssh_draft(
        port,
        host.ssh(),
        argv,
        dataset={"source": "synthetic", "input_tokens": 64, "output_tokens": 16},
        load={"requests": 16, "concurrency": 4},
    )
    r = start_run(ws, freeze_case(ws, draft=draft).case_id, wait=True, timeout_s=180)
    assert r.run_id is not None, r.text()
    pid = int(evidence(ws, r.run_id, "service")["pid"])
    lines = [orjson.loads(x) for x in ws.run(r.run_id).load_accel.read_bytes().splitlines()]
    assert len(lines) >= 2 and all(x["host"] == "127.0.0.1" and x["tool"] == "nvidia-smi" for x in lines), lines
    first = lines[0]["devices"]
    assert [d["index"] for d in first] == ["127.0.0.1:0", "127.0.0.1:1"], first
    assert {(p["pid"], p["ours"]) for d in first for p in d["processes"]} == {(pid, True), (4242, False)}, first
    report = ws.run(r.run_id).report_md.read_text()
    assert "accelerators, whole window: nvidia-smi" in report and "device 127.0.0.1:0" in report, report
    assert "was shared with another process during the window: pid 4242 2048 MiB" in report, report
    d = orjson.loads(ws.run(r.run_id).decision.read_bytes())
    assert d["outcome"] == "insufficient" and any("pid 4242" in m for m in d["missing"]), d
