"""A 12-point campaign on one target, then the same campaign on a pool of two: the wall-time ratio, the answers
(the same winner, or the same declared tie), the service starts, and the noise the pool's answer reports (run to
run on one target, between the targets).

By hand, on a quiet host (hold the CPU lock):
  `.venv/bin/python bench/bench_pool.py reference [N]`   two reference targets (the embedded engine), N requests
  `set -a; . ~/.cache/caseledger/llama.env; set +a; .venv/bin/python bench/bench_pool.py llama [N]`
                                                     two llama-servers of one thread each (-t 1)
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from caseledger import services
from caseledger.campaign.view import CampaignView
from caseledger.ledger import authorization
from caseledger.tools import freeze_any, start_any
from caseledger.tools.campaigns import CampaignFrozen
from caseledger.workspace import Workspace
from tests.conftest import free_port, knee_base, until_complete
from tests.engine import llama_draft, llama_paths


def _base(kind: str, port: int, requests: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The base case and the axes of a 12-point campaign on that kind of target."""
    if kind == "reference":
        base = knee_base(port, "pool-bench", requests)
        return base, [{"path": "load.concurrency", "values": [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16]}]
    server, model = llama_paths()
    base = llama_draft(
        port,
        server,
        model,
        scenario="pool-bench",
        dataset={"source": "synthetic", "input_tokens": 64, "output_tokens": 32, "tokenizer": model},
        load={"requests": requests, "concurrency": 1},
    )
    argv = base["service"]["argv"]
    argv[argv.index("-t") + 1] = "1"  # one core each
    return base, [
        {"path": "service.argv[-np]", "values": [2, 4]},
        {"path": "load.concurrency", "values": [1, 2, 3, 4, 6, 8]},
    ]


def run(kind: str, targets: int, requests: int) -> dict[str, Any]:
    ws = Workspace(Path(tempfile.mkdtemp()) / "ws")
    (ws.root / "cases").mkdir(parents=True)
    authorization.set_mode(ws, "auto")
    ports = [free_port() for _ in range(targets)]
    base, axes = _base(kind, ports[0], requests)
    base["measurement"] = {"evidence": {"max_other_cpu_share": 1.0}}  # the targets share this host (both runs)
    body: dict[str, Any] = {
        "name": "pool-bench",
        "base": base,
        "axes": axes,
        "decision": {
            "primary_metric": "output_throughput",
            "limits": {"tpot_p99_ms": 11.0 if kind == "reference" else 60.0},
        },
        "repeats": {"runs": 1, "settle_runs": 3, "budget": 6},
    }
    if targets > 1:
        body["pool"] = [
            {"name": f"t{i}", "set": {"target.endpoints.0.base_url": f"http://127.0.0.1:{p}/v1"}}
            for i, p in enumerate(ports)
        ]
    t0 = time.monotonic()
    try:
        f = freeze_any(ws, draft={"campaign": body})
        assert isinstance(f, CampaignFrozen), f
        start_any(ws, f.campaign_id)
        v: CampaignView = until_complete(ws, f.campaign_id, timeout_s=7200.0, wait_s=60.0)
        label = {r.case_id: r.label for r in v.rows}
        return {
            "targets": targets,
            "wall_s": round(time.monotonic() - t0, 1),
            "answer": label.get(v.winner or "", "tie " + "/".join(sorted(label[c] for c in v.tie))),
            "runs": v.progress["runs"],
            "starts": v.progress["service_starts"],
            "noise": v.answer.split("noise seen: ", 1)[1] if "noise seen: " in v.answer else "-",
        }
    finally:
        services.stop_all(ws)


def main() -> None:
    kind = sys.argv[1] if len(sys.argv) > 1 else "reference"
    requests = int(sys.argv[2]) if len(sys.argv) > 2 else (32 if kind == "reference" else 16)
    one = run(kind, 1, requests)
    print(one, flush=True)
    two = run(kind, 2, requests)
    print(two, flush=True)
    print(
        f"{kind}: pool of 2 / one target wall time = {two['wall_s'] / one['wall_s']:.2f}; same answer: "
        f"{one['answer'] == two['answer']}"
    )


if __name__ == "__main__":
    main()
