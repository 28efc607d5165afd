"""The drift rule (campaign/drift.py) on this host: K campaigns of identical points (four values of dataset.seed: the
same prompt and output lengths) on the reference target with nothing changed, each in a fresh workspace, and M
campaigns where the target slows 2x (SIGUSR1) after the first run. Counts the campaigns that confirm no drift
(no change set aside, none suspected, not inconclusive) and those that find the 2x change; per campaign the
control's runs (tok/s, other processes' share of the host's CPU), its answer's first words, and what the same
runs would give with the contention evidence left out. The cases accept a contended host
(measurement.evidence.max_other_cpu_share 1), as on a shared one: the host's load is the noise under test.
By hand, timing-sensitive (nothing else of yours running): `.venv/bin/python bench/bench_drift.py [K [M [N]]]`
(defaults 20, 3, 16 requests a run).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from caseledger import services
from caseledger.campaign import planner
from caseledger.campaign.store import load_campaign
from caseledger.campaign.view import CampaignView, current_standing
from caseledger.case.metrics import METRICS
from caseledger.ledger import authorization
from caseledger.ledger.runs import scan_runs
from caseledger.run.campaign_driver import stop_drivers
from caseledger.tools import freeze_any, start_any
from caseledger.tools.campaigns import CampaignFrozen
from caseledger.workspace import Workspace, read_json_or_none
from tests.conftest import free_port, knee_base
from tests.helpers import until_complete


def draft(port: int, requests: int) -> dict[str, Any]:
    base = knee_base(port, "drift-bench", requests)
    base["measurement"] = {"evidence": {"max_other_cpu_share": 1.0}}  # a shared host, declared as such
    return {
        "campaign": {
            "name": "drift-bench",
            "base": base,
            "axes": [{"path": "dataset.seed", "values": [1, 2, 3, 4]}],
            "search": {"kind": "grid"},
            "decision": {"primary_metric": "output_throughput"},  # min_effect 0.02: the floor is the rule's own
        }
    }


def slow_after_first(ws: Workspace, fired: list[float]) -> None:
    """SIGUSR1 the reference target (every step 2x as long) once the first run has decided."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        metas = scan_runs(ws).metas
        if metas and read_json_or_none(ws.run(metas[0].run_id).phase_file("decide")) is not None:
            st = read_json_or_none(next(ws.services_dir.glob("*.json")))
            if st is not None:
                os.kill(int(st["proc"]["pid"]), signal.SIGUSR1)
                fired.append(time.monotonic())
                return
        time.sleep(0.05)


def once(requests: int, slow: bool) -> dict[str, Any]:
    ws = Workspace(Path(tempfile.mkdtemp()) / "ws")
    (ws.root / "cases").mkdir(parents=True)
    authorization.set_mode(ws, "auto")
    t0 = time.monotonic()
    fired: list[float] = []
    try:
        f = freeze_any(ws, draft=draft(free_port(), requests))
        assert isinstance(f, CampaignFrozen)
        if slow:
            threading.Thread(target=slow_after_first, args=(ws, fired), daemon=True).start()
        start_any(ws, f.campaign_id)
        v = until_complete(ws, f.campaign_id, timeout_s=3600, wait_s=60)
        return verdict(ws, f.campaign_id, v) | {"wall_s": round(time.monotonic() - t0, 1), "slowed": bool(fired)}
    finally:
        stop_drivers(ws)  # an interrupted bench leaves no driver starting points
        services.stop_all(ws)
        shutil.rmtree(ws.root.parent, ignore_errors=True)


def verdict(ws: Workspace, campaign_id: str, v: CampaignView) -> dict[str, Any]:
    camp = load_campaign(ws, campaign_id)
    pl, obs, _, _ = current_standing(ws, camp)
    ctl = next(o for o in obs if o.case_id in pl.controls)
    higher = METRICS[camp.decision.primary_metric].higher_is_better
    blind = planner.standing(
        [replace(o, others=[]) for o in obs], camp.search, camp.repeats, higher, None, camp.decision.min_effect
    )
    return {
        "no_drift": pl.cut is None and pl.drift is None and pl.suspect is None,
        "found": pl.cut is not None or pl.drift is not None or pl.suspect is not None,
        "answer": v.answer.split(" (")[0][:70],
        "control": [f"{m:.1f}@{(o or 0):.0%}" for m, o in zip(ctl.metric, ctl.others, strict=False)],
        "host_noise_notes": sum(1 for n in pl.notes if "host noise" in n),
        "blind_no_drift": blind.cut is None and blind.drift is None and blind.suspect is None,
        "runs": v.progress["runs"],
    }


def main() -> None:
    k = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    m = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    with tempfile.TemporaryDirectory() as host:  # leases and policy of this bench alone
        for name in ("CASELEDGER_HOST_DIR", "CASELEDGER_LEASE_HOST_DIR", "XDG_CONFIG_HOME"):
            os.environ[name] = host
        os.environ["CASELEDGER_CHART_AFTER_RUN"] = "0"
        t0 = time.monotonic()
        same = []
        for i in range(k):
            same.append(once(n, slow=False))
            print(f"identical {i + 1}: {same[-1]}", flush=True)
        changed = []
        for i in range(m):
            changed.append(once(n, slow=True))
            print(f"2x change {i + 1}: {changed[-1]}", flush=True)
    ok = sum(1 for r in same if r["no_drift"])
    blind = sum(1 for r in same if r["blind_no_drift"])
    found = sum(1 for r in changed if r["found"] and r["slowed"])
    print(
        f"identical points, nothing changed: {ok}/{k} confirm no drift (contention evidence left out: {blind}/{k}); "
        f"2x change: found in {found}/{m}; {n} requests a run; {time.monotonic() - t0:.0f} s in all"
    )


if __name__ == "__main__":
    main()
