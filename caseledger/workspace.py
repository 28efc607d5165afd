"""The workspace: where drafts, the ledger and HANDOFF.md live, and how files in it are written.

Layout (everything the tool writes is under ledger/):
    cases/                     drafts written by people or agents
    HANDOFF.md                 generated snapshot, never authoritative
    ledger/cases/<case_id>.json            frozen cases, read-only
    ledger/datasets/<dataset_id>/          materialized datasets (entries.jsonl, identity.json)
    ledger/runs/<run_id>/                  one directory per run (see RunPaths)
    (target leases are host-wide, in $CASELEDGER_HOST_DIR: see ledger/leases.py)
    ledger/services/<target_key>.json      the live service started by caseledger on that target
    ledger/authorization.json              paused | single | auto
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import os
import re
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from caseledger.errors import LockTimeout, PathEscapes, quoted
from caseledger.procs import cmdline, flock_holders

ENV_WORKSPACE = "CASELEDGER_WORKSPACE"
RESULT_FILE = "result.json"  # one result of one processor version, window rule and raw input
_ID = re.compile(r"[a-z]-[0-9a-f]{6,64}")  # matched whole (fullmatch): no trailing newline


def canonical_json(obj: Any) -> bytes:
    """Sorted-key JSON bytes: the form that is hashed and stored."""
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def atomic_write(path: Path, data: bytes | str, mode: int = 0o644) -> None:
    """Write via temp file + fsync + rename, so readers never see a half-written artifact."""
    if isinstance(data, str):
        data = data.encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


_FALLOC_FL_KEEP_SIZE = 1


def reserve(fd: int, nbytes: int) -> bool:
    """Allocate `nbytes` of disk after the end of `fd` without changing its size (fallocate KEEP_SIZE), so
    later appends up to that much cannot fail with ENOSPC. False when the disk has no room for it; True too
    where the filesystem cannot reserve (nothing better is possible there)."""
    if nbytes <= 0:
        return True
    libc = ctypes.CDLL(None, use_errno=True)
    size = os.fstat(fd).st_size
    if libc.fallocate(fd, _FALLOC_FL_KEEP_SIZE, ctypes.c_long(size), ctypes.c_long(nbytes)) == 0:
        return True
    # ENOSPC/EDQUOT: no room. EOPNOTSUPP and the like: this filesystem cannot reserve (True: nothing better)
    return ctypes.get_errno() not in (errno.ENOSPC, errno.EDQUOT)


class Spare:
    """A small file of allocated disk kept aside; freed when the disk is full, so the last words (an end
    file, an event naming the cause) can still be written."""

    def __init__(self, path: Path, nbytes: int = 256 * 1024) -> None:
        self.path = path
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, nbytes)
            finally:
                os.close(fd)
        except OSError:  # the disk is already full: nothing to set aside
            path.unlink(missing_ok=True)

    def free(self) -> None:
        self.path.unlink(missing_ok=True)


def is_disk_full(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


def write_json(path: Path, obj: Any, mode: int = 0o644) -> None:
    atomic_write(path, orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n", mode)


def read_json(path: Path) -> Any:
    return orjson.loads(path.read_bytes())


def read_json_or_none(path: Path) -> Any:
    try:
        return orjson.loads(path.read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None


def utc_now(timespec: str = "milliseconds") -> str:
    return datetime.now(UTC).isoformat(timespec=timespec).replace("+00:00", "Z")


def utc_from_epoch(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


ENV_LOCK_TIMEOUT = "CASELEDGER_LOCK_TIMEOUT_S"
LOCK_TIMEOUT_S = 30.0  # the ledger's locks are held for milliseconds (an append, a lease renewal): past this, stuck


def lock_timeout() -> float:
    """How long a caller waits for a held lock: $CASELEDGER_LOCK_TIMEOUT_S when a positive number, else 30 s."""
    try:
        value = float(os.environ.get(ENV_LOCK_TIMEOUT, ""))
    except ValueError:
        return LOCK_TIMEOUT_S
    return value if value > 0 and value != float("inf") else LOCK_TIMEOUT_S


def lock_fd(fd: int, path: Path, timeout_s: float | None = None) -> None:
    """Take an exclusive flock on `fd` (the file or directory `path`), waiting at most `timeout_s` (default:
    lock_timeout()). Free, it is the one flock call a blocking wait makes; held, it is polled (a blocking flock
    cannot be bounded from a thread), then LockTimeout names the lock file, the holder's pid and the fix."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    limit = lock_timeout() if timeout_s is None else timeout_s
    deadline = time.monotonic() + limit
    pause = 0.001
    while True:
        time.sleep(pause)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise _lock_timeout(fd, path, limit) from None
        pause = min(pause * 2, 0.05)


def _lock_timeout(fd: int, path: Path, waited: float) -> LockTimeout:
    holders = flock_holders(fd)
    if not holders:
        return LockTimeout(
            f"waited {waited:g} s for the lock {path}; its holder is not listed in /proc/locks",
            f"find the process holding it (fuser -v {path}), stop it if it is stuck, and call again",
        )
    pid = holders[0]
    if pid == os.getpid():
        return LockTimeout(
            f"waited {waited:g} s for the lock {path}, held by pid {pid}: another call in this process",
            f"call again when that call has finished (${ENV_LOCK_TIMEOUT} sets the wait)",
        )
    cmd = cmdline(pid)  # its program, not its arguments: they may carry anything
    what = f" ({quoted(' '.join(cmd[:3]), 120)})" if cmd else ""
    return LockTimeout(
        f"waited {waited:g} s for the lock {path}, held by pid {pid}{what}",
        f"if pid {pid} is stuck, stop it (kill {pid}) and call again; if it is still working, call "
        f"again later (${ENV_LOCK_TIMEOUT} sets the wait)",
    )


@contextmanager
def flocked(path: Path, timeout_s: float | None = None) -> Iterator[None]:
    """Hold an exclusive flock on the file `path` for the block; a wait for it is bounded (lock_fd)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        lock_fd(f.fileno(), path, timeout_s)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


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
