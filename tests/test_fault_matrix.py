"""The fault matrix (issue 11, item 9): real processes killed or damaged at every step that matters, and
after each one the facts checked where they are true: formal requests counted by the target itself
(GET /stats, by the x-caseledger-phase header), the raw records on disk, the service's pid and start
count, the phase events, and what status said before resume.

Every cell records its checks into the session's matrix (tests/conftest.py prints it at the end). Columns:
  class    status named the right failure class before resume
  next     status's next call was the right repair of this run
  plan     status predicted what resume runs (first phase, service restart, re-send)
  svc      status said the service is gone
  state    the final state of the run
  count    formal requests counted by the target equal the ledger's (N for a full load)
  raw      every completed request has its raw record
  starts   service starts grew only where the service died (one new start, a new pid)
  once     finished phases ran once (phase events, load clients, warmup/route requests at the target)
  resend   resume re-sent nothing
  midcall  the MCP server was killed while the call was waiting, before any answer
  detached the run outlived the MCP server
  one      exactly one of the racing calls won
  refused  the refused call raised the right error, naming the fix
  tree     a refused call wrote nothing
  mode     the authorization mode afterwards
  kept     the superseded load attempt is kept and marked
  missing  status lists the missing evidence
  repair   restoring the evidence makes the repair work
  step     the clock step was in effect (a process under it read the wall clock an hour off)
  early    the controller ended the load of a stopped engine early (a load_ended_early event), not after every
           queued request had waited out its timeout
  reuse    a service another workspace keeps was used as it is (its pid, marked kept_by), not started again
  keeper   the host-wide record names the workspace that keeps the target's service, unchanged by a reuse
  why      status said why the campaign's driver waits, naming what it waits for and the fix
  stop     the fix the refusal named worked
  given    no point was given up
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from mcp import Client, StdioServerParameters

from caseledger.case.phases import PHASES, Phase
from caseledger.case.plan import FAILURE_OF_PHASE
from caseledger.errors import EvidenceChanged, NotAuthorized, NothingToResume, TargetHeld
from caseledger.ledger import authorization
from caseledger.ledger.events import read_events
from caseledger.tools import freeze_case, phase_status, reprocess_raw, resume, start_run, summarize
from caseledger.workspace import Workspace
from tests.conftest import (
    free_port,
    ref_draft,
    reference_targets,
    required_program,
    start_with_fault,
    stats,
    tree_digest,
    two_workspaces,
)
from tests.helpers import (
    FAST,
    N,
    after,
    by_phase,
    cell,
    clients,
    ended_ok,
    kill,
    race,
    raw_lines,
    runs_of,
    service_pid,
    service_state,
    settled,
    slow_draft,
    wait_until,
    why,
)

pytestmark = [pytest.mark.integration, pytest.mark.processes]  # kills, stops, races: real processes are the point

# ------------------------------------------------------------------------------- 1. controller SIGKILLed


KILLS = [  # after every phase but decide (nothing runs after it) and cache_prepare (not a cell of the matrix)
    (f"controller:exit_after={p}", f"kill controller after {p}")
    for p in PHASES
    if p not in (Phase.CACHE_PREPARE, Phase.DECIDE)
]
KILLS.append(("controller:exit_during=load", "kill controller during load"))


@pytest.mark.parametrize(("fault", "name"), KILLS, ids=[k[0].split(":")[1] for k in KILLS])
def test_controller_killed_then_resume(
    ws: Workspace,
    stop_services: None,
    monkeypatch: pytest.MonkeyPatch,
    fault_matrix: dict[str, dict[str, bool]],
    fault: str,
    name: str,
) -> None:
    port = free_port()
    case = freeze_case(ws, draft=ref_draft(port))
    killed = "load" if "exit_during" in fault else fault.split("=")[1]
    with cell(fault_matrix, name) as c:
        r = start_with_fault(monkeypatch, fault, ws, case.case_id, wait=True)
        assert r.run_id is not None
        s = settled(ws, r.run_id)
        nxt = after(killed)[0]
        c.check(
            "class",
            s.state == "end_unknown" and s.phase == nxt and s.failure_class == FAILURE_OF_PHASE[Phase(nxt)],
            s.text(),
        )
        repair = "reprocess_raw" if s.failure_class == "collect" else "resume"  # collect: repaired from raw data
        c.check("next", f"{repair}(run_id='{r.run_id}')" in s.next_call, s.next_call)
        c.check(
            "plan",
            s.resume_runs == after(killed)
            and not s.next_resends_requests
            and s.next_restarts_service == (killed == "preflight"),
            s.text(),
        )
        before = ended_ok(ws, r.run_id)
        pid_before = service_pid(ws, r.run_id) if killed != "preflight" else None

        res = resume(ws, r.run_id, wait=True)
        s2 = phase_status(ws, r.run_id)
        st = stats(port)
        c.check("state", res.state == "succeeded" and s2.state == "succeeded", why(ws, r.run_id))
        c.check(
            "count",
            st["by_phase"].get("load") == N == s2.sent == s2.done,
            f"target {st['by_phase']}, ledger sent {s2.sent} done {s2.done}",
        )
        c.check("raw", raw_lines(ws.run(r.run_id).raw) == s2.done == N, raw_lines(ws.run(r.run_id).raw))
        svc = service_state(ws, r.run_id)
        c.check(
            "starts",
            svc.get("starts") == 1 and st["pid"] == svc["proc"]["pid"] and pid_before in (None, st["pid"]),
            f"{svc.get('starts')} starts, pid {pid_before} -> {st['pid']}",
        )
        ends = ended_ok(ws, r.run_id)
        # a load whose controller died under it ends by the client's end file (no phase_ended of its own)
        c.check(
            "once",
            all(ends[p.value] == 1 for p in PHASES if p != Phase.LOAD or killed != "load")
            and ends["load"] <= 1
            and all(before[p] == 1 for p in before)
            and clients(ws, r.run_id) == 1
            and st["by_phase"].get("warmup") == 2
            and st["by_phase"].get("route_verify") == 1,
            f"phase ends {dict(ends)}, {clients(ws, r.run_id)} load clients, target {st['by_phase']}",
        )


# --------------------------------------------------------------------------------- 2. load client SIGKILLed


def test_load_client_killed_mid_load(
    ws: Workspace, stop_services: None, monkeypatch: pytest.MonkeyPatch, fault_matrix: dict[str, dict[str, bool]]
) -> None:
    port = free_port()
    case = freeze_case(ws, draft=slow_draft(port, 24))
    with cell(fault_matrix, "kill load client mid-load") as c:
        r = start_with_fault(monkeypatch, "load:exit_after=3", ws, case.case_id, wait=True)
        assert r.run_id is not None
        s = settled(ws, r.run_id)
        c.check("class", s.failure_class == "end_unknown" and s.phase == "load", s.text())
        c.check("next", f"resume(run_id='{r.run_id}')" in s.next_call and not s.next_resends_requests, s.text())
        served = by_phase(port)
        c.check("count", served == s.sent and s.done == 3, f"target {served}, ledger sent {s.sent} done {s.done}")

        res = resume(ws, r.run_id, wait=True)
        s2 = phase_status(ws, r.run_id)
        c.check("state", res.state == "partial" == s2.state and s2.load_ended == "partial", s2.text())
        c.check("resend", by_phase(port) == served, f"{served} -> {by_phase(port)}")
        c.check("count", by_phase(port) == s2.sent, f"target {by_phase(port)}, ledger sent {s2.sent}")
        c.check(
            "raw",
            raw_lines(ws.run(r.run_id).raw) == s2.done == 3,
            f"raw {raw_lines(ws.run(r.run_id).raw)}, done {s2.done}",
        )
        c.check("starts", service_state(ws, r.run_id).get("starts") == 1, service_state(ws, r.run_id))
        c.check(
            "once",
            clients(ws, r.run_id) == 1 and stats(port)["by_phase"].get("warmup") == 2,
            f"{clients(ws, r.run_id)} load clients, target {stats(port)['by_phase']}",
        )


# ------------------------------------------------------------------------- 3. controller and client killed


def test_controller_and_client_killed_mid_load(
    ws: Workspace, stop_services: None, monkeypatch: pytest.MonkeyPatch, fault_matrix: dict[str, dict[str, bool]]
) -> None:
    port = free_port()
    case = freeze_case(ws, draft=slow_draft(port, 24))
    with cell(fault_matrix, "kill controller and client mid-load") as c:
        r = start_with_fault(monkeypatch, "controller:exit_during=load", ws, case.case_id)
        assert r.run_id is not None
        paths = ws.run(r.run_id)
        wait_until(
            lambda: raw_lines(paths.raw) >= 3 and not phase_status(ws, r.run_id).owner_alive,
            60,
            "3 raw records and the controller gone",
        )
        kill(int(orjson.loads(paths.load_pid.read_bytes())["pid"]))
        s = settled(ws, r.run_id)
        c.check("class", s.failure_class == "end_unknown" and s.phase == "load", s.text())
        c.check("next", f"resume(run_id='{r.run_id}')" in s.next_call and not s.next_resends_requests, s.text())
        served = by_phase(port)

        res = resume(ws, r.run_id, wait=True)
        s2 = phase_status(ws, r.run_id)
        c.check("state", res.state in ("partial", "succeeded") and s2.state == res.state, s2.text())
        c.check("resend", by_phase(port) == served, f"{served} -> {by_phase(port)}")
        # sent is logged before a request's first byte leaves: a SIGKILL between the two leaves one logged request
        # the target never saw (never one it saw twice, never one it saw unlogged)
        c.check(
            "count",
            s2.done <= by_phase(port) <= s2.sent,
            f"target {by_phase(port)}, ledger sent {s2.sent}, done {s2.done}",
        )
        c.check("raw", raw_lines(paths.raw) == s2.done >= 3, f"raw {raw_lines(paths.raw)}, done {s2.done}")
        c.check("starts", service_state(ws, r.run_id).get("starts") == 1, service_state(ws, r.run_id))
        c.check(
            "once",
            clients(ws, r.run_id) == 1 and stats(port)["by_phase"].get("warmup") == 2,
            f"{clients(ws, r.run_id)} load clients, target {stats(port)['by_phase']}",
        )


# ------------------------------------------------------------------------------ 4. MCP server killed mid-call


def _children(cmd_part: str) -> list[int]:
    """Pids of this process's children whose command line contains cmd_part."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == os.getpid() and cmd_part in cmd:
            out.append(int(d.name))
    return out


def test_mcp_server_killed_mid_call(
    ws: Workspace, stop_services: None, fault_matrix: dict[str, dict[str, bool]]
) -> None:
    port = free_port()
    case = freeze_case(ws, draft=ref_draft(port))
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "caseledger", "mcp", "--workspace", str(ws.root)], env=dict(os.environ)
    )
    outcome: dict[str, Any] = {}

    async def scenario() -> None:
        async with Client(params) as client:
            servers = _children(f"caseledger mcp --workspace {ws.root}")
            outcome["servers"] = servers

            async def call() -> None:
                try:
                    outcome["result"] = await client.call_tool("start_run", {"case_id": case.case_id})
                except Exception as e:  # the server died under the call
                    outcome["error"] = f"{type(e).__name__}: {e}"

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                with anyio.fail_after(30):  # the controller spawned, the call still waiting for preflight
                    while not any(
                        ws.run(p.name).controller_pid.exists()
                        for p in (ws.runs_dir.iterdir() if ws.runs_dir.exists() else [])
                    ):
                        await anyio.sleep(0.005)
                outcome["returned_before_kill"] = "result" in outcome
                for pid in servers:
                    os.kill(pid, signal.SIGKILL)
                with anyio.move_on_after(15):
                    while "result" not in outcome and "error" not in outcome:
                        await anyio.sleep(0.05)
                tg.cancel_scope.cancel()

    with cell(fault_matrix, "kill MCP server mid start_run") as c:
        anyio.run(scenario)
        c.check(
            "midcall",
            len(outcome["servers"]) == 1 and not outcome["returned_before_kill"] and "result" not in outcome,
            outcome,
        )
        runs = sorted(p.name for p in ws.runs_dir.iterdir())
        assert len(runs) == 1, runs
        s = settled(ws, runs[0])
        c.check("detached", s.state == "succeeded", s.text())
        c.check("count", by_phase(port) == N == s.sent == s.done, f"target {by_phase(port)}, ledger {s.sent}")
        c.check("raw", raw_lines(ws.run(runs[0]).raw) == N, raw_lines(ws.run(runs[0]).raw))
        c.check("starts", service_state(ws, runs[0]).get("starts") == 1, service_state(ws, runs[0]))


# ---------------------------------------------------------------------- 5. service killed after its phase


def test_service_killed_after_its_phase(
    ws: Workspace, stop_services: None, monkeypatch: pytest.MonkeyPatch, fault_matrix: dict[str, dict[str, bool]]
) -> None:
    port = free_port()
    case = freeze_case(ws, draft=ref_draft(port))
    with cell(fault_matrix, "kill service after its phase") as c:
        r = start_with_fault(monkeypatch, "controller:exit_after=service", ws, case.case_id, wait=True)
        assert r.run_id is not None
        settled(ws, r.run_id)
        old = service_pid(ws, r.run_id)
        kill(old)
        wait_until(lambda: phase_status(ws, r.run_id).service_alive is False, 10, "the service to be seen dead")
        s = phase_status(ws, r.run_id)
        c.check(
            "svc",
            s.service_alive is False and "service: the process this run measured on is gone" in s.text(),
            s.text(),
        )
        c.check("class", s.failure_class == "service", s.text())
        c.check(
            "plan",
            s.resume_runs[:1] == ["service"]
            and s.next_restarts_service
            and s.next_repeats_warmup
            and not s.next_resends_requests,
            s.text(),
        )
        c.check("next", f"resume(run_id='{r.run_id}') starts again at service" in s.next_call, s.next_call)

        res = resume(ws, r.run_id, wait=True)
        s2 = phase_status(ws, r.run_id)
        st = stats(port)
        svc = service_state(ws, r.run_id)
        c.check("state", res.state == "succeeded" == s2.state, why(ws, r.run_id))
        c.check(
            "starts",
            svc.get("starts") == 2 and svc["proc"]["pid"] == st["pid"] != old,
            f"starts {svc.get('starts')}, pid {old} -> {st['pid']}",
        )
        c.check(
            "count",
            st["by_phase"].get("load") == N == s2.sent == s2.done,
            f"target {st['by_phase']}, ledger sent {s2.sent}",
        )
        c.check("raw", raw_lines(ws.run(r.run_id).raw) == N, raw_lines(ws.run(r.run_id).raw))
        ends = ended_ok(ws, r.run_id)
        c.check(
            "once",
            ends["preflight"] == 1
            and ends["service"] == 2
            and all(ends[p.value] == 1 for p in PHASES if p not in (Phase.PREFLIGHT, Phase.SERVICE))
            and st["by_phase"].get("warmup") == 2,
            f"phase ends {dict(ends)}, new target {st['by_phase']}",
        )


# --------------------------------------------------------------------------------- 6. service killed mid-load


def test_service_killed_mid_load(ws: Workspace, stop_services: None, fault_matrix: dict[str, dict[str, bool]]) -> None:
    port = free_port()
    case = freeze_case(ws, draft=slow_draft(port, 24))
    with cell(fault_matrix, "kill service mid-load") as c:
        r = start_run(ws, case.case_id)
        assert r.run_id is not None
        paths = ws.run(r.run_id)
        wait_until(lambda: paths.load_sent.exists() and paths.load_sent.stat().st_size > 0, 60, "the first send")
        old = service_pid(ws, r.run_id)
        kill(old)
        s = settled(ws, r.run_id)
        c.check("class", s.state == "failed" and s.failure_class == "service" and s.phase == "load", s.text())
        c.check("svc", s.service_alive is False, s.text())
        c.check(
            "plan",
            s.resume_runs[:1] == ["service"]
            and "load" in s.resume_runs
            and s.next_resends_requests
            and s.next_restarts_service,
            s.text(),
        )
        c.check("next", f"resume(run_id='{r.run_id}')" in s.next_call, s.next_call)

        res = resume(ws, r.run_id, wait=True)
        s2 = phase_status(ws, r.run_id)
        st = stats(port)
        svc = service_state(ws, r.run_id)
        c.check("state", res.state == "succeeded" == s2.state, why(ws, r.run_id))
        marker = paths.load_attempt_dir(1) / "superseded.json"
        c.check(
            "kept",
            marker.exists() and raw_lines(paths.load_attempt_dir(1) / "raw.jsonl") > 0,
            sorted(p.name for p in paths.root.iterdir()),
        )
        c.check(
            "starts",
            svc.get("starts") == 2 and svc["proc"]["pid"] == st["pid"] != old,
            f"starts {svc.get('starts')}, pid {old} -> {st['pid']}",
        )
        c.check(
            "count",
            st["by_phase"].get("load") == N == s2.sent == s2.done,
            f"new target {st['by_phase']}, ledger sent {s2.sent}",
        )
        c.check("raw", raw_lines(paths.raw) == N, raw_lines(paths.raw))


# --------------------------------------------------------------------------------------- 7. torn events line


def test_torn_events_line_after_a_failure(
    ws: Workspace, stop_services: None, monkeypatch: pytest.MonkeyPatch, fault_matrix: dict[str, dict[str, bool]]
) -> None:
    port = free_port()
    case = freeze_case(ws, draft=ref_draft(port))
    with cell(fault_matrix, "torn events line after a failure") as c:
        r = start_with_fault(monkeypatch, "postprocess:fail=import", ws, case.case_id, wait=True)
        assert r.run_id is not None
        s = settled(ws, r.run_id)
        with ws.run(r.run_id).events.open("ab") as f:
            f.write(b'{"seq": 999, "type": "phase_sta')
        t = phase_status(ws, r.run_id)
        c.check(
            "class",
            s.failure_class == t.failure_class == "collect"
            and t.state == s.state == "failed"
            and t.phase == "postprocess",
            t.text(),
        )
        c.check("next", t.next_call == s.next_call and "reprocess_raw(" in t.next_call, t.next_call)
        c.check("plan", t.resume_runs == ["postprocess", "decide"] and not t.next_resends_requests, t.text())

        res = resume(ws, r.run_id, wait=True)
        s2 = phase_status(ws, r.run_id)
        c.check("state", res.state == "succeeded" == s2.state, why(ws, r.run_id))
        c.check("count", by_phase(port) == N == s2.sent, f"target {by_phase(port)}, ledger {s2.sent}")
        ends = ended_ok(ws, r.run_id)
        c.check("once", all(ends[p.value] == 1 for p in PHASES), dict(ends))


# -------------------------------------------------------------------- 8. two workspaces racing for one target

TRIALS = 10  # each trial is a whole run (2-3 s) racing from two processes


def test_two_workspaces_race_for_one_target(tmp_path: Path, fault_matrix: dict[str, dict[str, bool]]) -> None:
    with reference_targets({"t": FAST}, tmp_path / "targets") as served:
        port = served["t"].port
        wss = two_workspaces(tmp_path, ref_draft(port, service={"adapter": "external"}))
        with cell(fault_matrix, f"two workspaces race one target x{TRIALS}") as c:
            for trial in range(TRIALS):
                runs_before = [runs_of(w) for w, _ in wss]
                count0 = by_phase(port)
                out = race(*[lambda w=w, cid=cid: start_run(w, cid, wait=True) for w, cid in wss])
                won = [k for k in range(2) if not isinstance(out[k], Exception)]
                lost = [out[k] for k in range(2) if isinstance(out[k], Exception)]
                shown = [x if isinstance(x, Exception) else why(wss[k][0], x.run_id) for k, x in enumerate(out)]
                c.check("one", len(won) == 1 and out[won[0]].state == "succeeded", f"trial {trial}: {shown}")
                c.check(
                    "refused",
                    len(lost) == 1 and isinstance(lost[0], TargetHeld) and "in workspace" in str(lost[0]),
                    f"trial {trial}: {lost}",
                )
                runs_after = [runs_of(w) for w, _ in wss]
                c.check("tree", sum(runs_after) - sum(runs_before) == 1, f"trial {trial}: {runs_before}->{runs_after}")
                c.check("count", by_phase(port) - count0 == N, f"trial {trial}: {count0} -> {by_phase(port)}")


# --------------------------------------------------------------------------------------- 9. concurrent resumes


def test_concurrent_resumes(
    ws: Workspace, stop_services: None, monkeypatch: pytest.MonkeyPatch, fault_matrix: dict[str, dict[str, bool]]
) -> None:
    port = free_port()
    case = freeze_case(ws, draft=ref_draft(port))
    with cell(fault_matrix, "two resumes at once") as c:
        r = start_with_fault(monkeypatch, "controller:exit_after=warmup", ws, case.case_id, wait=True)
        assert r.run_id is not None
        run_id = r.run_id
        settled(ws, run_id)
        out = race(lambda: resume(ws, run_id, wait=True), lambda: resume(ws, run_id, wait=True))
        won = [x for x in out if not isinstance(x, Exception)]
        lost = [x for x in out if isinstance(x, Exception)]
        c.check("one", len(won) == 1 and won[0].state == "succeeded", out)
        c.check(
            "refused",
            len(lost) == 1
            and (
                (isinstance(lost[0], TargetHeld) and "already being continued" in str(lost[0]))
                or (isinstance(lost[0], NothingToResume) and "live controller" in str(lost[0]))
            ),
            lost,
        )
        s2 = phase_status(ws, run_id)
        st = stats(port)
        ends = ended_ok(ws, run_id)
        c.check(
            "once",
            all(ends[p.value] == 1 for p in PHASES)
            and st["by_phase"].get("warmup") == 2
            and len([e for e in read_events(ws.run(run_id)).events if e.type == "controller_started"]) == 2,
            f"phase ends {dict(ends)}, target {st['by_phase']}",
        )
        c.check("count", st["by_phase"].get("load") == N == s2.sent, f"target {st['by_phase']}, ledger {s2.sent}")
        c.check("starts", service_state(ws, run_id).get("starts") == 1, service_state(ws, run_id))


# ------------------------------------------------------------------------------------------- 10. single races


def test_single_race(ws: Workspace, stop_services: None, fault_matrix: dict[str, dict[str, bool]]) -> None:
    ports = [free_port(), free_port()]
    cases = [freeze_case(ws, draft=ref_draft(p)).case_id for p in ports]
    authorization.set_mode(ws, "single")
    with cell(fault_matrix, "single: two starts at once") as c:
        out = race(*[lambda cid=cid: start_run(ws, cid, wait=True) for cid in cases])
        won = [k for k in range(2) if not isinstance(out[k], Exception)]
        lost = [out[k] for k in range(2) if isinstance(out[k], Exception)]
        c.check("one", len(won) == 1 and out[won[0]].state == "succeeded", out)
        c.check("refused", len(lost) == 1 and isinstance(lost[0], NotAuthorized) and "authorize" in lost[0].fix, lost)
        c.check("mode", authorization.current_mode(ws) == "paused", authorization.current_mode(ws))
        c.check("tree", len(list(ws.runs_dir.iterdir())) == 1, sorted(p.name for p in ws.runs_dir.iterdir()))
        if len(won) == 1:
            c.check("count", by_phase(ports[won[0]]) == N, stats(ports[won[0]]))


# ----------------------------------------------------------------------------- 11. damaged authorization file

AUTH_FILES = [
    (b'{"mo', "truncated authorization.json"),
    (b'"PAUSED"', 'authorization.json is "PAUSED"'),
    (b'{"mode": "PAUSED"}', 'authorization mode "PAUSED"'),
]


@pytest.mark.parametrize(("content", "name"), AUTH_FILES, ids=["truncated", "bare-PAUSED", "mode-PAUSED"])
def test_damaged_authorization_refuses(
    ws: Workspace, stop_services: None, fault_matrix: dict[str, dict[str, bool]], content: bytes, name: str
) -> None:
    case = freeze_case(ws, draft=ref_draft(free_port()))
    ws.authorization_file.write_bytes(content)
    with cell(fault_matrix, name + " refuses start") as c:
        before = tree_digest(ws.root)
        try:
            r = start_run(ws, case.case_id)
            c.check("refused", False, f"started: {r.text()}")
        except NotAuthorized as e:
            c.check("refused", "authorize" in e.fix and "paused" in e.message, e)
        c.check("tree", tree_digest(ws.root) == before, "the refused call changed the workspace")
        c.check("mode", authorization.current_mode(ws) == "paused", authorization.current_mode(ws))


# ------------------------------------------------------------------------ 12-13. evidence changed or deleted


def test_changed_and_deleted_evidence(
    ws: Workspace, stop_services: None, fault_matrix: dict[str, dict[str, bool]]
) -> None:
    port = free_port()
    case = freeze_case(ws, draft=ref_draft(port))
    r = start_run(ws, case.case_id, wait=True)
    assert r.run_id is not None and r.state == "succeeded", r.text()
    paths = ws.run(r.run_id)
    with cell(fault_matrix, "modified raw data refuses reprocess") as c:
        data = paths.raw.read_bytes()
        at = data.index(b'"ok":true') + len(b'"ok":')
        paths.raw.write_bytes(data[:at] + b"f" + data[at + 1 :])  # one byte: true -> frue
        s = phase_status(ws, r.run_id)  # status and summarize say so, not only reprocess
        c.check("status", "changed evidence: load/raw.jsonl changed after the load ended" in s.text(), s.text())
        told = summarize(ws, [r.run_id]).text()
        c.check("summary", "changed evidence: load/raw.jsonl changed" in told, told)
        before = tree_digest(ws.root)
        try:
            reprocess_raw(ws, r.run_id)
            c.check("refused", False, "reprocessed modified raw data")
        except EvidenceChanged as e:
            c.check("refused", "raw.jsonl changed" in e.message and "restore" in e.fix, e)
        c.check("tree", tree_digest(ws.root) == before, "the refused reprocess changed the workspace")
        paths.raw.write_bytes(data)
        served = by_phase(port)
        rep = reprocess_raw(ws, r.run_id)
        c.check("repair", rep.requests == N and rep.requests_sent == 0 and by_phase(port) == served, rep.text())
    with cell(fault_matrix, "deleted phases/service.json in status") as c:
        paths.phase_file("service").unlink()
        s = phase_status(ws, r.run_id)
        c.check("missing", s.missing_evidence == ["phases/service.json"] and "missing evidence" in s.text(), s.text())


# ------------------------------------------------------------------------------- 12. a clock step during a lease


def faketime() -> str:
    """libfaketime's wrapper (Debian's `faketime`): skipped when missing, failed under CASELEDGER_REQUIRE_FAKETIME=1
    (set by .ci/run, which installs it)."""
    return required_program(("faketime",), "faketime", "CASELEDGER_REQUIRE_FAKETIME")


def faketime_env() -> dict[str, str]:
    """This process's environment (read now: the session's host directory) with both clocks stepped."""
    return {**os.environ, "FAKETIME_DONT_FAKE_MONOTONIC": "0"}  # see cli_under_clock


def cli_under_clock(step: str, ws: Workspace, *args: str) -> Any:
    """`caseledger --workspace WS ARGS` with its wall clock (and its children's) stepped by `step` ('+1h'): what an
    NTP step or a hand-set clock does. libfaketime steps the monotonic clock of those processes too (with
    FAKETIME_DONT_FAKE_MONOTONIC=1 its sleeps fail with EINVAL): the same offset for each, so their intervals hold."""
    import subprocess

    argv = [faketime(), "-f", step, sys.executable, "-m", "caseledger", "--workspace", str(ws.root), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=faketime_env())


def cli_clock(step: str) -> float:
    """The wall clock a process started as cli_under_clock starts it reads (epoch seconds)."""
    import subprocess

    argv = [faketime(), "-f", step, sys.executable, "-c", "import time; print(time.time())"]
    return float(
        subprocess.run(argv, capture_output=True, text=True, timeout=30, env=faketime_env(), check=True).stdout
    )


def test_a_clock_stepped_an_hour_either_way_gives_the_target_no_second_owner(
    tmp_path: Path, fault_matrix: dict[str, dict[str, bool]]
) -> None:
    """Run A is started by a process whose clock is an hour behind (the lease it writes first expired an hour
    ago by the true clock, until A's controller renews it); while A loads, B tries the same target with its clock
    an hour ahead (A's lease reads as expired an hour ago), and once at the true time: both are refused (A's
    processes are alive), the target counts one load, and B runs once A is done."""
    faketime()
    # A's load lasts ~13 s (8 waves of 8 tokens at 0.2 s): B's two tries come after two CLI processes under
    # faketime, seconds each on a busy host; a 2.6 s load (0.04 s steps) was over by then once, and B then
    # rightly started on a free target
    slow = {**FAST, "decode_step_s": 0.2, "decode_step_per_seq_s": 0.0}
    with reference_targets({"t": slow}, tmp_path / "targets") as served:
        port = served["t"].port
        draft = ref_draft(port, service={"adapter": "external"}, load={"requests": 16, "concurrency": 2})
        (a, ca), (b, cb) = two_workspaces(tmp_path, draft)
        with cell(fault_matrix, "clock stepped 1 h during a lease") as c:
            got = cli_under_clock("-1h", a, "--json", "run", ca)
            c.check("ran", got.returncode == 0, got.stdout[-800:] + got.stderr[-800:])
            rid = orjson.loads(got.stdout)["run_id"]
            wait_until(lambda: phase_status(a, rid).done >= 2, 60, "A's load under way")
            # B's clock reads A's lease (renewed LEASE_S ahead by A's controller) as expired an hour ago: only
            # A's live processes keep the target
            seen = cli_clock("+1h") - time.time()
            c.check("step", 3500 < seen < 3700, seen)
            ahead = cli_under_clock("+1h", b, "run", cb)
            c.check("refused", ahead.returncode != 0 and "held" in (ahead.stdout + ahead.stderr).lower(), ahead)
            try:
                start_run(b, cb)
                c.check("one", False, f"B started beside A at the true time (A now: {phase_status(a, rid).text()})")
            except TargetHeld as e:
                c.check("one", rid in str(e), str(e))
            c.check("tree", runs_of(b) == 0, runs_of(b))
            s = wait_until(lambda: (x := phase_status(a, rid)).state == "succeeded" and not x.owner_alive and x, 90)
            c.check("count", by_phase(port) == 16, (stats(port), s.text()))
            after = cli_under_clock("+1h", b, "--json", "run", cb)
            rb = orjson.loads(after.stdout)["run_id"] if after.returncode == 0 else None
            done = rb is not None and wait_until(lambda: phase_status(b, rb).state == "succeeded", 90, "B's run")
            c.check(
                "once", bool(done) and by_phase(port) == 32, (after.stdout[-500:], after.stderr[-500:], stats(port))
            )


# ------------------------------------------------------------------------------ 13. concurrent CLI and MCP writers


def test_the_cli_and_an_mcp_server_writing_one_workspace_at_once_lose_and_tear_nothing(
    ws: Workspace, tmp_path: Path, stop_services: None, fault_matrix: dict[str, dict[str, bool]]
) -> None:
    """A person's CLI and an agent's MCP server (a real stdio subprocess) write one workspace at the same moment:
    each freezes the same draft (one case id, one case file), then each starts a run of its own case on its own
    target and waits for it. Both runs succeed, each target counts one load, every event line parses, the
    index lists both runs and HANDOFF.md names both scenarios."""
    import subprocess

    from caseledger.ledger.index import open_index

    with reference_targets({"cli": FAST, "mcp": FAST}, tmp_path / "targets") as served:
        ports = {k: s.port for k, s in served.items()}
        drafts = {k: ref_draft(p, scenario=f"writer-{k}", service={"adapter": "external"}) for k, p in ports.items()}
        for k, d in drafts.items():
            (ws.cases_dir / f"{k}.json").write_bytes(orjson.dumps(d))
        (ws.cases_dir / "shared.json").write_bytes(orjson.dumps(drafts["cli"]))
        params = StdioServerParameters(
            command=sys.executable, args=["-m", "caseledger", "mcp", "--workspace", str(ws.root)], env=dict(os.environ)
        )
        cli = [sys.executable, "-m", "caseledger", "--workspace", str(ws.root), "--json"]
        out: dict[str, Any] = {}

        def by_cli() -> None:
            shared = subprocess.run([*cli, "freeze", "cases/shared.json"], capture_output=True, text=True)
            own = subprocess.run([*cli, "freeze", "cases/cli.json"], capture_output=True, text=True)
            out["cli_shared"] = orjson.loads(shared.stdout)["case_id"]
            cid = orjson.loads(own.stdout)["case_id"]
            run = subprocess.run([*cli, "run", "--wait", cid], capture_output=True, text=True, timeout=120)
            out["cli_run"] = orjson.loads(run.stdout) if run.returncode == 0 else run.stdout + run.stderr

        async def by_mcp() -> None:
            async with Client(params) as client:
                shared = await client.call_tool("freeze_case", {"path": "cases/shared.json"})
                own = await client.call_tool("freeze_case", {"path": "cases/mcp.json"})
                assert shared.structured_content and own.structured_content
                out["mcp_shared"] = shared.structured_content["case_id"]
                r = await client.call_tool("start_run", {"case_id": own.structured_content["case_id"]})
                got = r.structured_content or {"error": str(r.content)}
                for _ in range(10):  # a bounded wait per call, as an agent waits
                    if "run_id" not in got or got.get("state") in ("succeeded", "failed"):
                        break
                    st = await client.call_tool("phase_status", {"run_id": got["run_id"], "wait_s": 30})
                    got = {**got, **(st.structured_content or {})}
                out["mcp_run"] = got

        with cell(fault_matrix, "CLI and MCP server write one workspace at once") as c:
            race(by_cli, lambda: anyio.run(by_mcp))
            c.check("one", out.get("cli_shared") == out.get("mcp_shared") is not None, out)
            runs = [out.get("cli_run"), out.get("mcp_run")]
            c.check("state", all(isinstance(r, dict) and r.get("state") == "succeeded" for r in runs), runs)
            c.check("count", all(by_phase(p) == N for p in ports.values()), {k: stats(p) for k, p in ports.items()})
            ids = [r["run_id"] for r in runs if isinstance(r, dict)]
            torn = [rid for rid in ids if (e := read_events(ws.run(rid))).torn_tail or e.bad_lines]
            c.check("event", len(ids) == 2 and not torn, (ids, torn))
            with open_index(ws) as idx:
                c.check("tree", idx.count() == 2 == runs_of(ws), (idx.count(), runs_of(ws)))
            text = ws.handoff.read_text()
            c.check("handoff", "writer-cli" in text and "writer-mcp" in text, text[:1500])
