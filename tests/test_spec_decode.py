"""Speculative decoding per window from per-request counts, beside the /metrics counters (whole window only).

The runs here are real: the reference target decodes speculatively as a subprocess on loopback, the load
client streams from it and counts each request's verify steps from the cumulative draft counts on its
chunks, and the postprocessor runs in a fresh process. The llama.cpp side is in test_engine_llamacpp.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest

from caseledger.case.model import Case
from caseledger.case.plan import delta, plan
from caseledger.metrics import NotObserved, Ratio, compute_result, latest_result
from caseledger.metrics._spec import NO_COUNTS, NO_STEPS, WHOLE_ONLY, WHOLE_ONLY_NO_COUNTS
from caseledger.services import identity_of, intended_argv
from caseledger.services.identity import model_files
from caseledger.tools import freeze_case, reprocess_raw, start_run
from caseledger.workspace import Workspace, read_json
from tests.conftest import free_port, ref_draft, stats

CASES = Path(__file__).resolve().parent.parent / "cases"


def spec_ref_draft(port: int) -> dict[str, Any]:
    return ref_draft(
        port,
        service={
            "reference": {
                "spec_tokens": 3,
                "spec_accept": 0.6,
                "seed": 5,
                "prefill_tokens_per_s": 200000,
                "decode_step_s": 0.002,
            }
        },
        dataset={"source": "synthetic", "input_tokens": 64, "output_tokens": 24},
        load={"requests": 12, "concurrency": 3},
        measurement={"spec_decode": "vllm"},
    )


def raw(ws: Workspace, run_id: str) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in ws.run(run_id).raw.read_bytes().splitlines()]


def metrics_texts(ws: Workspace, run_id: str) -> tuple[str, str]:
    p = ws.run(run_id)
    return p.metrics_before.read_text(), p.metrics_after.read_text()


@pytest.mark.integration
def test_reference_run_per_request_al_equals_the_counter_delta_and_native_has_its_own(
    ws: Workspace, stop_services: None
) -> None:
    port = free_port()
    r = start_run(ws, freeze_case(ws, draft=spec_ref_draft(port)).case_id, wait=True)
    assert r.state == "succeeded", r.text()
    recs = raw(ws, r.run_id)
    assert len(recs) == 12 and all(x["ok"] for x in recs)
    for x in recs:  # every decode step of the reference drafts: steps = output - first token - accepted
        steps = x["spec_steps"]
        assert sum(d for d, _ in steps) == x["spec_draft_tokens"]
        assert sum(a for _, a in steps) == x["spec_accepted_tokens"]
        assert len(steps) == x["completion_tokens"] - 1 - x["spec_accepted_tokens"]
        assert all(d == 3 and 0 <= a <= 3 for d, a in steps)

    res = latest_result(ws.run(r.run_id).root)
    assert res is not None
    whole = res.windows.whole.spec_decode
    per = whole.per_request
    delta_of = {c.name: c.delta for c in whole.counters}
    out = sum(x["completion_tokens"] for x in recs)
    steps = sum(len(x["spec_steps"]) for x in recs)
    accepted = sum(x["spec_accepted_tokens"] for x in recs)
    # the counters bracket the formal load only (warmup ran before the first snapshot)
    assert delta_of["vllm:spec_decode_num_drafts_total"] == steps == per.verify_steps
    assert delta_of["vllm:spec_decode_num_accepted_tokens_total"] == accepted == per.accepted_tokens
    assert isinstance(per.acceptance_length, Ratio) and isinstance(whole.acceptance_length, Ratio)
    assert (per.acceptance_length.numerator, per.acceptance_length.denominator) == (out, steps)
    assert per.acceptance_length.value == whole.acceptance_length.value == out / steps
    assert per.acceptance_length.text == f"{out} / {steps} = {out / steps:.4f}"
    assert isinstance(per.acceptance_rate, Ratio) and isinstance(whole.acceptance_rate, Ratio)
    assert per.acceptance_rate.value == whole.acceptance_rate.value == accepted / (3 * steps)
    assert whole.agree is True and len(whole.agreement) == 3 and all(a.endswith("equal") for a in whole.agreement)
    assert per.requests == per.requests_with_steps == 12 and per.start_s == 0.0 and per.end_s is not None
    # acceptance by position: from the recorded steps and from the per-position counter, the same numbers
    assert isinstance(per.by_position, list) and isinstance(whole.by_position_counters, list)
    assert [(p.position, p.accepted, p.verify_steps) for p in per.by_position] == [
        (p.position, p.accepted, p.verify_steps) for p in whole.by_position_counters
    ]
    first = sum(1 for x in recs for _, a in x["spec_steps"] if a > 0)
    assert per.by_position[0].accepted == first

    native = res.windows.native
    assert native.found and native.ok < 12
    nper = native.spec_decode.per_request
    assert nper.requests == native.ok
    assert isinstance(nper.acceptance_length, Ratio) and isinstance(nper.acceptance_rate, Ratio)
    assert nper.start_s is not None and native.start_s is not None and nper.start_s >= native.start_s
    assert isinstance(native.spec_decode.acceptance_length, NotObserved)
    assert native.spec_decode.acceptance_length.reason == WHOLE_ONLY
    assert native.spec_decode.agreement == [] and native.spec_decode.agree is None

    # reprocess recomputes every spec figure from the raw data and the snapshots alone
    shutil.rmtree(ws.run(r.run_id).results)
    served = stats(port)["requests_total"]
    again = reprocess_raw(ws, r.run_id)
    assert again.requests == 12 and stats(port)["requests_total"] == served  # counted at the target: none sent
    redone = latest_result(ws.run(r.run_id).root)
    assert redone is not None and redone.windows == res.windows


@pytest.mark.integration
def test_counts_missing_from_records_are_not_observed_with_the_reason(ws: Workspace, stop_services: None) -> None:
    r = start_run(ws, freeze_case(ws, draft=spec_ref_draft(free_port())).case_id, wait=True)
    assert r.state == "succeeded", r.text()
    case = Case.model_validate(read_json(ws.run(r.run_id).case))
    before, after = metrics_texts(ws, r.run_id)
    recs = raw(ws, r.run_id)

    # the server streamed no per-chunk counts: verify steps unknown, acceptance still known from the totals
    no_steps = [{**x, "spec_steps": None} for x in recs]
    sd = compute_result(case, no_steps, metrics_before=before, metrics_after=after).windows.whole.spec_decode
    assert isinstance(sd.per_request.acceptance_length, NotObserved)
    assert sd.per_request.acceptance_length.reason == NO_STEPS
    assert isinstance(sd.per_request.acceptance_rate, Ratio)
    assert isinstance(sd.acceptance_length, Ratio)  # the counters still give the whole window's AL
    assert sd.agree is True and [a.split(":")[0] for a in sd.agreement] == ["draft tokens", "accepted tokens"]

    # an engine without per-request counts (or a draftless one): per-request figures NOT_OBSERVED, native too
    bare = [{k: v for k, v in x.items() if not k.startswith("spec_")} for x in recs]
    res = compute_result(case, bare, metrics_before=before, metrics_after=after)
    per = res.windows.whole.spec_decode.per_request
    assert isinstance(per.acceptance_length, NotObserved) and per.acceptance_length.reason == NO_COUNTS
    assert isinstance(per.acceptance_rate, NotObserved) and per.acceptance_rate.reason == NO_COUNTS
    native = res.windows.native.spec_decode
    assert isinstance(native.acceptance_length, NotObserved) and native.acceptance_length.reason == WHOLE_ONLY_NO_COUNTS

    # a step list that does not add up to the final totals is refused, not trusted
    broken = [{**x, "spec_steps": x["spec_steps"][1:]} if i == 0 else x for i, x in enumerate(recs)]
    per = compute_result(case, broken).windows.whole.spec_decode.per_request
    assert isinstance(per.acceptance_length, NotObserved) and "do not add up" in per.acceptance_length.reason


# ---- the speculative case fields: they land in argv, a draft-length child restarts the service -------------


def spec_template(**speculative: Any) -> dict[str, Any]:
    d = dict(orjson.loads((CASES / "llamacpp-spec.json").read_bytes()))
    d["service"] = {**d["service"], "speculative": {**d["service"]["speculative"], **speculative}}
    return d


def test_speculative_fields_fill_their_argv_placeholders() -> None:
    case = Case.model_validate(spec_template(draft_max=2)).filled()
    argv = intended_argv(case)
    assert argv[argv.index("--spec-draft-n-max") + 1] == "2"
    assert argv[argv.index("--spec-type") + 1] == "draft-simple"
    assert argv[argv.index("-md") + 1] == "models/gemma-3-270m-q4_k_m.gguf"
    assert not any("{" in a for a in argv), argv


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"speculative": {"draft_model": "d.gguf", "spec_type": "draft-simple", "draft_max": None}},
            "service.argv uses {draft_max} but service.speculative.draft_max is not set",
        ),
        (
            {"argv": ["llama-server", "-m", "m.gguf", "--port", "{port}"]},
            "service.speculative.draft_model is set but service.argv has no {draft_model}",
        ),
        ({"adapter": "reference", "argv": []}, "service.speculative is only used by adapter 'command'"),
    ],
)
def test_speculative_fields_that_would_not_reach_the_engine_are_refused(change: dict[str, Any], message: str) -> None:
    d = spec_template()
    d["service"] = {**d["service"], **change}
    with pytest.raises(ValueError, match=message.replace("{", r"\{").replace("}", r"\}")):
        Case.model_validate(d)


def test_a_child_changing_only_the_draft_length_is_a_service_change() -> None:
    parent = Case.model_validate(spec_template()).filled()
    child = Case.model_validate(spec_template(draft_max=2)).filled()
    changes = delta(parent, child)
    assert [(d.path, d.old, d.new, d.impact.value) for d in changes] == [
        ("service.speculative.draft_max", 4, 2, "service")
    ]
    steps = {s.phase.value: s.action for s in plan(child, changes, has_parent=True)}
    assert steps["service"] == "run" and steps["warmup"] == "run" and steps["load"] == "run"
    assert identity_of(child) != identity_of(parent)


def test_cases_without_speculative_fields_keep_their_canonical_form() -> None:
    d = dict(orjson.loads((CASES / "llamacpp.json").read_bytes()))
    canonical = Case.model_validate(d).filled().canonical()
    assert "speculative" not in canonical["service"]  # so case ids frozen before the field existed still hold


def test_model_file_hashes_join_the_service_identity(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws")
    target, draft = tmp_path / "target.gguf", tmp_path / "draft.gguf"
    target.write_bytes(b"target weights")
    draft.write_bytes(b"draft weights v1")
    d = spec_template(draft_model=str(draft))
    d["service"]["argv"][d["service"]["argv"].index("-m") + 1] = str(target)
    case = Case.model_validate(d).filled()
    files = model_files(ws, case)
    assert [(f["option"], f["bytes"]) for f in files] == [("-m", 14), ("-md", 16)]
    first = identity_of(case, files)
    assert model_files(ws, case) == files  # cached by stat
    draft.write_bytes(b"draft weights v2")  # same path and argv, other weights: another service
    again = model_files(ws, case)
    assert again[1]["sha256"] != files[1]["sha256"] and again[0] == files[0]
    assert identity_of(case, again) != first
