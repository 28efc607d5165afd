"""Shared fixtures: temporary workspaces, free ports, case drafts on the reference target."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest

from caseledger.workspace import Workspace


def tree_digest(root: Path) -> str:
    """Digest of every path and file content under root (lock and temp files included)."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode() + b"\0")
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    w = Workspace(tmp_path / "ws")
    (w.root / "cases").mkdir(parents=True)
    from caseledger.ledger import authorization

    authorization.set_mode(w, "auto")
    return w


def ref_draft(port: int, **over: Any) -> dict[str, Any]:
    """A small reference-target case: fast enough for tests, real processes and sockets."""
    d: dict[str, Any] = {
        "scenario": "ref-test",
        "target": {"endpoints": [{"base_url": f"http://127.0.0.1:{port}/v1", "model": "ref-model"}]},
        "service": {"adapter": "reference", "reference": {"prefill_tokens_per_s": 200000, "decode_step_s": 0.002,
                                                           "decode_step_per_seq_s": 0.0002, "slots": 8}},
        "dataset": {"source": "synthetic", "input_tokens": 64, "output_tokens": 8},
        "load": {"requests": 8, "concurrency": 2},
        "warmup": {"requests": 2, "concurrency": 2, "max_tokens": 2},
    }
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(d.get(k), dict):
            d[k] = {**d[k], **v}
        else:
            d[k] = v
    return d


def write_draft(ws: Workspace, name: str, draft: dict[str, Any]) -> Path:
    p = ws.cases_dir / name
    p.write_bytes(orjson.dumps(draft, option=orjson.OPT_INDENT_2))
    return p


@pytest.fixture
def stop_services(ws: Workspace) -> Iterator[None]:
    yield
    from caseledger import services

    services.stop_all(ws)


@pytest.fixture(scope="session", autouse=True)
def _host_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Target leases are host-wide; the suite keeps its own host directory (shared by every workspace and
    child process of the session, as on a real host), so a rerun never meets a previous run's leases."""
    old = os.environ.get("CASELEDGER_HOST_DIR")
    os.environ["CASELEDGER_HOST_DIR"] = str(tmp_path_factory.mktemp("host"))
    yield
    if old is None:
        os.environ.pop("CASELEDGER_HOST_DIR", None)
    else:
        os.environ["CASELEDGER_HOST_DIR"] = old


@pytest.fixture(autouse=True)
def _no_fault_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CASELEDGER_FAULT", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@dataclass
class Served:
    """A reference target started as a real subprocess on loopback."""

    proc: subprocess.Popen[bytes]
    url: str
    config: dict[str, Any]
    stdout: Path
    stderr: Path

    @property
    def base(self) -> str:
        return self.url

    def client(self, timeout: float = 10.0) -> httpx2.Client:
        return httpx2.Client(base_url=self.url, timeout=timeout)


@contextmanager
def reference_targets(configs: dict[str, dict[str, Any]], log_dir: Path,
                      model: str = "ref-model") -> Iterator[dict[str, Served]]:
    """Start every configuration at once (start-up is mostly imports), wait for each, stop all at the end."""
    out: dict[str, Served] = {}
    log_dir.mkdir(parents=True, exist_ok=True)
    for name, cfg in configs.items():
        port = free_port()
        so, se = log_dir / f"{name}.out", log_dir / f"{name}.err"
        with so.open("wb") as fo, se.open("wb") as fe:
            proc = subprocess.Popen(
                [sys.executable, "-m", "caseledger.target", "serve", "--host", "127.0.0.1", "--port", str(port),
                 "--model", model, "--config-json", json.dumps(cfg)],
                stdout=fo, stderr=fe, stdin=subprocess.DEVNULL)
        out[name] = Served(proc, f"http://127.0.0.1:{port}", cfg, so, se)
    try:
        for name, s in out.items():
            deadline = time.monotonic() + 30
            while True:
                assert s.proc.poll() is None, f"reference target {name} exited: {s.stderr.read_text()[-500:]}"
                try:
                    if httpx2.get(s.url + "/health", timeout=1).status_code == 200:
                        break
                except httpx2.TransportError:
                    pass
                assert time.monotonic() < deadline, f"reference target {name} never became healthy"
                time.sleep(0.05)
        yield out
    finally:
        for s in out.values():
            if s.proc.poll() is None:
                s.proc.terminate()
                try:
                    s.proc.wait(5)
                except subprocess.TimeoutExpired:
                    s.proc.kill()
                    s.proc.wait()
