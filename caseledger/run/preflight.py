"""Preflight in a fresh process: reload the frozen case from disk through the real entry points.

`python -m caseledger.preflight RUN_DIR` installs an audit hook FIRST that refuses every outgoing
connection, UDP send, name lookup and child process, so a preflight provably sends no model request.
It then builds the load plan with the same function the load client uses, builds the collector with the
same function postprocess uses (on zero records), verifies the dataset hash and entry count against N,
the deadline and free disk. It prints one JSON line and exits 0, or prints the error and exits 1.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from datetime import UTC, datetime
from os import PathLike
from pathlib import Path
from typing import Any

import httpx2
import orjson

from caseledger import datasets
from caseledger.case.store import case_id_of, is_case_id_of
from caseledger.ledger.runs import read_run
from caseledger.load.faults import fault
from caseledger.load.plan import plan_of, raw_bytes_needed
from caseledger.procs import child_env

Path_ = PathLike[str]

_BLOCKED = {
    "socket.connect": "outgoing connection", "socket.sendto": "UDP send", "socket.sendmsg": "socket send",
    "socket.getaddrinfo": "name lookup", "socket.gethostbyname": "name lookup",
    "subprocess.Popen": "child process", "os.system": "child process", "os.exec": "exec",
    "os.posix_spawn": "child process", "os.fork": "fork",
}


def _guard(event: str, args: tuple[Any, ...]) -> None:
    if event in _BLOCKED:
        raise PermissionError(f"preflight forbids {_BLOCKED[event]} ({event})")


def install_guard() -> None:
    sys.addaudithook(_guard)


def run(run_dir: str) -> dict[str, Any]:



    run = read_run(Path(run_dir))
    paths, meta, case = run.paths, run.meta, run.case
    checks: dict[str, Any] = {}
    if not is_case_id_of(case, meta.case_id):
        raise ValueError(f"case.json hashes to {case_id_of(case)}, the run says {meta.case_id}: the frozen case "
                         "changed")
    checks["case_reload"] = meta.case_id
    ws = run.workspace
    if fault("preflight", "connect") is not None:  # test hook: prove the guard holds
        httpx2.get(case.target.endpoints[0].base_url.rstrip("/") + "/models", timeout=2)
    if not meta.load_reuse:
        checks["dataset_sha256"] = datasets.verify(ws, meta.dataset())
        plan = plan_of(run)  # the load client's own plan function, on the run read above
        n = plan.planned
        if n != case.load.requests:
            raise ValueError(f"load plan has {n} requests, the case says load.requests={case.load.requests}")
        checks["load_plan_requests"] = n
    # lazy: metrics (result models, ~30 ms) is needed in this child only; run_fresh's callers stay light
    from caseledger.metrics import compute_result

    res = compute_result(case, [])
    checks["collector"] = type(res).__name__
    if case.deadline is not None and case.deadline <= datetime.now(UTC):
        raise ValueError(f"deadline {case.deadline.isoformat()} has passed; freeze a case with a later deadline")
    need = 2 * raw_bytes_needed(case) + (8 << 20)  # the raw records, their results, events and reports
    free = shutil.disk_usage(paths.root).free
    if free < need:
        raise ValueError(f"free disk {free >> 20} MiB < {need >> 20} MiB needed for raw records and results")
    checks["disk_free_mib"] = free >> 20
    checks["sockets"] = "forbidden (audit hook)"
    return checks


def run_fresh(run_dir: str | Path_, timeout_s: float = 300.0) -> dict[str, Any]:
    """Run `python -m caseledger.preflight RUN_DIR` in a fresh process; {"ok": bool, "checks"|"error": ...}."""



    p = subprocess.run([sys.executable, "-m", "caseledger.run.preflight", str(run_dir)], capture_output=True,
                       env=child_env(), timeout=timeout_s, stdin=subprocess.DEVNULL)
    lines = p.stdout.decode(errors="replace").strip().splitlines()
    try:
        res: dict[str, Any] = orjson.loads(lines[-1]) if lines else {}
    except orjson.JSONDecodeError:
        res = {}
    if p.returncode != 0 or not res.get("ok"):
        err = res.get("error") or (p.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        return {"ok": False, "error": err}
    return res


def main(argv: list[str] | None = None) -> int:
    install_guard()
    args = sys.argv[1:] if argv is None else argv

    try:
        checks = run(args[0])
    except Exception as e:
        sys.stdout.write(orjson.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"}).decode() + "\n")
        return 1
    sys.stdout.write(orjson.dumps({"ok": True, "checks": checks}).decode() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
