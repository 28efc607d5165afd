"""Adapter 'reference': the embedded reference target (`python -m caseledger.target serve`), started detached
with the case's performance model as JSON."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import ClassVar

from caseledger import procs
from caseledger.case.model import Case
from caseledger.case.service import KIND_TRAITS
from caseledger.case.target import Endpoint
from caseledger.services.adapter import AdapterKind, host_port
from caseledger.workspace import canonical_json


class Reference:
    kind: ClassVar[AdapterKind] = "reference"
    launched: ClassVar[bool] = KIND_TRAITS[kind].launched

    def argv(self, case: Case, unit_argv: Sequence[str], route: Endpoint | None) -> list[str]:
        host, port = host_port(case.target.endpoints[0].base_url)
        cfg = canonical_json(case.service.reference.model_dump(mode="json")).decode()
        return [
            sys.executable,
            "-m",
            "caseledger.target",
            "serve",
            "--host",
            host,
            "--port",
            str(port),
            "--model",
            case.target.endpoints[0].model,
            "--config-json",
            cfg,
        ]

    def identity_argv(self, argv: list[str]) -> list[str]:
        """Without the interpreter's path: the same target under another Python is the same service."""
        return argv[1:]

    def child_env(self) -> dict[str, str]:
        """PYTHONPATH at this package, so `python -m caseledger.target` imports this checkout (caseledger's own
        code, not the caller's setting)."""
        return {"PYTHONPATH": procs.PKG_PARENT}

    def reads_model_files(self, remote: bool) -> bool:
        return False
