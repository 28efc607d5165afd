"""Runs against a real llama.cpp llama-server (Gemma 3 270M) that caseledger starts with the command adapter.

One workspace and one server for the module: every case here launches the same argv on the same port, so
the service identity is equal and later runs reuse the live server (as a real session would). Each test
still stands alone: whichever runs first starts the server. Keep the load SMALL (2 CPU cores, prefill
~250 tok/s, decode ~35 tok/s): a handful of ~100-token prompts and 8 output tokens per request.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import httpx2
import orjson
import pytest

from caseledger import services
from caseledger.case.phases import PHASES
from caseledger.ledger import authorization
from caseledger.ledger.state import fold
from caseledger.metrics import NotObserved, Ratio, latest_result
from caseledger.metrics._spec import NO_COUNTS, WHOLE_ONLY, WHOLE_ONLY_NO_COUNTS
from caseledger.outcome.report import render_side_by_side
from caseledger.tools import freeze_case, phase_status, reprocess_raw, start_run
from caseledger.workspace import Workspace, read_json
from tests.conftest import free_port
from tests.engine import MODEL_ALIAS, counters, llama_draft, llama_paths, llama_spec_draft, llama_template, work

pytestmark = [pytest.mark.engine, pytest.mark.integration]

TIMEOUT = 420.0  # per run; a few seconds on an idle machine, minutes when the 2 cores are shared


class Llama:
    """The module's workspace, port and binaries."""

    def __init__(self, ws: Workspace, port: int, server: str, model: str) -> None:
        self.ws, self.port, self.server, self.model = ws, port, server, model

    def draft(self, **over: Any) -> dict[str, Any]:
        return llama_draft(self.port, self.server, self.model, **over)

    def spec_draft(self, draft_max: int = 4, **over: Any) -> dict[str, Any]:
        return llama_spec_draft(self.port, self.server, self.model, draft_max, **over)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Llama]:
    server, model = llama_paths()
    ws = Workspace(tmp_path_factory.mktemp("engine") / "ws")
    (ws.root / "cases").mkdir(parents=True)
    authorization.set_mode(ws, "auto")
    try:
        yield Llama(ws, free_port(), server, model)
    finally:
        services.stop_all(ws)


def records(ws: Workspace, run_id: str) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in ws.run(run_id).raw.read_bytes().splitlines()]


def service_evidence(ws: Workspace, run_id: str) -> dict[str, Any]:
    return dict(read_json(ws.run(run_id).phase_file("service")))


def test_full_run_then_hot_child_reuses_the_live_llama_server(llama: Llama) -> None:
    ws = llama.ws
    base = freeze_case(ws, draft=llama.draft())
    r1 = start_run(ws, base.case_id, wait=True, timeout_s=TIMEOUT)
    assert r1.state == "succeeded", phase_status(ws, r1.run_id).text()
    v1 = fold(ws, r1.run_id)
    assert all(v1.phases[p].state.value in ("done", "reused", "skipped") for p in PHASES), v1.phases
    assert v1.phases["route_verify"].state.value == "done"

    # intended == effective: the argv read back from /proc is the case's, with {host}/{port} filled in
    ev1 = service_evidence(ws, r1.run_id)
    assert ev1["effective_argv"] == ev1["intended_argv"]
    assert ev1["effective_argv"][0] == llama.server and str(llama.port) in ev1["effective_argv"]
    assert ev1["verified_by"] == "live process cmdline + health"
    routes = read_json(ws.run(r1.run_id).phase_file("route_verify"))["routes"]
    assert MODEL_ALIAS in routes[0]["models"] and routes[0]["ok"]

    # the server accepted ignore_eos and stream_options (exactly max_tokens out, usage on every request)
    recs = records(ws, r1.run_id)
    assert len(recs) == 4 and all(r["ok"] for r in recs), [r["error"] for r in recs]
    assert {r["completion_tokens"] for r in recs} == {8}
    assert all(r["prompt_tokens"] and r["cached_tokens"] is not None for r in recs)
    assert all(len(r["chunk_ns"]) >= 2 and r["finish_reason"] == "length" for r in recs)
    # the GGUF's own tokenizer + the server's template: our counts are the server's, on every request
    assert [r["prompt_tokens"] for r in recs] == [r["input_tokens_chat"] for r in recs]
    result = latest_result(ws.run(r1.run_id).root)
    assert result is not None
    whole = result.windows.whole
    # a real engine's usage passes every count check (one token per content chunk), and its own counter of
    # generated tokens moved by exactly the per-request sum
    assert result.checks is not None and result.checks.invalid == 0 and result.checks.checked == 4, result.checks
    gen = [c for c in result.checks.counters if c.counter == "llamacpp:tokens_predicted_total"]
    assert gen and gen[0].per_request_sum == 32, result.checks.counters
    assert whole.ok == 4 and whole.throughput.output.numerator == 32  # type: ignore[union-attr]
    assert whole.latency.ttft.p50 > 0 and whole.latency.tpot.p50 > 0  # type: ignore[union-attr]
    # llama.cpp's spec counters are there (and stay 0 without a draft model): AL is NOT_OBSERVED, with why
    assert whole.spec_decode.source == "llamacpp"
    assert whole.spec_decode.acceptance_length.value == "NOT_OBSERVED"  # type: ignore[union-attr]
    assert "is 0 during the load" in whole.spec_decode.acceptance_length.reason  # type: ignore[union-attr]
    # no draft model: llama.cpp's timings carry no draft counts, so the per-request figures say why too
    assert all(r["spec_draft_tokens"] is None and r["spec_steps"] is None for r in recs)
    for w in (whole, result.windows.native):
        per = w.spec_decode.per_request.acceptance_length
        assert isinstance(per, NotObserved) and per.reason == NO_COUNTS, per
    native_al = result.windows.native.spec_decode.acceptance_length
    assert isinstance(native_al, NotObserved) and native_al.reason == WHOLE_ONLY_NO_COUNTS

    # hot child: only the concurrency changes
    before = work(llama.port)
    child = freeze_case(ws, draft=llama.draft(load={"requests": 4, "concurrency": 4}), parent=base.case_id)
    assert [d.path for d in child.delta] == ["load.concurrency"]
    r2 = start_run(ws, child.case_id, wait=True, timeout_s=TIMEOUT)
    assert r2.state == "succeeded", phase_status(ws, r2.run_id).text()
    v2 = fold(ws, r2.run_id)
    assert {p: v2.phases[p].state.value for p in ("service", "warmup", "route_verify")} == {
        "service": "reused",
        "warmup": "reused",
        "route_verify": "reused",
    }
    ev2 = service_evidence(ws, r2.run_id)
    assert ev2["outcome"] == "reused" and ev2["pid"] == ev1["pid"]  # the same process: not restarted
    assert ev2["starts"] == ev1["starts"] and ev2["effective_argv"] == ev1["effective_argv"]
    after = work(llama.port)
    # only the 4 formal requests did model work: 4 x 8 tokens (warmup would add 2 x 2, route_verify 1)
    assert after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"] == 32
    assert len(records(ws, r2.run_id)) == 4


def test_a_hot_child_changing_only_the_tokenizer_verifies_its_tokens_before_the_formal_load(llama: Llama) -> None:
    """The live, warm llama-server is reused, but its routes were verified with another tokenizer: route_verify
    runs again, finds the builtin tokenizer's counts are not the server's, and stops the run before any formal
    request; nothing is decided against the parent."""
    ws = llama.ws
    base = freeze_case(ws, draft=llama.draft())
    r1 = start_run(ws, base.case_id, wait=True, timeout_s=TIMEOUT)
    assert r1.state == "succeeded", phase_status(ws, r1.run_id).text()
    child = freeze_case(ws, draft=llama.draft(dataset={"tokenizer": "builtin"}), parent=base.case_id)
    assert [d.path for d in child.delta] == ["dataset.tokenizer"]
    before = work(llama.port)
    r2 = start_run(ws, child.case_id, wait=True, timeout_s=TIMEOUT)
    s = phase_status(ws, r2.run_id)
    assert s.state == "failed" and s.phase == "route_verify" and s.failure_class == "dataset", s.text()
    assert s.sent == 0 and s.decision is None, s.text()
    v = fold(ws, r2.run_id)
    assert v.phases["service"].state.value == "reused" and v.phases["warmup"].state.value == "reused"
    assert "dataset tokenizer ≠ server tokenizer" in (read_json(ws.run(r2.run_id).phase_file("route_verify"))["error"])
    # only route_verify's one request did model work: no formal request reached the engine
    after = work(llama.port)
    assert after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"] <= 8


def test_prefix_cache_case_passes_its_cache_check(llama: Llama) -> None:
    # concurrency 1: llama.cpp keeps a prefix in the slot that computed it; a concurrent request that
    # lands on another slot misses, which would make the check depend on slot assignment
    draft = llama.draft(
        scenario="llamacpp-prefix",
        dataset={
            "source": "prefix_cache",
            "input_tokens": 160,
            "output_tokens": 8,
            "prefix_ratio": 0.8,
            "block_size": 16,
            "prefix_groups": 1,
        },
        load={"requests": 3, "concurrency": 1},
        warmup={"requests": 1, "concurrency": 1},
        cache={"min_hit_ratio": 0.6, "check_requests": 2},
    )
    ws = llama.ws
    case = freeze_case(ws, draft=draft)
    run = start_run(ws, case.case_id, wait=True, timeout_s=TIMEOUT)
    assert run.state == "succeeded", phase_status(ws, run.run_id).text()
    ev = read_json(ws.run(run.run_id).phase_file("cache_prepare"))
    assert ev["mode"] == "seed+check" and ev["seed"]["ok"] == ev["seed"]["requests"] == 1
    # llama.cpp reports usage.prompt_tokens_details.cached_tokens; the ratio divides by its prompt_tokens
    check = ev["check"]
    assert len(check["hit_ratios"]) == 2 and min(check["hit_ratios"]) >= 0.6, check
    assert all(0 < c < p for c, p in zip(check["cached_tokens"], check["prompt_tokens"], strict=True)), check
    result = latest_result(ws.run(run.run_id).root)
    assert result is not None
    cache = result.windows.whole.cache
    assert cache.requests_with_cached_tokens == 3
    assert cache.share_meeting_min == 1.0, cache.hit_ratio
    assert cache.uncached_input_throughput.numerator < cache.nominal_input_throughput.numerator  # type: ignore[union-attr]


@pytest.mark.processes
def test_collect_failure_is_repaired_from_raw_without_model_work(llama: Llama, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = llama.ws
    draft = llama.draft(scenario="llamacpp-collect", load={"requests": 3, "concurrency": 2})
    case = freeze_case(ws, draft=draft)
    monkeypatch.setenv("CASELEDGER_FAULT", "postprocess:fail=import")  # the collector runs without site-packages
    run = start_run(ws, case.case_id, wait=True, timeout_s=TIMEOUT)
    monkeypatch.delenv("CASELEDGER_FAULT")
    s = phase_status(ws, run.run_id)
    assert s.state == "failed" and s.phase == "postprocess" and s.failure_class == "collect", s.text()
    assert s.done == 3 and s.load_ended == "yes" and not s.next_resends_requests
    assert "reprocess_raw" in s.next_call

    raw_before = ws.run(run.run_id).raw.read_bytes()
    before, slots_before = work(llama.port), slot_tasks(llama.port)
    fixed = reprocess_raw(ws, run.run_id)
    after, slots_after = work(llama.port), slot_tasks(llama.port)
    assert fixed.requests == 3
    assert after == before, "reprocess_raw made the server do model work"
    assert slots_after == slots_before  # no slot took a new task
    assert ws.run(run.run_id).raw.read_bytes() == raw_before
    s2 = phase_status(ws, run.run_id)
    assert s2.results_extracted and s2.phases["postprocess"] == "done", s2.text()
    result = latest_result(ws.run(run.run_id).root)
    assert result is not None and result.windows.whole.ok == 3


def slot_tasks(port: int) -> list[tuple[int, Any]]:
    """(slot id, id of the last task it took) per slot: unchanged means no request reached a slot."""
    r = httpx2.get(f"http://127.0.0.1:{port}/slots", timeout=10, trust_env=False)
    r.raise_for_status()
    return [(s["id"], s.get("id_task")) for s in r.json()]


SPEC_DRAFTS = "llamacpp:spec_decode_num_drafts_total"


def test_speculative_llama_server_per_request_al_equals_the_metrics_delta(llama: Llama) -> None:
    ws = llama.ws
    draft = llama.spec_draft(
        scenario="llamacpp-spec", dataset={"output_tokens": 16}, load={"requests": 6, "concurrency": 2}
    )
    base = freeze_case(ws, draft=draft)
    r1 = start_run(ws, base.case_id, wait=True, timeout_s=TIMEOUT)
    assert r1.state == "succeeded", phase_status(ws, r1.run_id).text()

    # the draft model's file hash is in the service identity, like the target's; its flags in the live argv
    ev = service_evidence(ws, r1.run_id)
    files = {f["option"]: f for f in ev["model_files"]}
    assert set(files) == {"-m", "-md"} and files["-m"]["sha256"] == files["-md"]["sha256"]
    eff = ev["effective_argv"]
    assert eff[eff.index("-md") + 1] == llama.model and eff[eff.index("--spec-draft-n-max") + 1] == "4"

    # llama.cpp's per-request counts, and the verify steps counted from its per-chunk timings
    recs = records(ws, r1.run_id)
    assert len(recs) == 6 and all(r["ok"] and r["completion_tokens"] == 16 for r in recs)
    for r in recs:
        steps = r["spec_steps"]
        assert steps and all(1 <= d <= 4 and 0 <= a <= d for d, a in steps)
        assert sum(d for d, _ in steps) == r["spec_draft_tokens"] > 0
        assert sum(a for _, a in steps) == r["spec_accepted_tokens"]

    result = latest_result(ws.run(r1.run_id).root)
    assert result is not None
    # several tokens per chunk under speculative decoding, bounded by the accepted drafts: all valid
    assert result.checks is not None and result.checks.invalid == 0, result.checks
    whole = result.windows.whole.spec_decode
    per = whole.per_request
    deltas = {c.name: c.delta for c in whole.counters}
    out = sum(r["completion_tokens"] for r in recs)
    steps_total = sum(len(r["spec_steps"]) for r in recs)
    # whole window: per-request sums equal the /metrics deltas (warmup and route_verify ran before the
    # first snapshot, so the deltas hold the formal requests only)
    assert per.verify_steps == steps_total == deltas[SPEC_DRAFTS]
    assert per.draft_tokens == deltas["llamacpp:spec_decode_num_draft_tokens_total"]
    assert per.accepted_tokens == deltas["llamacpp:spec_decode_num_accepted_tokens_total"]
    assert whole.agree is True, whole.agreement
    assert isinstance(per.acceptance_length, Ratio) and isinstance(whole.acceptance_length, Ratio)
    assert per.acceptance_length.value == whole.acceptance_length.value == out / steps_total
    text = f"{out} / {steps_total} = {out / steps_total:.4f}"
    assert per.acceptance_length.text == whole.acceptance_length.text == text
    assert isinstance(per.acceptance_rate, Ratio) and isinstance(whole.acceptance_rate, Ratio)
    assert per.acceptance_rate.value == whole.acceptance_rate.value
    assert isinstance(per.by_position, list) and isinstance(whole.by_position_counters, list)
    assert [(p.position, p.accepted) for p in per.by_position] == [
        (p.position, p.accepted) for p in whole.by_position_counters
    ]
    # native window: its own requests and interval from per-request counts; counters say why not
    native = result.windows.native
    nper = native.spec_decode.per_request
    assert native.found and nper.requests == native.ok >= 1
    assert isinstance(nper.acceptance_length, Ratio) and nper.acceptance_length.denominator >= 1
    assert isinstance(nper.acceptance_rate, Ratio)
    nal = native.spec_decode.acceptance_length
    assert isinstance(nal, NotObserved) and nal.reason == WHOLE_ONLY

    # reprocess recomputes all of it from the raw data and the saved snapshots, with no model work
    before = counters(llama.port)
    shutil.rmtree(ws.run(r1.run_id).results)
    slots = slot_tasks(llama.port)
    fixed = reprocess_raw(ws, r1.run_id)
    assert fixed.requests == 6 and slot_tasks(llama.port) == slots  # no slot took a task: nothing sent
    redone = latest_result(ws.run(r1.run_id).root)
    assert redone is not None and redone.windows == result.windows
    assert counters(llama.port)[SPEC_DRAFTS] == before[SPEC_DRAFTS]

    # a child that changes only the draft length is a service change: restarted with the new argv
    child = freeze_case(
        ws,
        draft=llama.spec_draft(
            draft_max=2, scenario="llamacpp-spec", dataset={"output_tokens": 16}, load={"requests": 6, "concurrency": 2}
        ),
        parent=base.case_id,
    )
    assert [(d.path, d.impact) for d in child.delta] == [("service.speculative.draft_max", "service")]
    r2 = start_run(ws, child.case_id, wait=True, timeout_s=TIMEOUT)
    assert r2.state == "succeeded", phase_status(ws, r2.run_id).text()
    ev2 = service_evidence(ws, r2.run_id)
    assert ev2["outcome"] == "done" and ev2["pid"] != ev["pid"] and ev2["identity"] != ev["identity"]
    eff2 = ev2["effective_argv"]
    assert eff2[eff2.index("--spec-draft-n-max") + 1] == "2"
    assert all(d <= 2 for r in records(ws, r2.run_id) for d, _ in r["spec_steps"])
    result2 = latest_result(ws.run(r2.run_id).root)
    assert result2 is not None and result2.windows.whole.spec_decode.agree is True
    side = render_side_by_side([(r1.run_id, base.case_id, result), (r2.run_id, child.case_id, result2)])
    al_row = next(line for line in side.splitlines() if line.startswith("| AL per-request |"))
    assert al_row.count("|") == 4 and "NOT_OBSERVED" not in al_row


@pytest.mark.parametrize("name", ["llamacpp.json", "llamacpp-spec.json"])
def test_template_as_written_runs_on_llama_server(llama: Llama, name: str) -> None:
    """The template users copy, with only the binary, the model path and the port filled in, succeeds: its
    tokenizer is the served GGUF's, so route verification finds the server's prompt tokens equal to the plan."""
    ws = llama.ws
    d = llama_template(name, free_port(), llama.server, llama.model)
    case = freeze_case(ws, draft=d)
    run = start_run(ws, case.case_id, wait=True, timeout_s=TIMEOUT)
    assert run.state == "succeeded", phase_status(ws, run.run_id).text()
    routes = read_json(ws.run(run.run_id).phase_file("route_verify"))["routes"]
    assert routes[0]["tokens"]["compared"] == "equal", routes
    recs = records(ws, run.run_id)
    assert len(recs) == d["load"]["requests"] and all(r["ok"] for r in recs), [r["error"] for r in recs]
    assert [r["prompt_tokens"] for r in recs] == [r["input_tokens_chat"] for r in recs]
    assert {r["completion_tokens"] for r in recs} == {d["dataset"]["output_tokens"]}
    result = latest_result(ws.run(run.run_id).root)
    assert result is not None and result.checks is not None and result.checks.invalid == 0, result.checks
    if d["service"].get("speculative"):  # drafts counted per request and at the server, and they agree
        assert result.windows.whole.spec_decode.agree is True, result.windows.whole.spec_decode.agreement
