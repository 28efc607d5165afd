"""caseledger's own small HTTP requests share one TLS context a process (caseledger/services/net.py)."""

from __future__ import annotations

import re
import ssl
from pathlib import Path

from caseledger.services import net

PACKAGE = Path(__file__).resolve().parent.parent / "caseledger"
HOOKS = {"run/preflight.py"}  # its fault hook sends a request as any client would, to prove the guard stops it


def test_one_tls_context_a_process_and_it_still_verifies() -> None:
    """Made once (httpx2 would build and load a new one for every client, ~25 ms of CPU each), and the one
    httpx2 would make: certificates and host names checked."""
    ctx = net.tls()
    assert net.tls() is ctx
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert ctx.cert_store_stats()["x509_ca"] > 0  # a CA store loaded, as httpx2's default


def test_no_module_makes_its_own_httpx_client_for_a_small_request() -> None:
    """Every one-off GET and sync client of the package goes through caseledger.services.net (the load client's one
    long-lived AsyncClient per process is its own)."""
    call = re.compile(r"\bhttpx2?\.(get|post|request|stream|Client)\(")
    found = [
        f"{p.relative_to(PACKAGE)}:{k}: {line.strip()}"
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.relative_to(PACKAGE).as_posix() != "services/net.py" and p.relative_to(PACKAGE).as_posix() not in HOOKS
        for k, line in enumerate(p.read_text().splitlines(), 1)
        if call.search(line)
    ]
    assert found == [], found
