"""The sample trace (cases/trace-sample.jsonl) replayed K times: how closely the load client keeps the trace's
schedule (arrival error = send time - due time, per request, from each run's result) on the reference target,
and on a real llama-server when llama.env is loaded. Each replay is a salted repeat of one case (the service
started once); the figures pool every replay's requests, so p99 is a percentile, not the maximum of 24.

    .venv/bin/python bench/bench_trace.py [K] [--engine]   (by hand, on a quiet host)
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from caseledger import services  # noqa: E402
from caseledger.ledger import authorization  # noqa: E402
from caseledger.tools import freeze_case, start_run  # noqa: E402
from caseledger.workspace import Workspace  # noqa: E402
from tests.conftest import free_port  # noqa: E402

TRACE = "cases/trace-sample.jsonl"


def _draft(engine: bool) -> dict[str, object]:
    port = free_port()
    if engine:
        from tests.engine import llama_paths, llama_template

        server, model = llama_paths()
        return llama_template("llamacpp-trace.json", port, server, model)
    d = orjson.loads((ROOT / "cases/ref-trace.json").read_bytes())
    d["target"]["endpoints"][0]["base_url"] = f"http://127.0.0.1:{port}/v1"
    return dict(d)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("k", nargs="?", type=int, default=5)
    ap.add_argument("--engine", action="store_true", help="llama-server (llama.env loaded) instead of the reference")
    args = ap.parse_args()
    ws = Workspace(Path(tempfile.mkdtemp(prefix="bench-trace-")) / "ws")
    (ws.root / "cases").mkdir(parents=True)
    shutil.copy(ROOT / TRACE, ws.root / TRACE)
    authorization.set_mode(ws, "auto")
    draft = _draft(args.engine)
    draft["load"] = {**dict(draft["load"]), "salt": True}  # type: ignore[arg-type]
    errors: list[float] = []
    try:
        case_id = freeze_case(ws, draft=draft).case_id
        for k in range(args.k):
            run = start_run(ws, case_id, wait=True, timeout_s=900)
            recs = [orjson.loads(x) for x in ws.run(run.run_id).raw.read_bytes().splitlines()]
            mine = sorted((r["send_ns"] - r["sched_ns"]) / 1e6 for r in recs if "sched_ns" in r)
            errors += mine
            print(f"replay {k + 1}: {run.state}, {len(mine)} requests, max {mine[-1]:.3f} ms", flush=True)
    finally:
        services.stop_all(ws)
    errors.sort()

    def pct(q: float) -> float:
        return errors[min(len(errors) - 1, round(q * (len(errors) - 1)))]

    late = sum(1 for e in errors if e > 1.0)
    print(
        f"{'llama-server' if args.engine else 'reference'}: {len(errors)} sends over {args.k} replays: arrival "
        f"error min {errors[0]:.3f} p50 {pct(0.5):.3f} p99 {pct(0.99):.3f} max {errors[-1]:.3f} ms; {late} "
        "more than 1 ms late"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
