"""The events of the ledger, typed: one model per event type, a union discriminated on `type`.

Two logs hold them, each a JSONL file written only through caseledger/ledger/events.py:
- a run's (ledger/runs/<run>/events.jsonl): `RunEvent`. A line: seq, utc, mono_ns, run, phase, attempt, type,
  owner, fence, input_hash, outputs, error, data; each type's model fixes what its phase, attempt, error and data
  hold. A writer builds the model (`PhaseStarted(phase=..., attempt=...)`); `append_event` adds the rest of
  the line (seq, clock, run, owner, fence, output hashes).
- a campaign driver's (ledger/campaigns/<g>/events.jsonl): `DriverEvent`, flat: utc, type and the type's fields.

The line format is the one these logs always had (the same keys), so a ledger written before the models reads
unchanged (tests/data/ledger_v1). A data field with a default is written only when its writer set it (the
dump leaves out what was not set), as writers left such keys out before. A phase's end carries the phase's
evidence as written (`PhaseEndedData`: outcome, failure class and fix typed, the evidence's own keys kept).

Every model but PhaseEndedData refuses a field it does not know, so a misspelled or mistyped field fails at its
writer (pydantic's ValidationError, naming it) and nothing is written. Reading never raises on a line: a torn last
line or an unparsable one is skipped and counted (records.read_jsonl, as before); a line of a type this version
does not know, or whose fields it does not accept (a key added by another version included), reads as an
`UnknownEvent` keeping the whole line and the reason, which every view ignores, as views ignored a type they did
not know. Its seq still counts: the next append follows the highest seq read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from caseledger.case.phases import Phase
from caseledger.errors import FailureClass
from caseledger.ledger.states import PhaseState


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ------------------------------------------------------------------------------------------- a run's events


class _RunLine(_Closed):
    """What every line of a run's log holds besides its type and data; `append_event` fills seq to outputs."""

    seq: int = 0
    utc: str = ""
    mono_ns: int = 0
    run: str = ""
    phase: Phase | None = None
    attempt: int | None = None
    owner: str | None = None
    fence: int | None = None
    input_hash: str | None = None
    outputs: dict[str, str] = Field(default_factory=dict)  # name -> sha256 of an output file
    error: str | None = None


class NoData(_Closed):
    """The data of an event that carries none ({})."""


class RunCreatedData(_Closed):
    case_id: str
    plan: dict[str, str] | None = None  # start_run's: phase -> its action (run, skip, reuse)
    imported_from: str | None = None  # an imported run's: the source it was read from


class RunCreated(_RunLine):
    type: Literal["run_created"] = "run_created"
    data: RunCreatedData


class PidData(_Closed):
    pid: int


class ControllerStarted(_RunLine):
    type: Literal["controller_started"] = "controller_started"
    data: PidData


class PhaseStarted(_RunLine):
    type: Literal["phase_started"] = "phase_started"
    phase: Phase
    attempt: int
    data: NoData = Field(default_factory=NoData)


class PhaseEndedData(BaseModel):
    """A phase's end: its outcome, a failure's class and fix, and the phase's evidence under its own keys."""

    model_config = ConfigDict(extra="allow", frozen=True)

    outcome: PhaseState = PhaseState.DONE
    failure_class: FailureClass | None = None
    fix: str | None = None


class PhaseEnded(_RunLine):
    type: Literal["phase_ended"] = "phase_ended"
    phase: Phase
    attempt: int
    data: PhaseEndedData


class OutcomeData(_Closed):
    outcome: str  # succeeded | failed:<class>


class RunEnded(_RunLine):
    type: Literal["run_ended"] = "run_ended"
    data: OutcomeData


class StopAskedData(_Closed):
    by: str


class StopAsked(_RunLine):
    type: Literal["stop_asked"] = "stop_asked"
    data: StopAskedData


class ResumedData(_Closed):
    from_phase: Phase
    runs: list[Phase]
    redo: list[Phase]
    kept: list[Phase]
    client_alive: bool


class Resumed(_RunLine):
    type: Literal["resumed"] = "resumed"
    data: ResumedData


class RunIdData(_Closed):
    run_id: str


class StartedQueuedRun(_RunLine):
    type: Literal["started_queued_run"] = "started_queued_run"
    data: RunIdData


class ClientHost(_Closed):
    host: str
    processes: list[int]


class LoadClientStartedData(_Closed):
    """One local client (pid, armed); several (pids, processes, armed; on load hosts: hosts); or one on a load
    host (pid, host, run_dir)."""

    pid: int | None = None
    pids: list[int | None] | None = None
    processes: int | None = None
    armed: bool | None = None
    hosts: list[ClientHost] | None = None
    host: str | None = None
    run_dir: str | None = None


class LoadClientStarted(_RunLine):
    type: Literal["load_client_started"] = "load_client_started"
    data: LoadClientStartedData


class LoadClientStoppedData(_Closed):
    pid: int | None


class LoadClientStopped(_RunLine):
    type: Literal["load_client_stopped"] = "load_client_stopped"
    data: LoadClientStoppedData


class LoadClientContinuedData(_Closed):
    stopped_s: float


class LoadClientContinued(_RunLine):
    type: Literal["load_client_continued"] = "load_client_continued"
    data: LoadClientContinuedData


class WhyData(_Closed):
    why: str


class LoadEndedEarly(_RunLine):
    type: Literal["load_ended_early"] = "load_ended_early"
    data: WhyData


class HostQuietWaitData(_Closed):
    waited_s: float
    quiet: bool
    other_share: float
    top: list[str]  # the other processes that took the most CPU ('pid 4242 cc1 38%')


class HostQuietWait(_RunLine):
    type: Literal["host_quiet_wait"] = "host_quiet_wait"
    data: HostQuietWaitData


class LoadArmedEndedData(_Closed):
    processes: list[dict[str, Any]]  # JSON: what each armed process of an earlier start did (never sent)


class LoadArmedEnded(_RunLine):
    type: Literal["load_armed_ended"] = "load_armed_ended"
    data: LoadArmedEndedData


RunEvent = (
    RunCreated
    | ControllerStarted
    | PhaseStarted
    | PhaseEnded
    | RunEnded
    | StopAsked
    | Resumed
    | StartedQueuedRun
    | LoadClientStarted
    | LoadClientStopped
    | LoadClientContinued
    | LoadEndedEarly
    | HostQuietWait
    | LoadArmedEnded
)

Emit = Callable[[RunEvent], None]  # appends an event of a run under its owner's fence (the controller's `event`)


# ------------------------------------------------------------------------------------------- a campaign driver's


class _DriverLine(_Closed):
    utc: str = ""  # set when written


class DriverStarted(_DriverLine):
    type: Literal["driver_started"] = "driver_started"
    pid: int


class DriverEnded(_DriverLine):
    type: Literal["driver_ended"] = "driver_ended"
    outcome: str


class Waiting(_DriverLine):
    """Why the driver waits (a paused authorization, a held target), with the refusal's fix when it named one."""

    type: Literal["waiting"] = "waiting"
    why: str
    fix: str | None = None


class PointRefused(_DriverLine):
    type: Literal["point_refused"] = "point_refused"
    case_id: str
    target: str | None = None  # a pool's target
    error: str


class PointStarted(_DriverLine):
    type: Literal["point_started"] = "point_started"
    case_id: str
    run_id: str
    label: str
    target: str | None = None  # a pool's target
    why: str | None


class PointEnded(_DriverLine):
    type: Literal["point_ended"] = "point_ended"
    case_id: str
    run_id: str
    state: str  # the run's end state


class PointResumed(_DriverLine):
    type: Literal["point_resumed"] = "point_resumed"
    case_id: str
    run_id: str
    label: str
    target: str | None = None  # a pool's target


class ResumeRefused(_DriverLine):
    type: Literal["resume_refused"] = "resume_refused"
    run_id: str
    error: str


class HostRefused(_DriverLine):
    """A point the host refused (run/admission/admit.py): not started again while this driver runs."""

    type: Literal["host_refused"] = "host_refused"
    case_id: str
    label: str
    target: str | None  # a pool's target
    error: str
    fix: str | None


class TargetRefused(_DriverLine):
    type: Literal["target_refused"] = "target_refused"
    target: str
    why: str


class SearchEnded(_DriverLine):
    """A proposing search ended at `points` points; `budget` (the budget then) when the budget ended it."""

    type: Literal["search_ended"] = "search_ended"
    points: int
    why: str
    budget: dict[str, Any] | None = None  # JSON: the campaign's budget as dumped


class PointProposed(_DriverLine):
    type: Literal["point_proposed"] = "point_proposed"
    case_id: str
    label: str
    why: str


class DiskWaited(_DriverLine):
    type: Literal["disk_waited"] = "disk_waited"
    seconds: float
    free_bytes_at_start: int


DriverEvent = (
    DriverStarted
    | DriverEnded
    | Waiting
    | PointRefused
    | PointStarted
    | PointEnded
    | PointResumed
    | ResumeRefused
    | HostRefused
    | TargetRefused
    | SearchEnded
    | PointProposed
    | DiskWaited
)


# ------------------------------------------------------------------------------------------- reading


class UnknownEvent(BaseModel):
    """A line this version does not read as any event: of another type or with fields it does not accept. Kept
    whole (`line`) with the reason (`problem`); every view ignores it."""

    model_config = ConfigDict(frozen=True)

    type: str  # the line's own type ('' when it names none)
    seq: int  # a run log's line's seq (0 when it has none)
    line: Any  # JSON: the line as parsed
    problem: str


_RUN: TypeAdapter[RunEvent] = TypeAdapter(Annotated[RunEvent, Field(discriminator="type")])
_DRIVER: TypeAdapter[DriverEvent] = TypeAdapter(Annotated[DriverEvent, Field(discriminator="type")])


def _unknown(obj: Any, e: ValidationError) -> UnknownEvent:  # obj: JSON, the line as parsed
    d = obj if isinstance(obj, dict) else {}
    t, seq = d.get("type"), d.get("seq")
    first = e.errors()[0]
    where = ".".join(str(x) for x in first["loc"])
    return UnknownEvent(
        type=t if isinstance(t, str) else "",
        seq=seq if isinstance(seq, int) and not isinstance(seq, bool) else 0,
        line=obj,
        problem=f"{where}: {first['msg']}" if where else first["msg"],
    )


def parse_run_event(obj: Any) -> RunEvent | UnknownEvent:  # obj: JSON, a line as parsed
    try:
        return _RUN.validate_python(obj)
    except ValidationError as e:
        return _unknown(obj, e)


def parse_driver_event(obj: Any) -> DriverEvent | UnknownEvent:  # obj: JSON, a line as parsed
    try:
        return _DRIVER.validate_python(obj)
    except ValidationError as e:
        return _unknown(obj, e)


_ENVELOPE = ("seq", "utc", "mono_ns", "run", "phase", "attempt", "type", "owner", "fence", "input_hash", "outputs")


def run_json(ev: RunEvent) -> dict[str, Any]:  # JSON: a run log's line
    """An event's line in a run's log: the envelope in its order, then error and the data its writer set."""
    line = {k: getattr(ev, k) for k in _ENVELOPE}
    line["phase"] = ev.phase.value if ev.phase is not None else None
    return {**line, "error": ev.error, "data": data_json(ev)}


def data_json(ev: RunEvent) -> dict[str, Any]:  # JSON: an event's data as its line holds it
    """An event's data as written: the fields its writer set (a phase's end: its evidence's keys too)."""
    return ev.data.model_dump(mode="json", exclude_unset=True)


def driver_json(ev: DriverEvent, utc: str) -> dict[str, Any]:  # JSON: a driver's line
    """A driver event's line: utc, type, then the fields its writer set."""
    return {"utc": utc, "type": ev.type, **ev.model_dump(mode="json", exclude_unset=True, exclude={"utc", "type"})}
