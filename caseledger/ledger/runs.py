"""Runs in the ledger: the typed run (run.json + case.json, read once), ids, listing, and lookups by case."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from caseledger.case.model import Case
from caseledger.case.plan import Phase, PlanStep
from caseledger.errors import CaseInvalid, NotFound
from caseledger.workspace import RESULT_FILE, RunPaths, Workspace, check_id, read_json_or_none, write_json


class Imported(BaseModel):
    """Where an imported run came from (it was not executed by caseledger)."""

    model_config = ConfigDict(extra="ignore")

    tool: str
    path: str
    dataset: str | None = None
    skipped: list[str] = Field(default_factory=list)
    differences: list[str] = Field(default_factory=list)
    # the foreign tool's own summary, kept verbatim as evidence for the cross-check (not run metadata)
    aisbench_summary: dict[str, Any] = Field(default_factory=dict)


class RunMeta(BaseModel):
    """run.json: what the run is (written at creation; later writers only set the flags below)."""

    model_config = ConfigDict(extra="ignore")

    run_id: str
    case_id: str
    scenario: str = "?"
    parent_case: str | None = None
    workspace: str
    dataset_id: str | None = None
    salt: str | None = None
    planned: int = 0
    target_key: str | None = None  # null for a preflight-only check (no target is taken)
    created_utc: str = ""
    created_mono_ns: int | None = None
    plan: list[PlanStep] = Field(default_factory=list)
    fence: int | None = None
    authorized: str | None = None  # the authorization mode that let the run (or its last resume) start
    load_reuse: str | None = None  # measurement-only: the run whose raw data this run reprocesses
    load_reused: bool = False  # no formal load of its own (measurement-only or imported)
    controller_spawned: bool = False
    preflight_only: bool = False
    imported: Imported | None = None

    def dataset(self) -> str:
        """The run's dataset id; CaseInvalid for a run record that names none (edited or truncated)."""
        if self.dataset_id is None:
            raise CaseInvalid(f"run {self.run_id} names no dataset_id in its run.json",
                              "the ledger was edited by hand: start a new run of the case (start_run)")
        return self.dataset_id

    def action(self, phase: Phase) -> str:
        """The plan's action for a phase (run | reuse | check | skip); 'run' when the plan does not say."""
        return next((s.action for s in self.plan if s.phase == phase), "run")

    def plan_step(self, phase: Phase) -> PlanStep | None:
        return next((s for s in self.plan if s.phase == phase), None)


@dataclass(frozen=True)
class Run:
    """One run as a tool call sees it: its paths, its metadata and (on first use) its frozen case, each read
    once and passed down instead of (workspace, run_id) and re-reads."""

    paths: RunPaths
    meta: RunMeta

    @cached_property
    def case(self) -> Case:
        try:
            return Case.model_validate(orjson.loads(self.paths.case.read_bytes()))
        except FileNotFoundError:
            raise NotFound(f"run '{self.paths.run_id}' has no case.json at {self.paths.case}",
                           "pass the run directory the controller created (ledger/runs/<run_id>)") from None
        except (orjson.JSONDecodeError, ValidationError) as e:
            raise CaseInvalid(f"{self.paths.case} is not a valid frozen case ({str(e).splitlines()[0][:200]})",
                              "the ledger was edited by hand: restore case.json, or start a new run") from None

    @property
    def run_id(self) -> str:
        return self.meta.run_id

    @property
    def workspace(self) -> Workspace:
        return Workspace(Path(self.meta.workspace))


def read_meta(paths: RunPaths) -> RunMeta:
    """run.json of a run directory; NotFound when absent, CaseInvalid (naming the file) when unreadable."""
    try:
        data = paths.run_json.read_bytes()
    except FileNotFoundError:
        raise NotFound(f"run '{paths.run_id}' has no run.json at {paths.run_json}",
                       "phase_status() without run_id shows the latest run; start one with start_run(case_id=...)"
                       ) from None
    except IsADirectoryError:
        raise CaseInvalid(f"{paths.run_json} is not a file", "restore the run directory from a backup") from None
    try:
        return RunMeta.model_validate(orjson.loads(data))
    except (orjson.JSONDecodeError, ValidationError) as e:
        first = str(e).splitlines()[0][:200]
        raise CaseInvalid(f"{paths.run_json} is not a valid run record ({first})",
                          "the ledger was edited by hand: restore run.json, or start a new run") from None


def write_meta(paths: RunPaths, meta: RunMeta) -> None:
    write_json(paths.run_json, meta.model_dump(mode="json"))


def read_run(root: Path) -> Run:
    """The run in a run directory (the controller, the load client, preflight and postprocess start here)."""
    paths = RunPaths(Path(root))
    return Run(paths=paths, meta=read_meta(paths))


def load_run(ws: Workspace, run_id: str) -> Run:
    """The run `run_id` of a workspace, checked and read once per tool call."""
    paths = ws.run(check_id(run_id, "run_id", "r"))
    if not paths.run_json.exists():
        raise NotFound(f"run_id '{run_id}' is not in the ledger at {ws.runs_dir}",
                       "phase_status() without run_id shows the latest run; start one with start_run(case_id=...)")
    return read_run(paths.root)


def new_run_id(ws: Workspace) -> str:
    while True:
        rid = "r-" + secrets.token_hex(4)
        if not (ws.runs_dir / rid).exists():
            return rid


def _metas(ws: Workspace) -> list[RunMeta]:
    """Readable run.json files of the workspace, oldest first; a stray or broken entry is skipped."""
    if not ws.runs_dir.exists():
        return []
    out = []
    for d in ws.runs_dir.iterdir():
        raw = read_json_or_none(d / "run.json")
        if not isinstance(raw, dict):
            continue
        try:
            out.append(RunMeta.model_validate(raw))
        except ValidationError:
            continue
    return sorted(out, key=lambda m: (m.created_utc, m.run_id))


def list_runs(ws: Workspace) -> list[str]:
    """Run ids, oldest first (by creation time recorded in run.json)."""
    return [m.run_id for m in _metas(ws)]


def latest_run_of_case(ws: Workspace, case_id: str, *, with_load_end: bool = False,
                       with_results: bool = False) -> str | None:
    for meta in reversed(_metas(ws)):
        if meta.case_id != case_id:
            continue
        p = ws.run(meta.run_id)
        if with_load_end and not p.load_end.exists():
            continue
        if with_results and not has_results(p):
            continue
        return meta.run_id
    return None


def has_results(paths: RunPaths) -> bool:
    """Evidence that postprocess produced results (any processor version)."""
    return paths.results.exists() and any(paths.results.rglob(RESULT_FILE))
