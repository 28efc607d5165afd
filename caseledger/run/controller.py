"""The controller: a detached process that holds the target's lease and runs a run's phases in order.

`python -m caseledger.run.controller RUN_DIR --fence N`. Before each phase it looks up the phase's recorded
state (a recorded success is kept, a recorded failure is where it starts again as a new attempt), runs it
with start/end events and an evidence file, and stops at the first failure with a failure class from
DESIGN.md. A heartbeat thread renews the lease; when the lease was taken over (fence rejected) the
controller stops at once. SIGTERM (`caseledger target stop`) stops the run: no phase before the load starts,
a formal load under way ends with what its clients recorded, and the phases after it keep and process that.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from caseledger import ledger, procs, redact, services
from caseledger.case.phases import PHASES, Phase
from caseledger.case.plan import FAILURE_OF_PHASE
from caseledger.errors import (
    CaseInvalid,
    CaseledgerError,
    FailureClass,
    FenceRejected,
    LockTimeout,
    PhaseFailed,
    RemoteError,
)
from caseledger.faults import checkpoint
from caseledger.ledger import calls, state
from caseledger.ledger import event_types as et
from caseledger.ledger.authorization import current_mode
from caseledger.ledger.evidence import (
    CachePrepareEvidence,
    ConfirmEndEvidence,
    DecideEvidence,
    LoadEvidence,
    NotRun,
    PhaseEvidence,
    PostprocessEvidence,
    PreflightEvidence,
    RouteVerifyEvidence,
    ServiceRecord,
    WarmupEvidence,
)
from caseledger.ledger.runs import read_run
from caseledger.ledger.state import PhaseState, client_refs, fold
from caseledger.run import after_load, prepare
from caseledger.run import lease as run_lease
from caseledger.run.admission.envcheck import CHART_ENV
from caseledger.run.handoff_writer import HandoffWriter
from caseledger.run.load import one as load_one
from caseledger.run.load import parts as load_parts
from caseledger.run.preflight import AHEAD, ahead_result, run_fresh
from caseledger.run.remote import load as remote_load
from caseledger.run.start import start_next
from caseledger.workspace import RunPaths, Spare, Workspace, is_disk_full, read_json_or_none, read_ref, write_json

PhaseBody = Callable[["Controller", int], PhaseEvidence]
STOP_MARGIN_S = 2.0  # the load stops at least this long before an unrenewed lease expires on the lease host
STOP_GRACE_S = 10.0  # a stopped load's clients record what is in flight and end within this, or are killed


# Set by a campaign driver in its own environment, so the controllers it starts inherit it: the driver draws the
# scenario's chart once when it ends, not each point's controller between points (the drawing would share the
# cores with the next point's formal window).
DRIVEN_BY = "CASELEDGER_CAMPAIGN_DRIVER"


def draw_chart(ws: Workspace, scenario: str) -> None:
    """Draw the scenario's chart for the result this run added, so the next summarize (MCP or CLI) finds it on disk
    instead of paying matplotlib and the drawing (~1.7 s) in the call (not with CASELEDGER_CHART_AFTER_RUN=0).
    Last and at the lowest CPU priority: after
    the outcome is recorded and the lease released, so a run starting meanwhile keeps the cores. Skipped for the
    point of a driven campaign (its driver draws once when it ends, not between points). Derived only: a failure
    is noted in the controller's log and never changes the run's outcome."""
    if os.environ.get(DRIVEN_BY) or os.environ.get(CHART_ENV) == "0":
        return
    try:  # not in the caller's process (procs.InProcess): no place for nice 19
        procs.launcher().niced(lambda: _draw_scenario(ws, scenario))
    except Exception as e:  # a derived file: whatever fails here, the run's facts stand
        print(f"controller: scenario chart not drawn: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


def _draw_scenario(ws: Workspace, scenario: str) -> None:
    from caseledger.views.chart import draw_scenario  # lazy: numpy and matplotlib (a controller starts light)

    draw_scenario(ws, scenario)


class Controller:
    def __init__(self, run_dir: Path, fence: int) -> None:
        self.run_ = read_run(run_dir)
        self.paths = self.run_.paths
        self.meta = self.run_.meta
        self.ws = self.run_.workspace
        self.case = self.run_.case
        if self.meta.target_key is None:
            raise CaseInvalid(f"{self.paths.run_json} names no target", f"start the run with {calls.start_run(...)}")
        self.key: str = self.meta.target_key
        self.fence = fence
        self.me = procs.me()
        self.owner = f"controller:{self.me['pid']}"
        self._stop = threading.Event()
        self.handoff = HandoffWriter(self.ws)
        self._deadline = time.monotonic() + ledger.LEASE_SECONDS  # the lease surely lapses by then unless renewed
        self.stop_asked = False  # SIGTERM (`caseledger target stop`): see _stop_asked
        self.phase_now: Phase | None = None  # the phase running now (read by the stop's thread)

    # ---- events
    def event(self, event: et.RunEvent, outputs: dict[str, Path] | None = None) -> None:
        ledger.append_event(
            self.ws, self.paths, event, owner=self.owner, fence=self.fence, target=self.key, outputs=outputs
        )

    def heartbeat(self) -> None:
        while not self._stop.wait(ledger.HEARTBEAT_SECONDS):
            try:
                self.renew()
            except LockTimeout as e:  # a stuck holder of the lease lock: this beat is missed, the next one retries
                print(f"controller: heartbeat: {e}", file=sys.stderr, flush=True)
            except RemoteError as e:  # the lease host did not answer: retry, but never load past the expiry
                print(f"controller: heartbeat: {e}", file=sys.stderr, flush=True)
                if time.monotonic() + ledger.HEARTBEAT_SECONDS + STOP_MARGIN_S >= self._deadline:
                    self.lose_target(f"the lease host did not answer for {ledger.LEASE_SECONDS:g}s: {e.message}")

    def renew(self) -> None:
        """Extend the lease, naming the load client (it keeps the lease if this controller dies)."""
        extra = client_refs(self.paths)
        sent = time.monotonic()
        try:
            run_lease.renew(
                self.ws,
                self.case,
                self.key,
                self.paths.run_id,
                self.fence,
                owner=self.me,
                extra_procs=extra,
                timeout_s=max(0.5, min(ledger.HEARTBEAT_SECONDS, self._deadline - sent - STOP_MARGIN_S)),
            )
        except FenceRejected as e:
            self.lose_target(e.message)  # a newer owner holds the target: stop loading and writing at once
        self._deadline = run_lease.deadline_after(sent)

    def lose_target(self, why: str) -> NoReturn:
        """The lease is lost (fenced by a newer owner) or about to lapse unrenewed: stop this run's load
        client and exit, so no request of this run reaches the target past the lease."""
        print(f"controller: lost the target's lease, stopping the load: {why}", file=sys.stderr, flush=True)
        # in the caller's process the process to end is the caller's: lease races are tested with real controllers
        procs.launcher().own_process(f"an inline run lost its target's lease: {why}")
        with contextlib.suppress(Exception):  # best effort: the exit below happens whatever this meets
            self.paths.load_abort.touch()
            self._end_clients(grace_s=1.0)
        os._exit(70)

    def _end_clients(self, grace_s: float) -> None:
        """SIGTERM every load client process of this run (here, on load hosts, each of a shared load); each
        records what it has in flight as cancelled and writes its end file, within grace_s or is killed."""
        ref = read_json_or_none(self.paths.load_pid) or read_json_or_none(self.paths.load_armed)
        if ref and self.case.load.host is not None and procs.elsewhere(ref):
            from caseledger.services.remote import Remote  # lazy: SSH only for a remote load client

            Remote(self.case.load.host).terminate(ref, grace_s=grace_s)
        elif ref:
            procs.terminate(ref, grace_s=grace_s)
        for part in client_refs(self.paths):  # every process of a shared load (load.processes > 1)
            procs.terminate(part, grace_s=grace_s)
        parts = [r for p in self.paths.load_parts() if (r := read_ref(p.load_pid)) is not None]
        remote_load.terminate_elsewhere(self.case, parts)  # the processes of a shared load on load hosts

    # ---- stop (SIGTERM: `caseledger target stop`)
    def _stop_asked(self, signum: int, frame: object) -> None:
        """SIGTERM: no phase before the load starts any more; a formal load under way is ended (its clients
        record what is in flight and write their end files), and the phases after it seal and process the
        records it has, so the run ends partial with nothing lost."""
        if not self.stop_asked:
            self.stop_asked = True
            threading.Thread(target=self._end_load_when_sent, daemon=True).start()

    def _end_load_when_sent(self) -> None:
        """End the formal load once it is sent (load/go written); nothing to do once this run is past its load."""
        while self.phase_now is None or PHASES.index(self.phase_now) <= PHASES.index(Phase.LOAD):
            if self.paths.load_end.exists():
                return
            if self.phase_now == Phase.LOAD and self.paths.load_go.exists():
                with contextlib.suppress(Exception):  # best effort: the load's own end is judged as ever
                    self._end_clients(grace_s=STOP_GRACE_S)
                return
            time.sleep(0.1)

    def _end_stopped(self, phase: Phase, attempt: int) -> FailureClass:
        """The phase a stop kept from starting, recorded as failed in its own class: status names the stop, and a
        resume (or the campaign's next driver) starts again from here."""
        cls = FAILURE_OF_PHASE[phase]
        self.event(et.PhaseStarted(phase=phase, attempt=attempt))
        self._end(
            phase,
            attempt,
            "failed",
            {"failure_class": cls, "fix": f"resume the run to go on from {phase} (nothing of it ran)"},
            error=f"stopped (SIGTERM, caseledger target stop) before {phase}: no formal request was sent",
        )
        return cls

    # ---- main loop
    def run(self) -> int:
        write_json(self.paths.controller_pid, {**self.me, "fence": self.fence})
        try:
            # the load client at once (a resume's fresh lease names none): a remote one keeps the lease even
            # if this controller gives up on its host before the first heartbeat
            extra = client_refs(self.paths)
            sent = time.monotonic()
            run_lease.renew(
                self.ws, self.case, self.key, self.paths.run_id, self.fence, owner=self.me, extra_procs=extra
            )
            self._deadline = run_lease.deadline_after(sent)
        except (FenceRejected, RemoteError) as e:  # nothing of this run has been sent yet
            print(f"controller: {e}", file=sys.stderr)
            return 70
        threading.Thread(target=self.heartbeat, daemon=True).start()
        procs.launcher().adopt(sigterm=self._stop_asked)  # (not the caller's signals: procs.InProcess)
        self.event(et.ControllerStarted(data=et.PidData(pid=self.me["pid"])))
        outcome = "succeeded"
        keep_lease = False
        spare = Spare(self.paths.root / ".spare")  # freed on a full disk: room for the event naming the cause
        phase: Phase | None = None
        try:
            view = fold(self.ws, self.run_)
            if view.phases[Phase.LOAD].state == PhaseState.PENDING:
                load_one.arm_client(self.run_)  # its start-up overlaps preflight and service
            steps = state.next_steps(view)  # the same steps phase_status announced
            for phase in PHASES:
                pv = view.phases[phase]
                if phase not in steps.run:
                    continue  # recorded success is kept (never repeated; the service chain after a lost service)
                checkpoint("controller", "before", phase, run_dir=self.paths.root)
                attempt = pv.attempt + 1
                if self.stop_asked and PHASES.index(phase) <= PHASES.index(Phase.LOAD):
                    outcome = f"failed:{self._end_stopped(phase, attempt)}"
                    break
                self.phase_now = phase
                self.event(et.PhaseStarted(phase=phase, attempt=attempt))
                self.handoff.ask()
                failed = self.run_phase(phase, attempt)
                if failed is not None:
                    outcome = f"failed:{failed}"
                    keep_lease = failed == FailureClass.END_UNKNOWN
                    break
                checkpoint("controller", "after", phase)
            self.event(et.RunEnded(data=et.OutcomeData(outcome=outcome)))
        except OSError as e:
            if not is_disk_full(e):
                raise
            outcome = f"failed:{FailureClass.DISK}"
            spare.free()
            self._disk_full(e, phase)
        finally:
            spare.free()
            load_one.disarm_client(self.paths)
            self._stop.set()
            if not keep_lease:
                try:
                    run_lease.release(self.ws, self.case, self.key, self.paths.run_id, self.fence)
                except RemoteError as e:  # the lease lapses at its expiry instead
                    print(f"controller: release: {e}", file=sys.stderr)
            self.handoff.final(self.paths.run_id)  # a full disk leaves it as it was: the outcome is recorded
            if not keep_lease and not outcome.endswith(FailureClass.DISK):
                nxt = start_next(self.ws, self.key)  # an explicitly queued, preflighted case
                if nxt:  # our fence is stale now (the next run holds the target): record without it
                    ledger.append_event(
                        self.ws, self.paths, et.StartedQueuedRun(data=et.RunIdData(run_id=nxt)), owner=self.owner
                    )
                elif outcome == "succeeded":
                    draw_chart(self.ws, self.case.scenario)
        return 0 if outcome == "succeeded" else 1

    def _disk_full(self, e: OSError, phase: Phase | None) -> None:
        """The disk filled up under the controller: record why, where, in the phase it was in (with the
        spare's room), so status names the cause and resume goes on once space is free."""
        where = Path(e.filename).name if e.filename else "a ledger file"
        msg = f"disk full (ENOSPC) writing {where}"
        with contextlib.suppress(OSError):
            at = phase or Phase.PREFLIGHT
            self.event(
                et.PhaseEnded(
                    phase=at,
                    attempt=fold(self.ws, self.run_).phases[at].attempt,
                    error=msg,
                    data=et.PhaseEndedData(
                        outcome=PhaseState.FAILED, failure_class=FailureClass.DISK, fix="free disk space, then resume"
                    ),
                )
            )
            self.event(et.RunEnded(data=et.OutcomeData(outcome=f"failed:{FailureClass.DISK}")))

    def run_phase(self, phase: Phase, attempt: int) -> FailureClass | None:
        """Run one phase body from the dispatch table and record its end; the failure class if it failed."""
        try:
            data = PHASE_BODIES[phase](self, attempt).evidence()  # the model as JSON, where it is written
        except OSError as e:
            if is_disk_full(e):
                raise  # run() records it with the spare's room: nothing more can be written here
            cls = FAILURE_OF_PHASE[phase]
            self._end(phase, attempt, "failed", {"failure_class": cls}, error=f"{type(e).__name__}: {e}")
            return cls
        except PhaseFailed as e:
            self._end(
                phase,
                attempt,
                "failed",
                {**e.evidence, "failure_class": e.failure_class, "fix": e.fix},
                error=e.message,
            )
            return e.failure_class
        except Exception as e:  # a bug of ours, never the phase's own class: resuming would meet the same bug
            cls = FailureClass.INTERNAL
            print(f"controller: {phase}: internal error", file=sys.stderr)
            traceback.print_exc()
            self._end(
                phase,
                attempt,
                "failed",
                {
                    "failure_class": cls,
                    "fix": "report it with the controller log (ledger/runs/<run>/controller.log); the raw data is kept",
                },
                error=f"{type(e).__name__}: {e}",
            )
            return cls
        self._end(phase, attempt, data.pop("outcome", "done"), data)
        return None

    # data: JSON, the evidence as written (a model's dump, or a failure's class, fix and PhaseFailed.evidence)
    def _end(
        self,
        phase: Phase,
        attempt: int,
        outcome: str,
        data: dict[str, Any],  # JSON: evidence
        error: str | None = None,
    ) -> None:
        # the phase's error and evidence carry outside text (a server's answer, a log line, an SSH error, an
        # exception): the values of the case's secrets are masked before either is written
        secrets = redact.current()
        error, data = (secrets.mask(error) if error else error), secrets.mask_obj(data)
        ev = self.paths.phase_file(phase)
        write_json(ev, {"phase": phase, "attempt": attempt, "outcome": outcome, "error": error, **data})
        self.event(
            et.PhaseEnded(
                phase=phase,
                attempt=attempt,
                error=error,
                data=et.PhaseEndedData.model_validate({"outcome": outcome, **data}),
            ),
            outputs={"evidence": ev},
        )

    def action(self, phase: Phase) -> str:
        return self.meta.action(phase)

    def _service_reused(self) -> bool:
        rec = self._service_record()
        return rec is not None and rec.outcome == "reused"

    def _service_record(self) -> ServiceRecord | None:
        return ServiceRecord.read(self.paths.phase_file(Phase.SERVICE))

    # ---- phase bodies: each returns its evidence or raises PhaseFailed
    def phase_preflight(self, attempt: int) -> PreflightEvidence:
        # the process start_run spawned ahead and handed this run (a resume runs a fresh one)
        res = (ahead_result(self.paths) if attempt == 1 else None) or run_fresh(self.paths.root)
        if not res.ok or res.checks is None:
            raise PhaseFailed(
                redact.cut(f"preflight: {res.error}", 300),
                FailureClass.BEFORE_MODEL,
                "fix the cause and resume; 0 model requests were sent",
            )
        checks = res.checks
        if self.case.load.host_shares() and not self.meta.load_reuse:
            # the load host too: same caseledger, the run and its dataset copied and hash-verified there, the
            # same preflight entry point run fresh there (sockets forbidden), the clock offset
            checks = checks.model_copy(update={"load_host": remote_load.preflight(self.run_)})
        return PreflightEvidence(checks=checks, requests_sent=0)

    def phase_service(self, attempt: int) -> ServiceRecord:
        if self.action(Phase.SERVICE) == "reuse" and self.meta.load_reuse:
            return ServiceRecord(outcome="reused", reason="measurement-only: the target is not contacted")
        allow_start = (self.meta.authorized or current_mode(self.ws)) != "paused"
        rec = services.ensure(self.ws, self.case, self.key, self.meta.case_id, allow_start=allow_start)
        rec.plan = self.action(Phase.SERVICE)
        return rec

    def phase_warmup(self, attempt: int) -> WarmupEvidence | NotRun:
        if self.case.warmup.requests == 0:
            return NotRun(outcome="skipped", reason="warmup.requests is 0")
        if self._service_reused() and self.action(Phase.WARMUP) == "reuse":
            return NotRun(outcome="reused", reason="service reused and warm")
        if self.meta.load_reuse:
            return NotRun(outcome="reused", reason="measurement-only")
        return prepare.warmup(self.run_, self._changed_routes())

    def phase_route_verify(self, attempt: int) -> RouteVerifyEvidence | NotRun:
        if self.meta.load_reuse or (self._service_reused() and self.action(Phase.ROUTE_VERIFY) == "reuse"):
            return NotRun(
                outcome="reused", reason="service reused: warmed and routes verified with this dataset since it started"
            )
        out = prepare.route_verify(self.run_, self._changed_routes())
        rec = self._service_record()
        if rec is not None:  # these instances are warm now: the next run's plan reuses warmup and routes
            services.mark_warm(self.ws, self.key, rec, self.paths.run_id, self.meta.dataset_id or "")
        return out

    def _changed_routes(self) -> list[int] | None:
        """With components, the routes whose processes the service phase (re)started (the others kept their pids
        and warm caches, so warmup and route verification skip them); None: every route."""
        rec = self._service_record()
        return (
            list(rec.changed_routes)
            if rec is not None and rec.changed_routes is not None and rec.partly_reused
            else None
        )

    def phase_cache_prepare(self, attempt: int) -> CachePrepareEvidence | NotRun:
        act = self.action(Phase.CACHE_PREPARE)
        step = self.meta.plan_step(Phase.CACHE_PREPARE)
        reason = step.reason if step else ""
        if act == "skip":
            return NotRun(outcome="skipped", reason=reason)
        if act == "reuse":
            return NotRun(outcome="reused", reason=reason)
        return prepare.cache_prepare(self.run_, seed=act == "run" or not self._service_reused())

    def phase_load(self, attempt: int) -> LoadEvidence:
        if self.meta.load_reuse:
            return load_one.reuse_parent_load(self.run_)

        def event(e: et.RunEvent) -> None:
            self.event(e)
            if isinstance(e, et.LoadClientStarted):
                # the client's ref into the lease now, not at the next heartbeat (a lease host that does not
                # answer: the heartbeat retries, and stops the load before the lease would lapse)
                with contextlib.suppress(RemoteError):
                    self.renew()

        if self.case.load.total_processes > 1:  # several client processes: their own start, wait and merge
            return load_parts.load(self.run_, attempt, event)
        return load_one.load(self.run_, attempt, event)

    def phase_confirm_end(self, attempt: int) -> ConfirmEndEvidence:
        if self.case.load.total_processes > 1:  # several client processes: each one's records and end file
            return load_parts.confirm_end(self.run_)
        return load_one.confirm_end(self.run_)

    def phase_postprocess(self, attempt: int) -> PostprocessEvidence:
        return after_load.postprocess(self.paths, sealed=state.sealed_raw_sha256(state.fold(self.ws, self.run_)))

    def phase_decide(self, attempt: int) -> DecideEvidence:
        return after_load.decide(self.run_)


# The one dispatch table: every phase has exactly one body (a test checks it covers Phase).
PHASE_BODIES: dict[Phase, PhaseBody] = {
    Phase.PREFLIGHT: Controller.phase_preflight,
    Phase.SERVICE: Controller.phase_service,
    Phase.WARMUP: Controller.phase_warmup,
    Phase.ROUTE_VERIFY: Controller.phase_route_verify,
    Phase.CACHE_PREPARE: Controller.phase_cache_prepare,
    Phase.LOAD: Controller.phase_load,
    Phase.CONFIRM_END: Controller.phase_confirm_end,
    Phase.POSTPROCESS: Controller.phase_postprocess,
    Phase.DECIDE: Controller.phase_decide,
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == [AHEAD]:  # spawned before the run existed (start.spawn_controller_ahead): its imports are done
        line = sys.stdin.readline().split()
        if len(line) != 2:
            return 0  # start_run gave up (e.g. the target was held): nothing to control
        args = [line[0], "--fence", line[1]]
        log = os.open(RunPaths(Path(line[0])).controller_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)  # from here on it writes where a controller spawned for its run writes
        os.dup2(log, 2)
        os.close(log)
    run_dir = Path(args[0])
    fence = int(args[args.index("--fence") + 1])
    try:
        return Controller(run_dir, fence).run()
    except CaseledgerError as e:
        print(f"controller: {redact.mask(str(e))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    code = main()
    gc.freeze()  # no final collection over every imported model at exit: ~0.15 s of teardown (the driver waits for it)
    raise SystemExit(code)
