"""The states a phase and a run can be in: light (no case model), so the event log reads them without the case."""

from __future__ import annotations

from enum import StrEnum


class PhaseState(StrEnum):
    PENDING = "pending"  # not started yet
    RUNNING = "running"  # started, no end, its owner is alive
    DONE = "done"  # ended with evidence
    REUSED = "reused"  # the parent's state was reused (the plan said so and it was verified)
    SKIPPED = "skipped"  # the case does not need it
    FAILED = "failed"  # ended in failure; failure_class says which
    UNKNOWN = "unknown"  # started, owner gone, no end evidence


class RunState(StrEnum):
    CREATED = "created"  # run dir written, controller not yet at work
    RUNNING = "running"  # a live controller (or the load client) is working
    SUCCEEDED = "succeeded"  # every phase done or reused; decision recorded
    PARTIAL = "partial"  # every phase done, but on a partial load (the client died): not a full measurement
    FAILED = "failed"  # stopped at a failed phase (failure_class)
    END_UNKNOWN = "end_unknown"  # owner lost while a phase was in flight; check evidence with resume
