"""Errors of caseledger. Every error names what went wrong, where, and the fix.

    CaseledgerError                 base; .fix says what to do next
    ├── CaseInvalid                 a draft or frozen case fails validation (field paths named)
    ├── NotFound                    unknown case id, run id, dataset id
    ├── PathEscapes                 a path that leaves the workspace, an id with '/' or '..'
    ├── TargetHeld                  a second owner for a busy target (holder run id, pid, expiry)
    ├── FenceRejected               an append carrying a fence token older than the target's
    ├── NotAuthorized               authorization mode forbids the action
    ├── NothingToResume             the run has no phase left to repair
    └── PhaseFailed                 a phase ended in failure (class, phase, short error)
"""

from __future__ import annotations


class CaseledgerError(Exception):
    """Base class: a business error with a message and the fix (the next call)."""

    exit_code = 2

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.message}; {self.fix}" if self.fix else self.message


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
    """A phase failed; carries its failure class."""

    def __init__(self, message: str, failure_class: str, fix: str = "") -> None:
        super().__init__(message, fix)
        self.failure_class = failure_class
