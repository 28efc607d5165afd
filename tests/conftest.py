"""Shared fixtures: temporary workspaces, free ports, case drafts on the reference target."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from caseledger.workspace import Workspace


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    w = Workspace(tmp_path / "ws")
    (w.root / "cases").mkdir(parents=True)
    from caseledger import authorization

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


@pytest.fixture(autouse=True)
def _no_fault_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CASELEDGER_FAULT", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
