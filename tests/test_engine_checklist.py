"""The seeds' checklist in one summarize call, on a real llama-server with self-draft speculative decoding and a
90% shared prefix: distributions, both windows with counts and durations, AL with its formula, the strict
acceptance rate, the cache hit range with its denominator, the requests below the declared ratio, and ITL per
engine step beside ITL per chunk."""

from __future__ import annotations

from pathlib import Path

import pytest

from caseledger import services
from caseledger.ledger import authorization
from caseledger.tools import freeze_case, phase_status, start_run, summarize
from caseledger.workspace import Workspace
from tests.conftest import free_port
from tests.engine import llama_paths, llama_spec_draft

pytestmark = [pytest.mark.engine, pytest.mark.integration]


def test_one_summarize_answers_the_checklist_of_a_speculative_prefix_run(tmp_path: Path) -> None:
    server, model = llama_paths()
    ws = Workspace(tmp_path / "ws")
    (ws.root / "cases").mkdir(parents=True)
    authorization.set_mode(ws, "auto")
    draft = llama_spec_draft(
        free_port(),
        server,
        model,
        scenario="llamacpp-checklist",
        dataset={
            "source": "prefix_cache",
            "input_tokens": 320,
            "output_tokens": 16,
            "prefix_ratio": 0.9,
            "block_size": 16,
            "prefix_groups": 1,
        },
        load={"requests": 6, "concurrency": 1},  # one slot keeps the prefix: every request may hit it
        warmup={"requests": 1, "concurrency": 1},
        cache={"min_hit_ratio": 0.8, "check_requests": 2},
    )
    try:
        run = start_run(ws, freeze_case(ws, draft=draft).case_id, wait=True, timeout_s=600)
        assert run.state == "succeeded", phase_status(ws, run.run_id).text()
        text = summarize(ws, [run.run_id or ""]).text()
    finally:
        services.stop_all(ws)
    print(text)  # the answer, for the issue note (pytest -s)
    assert "whole (whole): 6 of 6 ok in " in text and "native (" in text, text  # both windows, counts, durations
    for d in ("TTFT p50/p99", "TPOT p50/p99", "E2E p50/p99", "ITL p50/p99"):  # the distributions
        assert d in text, (d, text)
    assert "AL " in text and " = " in text and ("(per-request counts)" in text or "(counters)" in text), text
    assert "strict acceptance " in text and " accepted / " in text and " drafted" in text, text
    assert "cache hit ratio " in text and "of chat-template prompt tokens" in text, text  # range, denominator
    assert " below 0.8)" in text, text  # the requests below the declared ratio
    # a verify step streams its accepted tokens together: ITL per step sits beside ITL per chunk
    assert "ITL per step p50/p99 " in text and " chunk gaps < 1 ms merged)" in text, text
