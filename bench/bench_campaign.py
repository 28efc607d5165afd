"""The knee campaign of tests/test_campaigns.py, run whole K times in fresh workspaces on the reference target:
does every repetition give the same answer (the exhaustive grid's winner, or a tie naming the same pair), how
many points does it measure, how many runs, tool calls and seconds, and what share of the wall time is formal
windows. By hand: `.venv/bin/python bench/bench_campaign.py [K]` (needs a quiet host: a busy one distorts
windows, and the campaign then repeats them).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from datetime import datetime

from caseledger import services
from caseledger.campaign.view import CampaignView
from caseledger.ledger import authorization
from caseledger.ledger.runs import load_run, scan_runs
from caseledger.outcome.summary import time_ledger
from caseledger.tools import freeze_any, start_any, status_any, summarize
from caseledger.tools.campaigns import CampaignFrozen
from caseledger.workspace import Workspace
from tests.conftest import free_port, knee_base

VALUES = [1, 2, 4, 8, 16, 32]
LIMIT_MS = 11.0


def draft(port: int) -> dict[str, object]:
    base = knee_base(port, "knee", 32)
    return {
        "campaign": {
            "name": "knee-c",
            "base": base,
            "axes": [{"path": "load.concurrency", "values": VALUES}],
            "search": {"kind": "knee", "axis": "load.concurrency", "monotone": True},
            "decision": {"primary_metric": "output_throughput", "limits": {"tpot_p99_ms": LIMIT_MS}},
        }
    }


def once() -> dict[str, object]:
    ws = Workspace(Path(tempfile.mkdtemp()) / "ws")
    (ws.root / "cases").mkdir(parents=True)
    authorization.set_mode(ws, "auto")
    t0 = time.monotonic()
    calls = 0
    try:
        f = freeze_any(ws, draft=draft(free_port()))
        assert isinstance(f, CampaignFrozen)
        start_any(ws, f.campaign_id)
        calls = 2
        while True:
            v = status_any(ws, f.campaign_id, wait_s=60)
            calls += 1
            assert isinstance(v, CampaignView)
            if v.complete:  # its answer says "campaign complete": what an agent stops on
                break
        summarize(ws, [f.campaign_id])
        calls += 1
        label = {r.case_id: r.label for r in v.rows}
        return {
            "where": where_time_went(ws),
            "answer": label.get(v.winner or "", "tie " + "/".join(label[c] for c in v.tie)),
            "measured": sum(1 for r in v.rows if r.runs),
            "runs": v.progress["runs"],
            "calls": calls,
            "wall_s": round(time.monotonic() - t0, 1),
            "formal_share": v.progress["formal_window_share"],
        }
    finally:
        services.stop_all(ws)


def where_time_went(ws: Workspace) -> dict[str, float]:
    """Mean seconds per run: start_run to the first formal request, the formal window, after it to the run's
    end, the gap to the next run's start (the driver's planning and launch), and each phase's wall time."""
    tls = [(m, time_ledger(load_run(ws, m.run_id))) for m in scan_runs(ws).metas]
    n = len(tls) or 1
    out: dict[str, float] = {"before_window": 0.0, "window": 0.0, "after_window": 0.0, "gap_to_next": 0.0}
    prev_end = None
    for m, tl in tls:
        created = datetime.fromisoformat(m.created_utc).timestamp()
        if prev_end is not None:
            out["gap_to_next"] += (created - prev_end) / n
        out["before_window"] += tl.get("start_run_to_first_formal_request_s", 0.0) / n
        out["window"] += tl.get("formal_window_s", 0.0) / n
        out["after_window"] += (
            tl.get("outside_formal_window_s", 0.0) - tl.get("start_run_to_first_formal_request_s", 0.0)
        ) / n
        prev_end = created + tl.get("run_wall_s", 0.0)
        for ph, x in tl["phases"].items():
            out[ph] = out.get(ph, 0.0) + (x["wall_s"] or 0.0) / n
    return {k: round(v, 3) for k, v in out.items()}


def main() -> None:
    k = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    rows = [once() for _ in range(k)]
    for i, r in enumerate(rows, 1):
        print(f"{i}: {r}")
    answers = {str(r["answer"]) for r in rows}
    print(
        f"answers: {sorted(answers)} ({'the same every time' if len(answers) == 1 else 'DIFFER'}); "
        f"exhaustive grid winner under tpot_p99_ms <= {LIMIT_MS:g}: C=4 (TPOT ~ 4 + 1.5 (C - 1) ms)"
    )


if __name__ == "__main__":
    main()
