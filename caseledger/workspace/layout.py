"""The workspace's layout: where drafts, the ledger and HANDOFF.md live, every file of a run, ids and the checks
that keep a given path inside the workspace (see the package's docstring for the tree)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from caseledger.errors import PathEscapes, quoted

ENV_WORKSPACE = "CASELEDGER_WORKSPACE"
RESULT_FILE = "result.json"  # one result of one processor version, window rule and raw input
_ID = re.compile(r"[a-z]-[0-9a-f]{6,64}")  # matched whole (fullmatch): no trailing newline


def is_id(value: object, prefix: str) -> bool:
    """True for an id of this kind, matched whole ('c', 'r', 'd' prefixes)."""
    return isinstance(value, str) and _ID.fullmatch(value) is not None and value.startswith(prefix + "-")


def check_id(value: str, field: str, prefix: str) -> str:
    """Refuse ids that could address anything outside the ledger ('/', '..', other shapes)."""
    if not is_id(value, prefix):
        raise PathEscapes(
            f"{field} '{quoted(value)}' is not a valid id",
            f"use the id exactly as returned (e.g. '{prefix}-1a2b3c…'); ids never contain '/' or '..'",
        )
    return value


@dataclass(frozen=True)
class RunPaths:
    """Every file of one run, in one place, so no path is spelled twice."""

    root: Path

    @property
    def run_id(self) -> str:
        return self.root.name

    @property
    def run_json(self) -> Path:
        return self.root / "run.json"

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def events_lock(self) -> Path:
        return self.root / "events.lock"

    @property
    def case(self) -> Path:
        return self.root / "case.json"

    @property
    def controller_log(self) -> Path:
        return self.root / "controller.log"

    @property
    def controller_pid(self) -> Path:
        return self.root / "controller.pid.json"

    @property
    def collector_pid(self) -> Path:
        """The postprocess collector's process while it runs (run/after_load.py): a reader sees it stopped."""
        return self.root / "collector.pid.json"

    def phase_file(self, phase: str) -> Path:
        return self.root / "phases" / f"{phase}.json"

    @property
    def load_dir(self) -> Path:
        return self.root / "load"

    @property
    def raw(self) -> Path:
        return self.load_dir / "raw.jsonl"

    @property
    def load_anchor(self) -> Path:
        return self.load_dir / "anchor.json"

    @property
    def load_progress(self) -> Path:
        return self.load_dir / "progress.json"

    @property
    def load_sent(self) -> Path:
        """One line per formal request, written before its first byte leaves (the intent to send)."""
        return self.load_dir / "sent.log"

    @property
    def load_end(self) -> Path:
        return self.load_dir / "end.json"

    @property
    def load_pid(self) -> Path:
        return self.load_dir / "pid.json"

    @property
    def load_log(self) -> Path:
        return self.load_dir / "client.log"

    @property
    def load_armed(self) -> Path:
        """The client spawned early (armed): it waits for `load_go` or `load_abort` before sending."""
        return self.load_dir / "armed.json"

    @property
    def load_go(self) -> Path:
        return self.load_dir / "go"

    @property
    def load_abort(self) -> Path:
        return self.load_dir / "abort"

    @property
    def load_heartbeat(self) -> Path:
        """Touched by the controller while clients on a load host wait armed (the pid there means nothing)."""
        return self.load_dir / "heartbeat"

    @property
    def load_not_started(self) -> Path:
        """An armed client on a load host that gave up waiting for the go: why, and its exit code (nothing sent)."""
        return self.load_dir / "not_started.json"

    @property
    def load_remote(self) -> Path:
        """Where the load client runs when load.host is set (written before its launch: no second launch)."""
        return self.load_dir / "remote.json"

    @property
    def load_clock(self) -> Path:
        """The clock offset between the load host and the controller, before and after the load."""
        return self.load_dir / "clock.json"

    @property
    def load_ready(self) -> Path:
        """A client of a several-process load built its plan and waits for load/go (see PartPaths)."""
        return self.load_dir / "ready"

    @property
    def load_stalls(self) -> Path:
        """The load client's stalls: one {start_ns, end_ns} line per span its event loop did not run."""
        return self.load_dir / "stalls.jsonl"

    @property
    def load_host(self) -> Path:
        """CPU samples of the load client's host during the formal load, written by the controller."""
        return self.load_dir / "host.jsonl"

    @property
    def load_accel(self) -> Path:
        """Accelerator samples of the service host during the formal load, written by the controller
        (run/accel/sampling.py)."""
        return self.load_dir / "accel.jsonl"

    @property
    def load_partial(self) -> Path:
        """Written when a resume finishes on the records of a client that died (nothing re-sent)."""
        return self.load_dir / "partial.json"

    def load_attempt_dir(self, attempt: int) -> Path:
        """Where a rejected formal load (hot_entry) is kept when the load is sent again."""
        return self.root / f"load.attempt-{attempt}"

    def load_part(self, k: int) -> PartPaths:
        """The files of client process k of a load with load.processes > 1 (load/p<k>/)."""
        return PartPaths(self.root, k)

    def load_parts(self) -> list[PartPaths]:
        """The client processes' directories that exist (load/p0, load/p1, ...): empty for a one-process load."""
        out, k = [], 0
        while (self.load_dir / f"p{k}").is_dir():
            out.append(self.load_part(k))
            k += 1
        return out

    @property
    def preflight_json(self) -> Path:
        return self.root / "preflight.json"

    @property
    def preflight_ahead(self) -> Path:
        """The result of the preflight process start_run spawned ahead of the run (run/preflight.py)."""
        return self.root / "preflight.ahead.json"

    @property
    def preflight_ahead_pid(self) -> Path:
        return self.root / "preflight.ahead.pid.json"

    @property
    def metrics_before(self) -> Path:
        return self.load_dir / "metrics_before.txt"

    @property
    def metrics_after(self) -> Path:
        return self.load_dir / "metrics_after.txt"

    @property
    def results(self) -> Path:
        """results/<processor_version>/<params_key>/<inputs_key>/RESULT_FILE (metrics/_store.py)."""
        return self.root / "results"

    @property
    def decision(self) -> Path:
        return self.root / "decision.json"

    @property
    def report_md(self) -> Path:
        return self.root / "report.md"

    @property
    def report_json(self) -> Path:
        return self.root / "report.json"

    @property
    def report_html(self) -> Path:
        return self.root / "report.html"


@dataclass(frozen=True)
class PartPaths(RunPaths):
    """The files of one client process of a load shared by load.processes > 1 processes: the same names as a
    one-process load, under load/p<k>/ (its own pid, anchor, raw records, intent log, stalls, end file), while
    the go and abort signals stay the run's (one go starts every process at one instant)."""

    part: int = 0

    @property
    def load_dir(self) -> Path:
        return self.root / "load" / f"p{self.part}"

    @property
    def load_go(self) -> Path:
        return self.root / "load" / "go"

    @property
    def load_abort(self) -> Path:
        return self.root / "load" / "abort"

    @property
    def load_heartbeat(self) -> Path:
        return self.root / "load" / "heartbeat"


@dataclass(frozen=True)
class Workspace:
    """A workspace directory; all paths the tool touches derive from here."""

    root: Path

    def __post_init__(self) -> None:
        # absolute and resolved, always: the root is compared across processes (leases name it) and a
        # relative one means something else in every child's working directory
        object.__setattr__(self, "root", Path(self.root).resolve())

    @classmethod
    def open(cls, path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> Workspace:
        env = os.environ if env is None else env
        chosen = path if path is not None else env.get(ENV_WORKSPACE) or "."
        return cls(Path(chosen).resolve())

    @property
    def cases_dir(self) -> Path:
        return self.root / "cases"

    @property
    def ledger(self) -> Path:
        return self.root / "ledger"

    @property
    def frozen_dir(self) -> Path:
        return self.ledger / "cases"

    @property
    def datasets_dir(self) -> Path:
        return self.ledger / "datasets"

    @property
    def runs_dir(self) -> Path:
        return self.ledger / "runs"

    @property
    def services_dir(self) -> Path:
        return self.ledger / "services"

    @property
    def authorization_file(self) -> Path:
        return self.ledger / "authorization.json"

    @property
    def preflights_dir(self) -> Path:
        return self.ledger / "preflights"

    @property
    def queue_dir(self) -> Path:
        return self.ledger / "queue"

    @property
    def reports_dir(self) -> Path:
        return self.ledger / "reports"

    @property
    def scenarios_dir(self) -> Path:
        """Per scenario: its decision record (decision.jsonl), which is not part of any case id."""
        return self.ledger / "scenarios"

    @property
    def campaigns_dir(self) -> Path:
        return self.ledger / "campaigns"

    @property
    def handoff(self) -> Path:
        return self.root / "HANDOFF.md"

    def frozen_case(self, case_id: str) -> Path:
        return self.frozen_dir / f"{check_id(case_id, 'case_id', 'c')}.json"

    def run(self, run_id: str) -> RunPaths:
        return RunPaths(self.runs_dir / check_id(run_id, "run_id", "r"))

    def dataset_dir(self, dataset_id: str) -> Path:
        return self.datasets_dir / check_id(dataset_id, "dataset_id", "d")

    def inside(self, relative: str, field: str) -> Path:
        """Resolve a workspace-relative path; refuse one that escapes the workspace."""
        root = self.root
        p = resolve_path(root, relative, field)
        if p != root and root not in p.parents:
            raise PathEscapes(
                f"{field} '{quoted(relative)}' resolves outside the workspace {root}",
                "put the file inside the workspace and give a path relative to it",
            )
        return p


MAX_PATH_CHARS = 1024  # longer paths are refused before the filesystem sees them


def resolve_path(base: Path, given: str | os.PathLike[str], field: str) -> Path:
    """`given` (relative to `base`) resolved, or PathEscapes naming the field: a NUL, an over-long path."""
    text = os.fspath(given)
    if "\0" in text or len(text) > MAX_PATH_CHARS:
        problem = "contains a NUL character" if "\0" in text else f"is {len(text)} characters long"
        raise PathEscapes(
            f"{field} '{quoted(text)}' {problem}",
            f"give a workspace-relative path of at most {MAX_PATH_CHARS} characters",
        )
    try:
        return (base / text).resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop, a component longer than the filesystem allows
        raise PathEscapes(
            f"{field} '{quoted(text)}' cannot be resolved ({quoted(e)})",
            "give a plain workspace-relative path to an existing file",
        ) from None


def exists(path: Path, field: str, given: str | os.PathLike[str]) -> bool:
    """path.exists(), with the errors it raises (a component longer than the filesystem allows, a loop)
    turned into PathEscapes naming the field and the fix."""
    try:
        return path.exists()
    except OSError as e:
        raise PathEscapes(
            f"{field} '{quoted(os.fspath(given))}' cannot be used ({quoted(e.strerror or e, 80)})",
            "give a plain workspace-relative path (each name at most 255 bytes)",
        ) from None


def read_file_field(path: Path, field: str, given: str | os.PathLike[str]) -> bytes:
    """The bytes of a regular file named by a field; a clear error (never a traceback) otherwise."""
    try:
        if not path.is_file():
            what = "a directory" if path.is_dir() else "not a file"  # (both raise ENAMETOOLONG: caught below)
            where = "" if os.fspath(given) == str(path) else f" ({quoted(path, 200)})"
            raise PathEscapes(
                f"{field} '{quoted(os.fspath(given))}' is {what}{where}", "give the path of a regular file"
            )
        return path.read_bytes()
    except OSError as e:
        raise PathEscapes(
            f"{field} '{quoted(os.fspath(given))}' cannot be read ({quoted(e)})",
            "give the path of a readable regular file",
        ) from None
