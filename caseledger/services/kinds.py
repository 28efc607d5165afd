"""The adapter registry: service kind (case.service.adapter) to its adapter. The only place a kind is looked
up by name; a test checks every kind the case model allows is registered."""

from __future__ import annotations

from collections.abc import Mapping

from caseledger.case.model import Case
from caseledger.services.adapter import Adapter, AdapterKind
from caseledger.services.command import Command
from caseledger.services.external import External
from caseledger.services.reference import Reference

ADAPTERS: Mapping[AdapterKind, Adapter] = {a.kind: a for a in (Reference(), External(), Command())}


def adapter_of(case: Case) -> Adapter:
    """The adapter of the case's service kind."""
    return ADAPTERS[case.service.adapter]
