"""service.components without an engine: two reference-target processes as two routes (command adapter), the
case model's rules for components, and the effective-identity checks on real processes (held files by inode,
env by value hash). The same paths run on llama-server in tests/test_components.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from caseledger import services
from caseledger.case.model import Case
from caseledger.errors import CaseInvalid
from caseledger.services import identity, live
from caseledger.tools import freeze_case, phase_status, resume, start_run
from caseledger.views.scenario import scenario_view
from caseledger.workspace import Workspace, read_json, sha256_file
from tests.conftest import free_port, ref_draft, start_with_fault, stats, tree_digest
from tests.helpers import target_argv


def two_routes(ports: tuple[int, int], **comp: Any) -> dict[str, Any]:
    d = ref_draft(ports[0])
    d["target"]["endpoints"] = [{"base_url": f"http://127.0.0.1:{p}/v1", "model": "ref-model"} for p in ports]
    d["service"] = {
        "adapter": "command",
        "components": [
            {"name": f"r{k}", "argv": target_argv(model="{model}"), "routes": [k], **comp} for k in range(2)
        ],
    }
    d["load"] = {"requests": 8, "concurrency": 2}
    return d


def service_ev(ws: Workspace, run_id: str) -> dict[str, Any]:
    return dict(read_json(ws.run(run_id).phase_file("service")))


def pids(ev: dict[str, Any]) -> dict[str, int]:
    return {c["name"]: c["pid"] for c in ev["components"]}


def wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[-1][:3]:
        assert time.monotonic() < deadline, f"pid {pid} still runs"
        time.sleep(0.05)


@pytest.fixture
def ports(ws: Workspace, stop_services: None) -> Iterator[tuple[int, int]]:
    yield free_port(), free_port()


BAD = {
    "route out of range": (
        lambda d: d["service"]["components"][1].update(routes=[2]),
        "route 2 does not exist (target.endpoints has 2)",
    ),
    "route twice": (lambda d: d["service"]["components"][1].update(routes=[0]), "route 0 is served by two components"),
    "route unserved": (
        lambda d: d["service"]["components"][1].update(routes=[], health_url="http://x:1/h", argv=["sleep", "1"]),
        "route 1 (http://127.0.0.1:",
    ),
    "argv beside components": (
        lambda d: d["service"].update(argv=["x"]),
        "service.argv is set beside service.components",
    ),
    "placeholder without route": (
        lambda d: d["service"]["components"][1].update(routes=[]),
        "'r1': argv uses {host} but routes is []",
    ),
    "same name twice": (lambda d: d["service"]["components"][1].update(name="r0"), "the name 'r0' is used twice"),
    "not command": (lambda d: d["service"].update(adapter="reference"), "service.components needs adapter 'command'"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_malformed_components_are_refused_naming_the_field_and_writing_nothing(name: str, ws: Workspace) -> None:
    edit, says = BAD[name]
    d = two_routes((free_port(), free_port()))
    edit(d)
    before = tree_digest(ws.root)
    with pytest.raises(CaseInvalid) as e:
        freeze_case(ws, draft=d)
    assert says in e.value.message and "service" in e.value.message, e.value.message
    assert e.value.fix
    assert tree_digest(ws.root) == before


def test_single_process_cases_keep_their_canonical_form() -> None:
    d = ref_draft(free_port())
    canon = Case.model_validate(d).canonical()
    assert "components" not in canon["service"]  # case ids frozen before components existed are unchanged


@pytest.mark.processes
@pytest.mark.integration
def test_a_dead_component_is_restarted_alone_and_only_its_route_is_warmed(
    ws: Workspace, ports: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    case = freeze_case(ws, draft=two_routes(ports))
    r = start_with_fault(monkeypatch, "controller:exit_before=load", ws, case.case_id, wait=True)
    deadline = time.monotonic() + 60
    while phase_status(ws, r.run_id).owner_alive and time.monotonic() < deadline:
        time.sleep(0.05)
    before = pids(service_ev(ws, r.run_id))
    assert {k: stats(p)["pid"] for k, p in zip(("r0", "r1"), ports, strict=True)} == before
    os.kill(before["r0"], signal.SIGKILL)
    wait_gone(before["r0"])
    s = phase_status(ws, r.run_id)
    assert s.service_alive is False and f"r0 pid {before['r0']}" in s.text(), s.text()
    warm1 = stats(ports[1])["by_phase"]

    res = resume(ws, r.run_id, wait=True)
    assert res.state == "succeeded", phase_status(ws, r.run_id).text()
    ev = service_ev(ws, r.run_id)
    after = pids(ev)
    assert after["r1"] == before["r1"] and after["r0"] != before["r0"]
    assert (ev["restarted"], ev["reused"], ev["changed_routes"]) == (["r0"], ["r1"], [0])
    # route 1's process got only its share of the formal load: no second warmup, no second route check
    by1 = stats(ports[1])["by_phase"]
    assert by1.get("warmup") == warm1.get("warmup") and by1.get("route_verify") == warm1.get("route_verify")
    by0 = stats(ports[0])["by_phase"]
    assert by0.get("warmup") == 2 and by0.get("route_verify") == 1  # the new process on route 0 was warmed
    assert by0["load"] + by1["load"] == 8 and by0["load"] == by1["load"] == 4  # round-robin over the routes

    # the next run of the same case keeps both processes and their warm state
    r2 = start_run(ws, case.case_id, wait=True)
    assert r2.state == "succeeded"
    ev2 = service_ev(ws, r2.run_id)
    assert ev2["outcome"] == "reused" and pids(ev2) == after


@pytest.mark.integration
def test_declared_held_files_are_checked_in_the_live_process(
    ws: Workspace, ports: tuple[int, int], tmp_path: Path
) -> None:
    exe = os.path.realpath(sys.executable)  # the interpreter maps its own binary while it serves
    held = two_routes(ports, files=[{"path": exe, "held": True}])
    r = start_run(ws, freeze_case(ws, draft=held).case_id, wait=True)
    assert r.state == "succeeded", r.text()
    for c in service_ev(ws, r.run_id)["components"]:
        assert c["files"] == [{"path": exe, "sha256": sha256_file(Path(exe)), "held": True}]
    services.stop_all(ws)

    other = tmp_path / "layout.bin"  # declared, but no process opens it
    other.write_bytes(b"expert layout v2")
    d = two_routes(ports, files=[{"path": str(other), "held": True}])
    r2 = start_run(ws, freeze_case(ws, draft=d).case_id, wait=True)
    s = phase_status(ws, r2.run_id)
    assert s.state == "failed" and s.phase == "service" and s.failure_class == "service", s.text()
    err = read_json(ws.run(r2.run_id).phase_file("service"))["error"]
    assert f"files {other}: intended sha256 {sha256_file(other)[:16]}" in err and "not open or mapped" in err, err
    assert s.sent == 0 and stats_down(ports[0])

    pinned = two_routes(ports, files=[{"path": str(other), "sha256": "0" * 64}])
    r3 = start_run(ws, freeze_case(ws, draft=pinned).case_id, wait=True)
    err3 = read_json(ws.run(r3.run_id).phase_file("service"))["error"]
    assert f"hashes to {sha256_file(other)[:16]}" in err3 and "the case pins 0000000000000000" in err3, err3
    assert stats_down(ports[0])  # refused before any start


def stats_down(port: int) -> bool:
    try:
        httpx2.get(f"http://127.0.0.1:{port}/stats", timeout=1, trust_env=False)
    except httpx2.HTTPError:
        return True
    return False


@pytest.mark.integration
def test_env_is_compared_by_value_hash_on_the_live_process(ws: Workspace) -> None:
    unit = identity.units(Case.model_validate(two_routes((1, 2), env={"EXPERTS": "layout-v2"})))[0]
    want = {"EXPERTS": identity.value_hash("layout-v2")}
    p = subprocess.Popen(["sleep", "30"], env={**os.environ, "EXPERTS": "layout-v1"})
    try:
        time.sleep(0.1)
        problem = live.effective_problem({"env_sha256": want}, unit, p.pid)
        got = identity.value_hash("layout-v1")
        assert problem == f"env EXPERTS: intended sha256 {want['EXPERTS']}, pid {p.pid} runs with sha256 {got}"
        assert "layout" not in problem  # values never appear, only their hashes
        assert live.effective_problem({"env_sha256": {"EXPERTS": got}}, unit, p.pid) is None
    finally:
        p.kill()
        p.wait()


def test_a_child_changing_one_component_shows_that_component_in_delta_plan_and_scenario(ws: Workspace) -> None:
    ports = (free_port(), free_port())
    base = freeze_case(ws, draft=two_routes(ports))
    d = two_routes(ports)
    d["service"]["components"][1]["argv"] = [*target_argv(model="{model}"), "--config-json", '{"slots": 2}']
    child = freeze_case(ws, draft=d, parent=base.case_id)
    assert [(x.path, x.impact) for x in child.delta] == [("service.components.r1.argv", "service")]
    assert {s.phase: s.action for s in child.plan}["service"] == "run"
    row = next(r for r in scenario_view(ws, "ref-test").rows if r.case_id == child.case_id)
    assert row.change == 'r1 --config-json {"slots": 2} added', row.change  # the flag, not the whole argv


@pytest.mark.integration
def test_terminate_reaps_a_stopped_child_so_no_zombie_keeps_its_pid() -> None:
    """An inline run starts its services as children of the caller: stopping one must reap it (a zombie keeps
    /proc/PID, and a long-lived MCP server would collect them)."""
    from caseledger import procs

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    ref = procs.me() | {"pid": p.pid, "start_time": procs.start_time(p.pid) or 0}
    assert procs.alive(ref)
    assert procs.terminate(ref, grace_s=2.0)
    assert not Path(f"/proc/{p.pid}").exists()  # reaped, not a zombie
