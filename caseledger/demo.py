"""`caseledger demo`: the whole loop on the embedded reference target, in a fresh temporary workspace.

Starts nothing by hand: the baseline run's service phase starts the reference target, the child run
(only concurrency changed) reuses it and skips warmup and route verification. Prints the plans, the
side-by-side summary, the time ledger and HANDOFF.md, then stops everything it started.
"""

from __future__ import annotations

import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import orjson

from caseledger import procs, services
from caseledger.ledger import authorization
from caseledger.tools import freeze_case, phase_status, start_run, summarize
from caseledger.workspace import Workspace, read_json_or_none


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def drafts(port: int) -> tuple[dict[str, Any], dict[str, Any]]:  # JSON: case drafts
    n, c = 48, 4
    base: dict[str, Any] = {  # JSON: a case draft
        "$schema": "../schemas/case.schema.json",
        "scenario": "demo-chat-512-64",
        "note": f"demo baseline: {n} chat requests, 512 input / 64 output tokens, C={c}, unlimited rate",
        "target": {"endpoints": [{"base_url": f"http://127.0.0.1:{port}/v1", "model": "ref-model"}], "cards": 1},
        "service": {
            "adapter": "reference",
            "reference": {
                "prefill_tokens_per_s": 60000,
                "decode_step_s": 0.004,
                "decode_step_per_seq_s": 0.0004,
                "slots": 16,
            },
        },
        "dataset": {"source": "synthetic", "input_tokens": 512, "output_tokens": 64},
        "load": {"requests": n, "concurrency": c},
        "measurement": {"whole": {"min_requests": 32}, "native": {"min_requests": 16, "min_duration_s": 1.0}},
        "decision": {"primary_metric": "output_throughput_per_card", "window": "whole", "min_effect": 0.02},
    }
    child = orjson.loads(orjson.dumps(base))
    child["load"]["concurrency"] = 12
    child["note"] = "demo candidate: only concurrency changes (4 -> 12): the hot path"
    return base, child


def _sayer(out: TextIO) -> Callable[..., None]:
    def say(text: str = "") -> None:
        out.write(text + "\n")
        out.flush()

    return say


def demo(keep: bool = False, as_json: bool = False) -> int:
    """The demo; with as_json the narrative goes to stderr and stdout gets one JSON summary line."""
    _say = _sayer(sys.stderr if as_json else sys.stdout)
    t0 = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="caseledger-demo-"))
    ws = Workspace(root)
    (root / "cases").mkdir()
    authorization.set_mode(ws, "auto", why="demo workspace")
    port = _port()
    base, child = drafts(port)
    (root / "cases" / "baseline.json").write_bytes(orjson.dumps(base, option=orjson.OPT_INDENT_2))
    (root / "cases" / "c12.json").write_bytes(orjson.dumps(child, option=orjson.OPT_INDENT_2))
    _say(f"# caseledger demo — workspace {root}, reference target on 127.0.0.1:{port}\n")
    run_ids: list[str] = []
    ok = False
    try:
        _say("$ caseledger freeze cases/baseline.json")
        f1 = freeze_case(ws, "cases/baseline.json", cwd_first=False)
        _say(f1.text() + "\n")
        _say("$ caseledger run " + f1.case_id + " --wait")
        r1 = start_run(ws, f1.case_id, wait=True)
        _say(r1.text() + "\n")
        _say(f"$ caseledger freeze cases/c12.json --parent {f1.case_id}")
        f2 = freeze_case(ws, "cases/c12.json", parent=f1.case_id, cwd_first=False)
        _say(f2.text() + "\n")
        _say("$ caseledger run " + f2.case_id + " --wait")
        r2 = start_run(ws, f2.case_id, wait=True)
        _say(r2.text() + "\n")
        assert r1.run_id and r2.run_id, "start_run without queue always creates a run"
        run_ids = [r1.run_id, r2.run_id]
        for rid in (r1.run_id, r2.run_id):
            _say(f"$ caseledger status {rid}")
            _say(phase_status(ws, rid).text() + "\n")
        _say(f"$ caseledger summarize {r1.run_id} {r2.run_id}")
        s = summarize(ws, [r1.run_id, r2.run_id])
        _say(s.text() + "\n")
        if s.side_by_side:
            _say(s.side_by_side)
        _say("## time ledger (seconds)")
        for r in s.runs:
            tl = r.time_ledger or {}
            ph = " ".join(f"{k}={v}" for k, v in tl.get("phases", {}).items())
            _say(
                f"{r.run_id}: start_run->first formal request {tl.get('start_run_to_first_formal_request_s')} s, "
                f"formal window {tl.get('formal_window_s')} s, outside it {tl.get('outside_formal_window_s')} s"
            )
            _say(f"  phases: {ph}")
        _say("\n$ cat HANDOFF.md")
        _say(ws.handoff.read_text())
        ok = r1.state == "succeeded" and r2.state == "succeeded"
    finally:
        stopped = services.stop_all(ws)
        left = _leftovers(ws)
        _say(f"stopped services: {', '.join(stopped) or 'none'}; processes left: {len(left)}")
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            _say(f"workspace kept at {root}")
    _say(f"demo {'passed' if ok and not left else 'FAILED'} in {time.monotonic() - t0:.1f} s")
    if as_json:
        sys.stdout.write(
            orjson.dumps(
                {
                    "passed": ok and not left,
                    "seconds": round(time.monotonic() - t0, 1),
                    "runs": run_ids,
                    "processes_left": len(left),
                    "workspace": str(root) if keep else None,
                }
            ).decode()
            + "\n"
        )
    return 0 if ok and not left else 1


def _leftovers(ws: Workspace) -> list[int]:
    """Pids of controllers, load clients and services of this workspace that still run."""

    left = []
    for d in ws.runs_dir.iterdir() if ws.runs_dir.exists() else []:
        for f in (d / "controller.pid.json", d / "load" / "pid.json"):
            ref = read_json_or_none(f)
            if ref and procs.alive(ref):
                left.append(int(ref["pid"]))
    for f in ws.services_dir.glob("*.json") if ws.services_dir.exists() else []:
        ref = (read_json_or_none(f) or {}).get("proc")
        if ref and procs.alive(ref):
            left.append(int(ref["pid"]))
    return left
