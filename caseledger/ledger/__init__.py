"""The run ledger: event logs (events), one owner per target (leases) and which workspace keeps a service on it
(keepers), runs and their folded state (runs, state), the queue of prepared cases and the authorization mode.
Readers never write run state."""

from caseledger.ledger.events import EventLog, append_event, read_events
from caseledger.ledger.leases import (
    HEARTBEAT_SECONDS,
    LEASE_SECONDS,
    Lease,
    acquire,
    current_fence,
    read_lease,
    release,
    renew,
    target_key,
)

__all__ = [
    "HEARTBEAT_SECONDS",
    "LEASE_SECONDS",
    "EventLog",
    "Lease",
    "acquire",
    "append_event",
    "current_fence",
    "read_events",
    "read_lease",
    "release",
    "renew",
    "target_key",
]
