"""Run state folded from events, then checked against evidence.

Readers (phase_status, summarize, handoff) call `fold`; they never write run state. Evidence outranks
status strings: an end file beats a stale 'started' event, results on disk beat a stale postprocess
failure, a dead controller turns an open phase into UNKNOWN instead of RUNNING.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from caseledger import procs
from caseledger.case.plan import FAILURE_OF_PHASE, PHASES, Phase
from caseledger.errors import OUTSIDE_CHARS, FailureClass, quoted
from caseledger.ledger.events import read_events
from caseledger.ledger.evidence import ComponentRecord, ServiceRecord
from caseledger.ledger.runs import Run, RunMeta, has_results, load_run
from caseledger.records import iter_lines
from caseledger.workspace import RunPaths, Workspace, read_json_or_none


class PhaseState(StrEnum):
    PENDING = "pending"  # not started yet
    RUNNING = "running"  # started, no end, its owner is alive
    DONE = "done"  # ended with evidence
    REUSED = "reused"  # the parent's state was reused (the plan said so and it was verified)
    SKIPPED = "skipped"  # the case does not need it
    FAILED = "failed"  # ended in failure; failure_class says which
    UNKNOWN = "unknown"  # started, owner gone, no end evidence


class RunState(StrEnum):
    CREATED = "created"  # run dir written, controller not yet at work
    RUNNING = "running"  # a live controller (or the load client) is working
    SUCCEEDED = "succeeded"  # every phase done or reused; decision recorded
    PARTIAL = "partial"  # every phase done, but on a partial load (the client died): not a full measurement
    FAILED = "failed"  # stopped at a failed phase (failure_class)
    END_UNKNOWN = "end_unknown"  # owner lost while a phase was in flight; check evidence with resume


@dataclass
class PhaseView:
    name: Phase
    state: PhaseState = PhaseState.PENDING
    attempt: int = 0
    started_utc: str | None = None
    ended_utc: str | None = None
    started_mono: int | None = None
    ended_mono: int | None = None
    failure_class: FailureClass | None = None
    error: str | None = None
    data: dict[str, Any] = field(default_factory=dict)  # its end event's data, JSON as any version wrote it
    evidence: str | None = None  # the file its end event names (the controller's phases/<phase>.json)


@dataclass
class Counts:
    planned: int = 0
    sent: int = 0
    done: int = 0
    ok: int = 0
    failed: int = 0


@dataclass
class RunView:
    run_id: str
    case_id: str
    scenario: str
    meta: RunMeta
    phases: dict[Phase, PhaseView]
    state: RunState
    failure_class: FailureClass | None
    current: Phase | None  # the phase the run is at (running, failed or next)
    controller_alive: bool
    client_alive: bool
    counts: Counts
    load_ended: str  # yes | no | unknown | partial
    results_extracted: bool
    decision: RecordedDecision | None  # the run's decision file (null: decide has not run)
    torn_events: bool
    blocker: str | None
    next_call: str
    next_restarts_service: bool
    next_repeats_warmup: bool
    next_resends_requests: bool
    service_alive: bool | None = None  # the service this run verified: alive now? None: not ours to check
    service_gone: list[str] = field(default_factory=list)  # its processes no longer live ('r1 pid 123')
    missing_evidence: list[str] = field(default_factory=list)  # files a finished phase wrote, now gone
    steps: NextSteps | None = None  # what the next controller (a resume) runs
    client_host: str | None = None  # the load client runs on this other host (load.host): alive is unknown here
    client_stopped: bool = False  # the load client's process is alive but stopped (SIGSTOP): no progress
    controller_stopped: bool = False  # the controller's process is alive but stopped


REPEATS_BEFORE_BY_HAND = 3  # attempts of one phase failing the same way, after which resume is no answer

# A load that failed with one of these sent nothing the target served (rejected or cut by a dead service):
# the next attempt sends it again, the failed attempt's raw data kept aside. Any other load failure is
# never re-sent (end_unknown: resume confirms what the client recorded).
RESEND_CLASSES = (FailureClass.HOT_ENTRY, FailureClass.AUTH, FailureClass.SERVICE, FailureClass.OVERLOAD)
_FINISHED = (PhaseState.DONE, PhaseState.REUSED, PhaseState.SKIPPED)
_SERVICE_CHAIN = (Phase.SERVICE, Phase.WARMUP, Phase.ROUTE_VERIFY, Phase.CACHE_PREPARE)


@dataclass(frozen=True)
class NextSteps:
    """What the next controller of a run does, computed once for phase_status, resume and the controller."""

    run: tuple[Phase, ...]  # the phases it runs, in order (finished ones are kept, never repeated, except:)
    redo: tuple[Phase, ...]  # finished phases it runs again: the service died, so service..cache again
    restarts_service: bool
    repeats_warmup: bool
    resends_requests: bool

    @property
    def first(self) -> Phase | None:
        return self.run[0] if self.run else None


def next_steps(v: RunView) -> NextSteps:
    """The phases a resume runs: every unfinished one, plus the service chain again when the service this
    run started or verified has died and the formal load is still to be sent."""
    meta, ph = v.meta, v.phases
    lv = ph[Phase.LOAD]
    load_sends = not meta.load_reuse and (
        lv.state == PhaseState.PENDING or (lv.state == PhaseState.FAILED and lv.failure_class in RESEND_CLASSES)
    )
    redo: tuple[Phase, ...] = ()
    # the service is gone or stopped, or answered no health before the formal load: it is started again
    unhealthy = lv.state == PhaseState.FAILED and bool(lv.data.get("service_problem"))
    if (v.service_alive is False or unhealthy) and load_sends:
        redo = tuple(p for p in _SERVICE_CHAIN if ph[p].state in _FINISHED)
    run = tuple(p for p in PHASES if ph[p].state not in _FINISHED or p in redo)
    # not yet run in this run (a preflight failure): the plan's live check at start_run says whether it is reused
    planned_reuse = (
        v.service_alive is None
        and ph[Phase.SERVICE].state == PhaseState.PENDING
        and meta.action(Phase.SERVICE) == "reuse"
    )
    restarts = (
        Phase.SERVICE in run
        and not meta.load_reuse
        and (v.service_alive is not True or unhealthy)
        and not planned_reuse
    )
    return NextSteps(
        run=run,
        redo=redo,
        restarts_service=restarts,
        repeats_warmup=Phase.WARMUP in run and not meta.load_reuse and meta.action(Phase.WARMUP) != "skip",
        resends_requests=Phase.LOAD in run and lv.state == PhaseState.FAILED and lv.failure_class in RESEND_CLASSES,
    )


def _service_alive(ws: Workspace, meta: RunMeta, sv: PhaseView) -> tuple[bool | None, list[str]]:
    """Whether the local service this run's service phase started or reused is still the live one."""
    rec = ServiceRecord.of(sv.data) if sv.state in _FINISHED else None
    if meta.load_reuse or not meta.target_key or rec is None:
        return None, []  # no service of ours (measurement-only)
    if not all(c.pid is not None and not c.host for c in rec.processes):
        return None, []  # external, or remote (no SSH round trip here)
    gone = _gone(ws, meta.target_key, rec)
    return not gone, gone


def _gone(ws: Workspace, key: str, rec: ServiceRecord) -> list[str]:
    """'pid N' (or 'NAME pid N' for a component) of each process of a service record no longer the live one:
    stopped, replaced or dead since."""
    out = []
    for c in rec.processes:
        comp = c if isinstance(c, ComponentRecord) else None
        st = read_json_or_none(ws.services_dir / f"{comp.key if comp else key}.json") or {}
        proc = st.get("proc")
        who = f"{comp.name} pid {c.pid}" if comp else f"pid {c.pid}"
        if not isinstance(proc, dict) or proc.get("pid") != c.pid or not procs.alive(proc):
            out.append(who)
        elif procs.stopped(proc):
            out.append(f"{who} stopped (SIGSTOP)")
    return out


def count_raw(path: Path) -> tuple[int, int]:
    """(records, ok) in a raw file, tolerating a torn last line; no JSON parsing for speed."""
    if not path.exists():
        return 0, 0
    n = ok = 0
    for last, line in iter_lines(path):
        if last:
            continue  # torn
        n += 1
        if b'"ok":true' in line:
            ok += 1
    return n, ok


def count_sent(paths: RunPaths) -> int:
    """Formal requests recorded as sent (load/sent.log: written before each one's first byte leaves)."""
    try:
        return paths.load_sent.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def load_counts(paths: RunPaths, planned: int) -> Counts:
    """The one count of a run's formal load: the end file when there is one, else the evidence on disk
    (sent from the intent log, done and ok from the raw records; progress.json is only a fallback)."""
    end = read_json_or_none(paths.load_end)
    if end:
        return Counts(
            planned, int(end.get("sent", 0)), int(end.get("done", 0)), int(end.get("ok", 0)), int(end.get("failed", 0))
        )
    parts = paths.load_parts()
    if parts:  # load.processes > 1, not merged yet: the sum of every process's own count
        each = [load_counts(p, 0) for p in parts]
        n, ok = sum(c.done for c in each), sum(c.ok for c in each)
        return Counts(planned, sum(c.sent for c in each), n, ok, n - ok)
    prog = read_json_or_none(paths.load_progress) or {}
    n, ok = count_raw(paths.raw)
    sent = max(count_sent(paths) or int(prog.get("sent", 0)), n)
    return Counts(planned, sent, n, ok, n - ok)


def client_refs(paths: RunPaths) -> list[dict[str, Any]]:
    """The load client's process reference, or every process's of a load shared by load.processes > 1."""
    refs = [read_json_or_none(paths.load_pid)] + [read_json_or_none(p.load_pid) for p in paths.load_parts()]
    return [r for r in refs if isinstance(r, dict)]


class RecordedDecision(BaseModel):
    """What a run's decision file says, as the ledger reads it (outcome/decide.py writes the full record)."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    outcome: str
    reason: str | None = None
    enough_to_decide: bool | None = None


def _fold_events(events: list[dict[str, Any]]) -> dict[Phase, PhaseView]:  # events.jsonl lines as parsed
    """Each phase's last attempt, from its started and ended events."""
    phases = {p: PhaseView(p) for p in PHASES}
    for ev in events:
        ph = ev.get("phase")
        if ph not in phases:
            continue
        v = phases[Phase(ph)]
        t = ev["type"]
        if t == "phase_started":
            v.state, v.attempt = PhaseState.RUNNING, ev.get("attempt") or 1
            v.started_utc, v.started_mono = ev["utc"], ev["mono_ns"]
            v.ended_utc = v.failure_class = v.error = v.evidence = None
            v.data = {}
        elif t == "phase_ended":
            v.state = PhaseState(ev["data"].get("outcome", "done"))
            v.ended_utc, v.ended_mono = ev["utc"], ev["mono_ns"]
            fc = ev["data"].get("failure_class")
            v.failure_class = FailureClass(fc) if fc else None
            v.error = ev.get("error")
            v.data = ev["data"]
            v.attempt = ev.get("attempt") or v.attempt
            v.evidence = (ev.get("outputs") or {}).get("evidence")
    return phases


def _check_evidence(
    phases: dict[Phase, PhaseView],
    *,
    end: bool,
    controller_alive: bool,
    client_alive: bool,
    results_extracted: bool,
    decided: bool,
) -> None:
    """Evidence outranks status strings: an end file beats a stale 'started', results on disk beat a stale
    postprocess failure, a decision file ends decide, and an open phase of a dead owner is unknown."""
    lv = phases[Phase.LOAD]
    if end and lv.state in (PhaseState.RUNNING, PhaseState.UNKNOWN):
        lv.state, lv.failure_class = PhaseState.DONE, None
    for v in phases.values():  # a live load client keeps load running
        if v.state == PhaseState.RUNNING and not controller_alive and not (v.name == Phase.LOAD and client_alive):
            v.state = PhaseState.UNKNOWN
            v.failure_class = FAILURE_OF_PHASE[v.name]
    pv = phases[Phase.POSTPROCESS]
    if results_extracted and pv.state in (PhaseState.FAILED, PhaseState.UNKNOWN, PhaseState.RUNNING):
        pv.state, pv.failure_class = PhaseState.DONE, None  # repaired by reprocess_raw
    dv = phases[Phase.DECIDE]
    if decided and dv.state in (PhaseState.PENDING, PhaseState.FAILED, PhaseState.UNKNOWN, PhaseState.RUNNING):
        dv.state, dv.failure_class = PhaseState.DONE, None


def _load_ended(
    paths: RunPaths,
    meta: RunMeta,
    lv: PhaseView,
    end: dict[str, Any] | None,  # load/end.json as the load client wrote it
    *,
    client_alive: bool,
    remote_followed: bool,
) -> str:
    """yes | no | unknown | partial, from the end file, the partial marker and the load's state."""
    if end:
        return "yes" if int(end.get("done", 0)) >= meta.planned else "partial"
    if read_json_or_none(paths.load_partial):
        return "partial"
    if meta.load_reused:
        return "yes"
    if client_alive or lv.state == PhaseState.PENDING or (remote_followed and lv.state == PhaseState.RUNNING):
        return "no"  # (a remote client is followed by its live controller)
    return "unknown"


def _overall(
    phases: dict[Phase, PhaseView], meta: RunMeta, load_ended: str, *, controller_alive: bool, client_alive: bool
) -> tuple[RunState, Phase | None, FailureClass | None]:
    """The run's state, the phase it is at, and its failure class."""

    def first(state: PhaseState) -> PhaseView | None:
        return next((v for v in phases.values() if v.state == state), None)

    failed, unknown, running = first(PhaseState.FAILED), first(PhaseState.UNKNOWN), first(PhaseState.RUNNING)
    pending = next((p for p, v in phases.items() if v.state == PhaseState.PENDING), None)
    if all(v.state in _FINISHED for v in phases.values()):
        return (RunState.PARTIAL if load_ended == "partial" else RunState.SUCCEEDED), None, None
    if running is not None and (controller_alive or client_alive):
        return RunState.RUNNING, running.name, None
    if failed is not None:
        return RunState.FAILED, failed.name, failed.failure_class
    if unknown is not None:
        return RunState.END_UNKNOWN, unknown.name, unknown.failure_class
    if controller_alive:
        return RunState.RUNNING, pending, None
    if pending is not None and any(v.state != PhaseState.PENDING for v in phases.values()):
        return RunState.END_UNKNOWN, pending, FAILURE_OF_PHASE[pending]
    if not controller_alive and meta.controller_spawned:
        return RunState.END_UNKNOWN, Phase.PREFLIGHT, FailureClass.BEFORE_MODEL
    return RunState.CREATED, Phase.PREFLIGHT, None


def fold(ws: Workspace, run: Run | str) -> RunView:
    """The run's state: events folded, then checked against the evidence on disk."""
    run = run if isinstance(run, Run) else load_run(ws, run)
    paths, meta = run.paths, run.meta
    log = read_events(paths)
    phases = _fold_events(log.events)
    ctl, clients = read_json_or_none(paths.controller_pid), client_refs(paths)
    # a process on a load host not yet seen gone there (only SSH can tell) outranks one seen gone
    client_ref = next((c for c in clients if procs.alive(c) or procs.elsewhere(c)), clients[0] if clients else None)
    controller_alive, client_alive = procs.alive(ctl), procs.alive(client_ref)
    client_host = procs.elsewhere(client_ref)
    end = read_json_or_none(paths.load_end)
    results_extracted = has_results(paths)
    decision = read_json_or_none(paths.decision)
    _check_evidence(
        phases,
        end=bool(end),
        controller_alive=controller_alive,
        client_alive=client_alive,
        results_extracted=results_extracted,
        decided=bool(decision),
    )
    load_ended = _load_ended(
        paths,
        meta,
        phases[Phase.LOAD],
        end,
        client_alive=client_alive,
        remote_followed=bool(client_host) and controller_alive,
    )
    state, current, failure_class = _overall(
        phases, meta, load_ended, controller_alive=controller_alive, client_alive=client_alive
    )
    service = _service_alive(ws, meta, phases[Phase.SERVICE])
    view = RunView(
        run_id=run.run_id,
        case_id=meta.case_id,
        scenario=meta.scenario,
        meta=meta,
        phases=phases,
        state=state,
        failure_class=failure_class,
        current=current,
        controller_alive=controller_alive,
        client_alive=client_alive,
        counts=load_counts(paths, meta.planned),
        load_ended=load_ended,
        results_extracted=results_extracted,
        decision=RecordedDecision.model_validate(decision) if decision else None,
        torn_events=log.torn_tail,
        blocker=None,
        next_call="",
        next_restarts_service=False,
        next_repeats_warmup=False,
        next_resends_requests=False,
        service_alive=service[0],
        service_gone=service[1],
        missing_evidence=_missing_evidence(paths, phases, meta),
        client_host=client_host,
        client_stopped=procs.stopped(client_ref),
        controller_stopped=procs.stopped(ctl),
    )
    view.steps = steps = next_steps(view)
    if state != RunState.RUNNING and steps.redo and view.failure_class is None:
        # every phase it ran is recorded as done, but the service it measured on is gone
        view.state, view.current, view.failure_class = RunState.FAILED, Phase.SERVICE, FailureClass.SERVICE
    view.next_restarts_service = steps.restarts_service
    view.next_repeats_warmup = steps.repeats_warmup
    view.next_resends_requests = steps.resends_requests
    _advise(view)
    return view


def _missing_evidence(paths: RunPaths, phases: dict[Phase, PhaseView], meta: RunMeta) -> list[str]:
    """Evidence a finished phase recorded that is no longer on disk (workspace-relative names)."""
    if meta.imported is not None:
        return []
    gone = [
        f"phases/{p.value}.json"
        for p, v in phases.items()
        if v.state in _FINISHED and v.evidence and not paths.phase_file(p).exists()
    ]
    if phases[Phase.LOAD].state == PhaseState.DONE and not meta.load_reused and not paths.raw.exists():
        gone.append("load/raw.jsonl")
    return gone


def sealed_raw_sha256(v: RunView) -> str | None:
    """The raw data's sha256 recorded when the load's end was confirmed (or, before that, at load end)."""
    for phase in (Phase.CONFIRM_END, Phase.LOAD):
        sha = v.phases[phase].data.get("raw_sha256") if phase in v.phases else None
        if isinstance(sha, str):
            return sha
    return None


def _advise(v: RunView) -> None:
    """The blocker at its boundary and the one next call."""
    if _advise_live(v):
        return
    ph = v.phases[v.current] if v.current else None
    err = (ph.error or "") if ph else ""
    if v.steps is not None and v.steps.redo and not err:
        err = f"the service ({', '.join(v.service_gone) or 'its process'}) is gone; the formal load still needs it"
    where = f"{v.current}: {quoted(err, OUTSIDE_CHARS)}" if err else f"{v.current}"
    v.blocker = f"{v.failure_class} at {where}"
    advice = _NEXT_AFTER.get(v.failure_class) if v.failure_class else None
    v.next_call = advice(v, ph) if advice else f"resume(run_id='{v.run_id}')"


def _advise_live(v: RunView) -> bool:
    """The next call of a run that has not stopped at a failure (finished, partial, running): True when set."""
    rid = v.run_id
    if v.state == RunState.SUCCEEDED:
        v.next_call = f"summarize(run_ids=['{rid}'])"
    elif v.state == RunState.PARTIAL:
        v.blocker = f"partial load: {v.counts.done} of {v.counts.planned} requests recorded (client died)"
        v.next_call = (
            f"start_run(case_id='{v.case_id}') for a full load; this run's records stay "
            f"(summarize(run_ids=['{rid}']) shows them)"
        )
    elif v.state == RunState.RUNNING and not v.controller_alive:
        v.blocker = "controller gone; the load client is still running"
        v.next_call = f"resume(run_id='{rid}') re-attaches to the running load client (nothing is re-sent)"
    elif v.state == RunState.RUNNING and (v.client_stopped or v.controller_stopped or v.service_gone):
        who = ", ".join(
            [
                *(["load client"] if v.client_stopped else []),
                *(["controller"] if v.controller_stopped else []),
                *[f"service {g}" for g in v.service_gone],
            ]
        )
        v.blocker = f"{who} stopped or gone while the run is at {v.current}: no progress; figures would be distorted"
        v.next_call = (
            f"send SIGCONT to what was stopped (or let the run fail and resume(run_id='{rid}')); "
            f"phase_status(run_id='{rid}') shows it"
        )
    elif v.state in (RunState.RUNNING, RunState.CREATED):
        v.next_call = f"phase_status(run_id='{rid}') later; the run continues in its controller"
    else:
        return False
    return True


def _after_before_model(v: RunView, ph: PhaseView | None) -> str:
    return (
        f"fix the cause and check it with start_run(case_id='{v.case_id}', preflight_only=True) (no run, no "
        f"lease), then resume(run_id='{v.run_id}') (re-runs preflight; 0 model requests sent); a case error "
        "needs freeze_case of a corrected draft"
    )


def _after_collect(v: RunView, ph: PhaseView | None) -> str:
    return f"reprocess_raw(run_id='{v.run_id}') — repairs from raw data, no requests re-sent"


def _after_hot_entry(v: RunView, ph: PhaseView | None) -> str:
    return (
        f"freeze_case(draft with the rejected parameter fixed, parent='{v.case_id}') then start_run (reuses the "
        f"warm service); or after a client fix resume(run_id='{v.run_id}')"
    )


def _after_service(v: RunView, ph: PhaseView | None) -> str:
    if ph is not None and ph.attempt >= REPEATS_BEFORE_BY_HAND:
        return (
            f"by hand: {ph.attempt} attempts of {v.current} failed the same way ({v.failure_class}); read the "
            "service log (ledger/services/*.log) and fix the engine or its case (freeze_case a corrected "
            "draft); `caseledger target stop` stops what caseledger started"
        )
    first = v.steps.first if v.steps else v.current
    return f"resume(run_id='{v.run_id}') starts again at {first}" + (
        " (starts the service once, then warmup and what follows)"
        if v.next_restarts_service
        else " (keeps the live service)"
    )


def _after_overload(v: RunView, ph: PhaseView | None) -> str:
    return (
        f"wait for the target to drain, then resume(run_id='{v.run_id}') (sends the load again as a new "
        f"attempt; this one's raw data is kept aside), or freeze_case a child with a lower load.rate "
        f"or load.concurrency (parent='{v.case_id}'): the target is rate-limited or saturated, the "
        "case is not wrong"
    )


def _after_internal(v: RunView, ph: PhaseView | None) -> str:
    return (
        f"a caseledger bug at {v.current}: report it with ledger/runs/{v.run_id}/controller.log; the raw "
        f"data is kept; resuming would meet the same bug (after a fix: resume(run_id='{v.run_id}'))"
    )


def _after_auth(v: RunView, ph: PhaseView | None) -> str:
    return (
        f"set the key named by target.api_key_env in the environment that runs caseledger, then "
        f"resume(run_id='{v.run_id}') — keeps the service, repeats the refused phase"
    )


def _after_dataset(v: RunView, ph: PhaseView | None) -> str:
    return (
        f"freeze_case(draft with the fix the blocker names, parent='{v.case_id}') then start_run "
        "(keeps the live service); resuming this run would fail the same way"
    )


def _after_disk(v: RunView, ph: PhaseView | None) -> str:
    return (
        f"free disk space on the workspace's filesystem, then resume(run_id='{v.run_id}') — goes on at "
        f"{v.current}; finished phases and recorded requests are kept, nothing is re-sent"
    )


def _after_end_unknown(v: RunView, ph: PhaseView | None) -> str:
    rid, c = v.run_id, v.counts
    at_load = v.current == Phase.LOAD and v.load_ended != "yes"
    if at_load and v.client_host:
        return (
            f"resume(run_id='{rid}') once {v.client_host} is reachable — re-attaches over SSH to the load "
            f"client there (pid and start time), copies the raw records still missing ({c.done} of "
            f"{c.planned} here); never starts a second client, sends nothing again; the lease is kept meanwhile"
        )
    if at_load and not v.client_alive and c.done < c.planned and c.sent:
        return (
            f"start_run(case_id='{v.case_id}') for a full measurement: the load client died after "
            f"{c.done} of {c.planned} records ({c.planned - c.sent} never sent); resume(run_id='{rid}') only "
            "ends this run as partial (nothing is re-sent)"
        )
    return (
        f"resume(run_id='{rid}') — keeps the lease, checks client process, end file and raw count; "
        "sends no formal request again"
    )


_NEXT_AFTER: dict[FailureClass, Callable[[RunView, PhaseView | None], str]] = {
    FailureClass.BEFORE_MODEL: _after_before_model,
    FailureClass.COLLECT: _after_collect,
    FailureClass.HOT_ENTRY: _after_hot_entry,
    FailureClass.SERVICE: _after_service,
    FailureClass.OVERLOAD: _after_overload,
    FailureClass.INTERNAL: _after_internal,
    FailureClass.AUTH: _after_auth,
    FailureClass.DATASET: _after_dataset,
    FailureClass.DISK: _after_disk,
    FailureClass.END_UNKNOWN: _after_end_unknown,
}
"""The one next call after a failure of each class (any other class: resume)."""
