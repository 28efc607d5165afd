"""Tool time on the hot path: start_run -> first formal request for a child case that changes only C.

Runs a baseline on the reference target, then K hot children (concurrency changes only), and prints the
time ledger of each: start_run -> first formal request, and where it went (controller start, preflight,
service check, load client start). Goal: under 1 s. Run by hand:
    python bench/bench_hot_path.py [K]            # the embedded reference target
    python bench/bench_hot_path.py K llamacpp     # a real llama-server (after: set -a; . ~/.cache/caseledger/llama.env)
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

from caseledger import services
from caseledger.demo import _port, drafts
from caseledger.ledger import authorization
from caseledger.ledger.events import read_events
from caseledger.ledger.runs import load_run
from caseledger.outcome.summary import time_ledger
from caseledger.tools import freeze_case, start_run
from caseledger.workspace import Workspace, read_json


def _t(utc: str) -> float:
    return datetime.fromisoformat(utc.replace("Z", "+00:00")).timestamp()


def _llamacpp(port: int) -> dict[str, Any]:
    d: dict[str, Any] = json.loads((Path(__file__).resolve().parents[1] / "cases" / "llamacpp.json").read_text())
    d.pop("$schema", None)
    argv = d["service"]["argv"]
    argv[0], argv[argv.index("-m") + 1] = os.environ["CASELEDGER_LLAMA_SERVER"], os.environ["CASELEDGER_LLAMA_MODEL"]
    d["dataset"]["tokenizer"] = os.environ["CASELEDGER_LLAMA_MODEL"]  # the served GGUF's own tokenizer
    d["target"]["endpoints"][0]["base_url"] = f"http://127.0.0.1:{port}/v1"
    d["service"]["health_url"] = f"http://127.0.0.1:{port}/health"
    return d


def main(k: int = 5, engine: str = "reference") -> None:
    ws = Workspace(Path(tempfile.mkdtemp(prefix="bench-hot-")))
    authorization.set_mode(ws, "auto")
    base = _llamacpp(_port()) if engine == "llamacpp" else drafts(_port())[0]
    base["load"]["requests"] = 16
    try:
        f0 = freeze_case(ws, draft=base)
        r0 = start_run(ws, f0.case_id, wait=True)
        rows = []
        for n in range(k):
            d = dict(base, load={**base["load"], "concurrency": 5 + n})  # != the baseline's 4
            f = freeze_case(ws, draft=d, parent=f0.case_id)
            r = start_run(ws, f.case_id, wait=True)
            assert r.state == "succeeded", r.text()
            tl = time_ledger(load_run(ws, r.run_id))
            ev = {(e["type"], e["phase"]): e for e in read_events(ws.run(r.run_id)).events}
            created = _t(ev[("run_created", None)]["utc"])
            anchor = read_json(ws.run(r.run_id).load_anchor)
            rows.append(
                {
                    "run": r.run_id,
                    "to_first_request": tl["start_run_to_first_formal_request_s"],
                    "controller_up": _t(ev[("controller_started", None)]["utc"]) - created,
                    "preflight": tl["phases"]["preflight"]["wall_s"],
                    "service": tl["phases"]["service"]["wall_s"],
                    "client_start": _t(anchor["wall_utc"]) - _t(ev[("phase_started", "load")]["utc"]),
                }
            )
        print(f"baseline {r0.run_id}; {k} hot children (only concurrency changes)")
        print(f"{'run':12} {'start->1st req':>14} {'ctl up':>7} {'preflight':>9} {'service':>8} {'client up':>9}")
        for x in rows:
            print(
                f"{x['run']:12} {x['to_first_request']:14.3f} {x['controller_up']:7.3f} {x['preflight']:9.3f} "
                f"{x['service']:8.3f} {x['client_start']:9.3f}"
            )
        print(
            f"median start_run -> first formal request: {statistics.median(x['to_first_request'] for x in rows):.3f} s"
        )
    finally:
        services.stop_all(ws)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5, sys.argv[2] if len(sys.argv) > 2 else "reference")
