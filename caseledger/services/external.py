"""Adapter 'external': an already-running endpoint; probed (/models, identity_command), never started, verified
as a process or stopped."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from caseledger.case.model import Case
from caseledger.case.service import KIND_TRAITS
from caseledger.case.target import Endpoint
from caseledger.services.adapter import AdapterKind


class External:
    kind: ClassVar[AdapterKind] = "external"
    launched: ClassVar[bool] = KIND_TRAITS[kind].launched

    def argv(self, case: Case, unit_argv: Sequence[str], route: Endpoint | None) -> list[str]:
        return []

    def identity_argv(self, argv: list[str]) -> list[str]:
        return argv

    def child_env(self) -> dict[str, str]:
        return {}

    def reads_model_files(self, remote: bool) -> bool:
        return False
