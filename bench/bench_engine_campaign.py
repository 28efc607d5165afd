"""A server flag x C campaign on a real llama-server, with windows as long as a user's: how much of the campaign's
wall time the formal windows cover, service starts against distinct service identities, and where the rest of
the time went (bench_campaign.where_time_went). By hand, on a quiet host, with llama.env loaded:
`set -a; . ~/.cache/caseledger/llama.env; set +a; .venv/bin/python bench/bench_engine_campaign.py [REQUESTS]`
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_campaign import where_time_went
from caseledger import services
from caseledger.campaign.view import CampaignView
from caseledger.ledger import authorization
from caseledger.tools import freeze_any, start_any, summarize
from caseledger.tools.campaigns import CampaignFrozen
from caseledger.workspace import Workspace
from tests.conftest import free_port
from tests.engine import llama_draft, llama_paths
from tests.helpers import until_complete


def main() -> None:
    requests = int(sys.argv[1]) if len(sys.argv) > 1 else 24
    server, model = llama_paths()
    ws = Workspace(Path(tempfile.mkdtemp()) / "ws")
    (ws.root / "cases").mkdir(parents=True)
    authorization.set_mode(ws, "auto")
    base = llama_draft(
        free_port(),
        server,
        model,
        scenario="bench-np-c",
        dataset={"source": "synthetic", "input_tokens": 128, "output_tokens": 64, "tokenizer": model},
        load={"requests": requests, "concurrency": 1},
    )
    draft = {
        "campaign": {
            "name": "np-by-c",
            "base": base,
            "axes": [
                {"path": "service.argv[-np]", "values": [2, 4]},
                {"path": "load.concurrency", "values": [1, 2, 4]},
            ],
            "decision": {"primary_metric": "output_throughput"},
            "repeats": {"runs": 1, "settle_runs": 1, "budget": 0},
        }
    }
    t0 = time.monotonic()
    try:
        f = freeze_any(ws, draft=draft)
        assert isinstance(f, CampaignFrozen), f
        start_any(ws, f.campaign_id)
        v: CampaignView = until_complete(ws, f.campaign_id, timeout_s=7200.0, wait_s=60.0)
        print(summarize(ws, [f.campaign_id]).text())
        print(
            {
                "wall_s": round(time.monotonic() - t0, 1),
                **{
                    k: v.progress[k]
                    for k in ("runs", "service_starts", "elapsed_s", "formal_window_s", "formal_window_share")
                },
            }
        )
        print("mean per run:", where_time_went(ws))
    finally:
        services.stop_all(ws)


if __name__ == "__main__":
    main()
