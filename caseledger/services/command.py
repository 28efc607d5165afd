"""Adapter 'command': an argv from the case, started locally or, with service.ssh, on another host over SSH;
{host}, {port}, {model} and the speculative placeholders are filled from the process's first route."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from caseledger.case.model import Case
from caseledger.case.service import KIND_TRAITS
from caseledger.case.target import Endpoint
from caseledger.services.adapter import AdapterKind, host_port


class Command:
    kind: ClassVar[AdapterKind] = "command"
    launched: ClassVar[bool] = KIND_TRAITS[kind].launched

    def argv(self, case: Case, unit_argv: Sequence[str], route: Endpoint | None) -> list[str]:
        fill: dict[str, str] = {}
        if route is not None:
            host, port = host_port(route.base_url)
            fill = {"{host}": host, "{port}": str(port), "{model}": route.model}
        spec = case.service.speculative
        if spec is not None:  # {draft_model}, {spec_type}, {draft_max}: the case validates each is set where used
            fill.update({"{" + k + "}": str(v) for k, v in spec.model_dump().items() if v is not None})
        out = []
        for arg in unit_argv:
            filled = arg
            for k, v in fill.items():
                filled = filled.replace(k, v)
            out.append(filled)
        return out

    def identity_argv(self, argv: list[str]) -> list[str]:
        return argv

    def child_env(self) -> dict[str, str]:
        return {}

    def reads_model_files(self, remote: bool) -> bool:
        """Local model files only: a remote process's files are not read from here."""
        return not remote
