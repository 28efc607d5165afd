"""Errors of caseledger. Every error names what went wrong, where, and the fix.

    CaseledgerError                 base; .fix says what to do next; optional context .run_id, .phase
    ├── CaseInvalid                 a draft or frozen case fails validation (field paths named)
    ├── NotFound                    unknown case id, run id, dataset id
    ├── PathEscapes                 a path that leaves the workspace, an id with '/' or '..'
    ├── TargetHeld                  a second owner for a busy target (holder run id, pid, expiry)
    ├── FenceRejected               an append carrying a fence token older than the target's
    ├── NotAuthorized               authorization mode forbids the action
    ├── NothingToResume             the run has no phase left to repair
    ├── PhaseFailed                 a phase ended in failure (.failure_class: FailureClass, short error)
    ├── EvidenceChanged             raw data or another sealed file differs from its recorded sha256
    ├── EvidenceInvalid             a phase file does not read as its phase's evidence model (file, fields named)
    ├── ResultConflict              a result directory already holds a different result (no version bump)
    ├── RemoteError                 an SSH connection or remote command failed (user@host:port named)
    ├── AisbenchImportError         a directory is not a readable AISBench perf output (also a ValueError)
    ├── NotWritable                 the filesystem refused a write (read-only workspace, permissions)
    ├── LockTimeout                 a lock held past the bounded wait (lock file, holder pid named)
    └── Unexpected                  a bug of ours (exit 1): any other exception, as an answer with a fix

    FailureClass                    StrEnum of the failure classes a failed phase carries (not an error)
    quoted(text, limit)             outside text made safe to show: secrets masked, one line, escaped, capped
    unexpected(exc)                 any other exception as an answer: NotWritable, else Unexpected

Context is carried as attributes (`run_id`, `phase`, `failure_class`), never folded into `str(e)`,
which stays "message" or "message; fix".
"""

from __future__ import annotations

import errno
import os
from enum import StrEnum
from pathlib import Path
from typing import Any, TypedDict

from caseledger.redact import cut as mask_and_cut

ECHO_CHARS = 80  # echoed input (an id, a path, a value) is cut to this many characters
MESSAGE_CHARS = 1200  # a whole error message or fix as shown
OUTSIDE_CHARS = 240  # outside text (a target's error body, an engine log line, an exception) in an answer


class FailureClass(StrEnum):
    """Why a phase failed; the value is what event logs and phase status carry."""

    BEFORE_MODEL = "before_model"  # failed before any request reached the model (preflight)
    HOT_ENTRY = "hot_entry"  # the formal entry rejected every request; the service stays warm
    SERVICE = "service"  # the service, warmup, routes or cache preparation failed
    COLLECT = "collect"  # collecting figures from the raw records failed (postprocess, decide)
    END_UNKNOWN = "end_unknown"  # the load's end is not established; resume checks the evidence
    AUTH = "auth"  # the target refused the credentials (HTTP 401/403); the service is healthy and kept
    DISK = "disk"  # the disk filled up (ENOSPC); free space and resume: finished work and records are kept
    DATASET = "dataset"  # the dataset is not what the server counts (another tokenizer): a new case is needed
    OVERLOAD = "overload"  # the target answered 429/503: rate-limited or saturated; lower r or C, or wait
    INTERNAL = "internal"  # a caseledger bug inside a phase: report it; the raw data is kept


def quoted(text: object, limit: int = ECHO_CHARS) -> str:
    """Text from outside (input, a server's body, a log line) as one safe line: the values of the secrets this
    process knows masked as *** (caseledger.redact), control characters and line breaks escaped (so it can
    never start a line of its own, e.g. a forged 'next:'), cut to `limit` characters at a word boundary where
    one is near, with the number of characters left out."""
    s = str(text)
    # masked before it is cut (a cut key would keep its first characters); escapes only lengthen: no more of a
    # 20 MB input is looked at
    head = mask_and_cut(s, limit + 1)
    out = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in head)
    if len(s) <= limit + 1 and len(out) <= limit:  # the whole text (masked) fits
        return out
    cut = out[:limit]
    space = cut.rfind(" ")
    if space >= limit * 3 // 4:
        cut = cut[:space]
    return f"{cut}… ({len(s)} chars)"


class FailureEvidence(TypedDict, total=False):
    """What a failed phase records beside its failure class and fix (phases/<phase>.json and its end
    event): PhaseFailed.evidence."""

    service_problem: str  # the service was found unfit: resume starts it once before the phase again
    reattached: bool  # a load on load hosts whose link was lost: it had re-attached to running clients
    hosts: list[dict[str, Any]]  # JSON: run/remote/hosts.py's row of each load host (LoadEvidence.hosts)
    disk_host: str  # a full disk on a load host (run/remote/preflight.py): which host, path and bytes needed
    disk_path: str
    disk_need_bytes: int


class CaseledgerError(Exception):
    """Base class: a business error with a message and the fix (the next call)."""

    exit_code = 2

    def __init__(self, message: str, fix: str = "", *, run_id: str | None = None, phase: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.run_id = run_id  # context: the run concerned, where known (not part of str())
        self.phase = phase  # context: the phase concerned, where known (not part of str())

    def __str__(self) -> str:
        return f"{self.message}; {self.fix}" if self.fix else self.message

    def shown(self) -> tuple[str, str]:
        """(message, fix) as they reach an agent or a terminal: each one line, escaped and capped, since a
        message may carry outside text (a path, a server's answer, an exception)."""
        return quoted(self.message, MESSAGE_CHARS), quoted(self.fix, MESSAGE_CHARS)


class NotWritable(CaseledgerError):
    """The filesystem refused a write: a read-only workspace (or host directory), or missing permissions."""


class LockTimeout(CaseledgerError):
    """A lock of the ledger stayed held past the bounded wait (a stuck holder): the lock file and pid named."""


class Unexpected(CaseledgerError):
    """A bug of ours: the answer still names the fix; the traceback goes to the log, not the agent."""

    exit_code = 1


_REFUSED_WRITE = (errno.EROFS, errno.EACCES, errno.EPERM)


def not_writable(e: BaseException) -> NotWritable | None:
    """NotWritable naming the path when `e` is the filesystem refusing a write, else None. The path named is the
    nearest one that exists: a temp or lock file that could not be created names its directory."""
    if (
        not isinstance(e, OSError)
        or e.errno not in _REFUSED_WRITE
        or not isinstance(e.filename, (str, bytes))
        or not e.filename
    ):
        return None
    path = Path(os.fsdecode(e.filename)).absolute()
    while not os.path.lexists(path) and path.parent != path:
        path = path.parent
    if e.errno != errno.EROFS and (os.access(path, os.W_OK) or not os.access(path, os.R_OK)):
        return None  # writable after all, or not even readable: a refused read, a signal, something else
    return NotWritable(
        f"not writable: {quoted(path, 200)} ({quoted(e.strerror or errno.errorcode[e.errno], 60)})",
        f"make {quoted(path, 200)} writable, or use --workspace on a writable copy of the workspace (cp -a)",
    )


def unexpected(e: BaseException) -> CaseledgerError:
    """What an exception that is no CaseledgerError answers: NotWritable when the filesystem refused a write
    (a read-only workspace is no bug), else Unexpected, a bug of ours that still names the fix."""
    refused = not_writable(e)
    if refused is not None:
        return refused
    return Unexpected(
        f"unexpected {type(e).__name__}: {quoted(e, OUTSIDE_CHARS)}",
        "this is a caseledger bug: rerun with CASELEDGER_DEBUG=1 for the traceback and report it",
    )


class CaseInvalid(CaseledgerError):
    """A case draft does not validate."""


class NotFound(CaseledgerError):
    """An id that names nothing in the ledger."""


class PathEscapes(CaseledgerError):
    """A path or id that would leave the workspace."""


class TargetHeld(CaseledgerError):
    """The target's lease is held by another live owner."""


class FenceRejected(CaseledgerError):
    """An append from an owner whose fence token is no longer current."""


class NotAuthorized(CaseledgerError):
    """The workspace's authorization mode forbids this action."""


class NothingToResume(CaseledgerError):
    """Resume was asked for a run that has nothing left to repair."""


class PhaseFailed(CaseledgerError):
    """A phase failed; carries its failure class (a str is converted: FailureClass(value))."""

    def __init__(
        self,
        message: str,
        failure_class: FailureClass | str,
        fix: str = "",
        *,
        run_id: str | None = None,
        phase: str | None = None,
        evidence: FailureEvidence | None = None,
    ) -> None:
        super().__init__(message, fix, run_id=run_id, phase=phase)
        self.failure_class = FailureClass(failure_class)
        self.evidence: FailureEvidence = (
            evidence or {}
        )  # recorded with the failed phase (e.g. service_problem: resume restarts it)


class EvidenceChanged(CaseledgerError):
    """Evidence on disk (raw records) no longer matches the sha256 recorded when it was sealed."""


class EvidenceInvalid(CaseledgerError):
    """A phase file (phases/<phase>.json) does not read as its phase's evidence model: edited since, or written by
    another version. The message names the file and each field that failed."""


class ResultConflict(CaseledgerError):
    """A result directory already holds a different result for the same version, parameters and inputs."""


class RemoteError(CaseledgerError):
    """An SSH connection or a remote command failed (a CaseledgerError: message names host, port, user; fix)."""


class AisbenchImportError(CaseledgerError, ValueError):
    """The directory is not a readable AISBench perf output (still a ValueError, as before the move)."""
