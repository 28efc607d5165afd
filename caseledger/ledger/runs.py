"""Runs in the ledger: the typed run (run.json + case.json, read once), ids, listing, and lookups by case."""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from caseledger import redact
from caseledger.case.model import Case
from caseledger.case.phases import Phase
from caseledger.case.plan import PlanStep
from caseledger.case.store import is_case_id_of
from caseledger.errors import CaseInvalid, NotFound, PathEscapes, quoted
from caseledger.ledger import calls, indexdb
from caseledger.workspace import RESULT_FILE, RunPaths, Workspace, check_id, is_id, write_json


class Imported(BaseModel):
    """Where an imported run came from (it was not executed by caseledger)."""

    model_config = ConfigDict(extra="ignore")

    tool: str
    path: str
    dataset: str | None = None
    skipped: list[str] = Field(default_factory=list)
    differences: list[str] = Field(default_factory=list)
    # the foreign tool's own summary, kept verbatim as evidence for the cross-check (not run metadata)
    aisbench_summary: dict[str, Any] = Field(default_factory=dict)  # JSON: AISBench's own


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
            raise CaseInvalid(
                f"run {self.run_id} names no dataset_id in its run.json",
                "the ledger was edited by hand: start a new run of the case (start_run)",
            )
        return self.dataset_id

    def action(self, phase: Phase) -> str:
        """The plan's action for a phase (run | reuse | check | skip); 'run' when the plan does not say."""
        return next((s.action for s in self.plan if s.phase == phase), "run")

    def plan_step(self, phase: Phase) -> PlanStep | None:
        return next((s for s in self.plan if s.phase == phase), None)


@dataclass(frozen=True)
class Run:
    """One run as a tool call sees it: its workspace, paths, metadata and (on first use) its frozen case, each
    read once and passed down instead of (workspace, run_id) and re-reads."""

    paths: RunPaths
    meta: RunMeta
    # the workspace whose ledger holds the run: the one the call came in with (never found by resolving the run
    # directory, and never the path run.json recorded: a moved or copied workspace keeps working)
    workspace: Workspace

    @cached_property
    def case(self) -> Case:
        """The run's copy of its frozen case, hash-checked against the run's case_id."""
        rel = f"ledger/runs/{self.paths.run_id}/case.json"
        try:
            case = Case.model_validate(orjson.loads(self.paths.case.read_bytes()))
        except FileNotFoundError:
            raise NotFound(
                f"run '{self.paths.run_id}' has no case.json at {self.paths.case}",
                "pass the run directory the controller created (ledger/runs/<run_id>)",
            ) from None
        except (OSError, orjson.JSONDecodeError, ValidationError) as e:
            raise CaseInvalid(
                f"{rel} is damaged: {first_problem(e)}",
                "the ledger was edited by hand: restore case.json, or start a new run",
            ) from None
        if not is_case_id_of(case, self.meta.case_id):
            raise CaseInvalid(
                f"{rel} is damaged: its content no longer hashes to {self.meta.case_id}",
                "the ledger was edited by hand: restore case.json, or start a new run",
            )
        # every process of the run reads its case here (controller, load client, preflight): from now on it masks
        # the values of the case's secrets in the text it records and shows
        redact.remember(case.env_names())
        return case

    @property
    def run_id(self) -> str:
        return self.meta.run_id


CREATING_S = 60.0  # a run directory without run.json younger than this is being created


def first_problem(e: Exception) -> str:
    """The first thing wrong with a file's content, one short line (a field and its problem where known)."""
    if isinstance(e, ValidationError) and e.errors():
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        return quoted(f"{where}: {err['msg']}", 160)
    return quoted(str(e).splitlines()[0] if str(e) else type(e).__name__, 160)


DAMAGED_FIX = "restore it from a backup, or move the run directory out of ledger/runs (other runs are unaffected)"


def read_meta(paths: RunPaths) -> RunMeta:
    """run.json of a run directory; NotFound when absent, CaseInvalid ('… is damaged') when unreadable."""
    rel = f"ledger/runs/{paths.run_id}/run.json"
    try:
        data = paths.run_json.read_bytes()
    except FileNotFoundError:
        raise NotFound(
            f"run '{paths.run_id}' has no run.json at {paths.run_json}",
            f"{calls.phase_status()} without run_id shows the latest run; start one with {calls.start_run(...)}",
        ) from None
    except OSError as e:
        raise CaseInvalid(f"{rel} is damaged: {quoted(e)}", DAMAGED_FIX) from None
    try:
        meta = RunMeta.model_validate(orjson.loads(data))
    except (orjson.JSONDecodeError, ValidationError) as e:
        raise CaseInvalid(f"{rel} is damaged: {first_problem(e)}", DAMAGED_FIX) from None
    if meta.run_id != paths.run_id:
        raise CaseInvalid(f"{rel} is damaged: it names run {quoted(meta.run_id)}", DAMAGED_FIX)
    return meta


def write_meta(paths: RunPaths, meta: RunMeta) -> None:
    write_json(paths.run_json, meta.model_dump(mode="json"))
    indexdb.touched(paths.root)  # the index reads run.json again at its next read


LINK_FIX = (
    "a run directory is a real directory in the ledger: remove the link, or move the directory it points "
    "to into its place (mv), then call again"
)


def check_not_link(paths: RunPaths) -> RunPaths:
    """`paths`, or PathEscapes when the run directory is a symbolic link: it may point anywhere (outside the
    workspace, into another ledger), so it is never followed, read as a run, or written through."""
    if paths.root.is_symlink():
        where = f"ledger/{paths.root.parent.name}/{paths.run_id}"
        try:
            target = f" (to {quoted(os.readlink(paths.root), 200)})"
        except OSError:
            target = ""
        raise PathEscapes(
            f"{where} is a symbolic link{target}, not a run directory; it is never followed",
            LINK_FIX,
            run_id=paths.run_id,
        )
    return paths


def read_run(root: Path, ws: Workspace | None = None) -> Run:
    """The run in a run directory (the controller, the load client, preflight and postprocess start here). Its
    workspace: `ws` when the caller has it, else the directory holding ledger/, by the path as given (a
    symbolic link is refused, never resolved)."""
    paths = check_not_link(RunPaths(Path(os.path.abspath(root))))
    meta = read_meta(paths)
    return Run(paths=paths, meta=meta, workspace=ws if ws is not None else Workspace(paths.root.parents[2]))


def load_run(ws: Workspace, run_id: str) -> Run:
    """The run `run_id` of a workspace, checked and read once per tool call. A case id stands for the
    latest run of that case (runs are reachable from their case everywhere a run id is accepted)."""
    if is_id(run_id, "c"):
        latest = latest_run_of_case(ws, run_id)
        if latest is None:
            raise NotFound(f"case {run_id} has no run yet in {ws.runs_dir}", calls.start_run(run_id))
        run_id = latest
    paths = check_not_link(ws.run(check_id(run_id, "run_id", "r")))
    if not paths.run_json.exists():
        raise NotFound(
            f"run_id '{run_id}' is not in the ledger at {ws.runs_dir}",
            f"{calls.phase_status()} without run_id shows the latest run; start one with {calls.start_run(...)}",
        )
    return read_run(paths.root, ws)


def new_run_id(ws: Workspace) -> str:
    while True:
        rid = "r-" + secrets.token_hex(4)
        if not (ws.runs_dir / rid).exists():
            return rid


@dataclass(frozen=True)
class RunScan:
    """Every entry of ledger/runs: the readable runs (oldest first) and what is damaged, each named."""

    metas: list[RunMeta]
    damaged: list[str]  # "ledger/runs/<entry>…: what is wrong" — listed, never hiding the other runs


def scan_runs(ws: Workspace) -> RunScan:
    """Read every run.json once; a damaged entry is reported, never an error for the other runs."""
    metas: list[RunMeta] = []
    damaged: list[str] = []
    entries = sorted(ws.runs_dir.iterdir()) if ws.runs_dir.is_dir() else []
    for d in entries:
        if d.is_symlink():  # never followed: it may point outside the workspace
            damaged.append(f"ledger/runs/{quoted(d.name, 40)} is a symbolic link, not a run directory (not followed)")
            continue
        if not d.is_dir() or not is_id(d.name, "r"):
            damaged.append(f"ledger/runs/{quoted(d.name, 40)} is not a run directory")
            continue
        try:
            metas.append(read_meta(RunPaths(d)))
        except CaseInvalid as e:
            damaged.append(e.message)
        except NotFound:
            if time.time() - d.stat().st_mtime > CREATING_S:  # younger: create_run is writing run.json
                damaged.append(f"ledger/runs/{d.name} has no run.json")
    return RunScan(sorted(metas, key=lambda m: (m.created_utc, m.run_id)), damaged)


def damaged_line(damaged: list[str]) -> str:
    """One line naming the damaged ledger entries (the first in full, the rest counted) and the fix."""
    more = f" (+{len(damaged) - 1} more)" if len(damaged) > 1 else ""
    return f"damaged ledger entry: {damaged[0]}{more}; fix: {DAMAGED_FIX}"


def _metas(ws: Workspace) -> list[RunMeta]:
    return scan_runs(ws).metas


def latest_run_of_case(
    ws: Workspace, case_id: str, *, with_load_end: bool = False, with_results: bool = False
) -> str | None:
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
