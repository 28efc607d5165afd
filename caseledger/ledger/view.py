"""The folded view of a run: phase and run states, the view of each phase and of the run, what comes next.

Frozen: `state.fold` builds each view once from the events and the evidence; readers never change one (a
reader that shows it otherwise builds a copy with `dataclasses.replace`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from caseledger.case.phases import Phase
from caseledger.errors import FailureClass
from caseledger.ledger.runs import RunMeta
from caseledger.ledger.states import PhaseState as PhaseState  # re-exported: readers name the view
from caseledger.ledger.states import RunState as RunState


@dataclass(frozen=True)
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
    data: dict[str, Any] = field(default_factory=dict)  # JSON: its end event's data, as any version wrote it
    evidence: str | None = None  # the file its end event names (the controller's phases/<phase>.json)


@dataclass(frozen=True)
class Counts:
    planned: int = 0
    sent: int = 0  # by the current load attempt
    done: int = 0
    ok: int = 0
    failed: int = 0
    earlier: tuple[int, ...] = ()  # formal requests sent by each earlier attempt, kept aside (a resent load)

    @property
    def sent_all(self) -> int:
        """Every formal request this run sent the target, over all its load attempts."""
        return self.sent + sum(self.earlier)


@dataclass(frozen=True)
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
    collector_stopped: bool = False  # the postprocess collector's process is alive but stopped
    stopped_pids: list[int] = field(default_factory=list)  # the controller's, load client's, collector's when stopped
    load_exit: str | None = None  # how the load client ended (its end file): complete | cancelled | disk_full


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


class RecordedDecision(BaseModel):
    """What a run's decision file says, as the ledger reads it (outcome/decide.py writes the full record)."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    outcome: str
    reason: str | None = None
    enough_to_decide: bool | None = None
