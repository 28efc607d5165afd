"""How files in the workspace are written and read: canonical JSON and its hashes, atomic writes, disk kept
aside for the last words when the disk is full, UTC timestamps, and bounded file locks."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from caseledger.errors import LockTimeout, quoted
from caseledger.procs import LoadRef, cmdline, flock_holders, ref_of


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


def read_ref(path: Path) -> LoadRef | None:
    """The process reference in a pid.json (or remote.json), or None when it is missing, torn or has no pid."""
    return ref_of(read_json_or_none(path))


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
