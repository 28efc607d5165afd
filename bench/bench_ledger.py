"""The ledger at scale: every hot read timed on a workspace of N valid runs (issue 25).

The runs are written directly in the ledger's formats (run.json, case.json, events.jsonl, load/end.json,
load/raw.jsonl, results/<version>/…/result.json, decision.json), never by a real load: the cases are frozen by
freeze_case, one result per case is computed by the real processor (compute_result) from synthetic raw records,
and every run of the case hard-links those files. Each read then runs in a fresh interpreter (as the CLI and a
new MCP session do): its tool time (perf_counter around the call, after the imports; a first and a second call),
the peak of Python allocations during a third call (tracemalloc) and the process's ru_maxrss.

    .venv/bin/python bench/bench_ledger.py 1000 10000 [--keep DIR] [--reuse DIR]

Reads: status (phase_status of the latest run), phase_status of a given run, summarize of a scenario, handoff
(`caseledger handoff`: regenerate HANDOFF.md), and the controller's HANDOFF refresh per phase (a phase_started
event appended to a running run, then handoff.refresh, as run/controller.py does before every phase).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402

SCENARIOS = 10  # scenarios in the workspace
CASES = 10  # cases per scenario (a sweep of load.concurrency)
ACTIVE = 2  # scenarios with runs in the last hours (both must show in HANDOFF.md)
PHASES = (
    "preflight",
    "service",
    "warmup",
    "route_verify",
    "cache_prepare",
    "load",
    "confirm_end",
    "postprocess",
    "decide",
)
T0 = 1_000_000_000_000


def _draft(scenario: str, c: int) -> dict[str, Any]:
    return {
        "scenario": scenario,
        "target": {"endpoints": [{"base_url": "http://127.0.0.1:9/v1", "model": "ref-model"}]},
        "service": {
            "adapter": "reference",
            "reference": {
                "prefill_tokens_per_s": 200000,
                "decode_step_s": 0.002,
                "decode_step_per_seq_s": 0.0002,
                "slots": 8,
            },
        },
        "dataset": {"source": "synthetic", "input_tokens": 64, "output_tokens": 8},
        "load": {"requests": 64, "concurrency": c},
        "measurement": {"whole": {"min_requests": 8}, "native": {"min_requests": 4, "min_duration_s": 0.01}},
        "decision": {"primary_metric": "output_throughput", "window": "whole", "limits": {"tpot_p99_ms": 50}},
    }


def _records(n: int, c: int, seed: int) -> list[dict[str, Any]]:
    """n raw records at concurrency c: 8 content chunks each, times spread a little by seed."""
    out = []
    ms = 1_000_000
    step = 2 + (seed % 5) * 0.1 + c * 0.05
    for i in range(n):
        send = T0 + (i // c) * int(20 * step * ms) + (i % c) * 1000
        first = send + int((5 + (i * 7 + seed) % 3) * ms)
        chunks = [first + int(k * step * ms) for k in range(8)]
        out.append(
            {
                "i": i,
                "entry": i,
                "route": 0,
                "send_ns": send,
                "chunk_ns": chunks,
                "chunk_tokens": [1] * 8,
                "end_ns": chunks[-1] + 1000,
                "status": 200,
                "ok": True,
                "error": None,
                "error_class": None,
                "prompt_tokens": 70,
                "completion_tokens": 8,
                "cached_tokens": 0,
                "finish_reason": "length",
                "input_tokens_body": 64,
                "input_tokens_chat": 70,
            }
        )
    return out


def _events(run_id: str, created: datetime, end: dict[str, Any], result_path: str) -> bytes:
    lines = []
    seq = 0
    t = created

    def ev(type_: str, phase: str | None = None, data: dict[str, Any] | None = None) -> None:
        nonlocal seq, t
        seq += 1
        t += timedelta(milliseconds=200)
        lines.append(
            orjson.dumps(
                {
                    "seq": seq,
                    "utc": t.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                    "mono_ns": seq * 10**8,
                    "run": run_id,
                    "phase": phase,
                    "attempt": 1 if phase else None,
                    "type": type_,
                    "owner": "bench",
                    "fence": 1,
                    "input_hash": None,
                    "outputs": {},
                    "error": None,
                    "data": data or {},
                }
            )
        )

    ev("run_created")
    ev("controller_started", data={"pid": 1})
    for p in PHASES:
        ev("phase_started", p)
        data: dict[str, Any] = {"outcome": "done"}
        if p == "load":
            data.update({"sent": end["sent"], "done": end["done"]})
        if p == "postprocess":
            data["result"] = result_path
        ev("phase_ended", p, data)
    ev("run_ended", data={"outcome": "succeeded"})
    return b"\n".join(lines) + b"\n"


_Template = tuple[str, str, Path, dict[str, Any]]  # (case id, scenario, template dir, end + result path)


def build(
    root: Path,
    n_runs: int,
    scenarios: int = SCENARIOS,
    cases_per: int = CASES,
    active: int = ACTIVE,
    blocked: bool = False,
    recent: int | None = None,
) -> dict[str, Any]:
    """A workspace of n_runs succeeded runs over scenarios × cases_per frozen cases, the last `active` scenarios
    with runs in the last hours (interleaved, or blocked: all of one scenario's, then the next's), and one run in
    progress (the newest); returns what the reads need.
    tests/test_index.py builds its ledgers here too."""
    from caseledger.ledger import authorization
    from caseledger.workspace import Workspace

    ws = Workspace(root)
    (root / "cases").mkdir(parents=True, exist_ok=True)
    authorization.set_mode(ws, "auto")
    templates = root / ".bench-templates"
    cases = _templates(ws, templates, scenarios, cases_per)
    # the runs: the oldest scenarios first, the last ACTIVE scenarios interleaved in the last hours
    old = [cs for cs in cases if int(cs[1][-2:]) < scenarios - active]
    new = [cs for cs in cases if int(cs[1][-2:]) >= scenarios - active]
    n_new = recent if recent is not None else max(len(new), n_runs // 10)  # runs in the last hours
    order = ([old[i % len(old)] for i in range(n_runs - n_new)] if old else []) + sorted(
        (new[i % len(new)] for i in range(n_new)), key=lambda cs: cs[1] if blocked else ""
    )
    ids = _runs(ws, order, n_new)
    shutil.rmtree(templates)
    live = _live_run(ws, f"r-{len(order):08x}", new[-1], ids[-1][0])
    return {
        "latest": live,
        "some_run": ids[len(ids) // 2][0],
        "scenario": ids[-1][1],
        "active": [f"bench-s{s:02d}" for s in range(scenarios - active, scenarios)],
        "inactive": [f"bench-s{s:02d}" for s in range(scenarios - active)],
    }


def _templates(ws: Any, templates: Path, scenarios: int, cases_per: int) -> list[_Template]:
    """Every case frozen by freeze_case, with the files its runs share: case.json, 64 raw records, the result the
    real processor computes from them, the decision against the scenario's first case, the end file."""
    from caseledger.case.store import load_case
    from caseledger.metrics import columns_from_records, compute_result, write_result
    from caseledger.outcome.decide import decide
    from caseledger.tools import freeze_case
    from caseledger.workspace import canonical_json

    cases: list[_Template] = []
    base_result = {}
    for s in range(scenarios):
        name = f"bench-s{s:02d}"
        for k in range(cases_per):
            c = k + 1
            parent = base_result[name][0] if k else None  # the sweep's children name its first case
            cid = freeze_case(ws, draft=_draft(name, c), parent=parent).case_id
            case = load_case(ws, cid)
            t = templates / cid
            (t / "load").mkdir(parents=True)
            (t / "case.json").write_bytes(canonical_json(case.canonical()) + b"\n")
            recs = _records(64, c, s * 31 + k)
            (t / "load" / "raw.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
            result = compute_result(case, columns_from_records(recs))
            path = write_result(t, result)
            if k == 0:
                base_result[name] = (cid, result)
                dec = decide(case, result, None, None, load_ended=True)
            else:
                bcid, bres = base_result[name]
                dec = decide(case, result, bres, bcid, load_ended=True, candidate_case=cid)
            (t / "decision.json").write_bytes(orjson.dumps(dec.model_dump(mode="json")))
            end = {"planned": 64, "sent": 64, "done": 64, "ok": 64, "failed": 0}
            (t / "load" / "end.json").write_bytes(orjson.dumps(end))
            cases.append((cid, name, t, {**end, "result_rel": str(path.relative_to(t))}))
    return cases


def _runs(ws: Any, order: list[_Template], n_new: int) -> list[tuple[str, str]]:
    """One run directory per entry of `order`, hard-linking its case's files; the last n_new in the last hours,
    the others a month ago, a minute apart. Returns (run id, scenario) in order."""
    now = datetime.now(UTC)
    runs_dir = ws.runs_dir
    runs_dir.mkdir(parents=True, exist_ok=True)
    ids = []
    for i, (cid, name, t, end) in enumerate(order):
        recent = i >= len(order) - n_new
        created = (
            now - timedelta(seconds=(len(order) - i) * 2)
            if recent
            else now - timedelta(days=30) + timedelta(seconds=i * 60)
        )
        rid = f"r-{i:08x}"
        d = runs_dir / rid
        (d / "load").mkdir(parents=True)
        (d / "results").mkdir()
        for rel in ("case.json", "load/raw.jsonl", "load/end.json", "decision.json", end["result_rel"]):
            dst = d / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.link(t / rel, dst)
        env = (t / end["result_rel"]).parent / "env.json"
        if env.exists():
            os.link(env, (d / end["result_rel"]).parent / "env.json")
        (d / "run.json").write_bytes(orjson.dumps(_meta(rid, cid, name, str(ws.root), created)))
        (d / "events.jsonl").write_bytes(_events(rid, created, end, str(d / end["result_rel"])))
        ids.append((rid, name))
    return ids


def _meta(rid: str, cid: str, scenario: str, root: str, created: datetime) -> dict[str, Any]:
    return {
        "run_id": rid,
        "case_id": cid,
        "scenario": scenario,
        "parent_case": None,
        "workspace": root,
        "dataset_id": "d-bench",
        "salt": None,
        "planned": 64,
        "target_key": "bench-target",
        "created_utc": created.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "plan": [{"phase": p, "action": "run", "reason": "bench"} for p in PHASES],
        "fence": 1,
        "authorized": "auto",
        "controller_spawned": True,
    }


def _live_run(ws: Any, live: str, case: _Template, newest: str) -> str:
    """One run in progress (the controller's refresh appends to it): its controller "alive" (the bench's own
    process stands in: the reads see a live process)."""
    from caseledger import procs

    runs_dir = ws.runs_dir
    d = runs_dir / live
    (d / "load").mkdir(parents=True)
    cid, name, _, _ = case
    now = datetime.now(UTC)
    shutil.copy(runs_dir / newest / "case.json", d / "case.json")
    meta = orjson.loads((runs_dir / newest / "run.json").read_bytes())
    meta.update(
        run_id=live,
        case_id=cid,
        scenario=name,
        created_utc=now.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    )
    (d / "run.json").write_bytes(orjson.dumps(meta))
    events = [json.loads(x) for x in _events(live, now, {"sent": 0, "done": 0}, "").splitlines()[:2]]
    (d / "events.jsonl").write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    (d / "controller.pid.json").write_bytes(orjson.dumps(procs.me()))  # alive while the bench runs (RunPaths)
    return live


REBUILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
from caseledger.ledger.index import open_index
from caseledger.workspace import Workspace
t = time.perf_counter()
with open_index(Workspace(sys.argv[2]), rebuild=True) as idx:
    n = idx.count()
print(json.dumps({"s": time.perf_counter() - t, "runs": n,
                  "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def rebuild_index(root: Path) -> dict[str, Any]:
    """The index built from the files once, in a fresh interpreter (`caseledger index --rebuild` does the same): the
    builder writes the files only, as an index lost or damaged would leave them. Not a read: the reads below then
    find the index the ledger's writers keep in step."""
    p = subprocess.run(
        [sys.executable, "-c", REBUILD, str(ROOT), str(root)], capture_output=True, text=True, timeout=1800
    )
    if p.returncode != 0:
        return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"}
    out: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


# ------------------------------------------------------------------------------------------------ the reads

CHILD = r"""
import json, os, resource, statistics, sys, time, tracemalloc
sys.path.insert(0, sys.argv[1])
from caseledger.workspace import Workspace
ws = Workspace(sys.argv[2]); what = sys.argv[3]; arg = sys.argv[4]
from caseledger.views import handoff
from caseledger.tools import phase_status, summarize
from caseledger.ledger.events import append_event
if what == "controller_refresh":
    import caseledger.run.controller  # noqa: F401 - what a controller process has imported before its first phase
PHASES = ["preflight", "service", "warmup", "route_verify", "cache_prepare", "load", "confirm_end", "postprocess",
          "decide"]
phases = iter(PHASES * 3)

def call():
    if what == "status":
        return phase_status(ws)
    if what == "phase_status":
        return phase_status(ws, arg)
    if what == "summarize_scenario":  # the text/JSON answer; its chart is timed apart (chart_png, below)
        return summarize(ws, [], scenario=arg)
    if what == "handoff":
        return handoff.refresh(ws)
    if what == "controller_refresh":  # as run/controller.py before each phase: an event, then the refresh
        append_event(ws, ws.run(arg), "phase_started", phase=next(phases), attempt=1, owner="bench")
        return handoff.refresh(ws)
    raise SystemExit(what)

extra = {}
if what == "summarize_scenario":  # a view nobody drew yet (as after a new result): its PNG must be drawn
    for f in (ws.reports_dir).glob(f"scenario-{arg}-*.png"):
        f.unlink()
times = []
for _ in range(len(PHASES) if what == "controller_refresh" else 2):  # a controller: one refresh per phase
    t = time.perf_counter(); out = call(); times.append(time.perf_counter() - t)
    if what == "summarize_scenario":  # the PNG the MCP answer attaches (drawn in memory: no writer drew this view)
        from caseledger.tools.summarize import chart_png
        t = time.perf_counter(); chart_png(ws, out); extra.setdefault("plot_s", []).append(time.perf_counter() - t)
if what == "controller_refresh":
    extra["later_median_s"] = statistics.median(times[1:]); extra["later_max_s"] = max(times[1:])
tracemalloc.start(); call(); peak = tracemalloc.get_traced_memory()[1]; tracemalloc.stop()
text = out if isinstance(out, str) else out.text()
print(json.dumps({"first_s": times[0], "second_s": times[1], "peak_mb": peak / 2**20,
                  "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "text": text, **extra}))
"""

READS = ("status", "phase_status", "summarize_scenario", "handoff", "controller_refresh")


def read(root: Path, what: str, arg: str) -> dict[str, Any]:
    env = {**os.environ, "CASELEDGER_HOST_DIR": str(root.parent / "host")}
    p = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT), str(root), what, arg],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if p.returncode != 0:
        return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"}
    out: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


def mcp_ready(root: Path) -> float | None:
    """Seconds from spawning `caseledger mcp` to its answer to `initialize` over stdio."""
    exe = Path(sys.executable).parent / "caseledger"
    if not exe.exists():
        return None
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "0"},
        },
    }
    t = time.perf_counter()
    p = subprocess.Popen(
        [str(exe), "mcp", "--workspace", str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write(json.dumps(init).encode() + b"\n")
    p.stdin.flush()
    line = p.stdout.readline()
    took = time.perf_counter() - t
    p.stdin.close()
    try:
        p.wait(5)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    return took if b'"result"' in line else None


def _extra(r: dict[str, Any]) -> str:
    if "plot_s" in r:
        return f"  (PNG: drawn in memory {r['plot_s'][0]:.3f} s, then kept by the process {r['plot_s'][1]:.3f} s)"
    if "later_median_s" in r:
        return f"  (phases 2-9: median {r['later_median_s']:.4f} s, max {r['later_max_s']:.4f} s)"
    return ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sizes", nargs="*", type=int, default=[1000, 10000])
    ap.add_argument("--keep", type=Path, help="build the workspaces under DIR and keep them")
    ap.add_argument("--reuse", type=Path, help="read the workspaces already under DIR (built by --keep)")
    ap.add_argument("--reads", default=",".join(READS), help="comma-separated subset of " + ", ".join(READS))
    ap.add_argument("--show", action="store_true", help="print each read's answer text")
    args = ap.parse_args()
    base = args.reuse or args.keep or Path(tempfile.mkdtemp(prefix="bench-ledger-"))
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}; workspaces under {base}")
    try:
        for n in args.sizes:
            root = base / f"ws-{n}"
            info_file = root / "bench-info.json"
            if args.reuse and info_file.exists():
                info = json.loads(info_file.read_text())
            else:
                if root.exists():
                    shutil.rmtree(root)
                t = time.perf_counter()
                info = build(root, n)
                info_file.write_text(json.dumps(info))
                print(f"\n{n} runs: built in {time.perf_counter() - t:.1f} s")
                idx = rebuild_index(root)
                print(f"index rebuilt from the files (once): {idx}")
            from caseledger import procs  # the live run's controller: this process, alive while it reads

            (root / "ledger" / "runs" / info["latest"] / "controller.pid.json").write_bytes(orjson.dumps(procs.me()))
            print(f"{'read':<20} {'1st s':>8} {'2nd s':>8} {'peak MB':>8} {'rss MB':>8}")
            for what in args.reads.split(","):
                arg = {
                    "phase_status": info["some_run"],
                    "summarize_scenario": info["scenario"],
                    "controller_refresh": info["latest"],
                }.get(what, "")
                r = read(root, what, arg)
                if "error" in r:
                    print(f"{what:<20} error: {r['error']}")
                    continue
                print(
                    f"{what:<20} {r['first_s']:>8.3f} {r['second_s']:>8.3f} {r['peak_mb']:>8.1f} "
                    f"{r['maxrss_mb']:>8.1f}{_extra(r)}"
                )
                if args.show:
                    print(r["text"])
            ready = mcp_ready(root)
            print(f"{'mcp initialize':<20} {ready if ready is not None else float('nan'):>8.3f}")
    finally:
        if not args.keep and not args.reuse:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
