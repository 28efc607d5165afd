"""Multi-turn conversations on a real llama-server: a later turn's cached tokens cover the earlier turns' history."""

from __future__ import annotations

import itertools

import orjson
import pytest

from caseledger.metrics import latest_result, parse_prometheus
from caseledger.tools import freeze_case, phase_status, reprocess_raw, start_run
from caseledger.workspace import Workspace, read_json
from tests.conftest import free_port
from tests.engine import llama_paths, llama_template

pytestmark = [pytest.mark.engine, pytest.mark.integration]

TIMEOUT = 600.0


def test_later_turns_on_llama_server_hit_the_history_the_server_counted(ws: Workspace, stop_services: None) -> None:
    server, model = llama_paths()
    port = free_port()
    d = llama_template("llamacpp-sessions.json", port, server, model)
    run = start_run(ws, freeze_case(ws, draft=d).case_id, wait=True, timeout_s=TIMEOUT)
    assert run.state == "succeeded", phase_status(ws, run.run_id).text()
    rd = ws.run(run.run_id)
    routes = read_json(rd.phase_file("route_verify"))["routes"]
    assert routes[0]["tokens"]["compared"] == "equal", routes  # turn 0 counted with the served tokenizer
    recs = sorted((orjson.loads(x) for x in rd.raw.read_bytes().splitlines()), key=lambda r: r["i"])
    assert len(recs) == 16 and all(r["ok"] for r in recs), [r["error"] for r in recs]
    # counted at the target: between the client's /metrics snapshots the server predicted N turns x 24 tokens (a
    # resent or extra turn would show here)
    before, after = (parse_prometheus(p.read_text()) for p in (rd.metrics_before, rd.metrics_after))
    assert after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"] == 16 * 24
    for s in range(4):
        turns = [r for r in recs if r["session"] == s]
        assert [r["turn"] for r in turns] == [0, 1, 2, 3]
        assert turns[0]["prompt_tokens"] == turns[0]["input_tokens_chat"]  # the first turn is planned exactly
        for prev, cur in itertools.pairwise(turns):
            print(s, cur["turn"], cur["prompt_tokens"], cur["planned_shared_tokens"], cur["cached_tokens"])
            assert cur["send_ns"] >= prev["end_ns"] + 100e6  # after the previous response and the think time
            assert prev["reply"] and prev["completion_tokens"] == 24
            assert cur["planned_shared_tokens"] == prev["prompt_tokens"] + prev["completion_tokens"]
            # the server's slot kept the conversation: the whole previous prompt is reused, and its reply nearly so
            assert cur["cached_tokens"] >= prev["prompt_tokens"], (prev, cur)
            assert cur["cached_tokens"] <= cur["planned_shared_tokens"] + 8 < cur["prompt_tokens"] + 8
    res = latest_result(rd.root)
    assert res is not None and res.sessions is not None
    ss = res.sessions
    print(ss.text)
    for t in ss.by_turn:
        print(
            t.turn,
            t.ttft_ms_p50,
            t.prompt_tokens_mean,
            t.planned_shared_tokens_mean,
            t.cached_tokens_mean,
            t.cached_over_planned,
        )
    assert (ss.sessions, ss.complete, ss.turns_recorded) == (4, 4, 16)
    assert all(t.cached_over_planned is not None and t.cached_over_planned >= 0.9 for t in ss.by_turn[1:]), ss.text
    snapshot = res.model_dump(mode="json")
    assert reprocess_raw(ws, run.run_id).requests == 16
    again = latest_result(rd.root)
    assert again is not None
    assert again.model_dump(mode="json")["sessions"] == snapshot["sessions"]
    assert again.model_dump(mode="json")["windows"] == snapshot["windows"]
