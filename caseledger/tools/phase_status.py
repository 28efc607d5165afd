"""phase_status: where a run stands, folded from events and checked against evidence. Read-only."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, Field

from caseledger.errors import MESSAGE_CHARS, OUTSIDE_CHARS, CaseInvalid, NotFound, quoted
from caseledger.ledger import authorization, calls, queue
from caseledger.ledger.calls import MAX_WAIT_S as MAX_WAIT_S  # the one bound: every next names it
from caseledger.ledger.index import open_index
from caseledger.ledger.intact import load_settled, settled_change, torn_lines
from caseledger.ledger.runs import damaged_line, load_run
from caseledger.ledger.state import fold
from caseledger.workspace import Workspace, is_id


class StatusResult(BaseModel):
    run_id: str
    case_id: str
    scenario: str
    state: str = Field(description="created | running | succeeded | failed | end_unknown")
    phase: str | None = Field(description="Current phase (running, failed or next); null when finished")
    phase_state: str | None
    phases: dict[str, str] = Field(description="phase -> pending|running|done|reused|skipped|failed|unknown")
    failure_class: str | None
    planned: int
    sent: int = Field(description="Formal requests sent by the current load attempt")
    sent_all: int = Field(0, description="Formal requests sent over every load attempt (a resent load counts again)")
    load_attempts: int = Field(1, description="Load attempts of this run (a resume that sends the load again adds one)")
    done: int
    failed: int
    load_ended: str = Field(description="yes | no | unknown | partial")
    results_extracted: bool
    enough_to_decide: bool | None = Field(description="null until decided")
    decision: str | None
    decision_reason: str | None = Field(
        None, description="Why the decision: a broken limit, the change and its noise, missing evidence"
    )
    owner_alive: bool = Field(description="The controller process is alive")
    client_alive: bool = Field(description="The load client process is alive")
    blocker: str | None
    next_restarts_service: bool
    next_repeats_warmup: bool
    next_resends_requests: bool
    authorization: str
    queued: list[str] = Field(default_factory=list, description="Cases queued to start when this target frees")
    load_reused_from: str | None = Field(
        None,
        description="Measurement-only run: the run whose raw data it reprocesses (this run sent no formal request)",
    )
    service_alive: bool | None = Field(
        None,
        description="The service this run started or verified is still "
        "alive (null: not ours to check: external, remote)",
    )
    client_stopped: bool = Field(False, description="The load client process is alive but stopped (SIGSTOP)")
    owner_stopped: bool = Field(False, description="The controller process is alive but stopped (SIGSTOP)")
    collector_stopped: bool = Field(
        False, description="The postprocess collector process is alive but stopped (SIGSTOP): kill -CONT names it"
    )
    service_gone: list[str] = Field(
        default_factory=list, description="The service's processes that are gone or stopped ('pid 12 stopped')"
    )
    missing_evidence: list[str] = Field(
        default_factory=list, description="Evidence files a finished phase recorded that are gone from disk"
    )
    changed_evidence: str | None = Field(
        None, description="Raw data that differs from its sha256 sealed when the load ended (tampered or damaged)"
    )
    torn: list[str] = Field(
        default_factory=list,
        description="Lines of the load's append-only files (raw records, host samples, ...) that do not parse: the "
        "file, the line, whether it was cut mid-write, what it means for the figures",
    )
    resume_runs: list[str] = Field(
        default_factory=list, description="The phases resume would run, in order (the same computation)"
    )
    damaged: list[str] = Field(
        default_factory=list, description="Damaged ledger entries found while looking for the latest run"
    )
    next_call: str

    def _client(self) -> str:
        pending = self.phases.get("load") == "pending"
        if self.client_stopped:
            return "STOPPED (SIGSTOP: alive, no progress)"
        if self.client_alive:
            return "armed (sends nothing before the load phase)" if pending else "alive"
        return "not started" if pending else "gone"

    def text(self) -> str:
        ph = f"{self.phase} {self.phase_state}" if self.phase else "all phases done"
        fc = f" [{self.failure_class}]" if self.failure_class else ""
        dec = "unknown" if self.enough_to_decide is None else ("yes" if self.enough_to_decide else "no")
        formal = (
            f"formal: reused {self.load_reused_from}'s raw data ({self.done} records), 0 sent by this run"
            if self.load_reused_from
            else f"formal sent {self.sent}/{self.planned} done {self.done} failed {self.failed}"
            + (
                f" (this attempt; {self.sent_all} sent over {self.load_attempts} attempts)"
                if self.load_attempts > 1
                else ""
            )
        )
        lines = [
            f"{self.run_id} {self.case_id} {self.scenario}: {self.state}{fc}, {ph}",
            f"{formal}; load ended "
            f"{self.load_ended}; results {'yes' if self.results_extracted else 'no'}; decide {dec}"
            + (f" ({self.decision})" if self.decision else ""),
            f"owner {'STOPPED (SIGSTOP)' if self.owner_stopped else 'alive' if self.owner_alive else 'gone'}, client "
            f"{self._client()}; "
            + ("collector STOPPED (SIGSTOP); " if self.collector_stopped else "")
            + f"auth {self.authorization}",
        ]
        if self.decision_reason and self.decision != "baseline":
            lines.append(f"why: {quoted(self.decision_reason, MESSAGE_CHARS)}")  # whole: the reason is the answer
        if self.blocker:
            lines.append(f"blocker: {quoted(self.blocker, OUTSIDE_CHARS + 40)}")
        if self.queued:
            lines.append(f"queued on this target: {', '.join(self.queued[:3])}")
        if self.service_alive is False:
            lines.append(
                "service: the process this run measured on is gone or stopped"
                + (f" ({', '.join(self.service_gone)})" if self.service_gone else "")
            )
        if self.missing_evidence:
            lines.append(
                f"missing evidence: {', '.join(self.missing_evidence[:4])}"
                + (f" (+{len(self.missing_evidence) - 4})" if len(self.missing_evidence) > 4 else "")
            )
        if self.changed_evidence:
            lines.append(f"changed evidence: {self.changed_evidence}")
        lines += [f"torn: {t}" for t in self.torn[:2]]
        if len(self.torn) > 2:
            lines.append(f"torn: +{len(self.torn) - 2} more lines (structured content: torn)")
        if self.state not in ("succeeded", "running", "created"):
            lines.append(
                f"resume runs: {', '.join(self.resume_runs) or 'nothing'}; restarts service: "
                + ("yes" if self.next_restarts_service else "no")
                + ", repeats warmup: "
                + ("yes" if self.next_repeats_warmup else "no")
                + ", re-sends requests: "
                + ("yes" if self.next_resends_requests else "no")
            )
        if self.damaged:
            lines.append(damaged_line(self.damaged))
        lines.append(f"next: {self.next_call}")
        return "\n".join(lines)


# The wait's bound (MAX_WAIT_S) is long enough for a campaign point. A wait sends progress notifications as the
# run moves; a client whose tool timeout is shorter (Codex: tool_timeout_sec, 60 s by default) sets it higher or
# waits less.
WAIT_POLL_S = 0.25


def _signature(s: StatusResult) -> tuple[object, ...]:
    """What a waiting caller is waiting for: a phase starting or ending, the load ending, a decision, a process
    stopping or going (request counts alone are progress, not a change)."""
    return (
        s.state,
        s.phase,
        s.phase_state,
        tuple(sorted(s.phases.items())),
        s.load_ended,
        s.results_extracted,
        s.decision,
        s.owner_alive,
        s.client_alive,
        s.client_stopped,
        s.collector_stopped,
        tuple(s.service_gone),
        s.blocker,
    )


def check_wait(wait_s: float) -> None:
    """A bounded wait (runs and campaigns alike): CaseInvalid naming the bound."""
    if not 0 <= wait_s <= MAX_WAIT_S:
        raise CaseInvalid(
            f"wait_s {wait_s:g} is outside 0..{MAX_WAIT_S:g}",
            f"give wait_s between 0 (answer at once) and {MAX_WAIT_S:g} seconds",
        )


Until = Literal["end", "change"]
UNTIL: dict[Until, str] = {
    "end": "the run ends, or needs the caller (a blocker: a stopped or dead process, a held target)",
    "change": "anything changes (a phase starts or ends, the load ends, a process stops): phase by phase",
}


def needs_caller(s: StatusResult) -> bool:
    """The run has ended, or cannot go on without the caller (its blocker: a stopped or gone process, a dead
    controller): what a default wait (until='end') answers on."""
    return s.state not in ("running", "created") or bool(s.blocker)


def phase_status(
    workspace: Workspace,
    run_id: str | None = None,
    wait_s: float = 0.0,
    progress: Callable[[StatusResult], None] | None = None,
    until: Until = "end",
) -> StatusResult:
    """Status of run_id, or of the latest run when none is given. wait_s > 0 (at most 600): return as soon as
    the run ends or needs the caller (until='end'), or at its next change (until='change'), or when wait_s has
    passed, instead of being polled with sleep. progress: sees every status the wait reads (phases and request
    counts move between the answers)."""
    check_wait(wait_s)
    first = _status(workspace, run_id)
    if wait_s <= 0 or needs_caller(first):
        return first
    if progress is not None:
        progress(first)
    deadline = time.monotonic() + wait_s
    sig = _signature(first)
    while time.monotonic() < deadline:
        time.sleep(min(WAIT_POLL_S, max(0.0, deadline - time.monotonic())))
        now = _status(workspace, first.run_id)
        if progress is not None:
            progress(now)
        if needs_caller(now) if until == "end" else _signature(now) != sig:
            return now
    return _status(workspace, first.run_id)


FINISHED = ("done", "reused", "skipped")


def phases_progress(s: StatusResult) -> tuple[float, float, str]:
    """(progress, total, message) of a run for a progress notification: phases finished of all, the formal
    load counting as its share of requests done while it runs; the value never goes down as the run advances."""
    value = float(sum(v in FINISHED for v in s.phases.values()))
    if s.phases.get("load") == "running" and s.planned:
        value += min(s.done, s.planned) / s.planned
    where = f"{s.phase} {s.phase_state}" if s.phase else s.state
    return (
        value,
        float(len(s.phases)),
        (f"{s.run_id} {where}: formal sent {s.sent}/{s.planned} done {s.done} failed {s.failed}"),
    )


def _any_run(ws: Workspace) -> bool:
    try:
        return any(True for _ in ws.runs_dir.iterdir())
    except FileNotFoundError:
        return False


def _status(workspace: Workspace, run_id: str | None = None) -> StatusResult:
    damaged: list[str] = []
    if (run_id is None or is_id(run_id, "c")) and not _any_run(workspace):
        # answered from the files: a refused call creates no index in a workspace without runs
        raise NotFound(
            "no runs in this workspace yet"
            if run_id is None
            else f"case {run_id} has no run yet in {workspace.runs_dir}",
            calls.first_case() if run_id is None else calls.start_run(run_id),
        )
    if run_id is None or is_id(run_id, "c"):
        with open_index(workspace) as idx:  # the latest run (of the case), without folding every run
            if run_id is None:
                latest = idx.latest()
                damaged = idx.damaged()
                if latest is None:
                    found = f" ({damaged_line(damaged)})" if damaged else ""
                    raise NotFound(f"no runs in this workspace yet{found}", calls.first_case())
            else:
                latest = next(idx.of_case(run_id), None)
                if latest is None:
                    raise NotFound(f"case {run_id} has no run yet in {workspace.runs_dir}", calls.start_run(run_id))
        run_id = latest.run_id
    run = load_run(workspace, run_id)
    v = fold(workspace, run)  # folded live: the one run asked about
    cur = v.phases[v.current] if v.current else None
    dec = v.decision
    return StatusResult(
        run_id=v.run_id,
        case_id=v.case_id,
        scenario=v.scenario,
        state=v.state.value,
        phase=v.current,
        phase_state=cur.state.value if cur else None,
        phases={k: p.state.value for k, p in v.phases.items()},
        failure_class=v.failure_class,
        planned=v.counts.planned,
        sent=0 if v.meta.load_reuse else v.counts.sent,
        sent_all=0 if v.meta.load_reuse else v.counts.sent_all,
        load_attempts=1 + len(v.counts.earlier),
        done=v.counts.done,
        failed=v.counts.failed,
        load_ended=v.load_ended,
        results_extracted=v.results_extracted,
        enough_to_decide=dec.enough_to_decide if dec else None,
        decision=dec.outcome if dec else None,
        decision_reason=dec.reason if dec else None,
        owner_alive=v.controller_alive,
        client_alive=v.client_alive,
        blocker=v.blocker,
        next_restarts_service=v.next_restarts_service,
        next_repeats_warmup=v.next_repeats_warmup,
        next_resends_requests=v.next_resends_requests,
        authorization=authorization.current_mode(workspace),
        queued=[e["case_id"] for e in queue.entries(workspace, v.meta.target_key or "-")],
        service_alive=v.service_alive,
        missing_evidence=v.missing_evidence,
        changed_evidence=settled_change(run.paths, v),
        torn=torn_lines(run.paths) if load_settled(v) else [],
        load_reused_from=v.meta.load_reuse,
        client_stopped=v.client_stopped,
        owner_stopped=v.controller_stopped,
        collector_stopped=v.collector_stopped,
        service_gone=v.service_gone,
        resume_runs=[p.value for p in v.steps.run] if v.steps else [],
        damaged=damaged,
        next_call=v.next_call,
    )
