"""Run state folded from events, then checked against evidence.

Readers (phase_status, summarize, handoff) call `fold`; they never write run state. Evidence outranks
status strings: an end file beats a stale 'started' event, results on disk beat a stale postprocess
failure, a dead controller turns an open phase into UNKNOWN instead of RUNNING. The view (ledger/view.py)
is built once, its advice (ledger/advice.py) included, and is frozen.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from caseledger import procs
from caseledger.case.phases import PHASES, Phase
from caseledger.case.plan import FAILURE_OF_PHASE
from caseledger.errors import FailureClass
from caseledger.ledger.advice import advise
from caseledger.ledger.event_types import PhaseEnded, PhaseStarted, RunEvent, UnknownEvent, data_json
from caseledger.ledger.events import read_events
from caseledger.ledger.evidence import ComponentRecord, LoadEnd, ServiceRecord
from caseledger.ledger.runs import Run, RunMeta, has_results, load_run
from caseledger.ledger.view import Counts, NextSteps, PhaseView, RecordedDecision
from caseledger.ledger.view import PhaseState as PhaseState  # re-exported: readers name the fold's module
from caseledger.ledger.view import RunState as RunState
from caseledger.ledger.view import RunView as RunView
from caseledger.procs import LoadRef
from caseledger.records import iter_lines
from caseledger.workspace import RunPaths, Workspace, read_json_or_none, read_ref

# A load that failed with one of these sent nothing the target served (rejected or cut by a dead service):
# the next attempt sends it again, the failed attempt's raw data kept aside. Any other load failure is
# never re-sent (end_unknown: resume confirms what the client recorded).
RESEND_CLASSES = (FailureClass.HOT_ENTRY, FailureClass.AUTH, FailureClass.SERVICE, FailureClass.OVERLOAD)
_FINISHED = (PhaseState.DONE, PhaseState.REUSED, PhaseState.SKIPPED)
_SERVICE_CHAIN = (Phase.SERVICE, Phase.WARMUP, Phase.ROUTE_VERIFY, Phase.CACHE_PREPARE)


def next_steps(v: RunView) -> NextSteps:
    """The phases a resume runs: every unfinished one, plus the service chain again when the service this
    run started or verified has died and the formal load is still to be sent."""
    return _next_steps(v.meta, v.phases, v.service_alive)


def _next_steps(meta: RunMeta, ph: dict[Phase, PhaseView], service_alive: bool | None) -> NextSteps:
    """`next_steps` from the parts of a view it reads (fold computes them before the view exists)."""
    lv = ph[Phase.LOAD]
    load_sends = not meta.load_reuse and (
        lv.state == PhaseState.PENDING or (lv.state == PhaseState.FAILED and lv.failure_class in RESEND_CLASSES)
    )
    redo: tuple[Phase, ...] = ()
    # the service is gone or stopped, or answered no health before the formal load: it is started again
    unhealthy = lv.state == PhaseState.FAILED and bool(lv.data.get("service_problem"))
    if (service_alive is False or unhealthy) and load_sends:
        redo = tuple(p for p in _SERVICE_CHAIN if ph[p].state in _FINISHED)
    run = tuple(p for p in PHASES if ph[p].state not in _FINISHED or p in redo)
    # not yet run in this run (a preflight failure): the plan's live check at start_run says whether it is reused
    planned_reuse = (
        service_alive is None
        and ph[Phase.SERVICE].state == PhaseState.PENDING
        and meta.action(Phase.SERVICE) == "reuse"
    )
    restarts = (
        Phase.SERVICE in run and not meta.load_reuse and (service_alive is not True or unhealthy) and not planned_reuse
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


def earlier_attempts(paths: RunPaths) -> tuple[int, ...]:
    """Formal requests sent by each earlier load attempt kept aside (load.attempt-N/), oldest first: its end file's
    count, else its intent log's lines."""
    out: list[tuple[int, int]] = []
    for d in paths.root.glob("load.attempt-*"):
        n = d.name.rpartition("-")[2]
        if not n.isdigit():
            continue
        end = read_json_or_none(d / paths.load_end.name)
        if end:
            out.append((int(n), int(end.get("sent", 0))))
            continue
        try:
            out.append((int(n), (d / paths.load_sent.name).read_bytes().count(b"\n")))
        except FileNotFoundError:
            out.append((int(n), 0))
    return tuple(sent for _, sent in sorted(out))


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


def client_refs(paths: RunPaths) -> list[LoadRef]:
    """The load client's process reference, or every process's of a load shared by load.processes > 1."""
    refs = [read_ref(p) for p in [paths.load_pid, *(q.load_pid for q in paths.load_parts())]]
    return [r for r in refs if r is not None]


def _fold_events(events: list[RunEvent | UnknownEvent]) -> dict[Phase, PhaseView]:
    """Each phase's last attempt, from its started and ended events."""
    phases = {p: PhaseView(p) for p in PHASES}
    for ev in events:
        if isinstance(ev, PhaseStarted):
            phases[ev.phase] = replace(
                phases[ev.phase],
                state=PhaseState.RUNNING,
                attempt=ev.attempt or 1,
                started_utc=ev.utc,
                started_mono=ev.mono_ns,
                ended_utc=None,
                failure_class=None,
                error=None,
                evidence=None,
                data={},
            )
        elif isinstance(ev, PhaseEnded):
            v = phases[ev.phase]
            phases[ev.phase] = replace(
                v,
                state=ev.data.outcome,
                ended_utc=ev.utc,
                ended_mono=ev.mono_ns,
                failure_class=ev.data.failure_class,
                error=ev.error,
                data=data_json(ev),
                attempt=ev.attempt or v.attempt,
                evidence=ev.outputs.get("evidence"),
            )
    return phases


def _check_evidence(
    phases: dict[Phase, PhaseView],
    *,
    end: bool,
    controller_alive: bool,
    client_alive: bool,
    results_extracted: bool,
    decided: bool,
) -> dict[Phase, PhaseView]:
    """Evidence outranks status strings: an end file beats a stale 'started', results on disk beat a stale
    postprocess failure, a decision file ends decide, and an open phase of a dead owner is unknown."""
    out = dict(phases)
    lv = out[Phase.LOAD]
    if end and lv.state in (PhaseState.RUNNING, PhaseState.UNKNOWN):
        out[Phase.LOAD] = replace(lv, state=PhaseState.DONE, failure_class=None)
    for p, v in list(out.items()):  # a live load client keeps load running
        if v.state == PhaseState.RUNNING and not controller_alive and not (v.name == Phase.LOAD and client_alive):
            out[p] = replace(v, state=PhaseState.UNKNOWN, failure_class=FAILURE_OF_PHASE[v.name])
    pv = out[Phase.POSTPROCESS]
    if results_extracted and pv.state in (PhaseState.FAILED, PhaseState.UNKNOWN, PhaseState.RUNNING):
        out[Phase.POSTPROCESS] = replace(pv, state=PhaseState.DONE, failure_class=None)  # repaired by reprocess_raw
    dv = out[Phase.DECIDE]
    if decided and dv.state in (PhaseState.PENDING, PhaseState.FAILED, PhaseState.UNKNOWN, PhaseState.RUNNING):
        out[Phase.DECIDE] = replace(dv, state=PhaseState.DONE, failure_class=None)
    return out


def _load_ended(
    paths: RunPaths,
    meta: RunMeta,
    lv: PhaseView,
    end: LoadEnd | None,  # load/end.json as the load client wrote it
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
    """The run's state: events folded, then checked against the evidence on disk, then advised."""
    run = run if isinstance(run, Run) else load_run(ws, run)
    paths, meta = run.paths, run.meta
    log = read_events(paths)
    ctl, clients = read_json_or_none(paths.controller_pid), client_refs(paths)
    collector = read_json_or_none(paths.collector_pid)  # postprocess's, while it runs
    # a process on a load host not yet seen gone there (only SSH can tell) outranks one seen gone
    client_ref = next((c for c in clients if procs.alive(c) or procs.elsewhere(c)), clients[0] if clients else None)
    controller_alive, client_alive = procs.alive(ctl), procs.alive(client_ref)
    client_host = procs.elsewhere(client_ref)
    end = read_json_or_none(paths.load_end)
    results_extracted = has_results(paths)
    decision = read_json_or_none(paths.decision)
    phases = _check_evidence(
        _fold_events(log.events),
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
    service_alive, service_gone = _service_alive(ws, meta, phases[Phase.SERVICE])
    steps = _next_steps(meta, phases, service_alive)
    if state != RunState.RUNNING and steps.redo and failure_class is None:
        # every phase it ran is recorded as done, but the service it measured on is gone
        state, current, failure_class = RunState.FAILED, Phase.SERVICE, FailureClass.SERVICE
    facts = RunView(
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
        counts=replace(load_counts(paths, meta.planned), earlier=earlier_attempts(paths)),
        load_ended=load_ended,
        results_extracted=results_extracted,
        decision=RecordedDecision.model_validate(decision) if decision else None,
        torn_events=log.torn_tail,
        blocker=None,
        next_call="",
        next_restarts_service=steps.restarts_service,
        next_repeats_warmup=steps.repeats_warmup,
        next_resends_requests=steps.resends_requests,
        service_alive=service_alive,
        service_gone=service_gone,
        missing_evidence=_missing_evidence(paths, phases, meta),
        steps=steps,
        client_host=client_host,
        client_stopped=procs.stopped(client_ref),
        controller_stopped=procs.stopped(ctl),
        collector_stopped=procs.stopped(collector),
        stopped_pids=[int(r["pid"]) for r in (ctl, client_ref, collector) if r is not None and procs.stopped(r)]
        + [int(m.group(1)) for g in service_gone if (m := re.search(r"pid (\d+) stopped", g))],
        load_exit=str(end["exit"]) if end and end.get("exit") else None,
    )
    advice = advise(facts)  # a pure function of the facts; the view returned carries it, frozen
    return replace(facts, blocker=advice.blocker, next_call=advice.next_call)


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
