"""The phases after the formal load and its confirm_end (run/load/): postprocess (the collector in a fresh
process), decide. Each returns its evidence model (ledger/evidence.py)
or raises PhaseFailed with a failure class."""

from __future__ import annotations

import contextlib
import io
import signal
import subprocess
import sys

import orjson

from caseledger import procs, redact
from caseledger.case.phases import Phase
from caseledger.case.plan import COLLECT_TIMEOUT_S
from caseledger.errors import EvidenceChanged, FailureClass, PhaseFailed
from caseledger.faults import fault
from caseledger.ledger import calls
from caseledger.ledger.evidence import (
    DecideEvidence,
    PostprocessEnv,
    PostprocessEvidence,
)
from caseledger.ledger.runs import Run
from caseledger.procs import child_env
from caseledger.workspace import RunPaths, sha256_file, write_json


def postprocess_env() -> tuple[list[str], dict[str, str]]:
    """The collector's argv and environment, as its evidence records them."""
    env = child_env()
    argv = [sys.executable, "-m", "caseledger.metrics"]
    if fault("postprocess", "fail") == "import":
        # test hook: the seeds' incident, a collector whose environment lacks a module (no site-packages)
        argv = [sys.executable, "-S", "-m", "caseledger.metrics"]
    return argv, env


Collected = tuple[int, bytes, bytes, list[str], dict[str, str]]  # exit code, stdout, stderr; the argv and env run


def _collector_inline(args: list[str]) -> Collected:
    """The collector's entry in this process (procs.InProcess): (exit code, stdout, stderr) as a fresh one
    gives, and what ran (no interpreter of its own, no environment)."""
    if fault("postprocess", "fail") is not None:
        raise RuntimeError("postprocess:fail needs the collector in a fresh process: the test needs real processes")
    from caseledger.metrics.__main__ import main  # lazy: the collector's entry, only for an inline run

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    argv = [sys.executable, "inline: caseledger.metrics.__main__.main in the caller's process"]
    return code, out.getvalue().encode(), err.getvalue().encode(), argv, {}


def check_raw(paths: RunPaths, sealed: str | None) -> None:
    """Refuse raw data whose sha256 differs from the one sealed when the load's end was confirmed."""
    if sealed is None:
        return
    now = sha256_file(paths.raw) if paths.raw.is_file() else "missing"
    if now != sealed:
        raise EvidenceChanged(
            f"ledger/runs/{paths.run_id}/load/raw.jsonl changed after the load ended "
            f"(sha256 {now[:12]}… now, {sealed[:12]}… sealed at confirm_end); nothing was recomputed",
            "restore raw.jsonl from a backup (its sha256 is in the confirm_end event); a new measurement "
            "needs start_run",
            run_id=paths.run_id,
            phase=Phase.POSTPROCESS,
        )


def _collector_process(args: list[str], paths: RunPaths) -> Collected:
    """The collector as a fresh process: (exit code, stdout, stderr, its argv and env as recorded). Its pid is
    recorded at once (collector.pid.json), so phase_status names it the moment it is stopped (SIGSTOP), with
    `kill -CONT`. One that gives no answer within COLLECT_TIMEOUT_S (stopped, or stuck) is killed, and the phase
    fails as `collect`: the raw data is on disk, reprocess_raw repairs it."""
    run_id = paths.run_id
    argv, env = postprocess_env()
    p = subprocess.Popen(
        [*argv, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, stdin=subprocess.DEVNULL
    )
    with contextlib.suppress(OSError):  # evidence for readers; a full disk fails the phase where it writes results
        write_json(paths.collector_pid, procs.ref(p.pid))
    try:
        out, err = p.communicate(timeout=COLLECT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise PhaseFailed(
            f"postprocess: the collector (pid {p.pid}) gave no answer in {COLLECT_TIMEOUT_S:g} s (stopped or "
            "stuck) and was killed",
            FailureClass.COLLECT,
            calls.repair_figures(run_id),
        ) from None
    return p.returncode, out, err, argv, env


def collector_error(code: int, stderr: bytes) -> str:
    """What a failed collector said: its last stderr line, else how it ended (a signal by name)."""
    last = (stderr.decode(errors="replace").strip().splitlines() or [""])[-1]
    if last:
        return last
    return f"killed by {signal.Signals(-code).name}, no output" if code < 0 else f"exit {code}, no output"


def postprocess(paths: RunPaths, extra: list[str] | None = None, *, sealed: str | None = None) -> PostprocessEvidence:
    """The processor in a fresh subprocess with an explicit, recorded environment; the original error is kept.
    `sealed`: the raw data's sha256 recorded at confirm_end, checked first."""
    check_raw(paths, sealed)
    args = [str(paths.root), *(extra or [])]
    code, out_b, err_b, argv, env = procs.launcher().answer(
        lambda: _collector_process(args, paths), lambda: _collector_inline(args)
    )
    recorded_env = PostprocessEnv(interpreter=argv[0], argv=argv[1:], PYTHONPATH=env.get("PYTHONPATH", ""))
    if code != 0:
        raise PhaseFailed(
            redact.cut(f"postprocess: {collector_error(code, err_b)}", 400),
            FailureClass.COLLECT,
            calls.repair_figures(paths.run_id),
        )

    out = orjson.loads(out_b.decode().strip().splitlines()[-1])  # the collector's one JSON line
    return PostprocessEvidence(
        result=out.get("result"), raw_sha256=out.get("raw_sha256"), env=recorded_env, requests=out.get("requests")
    )


def decide(run: Run) -> DecideEvidence:
    """The run's decision, written with its reports (outcome/summary.py); its evidence names the outcome."""
    from caseledger.outcome import summary  # lazy: the outcome stage (numpy) is only needed once the load ended

    rec = summary.decide_run(run)  # decision.json's body, as JSON
    return DecideEvidence(decision=rec.get("outcome"), missing=rec.get("missing", []), baseline=rec.get("baseline_ref"))
