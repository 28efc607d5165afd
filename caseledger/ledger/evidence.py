"""The phases' evidence as models, as the ledger stores it. First the service phase's: what `ensure` found or
started, process by process.

One `ServiceRecord` per service phase (written to phases/service.json and the phase's end event); with
components, one `ComponentRecord` per component inside it. Fields a form does not have stay unset and are
left out of the JSON, so each form's evidence reads as before: a launched process (argv intended and read
back, files, env hashes, pid, starts), a remote one (host, login, host-key policy), an external endpoint
(the models it serves, its identity command's output).

Readers outside run/ (the time ledger, the report, the campaign view) read a phase file back through
`read_evidence`: the phase's model, never a dict.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Required, Self, TypedDict, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from caseledger.errors import EvidenceInvalid
from caseledger.procs import LoadRef
from caseledger.workspace import RunPaths, read_json_or_none

ServiceOutcome = Literal["done", "reused", "skipped"]
"""done: started (or, external, probed) by this phase; reused: a live process with the case's identity kept
with its warm caches; skipped: not the phase's to run."""


class FileEvidence(BaseModel):
    """A declared file of a service process: its hash and whether the live process holds that file."""

    model_config = ConfigDict(extra="allow")
    path: str
    sha256: str | None = None
    held: bool = False


class Listener(BaseModel):
    """An external service's process found on this host: it listens on an endpoint's port. Its CPU, and its
    children's, is the service's in the host CPU evidence, never another process's."""

    model_config = ConfigDict(extra="forbid")
    pid: int
    start_time: int = Field(description="Clock ticks since boot (/proc/PID/stat): the pid is this process only")
    command: str = Field(description="Its program (and module), never its arguments: 'llama-server'")
    port: int = Field(description="The endpoint's port it listens on")

    def line(self) -> str:
        return f"pid {self.pid} {self.command}, found listening on :{self.port}"


class ServiceRecord(BaseModel):
    """The evidence of the service phase (the whole target, or one component of it)."""

    # a key this version does not know is an error where the record is built (a misspelt field), and is dropped
    # where it is read back (of(): JSON written by any version of this model)
    model_config = ConfigDict(extra="forbid")
    outcome: ServiceOutcome
    identity: str | None = Field(None, description="The intended service identity (s-…)")
    reason: str | None = Field(None, description="Why the phase did nothing (measurement-only)")
    plan: str | None = Field(None, description="What the run's plan said for the service phase")
    intended_argv: list[str] | None = None
    effective_argv: list[str] | None = Field(None, description="The argv read back from the live process")
    model_files: list[dict[str, Any]] | None = None  # JSON: services.identity.ModelFile rows
    pid: int | None = None
    starts: int | None = Field(None, description="Processes started on this target key so far")
    files: list[FileEvidence] | None = None
    env_sha256: dict[str, str] | None = None
    engine_version: str | None = None
    engine: str | None = Field(
        None, description="The engine detected at its start and how: 'llamacpp (argv: llama-server)', 'tgi (/info)'"
    )
    env: dict[str, str] | None = Field(None, description="The environment shown (secrets masked)")
    verified_by: str | None = None
    kept_by: str | None = Field(
        None, description="Reused from the workspace of this host that started and keeps it (unset: this one)"
    )
    host: str | None = Field(None, description="The remote host (unset: this host)")
    ssh: dict[str, Any] | None = None  # JSON: the SSH login (read back from any version's record)
    host_key: str | None = None
    live_identity: str | None = Field(None, description="External: hash of what the endpoints answer")
    endpoints: list[dict[str, Any]] | None = None  # JSON: external: {base_url, models} as the endpoints answered
    identity_output: str | None = None
    listeners: list[Listener] | None = Field(
        None,
        description="External: the processes on this host that listen on the endpoints' ports (their CPU and "
        "their children's counts as the service's); unset: none found, listeners_note says why",
    )
    listeners_note: str | None = Field(
        None, description="External: why no process of the service was found (a remote server: NOT_OBSERVED)"
    )
    components: list[ComponentRecord] | None = None
    restarted: list[str] | None = Field(None, description="Components (re)started by this phase")
    reused: list[str] | None = Field(None, description="Components kept with their warm caches")
    changed_routes: list[int] | None = Field(None, description="Routes whose processes changed")

    def evidence(self) -> dict[str, Any]:  # JSON: the phase file and its end event
        """The JSON evidence: the fields this form set, nothing else."""
        return self.model_dump(mode="json", exclude_unset=True)

    @property
    def processes(self) -> list[ServiceRecord]:
        """Each process of the service: its components, or itself."""
        return list(self.components) if self.components else [self]

    @property
    def partly_reused(self) -> bool:
        """Some components kept, others (re)started."""
        return self.outcome != "reused" and bool(self.reused)

    @classmethod
    def read(cls, path: Path) -> ServiceRecord | None:
        """The record a finished service phase wrote, or None (not run yet, or not a record)."""
        data = read_json_or_none(path)
        return cls.of(data) if data else None

    @classmethod
    def of(cls, data: dict[str, Any]) -> ServiceRecord | None:  # JSON: a phase's evidence as read
        """The record in a phase's evidence dict, or None when it is none (e.g. a failed phase's data)."""
        if data.get("outcome") not in get_args(ServiceOutcome):
            return None
        return cls.model_validate(data, extra="ignore")


class ComponentRecord(ServiceRecord):
    """One component of a multi-process service."""

    name: str
    role: str | None = None
    key: str = Field(description="Its target key: the state file ledger/services/<key>.json")
    routes: list[int] = Field(default_factory=list, description="The routes it serves (empty: every route)")


ServiceRecord.model_rebuild()


class Evidence(BaseModel):
    """The evidence of one phase (or a part of it), built once by the phase and written as JSON to
    phases/<phase>.json and its end event. As with `ServiceRecord`, fields a form does not have stay unset and
    are left out of the JSON; a field set to None is written as null."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    def evidence(self) -> dict[str, Any]:  # JSON: the phase file and its end event
        """The JSON evidence: the fields this form set, nothing else."""
        return self.model_dump(mode="json", exclude_unset=True, by_alias=True)

    def merged(self, other: Self) -> Self:
        """This evidence with the fields `other` set (where both set one: other's)."""
        return self.model_copy(update={k: getattr(other, k) for k in other.model_fields_set})


PhaseEvidence = Evidence | ServiceRecord
"""What a phase body returns: the service phase's record, or any other phase's evidence."""


class NotRun(Evidence):
    """A phase the plan reused or skipped: nothing was sent, the reason says why."""

    outcome: Literal["reused", "skipped"]
    reason: str


class ContextCheck(Evidence):
    """Every formal request's prompt and max_tokens against the model's context."""

    limit: int
    from_: str = Field(alias="from", description="The case field the limit comes from")
    longest_request_tokens: int


class PreflightChecks(Evidence):
    """What preflight checked in its fresh, socket-less process (and on the load host, with load.host)."""

    case_reload: str = Field(description="The case id the frozen case.json hashes to")
    dataset_sha256: str | None = None
    load_plan_requests: int | None = None
    context: ContextCheck | None = None
    collector: str
    disk_free_mib: int
    sockets: str
    process: str | None = Field(None, description="Set when the process spawned ahead ran it (or an inline run)")
    load_host: dict[str, Any] | None = None  # JSON: run/remote/load.py's preflight record of the load host


class PreflightResult(Evidence):
    """The one JSON line (or preflight.ahead.json) a preflight process answers with."""

    ok: bool
    checks: PreflightChecks | None = None
    error: str | None = None


class PreflightEvidence(Evidence):
    checks: PreflightChecks
    requests_sent: int


class Sent(Evidence):
    """A group of requests a phase sent: how many, how many answered, the wall time and the latencies' sum."""

    requests: int
    ok: int
    wall_s: float
    latency_sum_s: float


class WarmupEvidence(Sent):
    routes: list[int] | None = Field(None, description="The routes warmed (unset: every route)")


class TokenTruth(Evidence):
    """The chat tokens the dataset planned against the prompt tokens the server counted, on one route."""

    planned_chat: int | None
    server_prompt: int | None
    compared: str


class RouteCheck(Evidence):
    route: int
    base_url: str
    models: list[str]
    ok: bool
    tokens: TokenTruth


class RouteVerifyEvidence(Evidence):
    routes: list[RouteCheck]
    wall_s: float
    only_changed_routes: list[int] | None = Field(None, description="The routes checked (unset: every route)")


class CacheCheck(Evidence):
    requests: int
    wall_s: float
    latency_sum_s: float
    hit_ratios: list[float]
    cached_tokens: list[int | None]
    prompt_tokens: list[int | None]
    denominator: str


class CachePrepareEvidence(Evidence):
    target_ratio: float
    mode: Literal["seed+check", "check"]
    seed: Sent | None = None
    check: CacheCheck


class PartialLoad(Evidence):
    """load/partial.json: a load whose client died without an end file, finished on what it recorded."""

    planned: int
    done: int
    sent: int
    in_flight_lost: int
    never_sent: int
    reason: str


class LoadEnd(TypedDict, total=False):
    """load/end.json as a load client wrote it (or load/parts.py merged the processes' ones), read by the load and
    confirm_end phases: the counts are always there, the rest as the client that wrote it had it."""

    planned: Required[int]
    sent: Required[int]
    done: Required[int]
    ok: Required[int]
    failed: Required[int]
    chunks: int
    first_send_ns: int | None
    last_end_ns: int | None
    wall_start_utc: str
    wall_end_utc: str
    cpu_user_s: float
    cpu_sys_s: float
    cpu_load_user_s: float
    cpu_load_sys_s: float
    plan_sha256: str
    transport: str
    nice: int
    exit: str  # complete | cancelled | disk_full
    reason: str  # disk_full: what the disk refused
    signal: str  # cancelled: the signal that stopped the load
    processes: list[dict[str, Any]]  # JSON: load/parts.py's merge, one row per process


class PhaseAttempt(BaseModel):
    """What the next attempt reads back of phases/<phase>.json as any attempt wrote it (failed too): which attempt
    it was, its failure class and its error. Empty when no attempt wrote the file."""

    model_config = ConfigDict(frozen=True, extra="ignore")  # the rest of the file is that attempt's evidence
    attempt: int | None = None
    failure_class: str | None = None
    error: str | None = None

    @classmethod
    def read(cls, path: Path) -> PhaseAttempt:
        data = read_json_or_none(path)
        return cls.model_validate(data) if isinstance(data, dict) else cls()


class LoadEvidence(Evidence):
    """The load phase: the end file's counts and the checks after it; or a partial load (`partial`); or a load
    reused from a parent run (`source_run`)."""

    outcome: Literal["done", "reused"] | None = None
    reattached: bool | None = None
    processes: int | list[dict[str, Any]] | None = None  # JSON: load/parts.py's per-process rows
    client_stopped_s: list[float] | None = None
    # with load.host: the remote client's record, as run/remote/load.py returns it
    host: str | None = None
    remote: LoadRef | None = None  # the remote client's process reference
    remote_run_dir: str | None = None
    clock: dict[str, Any] | None = None  # JSON: run/remote/load.py's clock offset record
    sealed_sha256: dict[str, str] | None = Field(
        None, description="Each copied file's sha256, sealed equal to the remote one"
    )
    link: dict[str, Any] | None = None  # JSON: run/remote/load.py's link counters
    hosts: list[dict[str, Any]] | None = None  # JSON: run/remote/load.py's record of each load host's processes
    planned: int | None = None
    sent: int | None = None
    done: int | None = None
    ok: int | None = None
    failed: int | None = None
    metrics_read_by: str | None = None
    client_timing: dict[str, Any] | None = None  # JSON: load.client.client_timing's record
    raw_sha256: str | None = None
    partial: bool | None = None
    in_flight_lost: int | None = None
    never_sent: int | None = None
    reason: str | None = None
    source_run: str | None = None


class ConfirmEndEvidence(Evidence):
    client_gone: bool
    end_file: bool
    records: int
    planned: int
    sent: int | None = None
    partial: PartialLoad | None = None
    all_accounted: bool
    processes: int | None = None
    raw_sha256: str


class PostprocessEnv(Evidence):
    """The collector's recorded environment: interpreter, its argv, PYTHONPATH."""

    interpreter: str
    argv: list[str]
    PYTHONPATH: str


class PostprocessEvidence(Evidence):
    result: str | None
    raw_sha256: str | None
    env: PostprocessEnv
    requests: int | None


class DecideEvidence(Evidence):
    decision: str | None
    missing: list[str]
    baseline: str | None


EVIDENCE_OF_PHASE: dict[str, type[Evidence]] = {
    "preflight": PreflightEvidence,
    "warmup": WarmupEvidence,
    "route_verify": RouteVerifyEvidence,
    "cache_prepare": CachePrepareEvidence,
    "load": LoadEvidence,
    "confirm_end": ConfirmEndEvidence,
    "postprocess": PostprocessEvidence,
    "decide": DecideEvidence,
}
"""The model of each phase's evidence when the phase did its work (the service phase's is `ServiceRecord`)."""

_ENVELOPE = ("phase", "attempt", "error")  # what the controller writes around the evidence in a phase file


def read_evidence(paths: RunPaths, phase: str) -> PhaseEvidence | None:
    """The evidence a finished phase wrote to phases/<phase>.json, read through its model: `ServiceRecord` for the
    service phase, `NotRun` for a phase the plan reused or skipped, else `EVIDENCE_OF_PHASE[phase]`. None: no
    evidence (the phase has not ended, its file is torn, or it failed: a failed phase's file holds its failure).
    A file that does not read as its model raises EvidenceInvalid naming the file and each field."""
    path = paths.phase_file(phase)
    data = read_json_or_none(path)
    if not isinstance(data, dict):
        return None
    body = {k: v for k, v in data.items() if k not in _ENVELOPE}
    outcome = body.pop("outcome", None)
    if outcome == "failed":
        return None
    if phase == "service":
        model: type[Evidence] | type[ServiceRecord] = ServiceRecord
    elif outcome == "done" or "outcome" in EVIDENCE_OF_PHASE[phase].model_fields:  # the load's: done or reused
        model = EVIDENCE_OF_PHASE[phase]
    else:
        model = NotRun  # reused or skipped (any other outcome fails on NotRun's outcome field)
    if "outcome" in model.model_fields:
        body["outcome"] = outcome
    try:
        return ServiceRecord.of(body) if model is ServiceRecord else model.model_validate(body)
    except ValidationError as e:
        where = "/".join(path.parts[-5:])  # ledger/runs/<run>/phases/<phase>.json
        fields = "; ".join(f"{'.'.join(map(str, err['loc'])) or '(the file)'}: {err['msg']}" for err in e.errors())
        raise EvidenceInvalid(
            f"{where} does not read as {model.__name__}: {fields}",
            "the phase's phase_ended event in events.jsonl carries the same evidence: restore the file from it "
            "(if this version wrote it, report it as a caseledger bug)",
            run_id=paths.run_id,
            phase=phase,
        ) from None
