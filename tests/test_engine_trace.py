"""The sample trace replayed on a real llama-server: on schedule, cached tokens beside the trace's shared blocks."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from caseledger.metrics import Distribution, latest_result
from caseledger.tools import freeze_case, phase_status, reprocess_raw, start_run
from caseledger.workspace import Workspace, read_json
from tests.conftest import free_port
from tests.engine import llama_paths, llama_template

pytestmark = [pytest.mark.engine, pytest.mark.integration]

TIMEOUT = 600.0
TRACE = "cases/trace-sample.jsonl"


def test_sample_trace_replays_on_llama_server_on_schedule_with_cached_beside_planned(
    ws: Workspace, stop_services: None
) -> None:
    server, model = llama_paths()
    (ws.root / TRACE).write_bytes((Path(__file__).resolve().parent.parent / TRACE).read_bytes())
    d = llama_template("llamacpp-trace.json", free_port(), server, model)
    run = start_run(ws, freeze_case(ws, draft=d).case_id, wait=True, timeout_s=TIMEOUT)
    assert run.state == "succeeded", phase_status(ws, run.run_id).text()
    rd = ws.run(run.run_id)
    routes = read_json(rd.phase_file("route_verify"))["routes"]
    assert routes[0]["tokens"]["compared"] == "equal", routes
    recs = sorted((orjson.loads(x) for x in rd.raw.read_bytes().splitlines()), key=lambda r: r["i"])
    assert len(recs) == 24 and all(r["ok"] for r in recs), [r["error"] for r in recs]
    assert [r["trace_row"] for r in recs] == list(range(24))
    assert [r["prompt_tokens"] for r in recs] == [r["input_tokens_chat"] for r in recs]  # the served tokenizer
    rows = [orjson.loads(x) for x in (ws.root / TRACE).read_bytes().splitlines()]
    assert [r["completion_tokens"] for r in recs] == [x["output_length"] for x in rows]
    res = latest_result(rd.root)
    assert res is not None and res.schedule is not None and res.trace is not None
    err = res.schedule.arrival_error
    assert isinstance(err, Distribution) and res.schedule.requests == 24
    print(res.schedule.text)
    # ms, client side, against the trace's schedule: never early, on time as a rule (p99 over repeated replays:
    # bench/bench_trace.py)
    assert err.min >= 0 and err.p50 < 1.0, res.schedule.text
    tr = res.trace
    print(tr.text)
    for r in tr.per_request:
        print(r.i, r.trace_row, r.planned_shared_tokens, r.cached_tokens, r.prompt_tokens)
    assert tr.with_cached_tokens == 24
    for r in tr.per_request:
        assert r.cached_tokens is not None and r.prompt_tokens is not None and r.cached_tokens < r.prompt_tokens
    # what the trace shares is what the server reuses: most of the planned shared tokens come back cached
    assert tr.cached_tokens >= 0.5 * tr.planned_shared_tokens, tr.text
    before = res.model_dump(mode="json")
    assert reprocess_raw(ws, run.run_id).requests == 24
    again = latest_result(rd.root)
    assert again is not None
    after = again.model_dump(mode="json")
    assert (after["schedule"], after["trace"], after["windows"]) == (
        before["schedule"],
        before["trace"],
        before["windows"],
    )
