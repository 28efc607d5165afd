"""The phases' evidence as models, as the ledger stores it. First the service phase's: what `ensure` found or
started, process by process.

One `ServiceRecord` per service phase (written to phases/service.json and the phase's end event); with
components, one `ComponentRecord` per component inside it. Fields a form does not have stay unset and are
left out of the JSON, so each form's evidence reads as before: a launched process (argv intended and read
back, files, env hashes, pid, starts), a remote one (host, login, host-key policy), an external endpoint
(the models it serves, its identity command's output).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from caseledger.workspace import read_json_or_none

ServiceOutcome = Literal["done", "reused", "skipped"]
"""done: started (or, external, probed) by this phase; reused: a live process with the case's identity kept
with its warm caches; skipped: not the phase's to run."""


class FileEvidence(BaseModel):
    """A declared file of a service process: its hash and whether the live process holds that file."""

    model_config = ConfigDict(extra="allow")
    path: str
    sha256: str | None = None
    held: bool = False


class ServiceRecord(BaseModel):
    """The evidence of the service phase (the whole target, or one component of it)."""

    model_config = ConfigDict(extra="ignore")  # read back from JSON written by any version of this model
    outcome: ServiceOutcome
    identity: str | None = Field(None, description="The intended service identity (s-…)")
    reason: str | None = Field(None, description="Why the phase did nothing (measurement-only)")
    plan: str | None = Field(None, description="What the run's plan said for the service phase")
    intended_argv: list[str] | None = None
    effective_argv: list[str] | None = Field(None, description="The argv read back from the live process")
    model_files: list[dict[str, Any]] | None = None  # services.identity.ModelFile rows, as JSON
    pid: int | None = None
    starts: int | None = Field(None, description="Processes started on this target key so far")
    files: list[FileEvidence] | None = None
    env_sha256: dict[str, str] | None = None
    engine_version: str | None = None
    env: dict[str, str] | None = Field(None, description="The environment shown (secrets masked)")
    verified_by: str | None = None
    host: str | None = Field(None, description="The remote host (unset: this host)")
    ssh: dict[str, Any] | None = None  # the SSH login as JSON (read back from any version's record)
    host_key: str | None = None
    live_identity: str | None = Field(None, description="External: hash of what the endpoints answer")
    endpoints: list[dict[str, Any]] | None = None  # external: {base_url, models} as the endpoints answered
    identity_output: str | None = None
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
    def of(cls, data: dict[str, Any]) -> ServiceRecord | None:  # a phase's evidence as read from JSON
        """The record in a phase's evidence dict, or None when it is none (e.g. a failed phase's data)."""
        return cls.model_validate(data) if data.get("outcome") in ("done", "reused", "skipped") else None


class ComponentRecord(ServiceRecord):
    """One component of a multi-process service."""

    name: str
    role: str | None = None
    key: str = Field(description="Its target key: the state file ledger/services/<key>.json")
    routes: list[int] = Field(default_factory=list, description="The routes it serves (empty: every route)")


ServiceRecord.model_rebuild()
