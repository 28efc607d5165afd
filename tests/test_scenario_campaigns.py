"""One answer per scenario across campaigns: the points of every campaign of a scenario rank together, and every
label carries the point's full setting (each knob away from the scenario's first case), with real campaigns on
the reference target."""

from __future__ import annotations

from typing import Any

import pytest

from caseledger.campaign.model import setting_label
from caseledger.campaign.store import driver_file
from caseledger.campaign.view import CampaignView, campaign_view
from caseledger.case.model import Case
from caseledger.ledger import authorization
from caseledger.tools import freeze_any, start_any, summarize
from caseledger.tools.campaigns import CampaignFrozen
from caseledger.views import handoff
from caseledger.workspace import Workspace, utc_now, write_json
from tests.conftest import KNEE_TARGET, free_port, knee_base, ref_draft
from tests.helpers import until_complete


def _grid(port: int, name: str, values: list[int], **target: Any) -> dict[str, Any]:
    base = knee_base(port, "two-campaigns", 16)
    base["service"]["reference"] = {**KNEE_TARGET, **target}
    return {
        "campaign": {
            "name": name,
            "base": base,
            "axes": [{"path": "load.concurrency", "values": values}],
            "search": {"kind": "grid"},
            "repeats": {"runs": 1, "settle_runs": 1, "budget": 0},
            "decision": {"primary_metric": "output_throughput", "limits": {"tpot_p99_ms": 1000}, "min_effect": 0.25},
        }
    }


def test_a_label_names_every_knob_away_from_the_first_case_but_the_axes_it_already_names() -> None:
    first = Case.model_validate(ref_draft_argv(["llama-server", "-np", "4", "-b", "2048"], 4)).filled()
    case = Case.model_validate(ref_draft_argv(["llama-server", "-np", "8", "-b", "512", "-fa"], 2)).filled()
    axes = ["service.argv[-np]", "load.concurrency"]
    assert setting_label(first, case, axes) == "-b=512 -fa"
    assert setting_label(first, case, []) == "C=2 -np=8 -b=512 -fa"
    assert setting_label(first, first, []) == ""


def ref_draft_argv(argv: list[str], c: int) -> dict[str, Any]:
    return ref_draft(8000, service={"adapter": "command", "argv": argv}, load={"requests": 8, "concurrency": c})


@pytest.mark.processes  # the detached drivers, end to end
def test_two_campaigns_of_one_scenario_rank_together_and_label_their_full_setting(
    ws: Workspace, stop_services: None
) -> None:
    authorization.set_mode(ws, "auto")
    port = free_port()
    a = freeze_any(ws, draft=_grid(port, "slow", [1, 2]))
    b = freeze_any(ws, draft=_grid(port, "fast", [2, 4], decode_step_s=0.002, decode_step_per_seq_s=0.0002))
    assert isinstance(a, CampaignFrozen) and isinstance(b, CampaignFrozen)
    start_any(ws, a.campaign_id)
    va: CampaignView = until_complete(ws, a.campaign_id)
    start_any(ws, b.campaign_id)
    vb: CampaignView = until_complete(ws, b.campaign_id)

    # the second campaign's base makes decode steps faster: its labels say so; the first's points are its axes alone
    assert sorted(r.label for r in va.rows) == ["C=1", "C=2"], va.text()
    fast = "decode_step_per_seq_s=0.0002 decode_step_s=0.002"
    assert sorted(r.label for r in vb.rows) == [f"C=2 {fast}", f"C=4 {fast}"], vb.text()
    assert len(va.controls) <= 1 and len(vb.controls) <= 1  # a control per identity with more than one point
    # TTFT and TPOT p50 beside the p99s, on every measured row and in its line
    want = {"ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms"}
    assert all(set(r.latency) == want for r in vb.rows), vb.text()
    assert all(r.latency["tpot_p50_ms"] <= r.latency["tpot_p99_ms"] for r in vb.rows)
    assert vb.text().count("| TTFT p50/p99 ") == 2, vb.text()

    sv = summarize(ws, [], scenario="two-campaigns").scenario
    assert sv is not None and sv.campaigns == [a.campaign_id, b.campaign_id], sv
    assert sv.answer is not None and sv.answer.startswith("across 2 campaigns: "), sv.text()
    points = {r.case_id: r for v in (va, vb) for r in v.rows}
    ranked = sorted((p for p in points.values() if p.metric_mean is not None), key=lambda p: -(p.metric_mean or 0))
    shown = [r for r in sv.rows if r.case_id in points]  # (a campaign's base that is no point of it: a case too)
    assert len(shown) == len(points) == 4, sv.text()
    for row in shown:  # each campaign's rows and the scenario's agree, point by point
        p = points[row.case_id]
        assert row.change == p.label and row.metric == p.metric_mean and row.runs == p.runs, (row, p)
    best = ranked[0]  # C=4 of the fast base: ~1.7x the runner-up (its C=2), ~4x the first campaign's: beyond noise
    assert sv.best_case == best.case_id and f"winner {best.label} ({best.case_id})" in sv.answer, sv.text()
    assert [r.case_id for r in sv.rows if r.best] == [best.case_id]
    assert {r.case_id: r.campaign_verdict for r in sv.rows}[best.case_id] == "winner"
    text = handoff.refresh(ws)
    assert f"across 2 campaigns: winner C=4 {fast}" in text, text
    assert campaign_view(ws, b.campaign_id).winner == best.case_id  # the newest campaign's own answer agrees

    # HANDOFF.md tells finished from stopped: both complete; a third whose driver stopped before any point ran
    # has its points left and the call that continues it
    for gid in (a.campaign_id, b.campaign_id):  # its own line, or in the compact form when the handoff is full
        assert f"campaign {gid} " in text or f"{gid} (complete)" in text, text
        assert not any(gid in x and ("active" in x or "stopped" in x) for x in text.splitlines()), text
        assert any(gid in x and ("complete: " in x or "(complete)" in x) for x in text.splitlines()), text
    c = freeze_any(ws, draft=_grid(port, "left", [8], slots=32))
    assert isinstance(c, CampaignFrozen)
    dead = {"pid": 2**22 + 7, "start": 1, "host": "x", "started_utc": "2026-01-01T00:00:00Z"}
    write_json(driver_file(ws, c.campaign_id), {**dead, "ended_utc": utc_now(), "outcome": "stopped (SIGTERM)"})
    text = handoff.refresh(ws)
    gid = c.campaign_id
    said = [x for x in text.splitlines() if gid in x]
    assert any("stopped with 1 point(s) left" in x or f"{gid} (stopped, 1 point(s) left)" in x for x in said), text
    assert f"next: start_run(case_id='{gid}')" in text, text
