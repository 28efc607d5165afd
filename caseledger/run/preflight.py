"""Preflight in a fresh process: reload the frozen case from disk through the real entry points.

`python -m caseledger.preflight RUN_DIR` installs an audit hook FIRST that refuses every outgoing
connection, UDP send, name lookup and child process, so a preflight provably sends no model request.
It then builds the load schedule with the same function the load client uses, builds the collector with the
same function postprocess uses (on zero records), verifies the dataset hash and entry count against N,
the deadline and free disk. It prints one JSON line and exits 0, or prints the error and exits 1.
"""

from __future__ import annotations

import contextlib
import gc
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from os import PathLike
from pathlib import Path
from typing import Any

import orjson

from caseledger import datasets, procs
from caseledger.case.model import Case
from caseledger.case.store import case_id_of, is_case_id_of
from caseledger.errors import CaseledgerError
from caseledger.faults import fault
from caseledger.ledger.evidence import ContextCheck, PreflightChecks, PreflightResult
from caseledger.ledger.runs import Run, read_run
from caseledger.load.schedule import Schedule, raw_bytes_needed, schedule_of
from caseledger.procs import child_env
from caseledger.workspace import RunPaths, read_json_or_none, write_json

Path_ = PathLike[str]

_BLOCKED = {
    "socket.connect": "outgoing connection",
    "socket.sendto": "UDP send",
    "socket.sendmsg": "socket send",
    "socket.getaddrinfo": "name lookup",
    "socket.gethostbyname": "name lookup",
    "subprocess.Popen": "child process",
    "os.system": "child process",
    "os.exec": "exec",
    "os.posix_spawn": "child process",
    "os.fork": "fork",
}


def _guard(event: str, args: tuple[Any, ...]) -> None:
    if event in _BLOCKED:
        raise PermissionError(f"preflight forbids {_BLOCKED[event]} ({event})")


class Refused(CaseledgerError):
    """A check of this phase said no (the case, the load schedule, the disk, the deadline): its text is the answer."""


def error_text(e: BaseException) -> str:
    """A refusal (this phase's or a ledger check's) reads as its own sentence with its fix; anything else keeps
    its type name, since it is unexpected."""
    return str(e) if isinstance(e, CaseledgerError) else f"{type(e).__name__}: {e}"


def install_guard() -> None:
    sys.addaudithook(_guard)


def run(run_dir: str) -> PreflightChecks:
    """Every check of the phase, on the run read back from disk; Refused (or a ledger error) at the first no."""
    run = read_run(Path(run_dir))
    paths, meta, case = run.paths, run.meta, run.case
    if not is_case_id_of(case, meta.case_id):
        raise Refused(f"case.json hashes to {case_id_of(case)}, the run says {meta.case_id}: the frozen case changed")
    if fault("preflight", "connect") is not None:  # test hook: prove the guard holds
        # lazy: httpx2 only for this test hook; preflight itself sends nothing
        import httpx2

        httpx2.get(case.target.endpoints[0].base_url.rstrip("/") + "/models", timeout=2)
    planned = None if meta.load_reuse else _schedule_checks(run)
    # lazy: metrics (result models, ~30 ms) is needed in this child only; run_fresh's callers stay light
    from caseledger.metrics import compute_result

    res = compute_result(case, [])
    if case.deadline is not None and case.deadline <= datetime.now(UTC):
        raise Refused(f"deadline {case.deadline.isoformat()} has passed; freeze a case with a later deadline")
    need = 2 * raw_bytes_needed(run) + (8 << 20)  # the raw records, their results, events and reports
    free = shutil.disk_usage(paths.root).free
    if free < need:
        raise Refused(f"free disk {free >> 20} MiB < {need >> 20} MiB needed for raw records and results")
    checks = PreflightChecks(
        case_reload=meta.case_id,
        collector=type(res).__name__,
        disk_free_mib=free >> 20,
        sockets="forbidden (audit hook)",
    )
    if planned is None:  # a measurement-only run sends no load: those checks stay unset
        return checks
    sha, n, context = planned
    checks = checks.model_copy(update={"dataset_sha256": sha, "load_plan_requests": n})
    return checks if context is None else checks.model_copy(update={"context": context})  # unset: context unknown


def _schedule_checks(run: Run) -> tuple[str, int, ContextCheck | None]:
    """For a run that sends a load: the dataset's verified hash, the load schedule's size, its requests against the
    model's context."""
    case = run.case
    sha = datasets.verify(run.workspace, run.meta.dataset())
    schedule = schedule_of(run)  # the load client's own function, on the run read above
    n = schedule.planned
    if n != case.load.requests:
        raise Refused(f"load schedule has {n} requests, the case says load.requests={case.load.requests}")
    return sha, n, context_check(case, schedule)


def context_limit(case: Case) -> tuple[int, str] | None:
    """The context each request gets, and where the number comes from; None: unknown."""
    if case.target.context_tokens is not None:
        return case.target.context_tokens, "target.context_tokens"
    ref = case.service.reference.max_model_len
    if case.service.traits.reference_config and ref is not None:
        return ref, "service.reference.max_model_len"
    return None


def context_check(case: Case, schedule: Schedule) -> ContextCheck | None:
    """Every formal request's chat prompt + max_tokens against the model's context; the first too long refuses
    the run before any request is sent (the engine would answer HTTP 400, or cut the prompt)."""
    limit = context_limit(case)
    if limit is None:
        return None
    bound, field = limit
    # a conversation's turn carries its history: its bound counts the earlier messages and replies
    need = [
        ((s.prompt_bound if s.prompt_bound is not None else s.input_tokens_chat or 0) + (s.max_tokens or 0), s)
        for s in schedule.specs
    ]
    over = [(t, s) for t, s in need if t > bound]
    if over:
        t, s = over[0]
        where = (
            f"trace row {s.trace_row}"
            if s.trace_row is not None
            else f"conversation {s.session} turn {s.turn}, with its history"
            if s.session is not None
            else f"entry {s.entry}"
        )
        raise Refused(
            f"{len(over)} of {len(need)} requests do not fit the context of {bound} tokens ({field}): the first, "
            f"request {s.i} ({where}), needs {t - (s.max_tokens or 0)} prompt + {s.max_tokens} output = {t} tokens; "
            f"lower dataset.input_tokens / output_tokens (their max), use a subset of the trace (dataset.entries), "
            f"fewer dataset.sessions.turns, or serve a longer context and raise {field}"
        )
    longest_t = max((t for t, _ in need), default=0)
    return ContextCheck(limit=bound, from_=field, longest_request_tokens=longest_t)


def run_fresh(run_dir: str | Path_, timeout_s: float = 300.0) -> PreflightResult:
    """Run `python -m caseledger.preflight RUN_DIR` in a fresh process; its answer (checks, or the error). In the
    caller's process (procs.InProcess): the same checks there, which no audit hook guards (the evidence says
    so)."""
    return procs.launcher().answer(lambda: _fresh(run_dir, timeout_s), lambda: _here(run_dir))


def _here(run_dir: str | Path_) -> PreflightResult:
    try:
        checks = run(str(run_dir)).model_copy(
            update={"sockets": "not forbidden (inline)", "process": "inline: the caller's process"}
        )
        return PreflightResult(ok=True, checks=checks)
    except Exception as e:
        return PreflightResult(ok=False, error=error_text(e))


def _fresh(run_dir: str | Path_, timeout_s: float) -> PreflightResult:
    p = subprocess.run(
        [sys.executable, "-m", "caseledger.run.preflight", str(run_dir)],
        capture_output=True,
        env=child_env(),
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )
    lines = p.stdout.decode(errors="replace").strip().splitlines()
    try:
        res: dict[str, Any] = orjson.loads(lines[-1]) if lines else {}  # JSON: the child's one answer line
    except orjson.JSONDecodeError:
        res = {}
    if p.returncode != 0 or not res.get("ok"):
        err = res.get("error") or (p.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        return PreflightResult(ok=False, error=err)
    return PreflightResult.model_validate(res)


AHEAD = "--ahead"
AHEAD_WAIT_S = 60.0


def spawn_ahead(keep: Iterable[str] = ()) -> subprocess.Popen[bytes]:
    """A fresh preflight interpreter started before the run exists: it imports the library (the slow part)
    while start_run takes the lease and writes the run, then gets the run directory on stdin and checks it
    exactly as `python -m caseledger.run.preflight RUN_DIR` would: a clean process, sockets forbidden, the
    case reloaded from disk. Its result lands in the run's preflight.ahead.json for the controller."""
    return spawn_waiting("caseledger.run.preflight", keep)


def spawn_waiting(module: str, keep: Iterable[str] = ()) -> subprocess.Popen[bytes]:
    """`python -m MODULE --ahead`, detached, its stdin a pipe: it imports, then waits for its run there."""
    return subprocess.Popen(
        [sys.executable, "-m", module, AHEAD],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=child_env(keep=keep),
        start_new_session=True,
        close_fds=True,
    )


def hand_over(p: subprocess.Popen[bytes], paths: RunPaths) -> None:
    """Give the waiting preflight process its run (its pid is recorded first, for the controller)."""
    write_json(paths.preflight_ahead_pid, procs.ref(p.pid))
    assert p.stdin is not None
    with contextlib.suppress(OSError):  # it died already: the controller runs preflight itself
        p.stdin.write(str(paths.root).encode() + b"\n")
        p.stdin.close()


def ahead_result(paths: RunPaths, timeout_s: float = AHEAD_WAIT_S) -> PreflightResult | None:
    """The handed-over preflight's result, waiting for it while it runs; None when there was none (a resume,
    a process that died): the caller then runs preflight in a fresh process itself."""
    ref = read_json_or_none(paths.preflight_ahead_pid)
    if ref is None:
        return None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        res = read_json_or_none(paths.preflight_ahead)
        if isinstance(res, dict):
            return PreflightResult.model_validate(res)
        if not procs.alive(ref):
            res = read_json_or_none(paths.preflight_ahead)
            return PreflightResult.model_validate(res) if isinstance(res, dict) else None
        time.sleep(0.005)
    return None


def _ahead() -> int:
    install_guard()
    # the collector's models are the rest of the start-up: import them while waiting for the run
    from caseledger.metrics import compute_result  # noqa: F401  # lazy: numpy, only in this child

    line = sys.stdin.readline().strip()
    if not line:
        return 0  # start_run gave up (e.g. the target was held): nothing to check
    try:
        checks = run(line).model_copy(update={"process": "spawned ahead, handed the run"})
        out = PreflightResult(ok=True, checks=checks)
    except Exception as e:
        out = PreflightResult(ok=False, error=error_text(e))
    write_json(RunPaths(Path(line)).preflight_ahead, out.evidence())
    return 0 if out.ok else 1


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == [AHEAD]:
        return _ahead()
    install_guard()

    try:
        out = PreflightResult(ok=True, checks=run(args[0]))
    except Exception as e:
        out = PreflightResult(ok=False, error=error_text(e))
    sys.stdout.write(orjson.dumps(out.evidence()).decode() + "\n")  # the one JSON line run_fresh reads
    return 0 if out.ok else 1


if __name__ == "__main__":
    code = main()
    gc.freeze()  # no final collection over every imported model at exit: ~0.15 s of teardown
    raise SystemExit(code)
