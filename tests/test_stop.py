"""`caseledger target stop` during a campaign: its driver, then its running point (the run's controller and load
client end it, every request the target received recorded), then the services; status tells where each stands."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from caseledger import procs
from caseledger.campaign.view import campaign_view
from caseledger.case.phases import Phase
from caseledger.ledger import authorization
from caseledger.ledger.event_types import PhaseStarted
from caseledger.ledger.events import read_events
from caseledger.ledger.runs import scan_runs
from caseledger.ledger.state import count_raw
from caseledger.tools import freeze_any, freeze_case, start_any, start_run, status_any
from caseledger.tools.campaigns import CampaignFrozen
from caseledger.workspace import Workspace, read_json_or_none, read_ref
from tests.conftest import external_draft, reference_targets, stats

SLOW = {"prefill_tokens_per_s": 200000, "decode_step_s": 0.05, "decode_step_per_seq_s": 0.0, "slots": 8}


def _stop(ws: Workspace) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "caseledger", "target", "stop", "--workspace", str(ws.root), "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return dict(orjson.loads(out.stdout))


def _running_point(ws: Workspace, records: int) -> str:
    """The run of the campaign's first point once its load has recorded `records` requests."""
    deadline = time.monotonic() + 120
    while True:
        metas = scan_runs(ws).metas
        if metas and count_raw(ws.run(metas[0].run_id).raw)[0] >= records:
            return metas[0].run_id
        assert time.monotonic() < deadline, [m.run_id for m in metas]
        time.sleep(0.05)


@pytest.mark.processes  # a detached driver, controller and load client, stopped from another process
def test_target_stop_ends_the_running_point_with_every_request_recorded(
    ws: Workspace, tmp_path: Path, stop_services: None
) -> None:
    authorization.set_mode(ws, "auto")
    with reference_targets({"slow": SLOW}, tmp_path / "targets") as served:
        port = served["slow"].port
        base = external_draft(
            port,
            scenario="stop",
            dataset={"source": "synthetic", "input_tokens": 32, "output_tokens": 16},
            load={"requests": 40, "concurrency": 2},
        )
        f = freeze_any(ws, draft={"campaign": {
            "name": "stop-c",
            "base": base,
            "axes": [{"path": "load.concurrency", "values": [2, 4]}],
            "search": {"kind": "grid"},
            "decision": {"primary_metric": "output_throughput"},
        }})  # fmt: skip
        assert isinstance(f, CampaignFrozen)
        start_any(ws, f.campaign_id)
        run_id = _running_point(ws, 4)
        paths = ws.run(run_id)
        ctl, client = read_ref(paths.controller_pid), read_ref(paths.load_pid)
        assert procs.alive(ctl) and procs.alive(client)
        answer = _stop(ws)
        assert answer["drivers"] == [f.campaign_id], answer
        (stopped,) = answer["runs"]
        assert stopped["run_id"] == run_id and stopped["state"] == "partial", answer
        assert "of 40 formal requests recorded" in stopped["line"], stopped
        assert not procs.alive(ctl) and not procs.alive(client)  # its controller and its load: both ended
        # no data lost: every formal request the target received has its raw record (finished, or cancelled)
        received = stats(port)["by_phase"].get("load", 0)
        records, ok = count_raw(paths.raw)
        end = read_json_or_none(paths.load_end) or {}
        assert 4 <= ok <= records == received == end.get("sent") < 40, (records, ok, received, end)
        assert end.get("exit") == "cancelled", end
        time.sleep(1.0)
        assert stats(port)["by_phase"].get("load", 0) == received  # nothing sent after the stop
    st = status_any(ws, run_id)
    text = st.text()
    assert text.startswith(f"{run_id} ") and ": partial, all phases done" in text.split("\n", 1)[0], text
    assert "its load was stopped (SIGTERM)" in text and "owner gone, client gone" in text, text
    view = campaign_view(ws, f.campaign_id)
    assert not view.driver_alive and len(scan_runs(ws).metas) == 1, view.text()  # no point started after it


@pytest.mark.processes  # a detached controller in its warmup, stopped from another process
def test_a_run_stopped_before_its_load_fails_at_the_next_phase_with_nothing_sent(
    ws: Workspace, tmp_path: Path, stop_services: None
) -> None:
    with reference_targets({"slow": {**SLOW, "decode_step_s": 0.4}}, tmp_path / "targets") as served:
        port = served["slow"].port
        draft = external_draft(port, warmup={"requests": 2, "concurrency": 1, "max_tokens": 8})
        case = freeze_case(ws, draft=draft)
        r = start_run(ws, case.case_id)  # returns once preflight passed: the warmup takes ~6 s
        assert r.run_id is not None, r.text()
        paths = ws.run(r.run_id)
        deadline = time.monotonic() + 60
        while not any(isinstance(e, PhaseStarted) and e.phase == Phase.WARMUP for e in read_events(paths).events):
            assert time.monotonic() < deadline, read_events(paths).events
            time.sleep(0.05)
        answer = _stop(ws)
        (stopped,) = answer["runs"]
        assert stopped["state"] == "failed", answer
        assert stats(port)["by_phase"].get("load", 0) == 0  # no formal request reached the target
    text = status_any(ws, r.run_id).text()
    assert "failed" in text.split("\n", 1)[0] and "route_verify" in text, text
    assert "stopped (SIGTERM, caseledger target stop) before route_verify" in text, text
    assert "resume" in text, text
    assert not procs.alive(read_ref(paths.controller_pid)) and not procs.alive(read_ref(paths.load_armed))
