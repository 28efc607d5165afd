"""Creating runs and spawning their detached controllers."""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
from typing import Any

from caseledger import cases, ledger, procs
from caseledger.case import PHASES
from caseledger.state import PhaseState, RunView, fold, list_runs
from caseledger.workspace import RunPaths, Workspace, read_json_or_none, write_json


def new_run_id(ws: Workspace) -> str:
    while True:
        rid = "r-" + secrets.token_hex(4)
        if not (ws.runs_dir / rid).exists():
            return rid


def latest_run_of_case(ws: Workspace, case_id: str, *, with_load_end: bool = False,
                       with_results: bool = False) -> str | None:
    for rid in reversed(list_runs(ws)):
        meta = read_json_or_none(ws.run(rid).run_json) or {}
        if meta.get("case_id") != case_id:
            continue
        p = ws.run(rid)
        if with_load_end and not p.load_end.exists():
            continue
        if with_results and not (p.results.exists() and any(p.results.rglob("result.json"))):
            continue
        return rid
    return None


def create_run(ws: Workspace, case_id: str, fence: int, key: str, rid: str, authorized: str) -> RunPaths:
    """Write the run's directory; `authorized` is the mode that let it start (single is consumed by it)."""
    from caseledger import datasets
    from caseledger.case import delta, plan

    case = cases.load_case(ws, case_id)
    parent = cases.load_case(ws, case.parent) if case.parent else None
    changes = delta(parent, case)
    steps = plan(case, changes, parent is not None)
    paths = ws.run(rid)
    paths.root.mkdir(parents=True)
    canon = case.canonical()
    from caseledger.workspace import atomic_write, canonical_json

    atomic_write(paths.case, canonical_json(canon) + b"\n", mode=0o444)
    meta: dict[str, Any] = {
        "run_id": rid, "case_id": case_id, "scenario": case.scenario, "parent_case": case.parent,
        "workspace": str(ws.root), "dataset_id": datasets.dataset_id_for(case),
        "salt": rid if case.load.salt else None, "planned": case.load.requests, "target_key": key,
        "created_utc": ledger.utc_now(), "created_mono_ns": time.monotonic_ns(),
        "plan": [s.model_dump() for s in steps],
        "fence": fence, "authorized": authorized,
    }
    if steps[PHASES.index("load")].action == "reuse":
        src = latest_run_of_case(ws, case.parent or "", with_load_end=True)
        if src is None:
            from caseledger.errors import NotFound

            raise NotFound(f"measurement-only case {case_id} needs a finished load of its parent {case.parent}",
                           f"run the parent first: start_run(case_id='{case.parent}')")
        meta["load_reuse"] = src
        meta["load_reused"] = True
    write_json(paths.run_json, meta)
    ledger.append_event(ws, paths, "run_created", owner="start_run", fence=fence, target=key,
                        data={"case_id": case_id, "plan": {s.phase: s.action for s in steps}})
    return paths


def preflight_only(ws: Workspace, case_id: str) -> dict[str, Any]:
    """Preflight a frozen case without a run: no lease, no controller, no service, no request. Allowed while
    paused and while another run holds the target (prepare the next candidate while the target is busy)."""

    from caseledger import datasets

    case = cases.load_case(ws, case_id)
    pid_ = "p-" + secrets.token_hex(4)
    root = ws.ledger / "preflights" / pid_
    root.mkdir(parents=True)
    paths = RunPaths(root)
    from caseledger.workspace import atomic_write, canonical_json

    atomic_write(paths.case, canonical_json(case.canonical()) + b"\n", mode=0o444)
    write_json(paths.run_json, {"run_id": pid_, "case_id": case_id, "scenario": case.scenario,
                                "workspace": str(ws.root), "dataset_id": datasets.dataset_id_for(case),
                                "salt": pid_ if case.load.salt else None, "planned": case.load.requests,
                                "created_utc": ledger.utc_now(), "preflight_only": True})
    from caseledger.preflight import run_fresh

    res = run_fresh(root)
    write_json(root / "preflight.json", res)
    return {"id": pid_, **res}


def spawn_controller(ws: Workspace, paths: RunPaths, fence: int) -> int:
    from caseledger.controller import child_env

    log = paths.controller_log.open("ab")
    p = subprocess.Popen([sys.executable, "-m", "caseledger.controller", str(paths.root), "--fence", str(fence)],
                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=child_env(),
                         start_new_session=True, close_fds=True)
    log.close()
    meta = read_json_or_none(paths.run_json) or {}
    meta["controller_spawned"] = True
    write_json(paths.run_json, meta)
    # the controller writes its own pid file; write one now so a reader never sees a gap
    write_json(paths.controller_pid, {"pid": p.pid, "start_time": procs.start_time(p.pid) or 0,
                                      "host": procs.me()["host"], "fence": fence})
    return p.pid


def wait_for(ws: Workspace, run_id: str, until: str, timeout: float) -> RunView:
    """Poll the folded state until `until` ('preflight' ended, or 'end' of the run) or the owner died."""
    deadline = time.monotonic() + timeout
    while True:
        view = fold(ws, run_id)
        if until == "preflight" and view.phases["preflight"].state not in (PhaseState.PENDING, PhaseState.RUNNING):
            return view
        settled = view.state.value not in ("running", "created") and (until != "end" or not view.controller_alive)
        if settled or time.monotonic() > deadline:
            return view
        time.sleep(0.05)
