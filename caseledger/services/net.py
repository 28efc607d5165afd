"""caseledger's own small HTTP requests (health, /models, /metrics, version endpoints), one TLS context a process.

httpx2 builds a new TLS context for every client it makes, `httpx2.get` included, and loads the CA store into it:
~25 ms of CPU each time, also for an http:// URL that never uses it. A controller asks a service's health,
counters and version several times a run; here the context is made once (the same one httpx2 would make) and
handed to every client."""

from __future__ import annotations

import functools
import ssl
from collections.abc import Mapping
from typing import Any

import httpx2


@functools.cache
def tls() -> ssl.SSLContext:
    """The process's TLS context: httpx2's default one (its CA store, SSL_CERT_FILE honoured), made once."""
    return httpx2.create_ssl_context()


def get(url: str, *, timeout: float, headers: Mapping[str, str] | None = None) -> httpx2.Response:
    """GET url as `httpx2.get` would, on the process's TLS context."""
    return httpx2.get(url, timeout=timeout, headers=headers, verify=tls())


def client(**kw: Any) -> httpx2.Client:  # JSON: httpx2.Client's keyword arguments
    """A client as `httpx2.Client(**kw)` would make, on the process's TLS context."""
    return httpx2.Client(verify=tls(), **kw)
