"""Results from real runs on the reference target: spec-decode counters, collect repair without new load."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest

from caseledger.metrics import NotObserved, Ratio, latest_result
from caseledger.tools import freeze_case, phase_status, reprocess_raw, start_run
from caseledger.workspace import RunPaths, Workspace, read_json
from tests.conftest import free_port, ref_draft, start_with_fault

pytestmark = pytest.mark.integration


def spec_draft(port: int, hide: list[str]) -> dict[str, object]:
    return ref_draft(
        port,
        service={
            "reference": {
                "spec_tokens": 3,
                "spec_accept": 0.6,
                "hide_counters": hide,
                "prefill_tokens_per_s": 200000,
                "decode_step_s": 0.002,
            }
        },
        dataset={"source": "synthetic", "input_tokens": 64, "output_tokens": 32},
        measurement={"spec_decode": "vllm"},
    )


def test_spec_decode_run_reports_al_with_its_formula(ws: Workspace, stop_services: None) -> None:
    r = start_run(ws, freeze_case(ws, draft=spec_draft(free_port(), [])).case_id, wait=True)
    assert r.state == "succeeded", r.text()
    res = latest_result(ws.run(r.run_id).root)
    assert res is not None
    sd = res.windows.whole.spec_decode
    assert isinstance(sd.acceptance_length, Ratio) and isinstance(sd.acceptance_rate, Ratio)
    al = sd.acceptance_length
    assert al.numerator > 0 and al.denominator > 0 and 1.0 < al.value <= 4.0
    assert f"{int(al.numerator)} / {int(al.denominator)} = {al.value:.4f}" == al.text
    assert 0 < sd.acceptance_rate.value <= 1
    assert isinstance(res.windows.native.spec_decode.acceptance_length, NotObserved)  # whole window only


def test_hidden_draft_token_counter_gives_not_observed_rate(ws: Workspace, stop_services: None) -> None:
    hide = ["vllm:spec_decode_num_draft_tokens_total"]
    r = start_run(ws, freeze_case(ws, draft=spec_draft(free_port(), hide)).case_id, wait=True)
    res = latest_result(ws.run(r.run_id).root)
    assert res is not None
    sd = res.windows.whole.spec_decode
    assert isinstance(sd.acceptance_rate, NotObserved) and "draft" in sd.acceptance_rate.reason
    assert isinstance(sd.acceptance_length, Ratio)  # AL needs only output tokens and drafts


@pytest.mark.processes
def test_broken_postprocess_is_collect_and_reprocess_sends_nothing(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, stop_services: None
) -> None:
    port = free_port()
    case = freeze_case(ws, draft=ref_draft(port))
    r = start_with_fault(monkeypatch, "postprocess:fail=import", ws, case.case_id, wait=True)
    s = phase_status(ws, r.run_id)
    assert s.failure_class == "collect" and "ModuleNotFoundError" in (s.blocker or "")
    before = httpx2.get(f"http://127.0.0.1:{port}/stats").json()["requests_total"]
    rep = reprocess_raw(ws, r.run_id)
    assert rep.requests == 8 and rep.decision == "baseline"
    after = httpx2.get(f"http://127.0.0.1:{port}/stats").json()["requests_total"]
    assert after == before
    assert phase_status(ws, r.run_id).state == "succeeded"


def test_a_collector_that_stops_answering_or_is_killed_fails_as_collect_never_internal(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The collector's process: one that gives no answer in time (SIGSTOPped, stuck) is killed and the phase is
    `collect` (reprocess_raw repairs it), never a caseledger bug; one killed by a signal says which."""
    import sys

    from caseledger.errors import FailureClass, PhaseFailed
    from caseledger.run import after_load

    monkeypatch.setattr(after_load, "COLLECT_TIMEOUT_S", 0.5)
    stuck = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSTOP)"]
    paths = RunPaths(tmp_path / "r-0123abcd")
    paths.root.mkdir()
    monkeypatch.setattr(after_load, "postprocess_env", lambda: (stuck, {}))
    with pytest.raises(PhaseFailed) as e:
        after_load._collector_process([], paths)
    assert read_json(paths.collector_pid)["pid"] > 0  # recorded at its start: a reader sees it stopped
    assert e.value.failure_class == FailureClass.COLLECT and "gave no answer in 0.5 s" in e.value.message
    assert "reprocess_raw(run_id='r-0123abcd')" in (e.value.fix or "")
    killed = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    monkeypatch.setattr(after_load, "postprocess_env", lambda: (killed, {}))
    code, _, err, _, _ = after_load._collector_process([], paths)
    assert after_load.collector_error(code, err) == "killed by SIGKILL, no output"
    assert after_load.collector_error(1, b"Traceback\nModuleNotFoundError: numpy\n") == "ModuleNotFoundError: numpy"
