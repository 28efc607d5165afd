"""The adapter protocol: what differs between service kinds (reference, external, command) before anything
runs. Each kind is one module (services.reference, services.external, services.command) and the registry
(services.kinds) is the only place a kind is looked up by its name; everything else asks the adapter."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Protocol
from urllib.parse import urlsplit

from caseledger.case.model import Case
from caseledger.case.service import AdapterKind
from caseledger.case.target import Endpoint

__all__ = ["Adapter", "AdapterKind", "host_port"]


def host_port(base_url: str) -> tuple[str, int]:
    """Host and port of an endpoint's base URL (the scheme's default port when none is written)."""
    u = urlsplit(base_url)
    return u.hostname or "127.0.0.1", u.port or (443 if u.scheme == "https" else 80)


class Adapter(Protocol):
    """One service kind. `launched`: caseledger starts, records, verifies and stops its processes (an external
    endpoint is only probed), read from the kind's traits (case.service.KIND_TRAITS) as the case layer reads it."""

    kind: ClassVar[AdapterKind]
    launched: ClassVar[bool]

    def argv(self, case: Case, unit_argv: Sequence[str], route: Endpoint | None) -> list[str]:
        """The argv a process of this kind is started with (empty when caseledger starts nothing)."""
        ...

    def identity_argv(self, argv: list[str]) -> list[str]:
        """The part of the argv that defines the service's identity."""
        ...

    def child_env(self) -> dict[str, str]:
        """Variables this kind adds to the child's minimal environment (below the case's own)."""
        ...

    def reads_model_files(self, remote: bool) -> bool:
        """Whether the model files named in the argv are hashed into the identity (they must be readable here)."""
        ...
