"""Multi-turn conversations (dataset.sessions) on the reference target: declared, sent turn by turn with the
server's replies as history, cached beside the planned history, recomputed by reprocess, never re-sent."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from caseledger import datasets
from caseledger.errors import CaseledgerError
from caseledger.metrics import latest_result
from caseledger.tools import freeze_case, phase_status, reprocess_raw, resume, start_run
from caseledger.workspace import Workspace
from tests.conftest import free_port, start_with_fault, stats

CASES = Path(__file__).resolve().parent.parent / "cases"


def sessions_draft(port: int, **over: Any) -> dict[str, Any]:
    d: dict[str, Any] = orjson.loads((CASES / "ref-sessions.json").read_bytes())
    d["target"]["endpoints"][0]["base_url"] = f"http://127.0.0.1:{port}/v1"
    d["warmup"] = {"requests": 2, "concurrency": 2, "max_tokens": 2}
    for k, v in over.items():
        d[k] = {**d[k], **v}
    return d


def raw(ws: Workspace, run_id: str) -> list[dict[str, Any]]:
    recs = [orjson.loads(x) for x in ws.run(run_id).raw.read_bytes().splitlines()]
    return sorted(recs, key=lambda r: r["i"])


def test_entries_are_numbered_turns_and_a_drawn_turn_count_is_part_of_the_dataset(ws: Workspace) -> None:
    frozen = freeze_case(ws, draft=sessions_draft(free_port()))
    entries = datasets.load_entries(ws, frozen.dataset_id)
    ident = datasets.load_identity(ws, frozen.dataset_id)
    assert [(e["session"], e["turn"], e["turns"]) for e in entries] == [(s, k, 4) for s in range(6) for k in range(4)]
    assert [e["think_s"] for e in entries] == [0.0 if e["turn"] == 0 else 0.05 for e in entries]
    assert ident.sessions is not None and (ident.sessions.count, ident.sessions.turns) == (6, 24)
    assert {e["body_tokens"] for e in entries} == {48}
    # turns drawn per conversation: seeded, the draw fixes N, another seed another dataset
    drawn = sessions_draft(
        free_port(), dataset={"sessions": {"count": 5, "turns": {"distribution": "uniform", "min": 1, "max": 4}}}
    )
    with pytest.raises(CaseledgerError) as e:
        freeze_case(ws, draft=drawn)
    want = int(str(e.value.fix).split("set load.requests to ")[1].split(" ")[0])
    drawn["load"]["requests"] = want
    a = freeze_case(ws, draft=drawn)
    turns = [e["turns"] for e in datasets.load_entries(ws, a.dataset_id) if e["turn"] == 0]
    assert sum(turns) == want and len(turns) == 5 and a.dataset_id != frozen.dataset_id
    assert freeze_case(ws, draft=drawn).dataset_id == a.dataset_id


@pytest.mark.parametrize(
    ("change", "field", "fix"),
    [
        ({"load": {"requests": 20}}, "6 conversations x 4 turns = 24", "set load.requests to 24"),
        ({"load": {"rate": 5.0}}, "load.rate must be null", "set load.rate null"),
        ({"target": {"api": "completions"}}, "needs target.api 'chat'", "set target.api 'chat'"),
        ({"dataset": {"source": "prefix_cache", "prefix_ratio": 0.5}}, "needs source 'synthetic'", "set source"),
        ({"dataset": {"entries": 30}}, "dataset.entries (30) must be null", "remove dataset.entries"),
        ({"dataset": {"sessions": {"count": 6, "turns": 0}}}, "turns", "greater than or equal to 1"),
        (
            {"dataset": {"sessions": {"count": 6, "turns": 4, "think_time_ms": -1}}},
            "think_time_ms",
            "greater than or equal to 0",
        ),
        (
            {"dataset": {"sessions": {"count": 6, "turns": {"distribution": "uniform", "min": 2, "max": 5000}}}},
            "dataset.sessions.turns: max 5000",
            "at most 1024",
        ),
        ({"dataset": {"sessions": {"turns": 4}}}, "dataset.sessions.count: required field is missing", "fix"),
    ],
)
def test_bad_session_declarations_are_refused_naming_the_field_and_the_fix(
    ws: Workspace, change: dict[str, Any], field: str, fix: str
) -> None:
    d = sessions_draft(free_port(), **change)
    with pytest.raises(CaseledgerError) as e:
        freeze_case(ws, draft=d)
    text = str(e.value) + " " + getattr(e.value, "fix", "")
    assert field in text and fix in text, text
    assert not ws.datasets_dir.exists() or not any(ws.datasets_dir.iterdir())
    assert not ws.frozen_dir.exists() or not any(ws.frozen_dir.glob("c-*.json"))


def test_preflight_refuses_a_conversation_that_outgrows_the_context(ws: Workspace, stop_services: None) -> None:
    # turn 3 carries three messages and replies: 4 x (48 + template) + 3 x 16 replies > 300 tokens
    d = sessions_draft(free_port(), target={"context_tokens": 300})
    run = start_run(ws, freeze_case(ws, draft=d).case_id, wait=True, timeout_s=120)
    st = phase_status(ws, run.run_id)
    assert st.state == "failed" and st.failure_class == "before_model", st.text()
    assert "context of 300 tokens" in (st.blocker or "") and "turn 3, with its history" in (st.blocker or "")


@pytest.mark.integration
def test_conversations_carry_the_servers_replies_and_later_turns_hit_the_history(
    ws: Workspace, stop_services: None
) -> None:
    port = free_port()
    run = start_run(ws, freeze_case(ws, draft=sessions_draft(port)).case_id, wait=True, timeout_s=300)
    assert run.state == "succeeded", phase_status(ws, run.run_id).text()
    assert stats(port)["by_phase"].get("load") == 24  # formal requests counted at the target: N, the total of turns
    recs = raw(ws, run.run_id)
    assert len(recs) == 24 and all(r["ok"] for r in recs), [r["error"] for r in recs]
    for s in range(6):
        turns = [r for r in recs if r["session"] == s]
        assert [r["turn"] for r in turns] == [0, 1, 2, 3] and {r["turns"] for r in turns} == {4}
        for prev, cur in itertools.pairwise(turns):
            # sent after the previous turn's response ended and its think time (50 ms) passed
            assert cur["send_ns"] - prev["end_ns"] >= 50e6, (prev, cur)
            # the history is the previous prompt and the reply the server streamed (16 tokens, every word one token)
            assert prev["reply"] and len(prev["reply"].split()) == prev["completion_tokens"] == 16
            assert cur["prompt_tokens"] > prev["prompt_tokens"] + prev["completion_tokens"] + cur["input_tokens_body"]
            assert cur["planned_shared_tokens"] == prev["prompt_tokens"] + prev["completion_tokens"]
            # the reference target caches prompt blocks (16 tokens): the whole previous prompt, down to a block
            assert prev["prompt_tokens"] - 15 <= cur["cached_tokens"] <= cur["planned_shared_tokens"], (prev, cur)
        assert "planned_shared_tokens" not in turns[0] and turns[0]["cached_tokens"] == 0
    res = latest_result(ws.run(run.run_id).root)
    assert res is not None and res.sessions is not None
    ss = res.sessions
    assert (ss.sessions, ss.complete, ss.incomplete, ss.turns_recorded) == (6, 6, 0, 24)
    assert [t.turn for t in ss.by_turn] == [0, 1, 2, 3] and all(t.ok == 6 for t in ss.by_turn)
    assert ss.by_turn[0].planned_shared_tokens_mean is None
    assert all(t.cached_over_planned is not None and 0.5 < t.cached_over_planned <= 1 for t in ss.by_turn[1:])
    assert all(p.turns_ok == 4 and p.complete and p.duration_s > 0.15 for p in ss.per_session)
    before = res.model_dump(mode="json")
    served = stats(port)["requests_total"]
    assert reprocess_raw(ws, run.run_id).requests == 24 and stats(port)["requests_total"] == served
    again = latest_result(ws.run(run.run_id).root)
    assert again is not None
    after = again.model_dump(mode="json")
    assert after["sessions"] == before["sessions"] and after["windows"] == before["windows"]
    report = ws.run(run.run_id).report_md.read_text()
    assert "## Conversations" in report and "| 3 | 6 / 6 |" in report


@pytest.mark.processes
@pytest.mark.integration
def test_a_killed_load_never_continues_a_conversation_and_the_result_says_which_are_cut(
    ws: Workspace, stop_services: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    # slower decode: turns are in flight when the client dies after its 6th record
    d = sessions_draft(port, service={"reference": {"decode_step_s": 0.01, "block_size": 16}})
    r = start_with_fault(monkeypatch, "load:exit_after=6", ws, freeze_case(ws, draft=d).case_id, wait=True)
    assert r.run_id is not None
    deadline = time.monotonic() + 90
    while (s := phase_status(ws, r.run_id)).state in ("running", "created") or s.owner_alive:
        assert time.monotonic() < deadline, s.text()
        time.sleep(0.2)
    assert s.failure_class == "end_unknown" and not s.next_resends_requests, s.text()
    served = stats(port)["by_phase"].get("load", 0)
    assert served == s.sent and len(raw(ws, r.run_id)) == 6
    res = resume(ws, r.run_id, wait=True)
    s2 = phase_status(ws, r.run_id)
    assert res.state == "partial" and stats(port)["by_phase"].get("load", 0) == served == s2.sent, s2.text()
    out = latest_result(ws.run(r.run_id).root)
    assert out is not None and out.sessions is not None
    ss = out.sessions
    assert ss.turns_recorded == 6 and ss.incomplete >= 1 and ss.complete + ss.incomplete == ss.sessions
    assert all(p.turns_recorded < p.turns_planned for p in ss.per_session if not p.complete)
