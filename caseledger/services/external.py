"""Adapter 'external': an already-running endpoint; probed (/models, identity_command), never started, verified
as a process or stopped. On this host its process is found by the socket listening on the endpoint's port, so
its CPU counts as the service's, not as another process's."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Sequence
from typing import ClassVar
from urllib.parse import urlsplit

from caseledger import procs, redact
from caseledger.case.model import Case
from caseledger.case.service import KIND_TRAITS
from caseledger.case.target import Endpoint
from caseledger.ledger.evidence import Listener
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


def listeners(case: Case) -> tuple[list[Listener], str | None]:
    """The processes on this host that serve the case's endpoints (each found by the listening socket on its
    port), or why none is named: an endpoint on another host (its CPU is NOT_OBSERVED here), no listener seen,
    or one whose process is not ours to read (another user's)."""
    found: dict[tuple[int, int], Listener] = {}
    notes: list[str] = []
    for ep in case.target.endpoints:
        u = urlsplit(ep.base_url)
        host, port = u.hostname or "", u.port or (443 if u.scheme == "https" else 80)
        if not on_this_host(host):
            notes.append(f"{host} is not this host: the service's CPU is NOT_OBSERVED")
            continue
        pids, seen = procs.listening_pids(port)
        for pid in sorted(pids):
            start, argv = procs.start_time(pid), procs.cmdline(pid)
            if start is not None and argv is not None:
                cmd = redact.current().mask(procs.program(argv))
                found.setdefault((pid, start), Listener(pid=pid, start_time=start, command=cmd, port=port))
        if not pids:
            notes.append(
                f"a process listens on :{port} but is not readable here (another user's): its CPU counts as "
                "other processes'"
                if seen
                else f"no process on this host was found listening on :{port}"
            )
    return list(found.values()), "; ".join(dict.fromkeys(notes)) or None


def on_this_host(host: str) -> bool:
    """Whether a URL's host names this machine: a loopback address, or one this host can bind (its own)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)
    except OSError:
        return False
    for family, _, _, _, addr in infos:
        ip = ipaddress.ip_address(str(addr[0]).split("%", 1)[0])
        if ip.is_loopback:
            return True
        with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((str(addr[0]), 0))
            return True
    return False
