"""Helpers the test modules share, in one place: waiting on a condition, counting at the reference target and its
launch argv; the fault matrix's cells and the facts of a run killed in the middle; the knee campaign; the MCP
server's workspace and answers, a call through the CLI and through MCP alike; a run directory without a process,
the load client's case, the report's and the AISBench import's data.

Fixtures and pytest's hooks stay in tests/conftest.py; what a test module calls goes here, never into another test
module (a test module imports helpers, not tests)."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import sqlite3
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from caseledger.case.phases import PHASES, Phase
from tests.conftest import free_port, knee_base, ref_draft, stats

if TYPE_CHECKING:
    import pytest
    from mcp.types import CallToolResult

    from caseledger.campaign.view import CampaignView
    from caseledger.case.model import Case
    from caseledger.records import RawRecord
    from caseledger.tools import StatusResult
    from caseledger.workspace import RunPaths, Workspace


def wait_until(pred: Callable[[], Any], timeout: float = 60.0, what: str = "") -> Any:
    """pred()'s first truthy answer, polled every 20 ms; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := pred():
            return got
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def by_phase(port: int, phase: str = "load") -> int:
    """Requests the reference target on the port received in a phase (its x-caseledger-phase header)."""
    return int(stats(port)["by_phase"].get(phase, 0))


def target_argv(port: int | str = "{port}", host: str | None = "{host}", model: str = "ref-model") -> list[str]:
    """The reference target's launch argv: by default with the placeholders a command-adapter case fills; no
    --host (host None) serves on the target's default address."""
    argv = [sys.executable, "-m", "caseledger.target", "serve"]
    argv += ["--host", host] if host is not None else []
    return [*argv, "--port", str(port), "--model", model]


# ------------------------------------------------------------------ the fault matrix's cells, runs killed midway

N = 8  # formal requests of every fault cell's case (C=2)
FAST = {"prefill_tokens_per_s": 200000, "decode_step_s": 0.002, "decode_step_per_seq_s": 0.0002, "slots": 8}


class Cell:
    """The checks of one cell, recorded into the matrix as they are made; `ok()` fails the test at the end
    with every failed check (so the matrix shows all of them, not only the first)."""

    def __init__(self, matrix: dict[str, dict[str, bool]], name: str) -> None:
        self.checks = matrix.setdefault(name, {})
        self.checks.clear()
        self.failures: list[str] = []

    def check(self, name: str, passed: bool, detail: object = "") -> bool:
        self.checks[name] = self.checks.get(name, True) and bool(passed)
        if not passed:
            self.failures.append(f"{name}: {detail}")
        return bool(passed)

    def ok(self) -> None:
        assert not self.failures, "failed checks:\n" + "\n".join(self.failures)


@contextmanager
def cell(matrix: dict[str, dict[str, bool]], name: str) -> Iterator[Cell]:
    c = Cell(matrix, name)
    try:
        yield c
    except BaseException as e:
        c.check("ran", False, f"{type(e).__name__}: {e}")
        raise
    c.ok()


def settled(ws: Workspace, run_id: str, timeout: float = 90) -> StatusResult:
    """Status once the run's controller is gone and the run is no longer running."""
    from caseledger.tools import phase_status  # lazy: the tools pull numpy

    def done() -> StatusResult | None:
        s = phase_status(ws, run_id)
        return s if s.state not in ("running", "created") and not s.owner_alive else None

    return wait_until(done, timeout, f"run {run_id} to settle")  # type: ignore[no-any-return]


def service_state(ws: Workspace, run_id: str) -> dict[str, Any]:
    from caseledger.ledger.state import fold

    key = fold(ws, run_id).meta.target_key
    p = ws.services_dir / f"{key}.json"
    return dict(orjson.loads(p.read_bytes())) if p.exists() else {}


def service_pid(ws: Workspace, run_id: str) -> int:
    return int(service_state(ws, run_id)["proc"]["pid"])


def ended_ok(ws: Workspace, run_id: str) -> Counter[str]:
    """Per phase, how many times it ended done/reused/skipped (what 'ran once' counts)."""
    from caseledger.ledger.event_types import PhaseEnded
    from caseledger.ledger.events import read_events

    return Counter(
        e.phase
        for e in read_events(ws.run(run_id)).events
        if isinstance(e, PhaseEnded) and e.data.outcome in ("done", "reused", "skipped")
    )


def clients(ws: Workspace, run_id: str) -> int:
    """How many load clients were started for the formal load (one, whatever was killed)."""
    from caseledger.ledger.events import read_events

    return sum(e.type == "load_client_started" for e in read_events(ws.run(run_id)).events)


def why(ws: Workspace, run_id: str | None) -> str:
    """A run's status and the end of its controller log: what a failed check shows."""
    from caseledger.tools import phase_status

    if run_id is None:
        return "no run"
    log = ws.run(run_id).controller_log
    return phase_status(ws, run_id).text() + "\ncontroller.log: " + (log.read_text()[-600:] if log.exists() else "-")


def runs_of(ws: Workspace) -> int:
    return len(list(ws.runs_dir.iterdir())) if ws.runs_dir.exists() else 0


def raw_lines(path: Path) -> int:
    return len(path.read_bytes().splitlines()) if path.exists() else 0


def after(phase: str) -> list[str]:
    """The phases after this one, in order."""
    return [p.value for p in PHASES[PHASES.index(Phase(phase)) + 1 :]]


def slow_draft(port: int, tokens: int = 48, **over: Any) -> dict[str, Any]:
    """A formal load slow enough to kill things in the middle of it: 8 requests of `tokens` tokens at 0.02 s a step,
    C=2 (about 5 s at 48 tokens, 2.5 s at 24); `over` merged into it as ref_draft merges."""
    base: dict[str, Any] = {
        "service": {"reference": {**FAST, "decode_step_s": 0.02, "decode_step_per_seq_s": 0.0}},
        "dataset": {"source": "synthetic", "input_tokens": 64, "output_tokens": tokens},
    }
    for k, v in over.items():
        base[k] = {**base[k], **v} if isinstance(v, dict) and k in base else v
    return ref_draft(port, **base)


def wait_state(ws: Workspace, run_id: str, pred: Any, timeout: float = 60) -> Any:
    """The run's status once pred(status) holds; AssertionError with the last status after `timeout` seconds."""
    from caseledger.tools import phase_status

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = phase_status(ws, run_id)
        if pred(s):
            return s
        time.sleep(0.1)
    raise AssertionError(f"timed out; last status:\n{phase_status(ws, run_id).text()}")


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def race(*calls: Callable[[], Any]) -> list[Any]:
    """Run the calls in threads released at the same instant; each one's result or exception."""
    barrier = threading.Barrier(len(calls))
    out: list[Any] = [None] * len(calls)

    def go(k: int) -> None:
        barrier.wait()
        try:
            out[k] = calls[k]()
        except Exception as e:
            out[k] = e

    threads = [threading.Thread(target=go, args=(k,)) for k in range(len(calls))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(180)
    return out


# ------------------------------------------------------------------------------------------------- campaigns


def knee_campaign(port: int, values: list[int], limit: float = 11.0, **over: Any) -> dict[str, Any]:
    """A knee campaign on load.concurrency over the knee target (tests/conftest.py KNEE_TARGET), 32 requests a
    point, output throughput under a TPOT p99 limit."""
    body = {
        "name": "knee-c",
        "base": knee_base(port, "knee", 32),
        "axes": [{"path": "load.concurrency", "values": values}],
        "search": {"kind": "knee", "axis": "load.concurrency", "monotone": True},
        "decision": {"primary_metric": "output_throughput", "limits": {"tpot_p99_ms": limit}},
        **over,
    }
    return {"campaign": body}


def until_complete(ws: Workspace, campaign_id: str, timeout_s: float = 300.0, wait_s: float = 30.0) -> CampaignView:
    """The campaign's view once it is complete and its driver has exited (phase_status waits, wait_s at most
    each); AssertionError with the view's text after timeout_s."""
    from caseledger.campaign.view import CampaignView, campaign_view
    from caseledger.tools import status_any

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = status_any(ws, campaign_id, wait_s=wait_s)
        assert isinstance(v, CampaignView)
        if v.complete and not v.driver_alive:
            return v
    raise AssertionError(campaign_view(ws, campaign_id).text())


# ------------------------------------------------------------------------------------------------ the MCP server

SIX = ["freeze_case", "start_run", "phase_status", "resume", "reprocess_raw", "summarize"]  # the server's tools
SHORT = 600  # bytes: an answer an agent reads every poll
REPO = Path(__file__).resolve().parents[1]


def baseline_draft(port: int, requests: int = 8) -> dict[str, Any]:
    """cases/ref-baseline.json against the reference target on the port."""
    d: dict[str, Any] = json.loads((REPO / "cases" / "ref-baseline.json").read_text())
    d.pop("$schema", None)
    d["target"]["endpoints"][0]["base_url"] = f"http://127.0.0.1:{port}/v1"
    d["load"]["requests"] = requests
    return d


def mcp_workspace(tmp_path: Path) -> Workspace:
    """A workspace as an agent's MCP server opens it: cases/draft.json is the baseline on a free port."""
    from caseledger.workspace import Workspace

    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "draft.json").write_text(json.dumps(baseline_draft(free_port())))
    return Workspace.open(tmp_path)


def text_of(r: CallToolResult) -> str:
    """A tool result's text."""
    from mcp.types import TextContent

    return "\n".join(c.text for c in r.content if isinstance(c, TextContent))


# ------------------------------------------------------------------------------------ the CLI and MCP alike


def cli_call(ws: Workspace, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """The CLI's exit code and what it wrote (stdout and stderr) for argv in the workspace."""
    from caseledger import cli

    rc = cli.main(["-w", str(ws.root), *argv])
    out = capsys.readouterr()
    return rc, out.out + out.err


def mcp_call(ws: Workspace, tool: str, args: dict[str, Any]) -> CallToolResult:
    """One tool call on the workspace's MCP server, in memory."""
    import anyio
    from mcp import Client

    from caseledger.server import build_server

    async def go() -> CallToolResult:
        async with Client(build_server(ws)) as c:
            return await c.call_tool(tool, args)

    return anyio.run(go)


def assert_refused(text: str, *needles: str) -> None:
    """A clean refusal: names what is wrong and the fix; no traceback, no bug report, no bare tool error."""
    assert "Traceback" not in text and "caseledger bug" not in text, text
    assert "fix:" in text, text
    for n in needles:
        assert n in text, (n, text)


def fake_run(ws: Workspace, rid: str, created: str) -> Path:
    """A run directory as create_run writes it (run.json and the hash-checked case copy), without a process; its
    root."""
    from caseledger.case.model import Case
    from caseledger.case.store import case_id_of, store
    from caseledger.ledger.runs import RunMeta, write_meta
    from caseledger.workspace import atomic_write, canonical_json

    case = Case.model_validate(ref_draft(1)).filled()
    store(ws, case)
    paths = ws.run(rid)
    paths.root.mkdir(parents=True)
    atomic_write(paths.case, canonical_json(case.canonical()) + b"\n")
    write_meta(
        paths,
        RunMeta(
            run_id=rid,
            case_id=case_id_of(case),
            scenario="ref-test",
            workspace=str(ws.root),
            planned=8,
            target_key="t-test",
            created_utc=created,
        ),
    )
    return paths.root


# ------------------------------------------------------------------------------------------ load, report, import

RUN_ID = "r-0123456789ab"
ACCEL_DATA = Path(__file__).resolve().parent / "data" / "accel"  # recorded outputs of nvidia-smi, rocm-smi, npu-smi


def make_run_dir(ws: Workspace, d: dict[str, Any], run_id: str = RUN_ID) -> RunPaths:
    """A run directory as the controller writes it: the filled case, run.json, the materialized dataset."""
    from caseledger import datasets
    from caseledger.case.model import Case
    from caseledger.case.store import case_id_of
    from caseledger.workspace import atomic_write, canonical_json, write_json

    case = Case.model_validate(d).filled()
    ident = datasets.materialize(ws, case)
    paths = ws.run(run_id)
    paths.root.mkdir(parents=True)
    atomic_write(paths.case, canonical_json(case.canonical()) + b"\n")
    write_json(
        paths.run_json,
        {
            "run_id": run_id,
            "case_id": case_id_of(case),
            "workspace": str(ws.root),
            "dataset_id": ident.dataset_id,
            "salt": run_id if case.load.salt else None,
            "planned": case.load.requests,
        },
    )
    return paths


def load_draft(port: int, requests: int, concurrency: int, **load: Any) -> dict[str, Any]:
    """A case for the load client alone (no service): N requests of 32 tokens in, 8 out, at C."""
    return {
        "scenario": "load-test",
        "target": {"endpoints": [{"base_url": f"http://127.0.0.1:{port}/v1", "model": "ref-model"}]},
        "dataset": {"source": "synthetic", "input_tokens": 32, "output_tokens": 8},
        "load": {"requests": requests, "concurrency": concurrency, **load},
    }


def progress_case(ws: Workspace) -> str:
    """A case whose progress a caller can watch: a few seconds of formal load after the service starts."""
    from caseledger.tools import freeze_case

    # 64 requests of 16 output tokens at C=2
    draft = ref_draft(
        free_port(),
        load={"requests": 64, "concurrency": 2},
        dataset={"source": "synthetic", "input_tokens": 64, "output_tokens": 16},
        service={
            "reference": {
                "prefill_tokens_per_s": 200000,
                "decode_step_s": 0.005,
                "decode_step_per_seq_s": 0.0005,
                "slots": 8,
            }
        },
    )
    return freeze_case(ws, draft=draft).case_id


MS = 1_000_000
SPEC_BEFORE = "vllm:spec_decode_num_drafts_total 0\nvllm:spec_decode_num_accepted_tokens_total 0\n"
SPEC_AFTER = "vllm:spec_decode_num_drafts_total 113463\nvllm:spec_decode_num_accepted_tokens_total 541897\n"


def report_case() -> Case:
    """A case of 640 requests of 1024 tokens at C=64 on 16 cards, 90% cache hits asked (tests/test_report.py)."""
    from caseledger.case.model import Case

    return Case.model_validate(
        {
            "scenario": "rep",
            "target": {"endpoints": [{"base_url": "http://127.0.0.1:9/v1", "model": "m"}], "cards": 16},
            "load": {"requests": 640, "concurrency": 64, "max_tokens": 1024},
            "cache": {"min_hit_ratio": 0.9},
        }
    )


def report_records(step_ms: float = 1.0, fail: int = 1) -> list[RawRecord]:
    """Its raw records: 10 waves of 64 streams, 16 chunks each, `fail` failed at the start."""
    out: list[RawRecord] = []
    for i in range(640):
        send = (i // 64) * 2000 * step_ms
        chunks = [send + 100 + k * step_ms for k in range(0, 1024, 64)]
        ok = i >= fail
        out.append(
            {
                "i": i,
                "entry": i,
                "route": 0,
                "send_ns": round(send * MS),
                "chunk_ns": [round(c * MS) for c in chunks],
                "chunk_tokens": [64] * len(chunks),
                "end_ns": round((chunks[-1] + 1) * MS),
                "status": 200 if ok else 500,
                "ok": ok,
                "error": None if ok else "HTTP 500",
                "error_class": None if ok else "http",
                "prompt_tokens": 131076,
                "completion_tokens": 1024 if ok else None,
                "cached_tokens": 118784,
                "finish_reason": "length",
                "input_tokens_body": 131072,
                "input_tokens_chat": 131076,
            }
        )
    return out


AISBENCH_DB = "gsm8k_0.db"
# perf_counter seconds; each list: send, then one stamp per SSE data: line (role-only first, usage-only last)
AISBENCH_TP = {
    0: [1000.0, 1000.125, 1000.25, 1000.375, 1000.5],
    1: [1000.0625, 1000.25, 1000.5, 1000.75],
    2: [1000.125, 1000.375, 1000.4375],
}


def blob(values: list[float]) -> bytes:
    """The values as AISBench stores an array in its sqlite database (numpy's .npy bytes)."""
    import numpy as np

    buf = io.BytesIO()
    np.save(buf, np.array(values, dtype=np.float64), allow_pickle=False)
    return buf.getvalue()


def make_perf_dir(root: Path, *, tmp_db: bool = False) -> Path:
    """A small AISBench-format performances/<model_abbr>/ directory."""
    perf = root / "outputs" / "default" / "20261102_100000" / "performances" / "vllm-api-stream-chat"
    db_path = perf / "tmp" / f"tmp_{AISBENCH_DB}" if tmp_db else perf / "db_data" / AISBENCH_DB
    db_path.parent.mkdir(parents=True)
    with sqlite3.connect(db_path) as conn:
        conn.execute("CREATE TABLE numpy_store (id INTEGER PRIMARY KEY AUTOINCREMENT, arr_blob BLOB NOT NULL)")
        for rid in (0, 1):
            conn.execute("INSERT INTO numpy_store (arr_blob) VALUES (?)", (blob(AISBENCH_TP[rid]),))  # rows 1, 2
    conn.close()
    lines = [
        {
            "data_abbr": "gsm8k",
            "id": 10,
            "uuid": "a",
            "success": True,
            "error_info": "",
            "input_tokens": 120,
            "output_tokens": 3,
            "time_points": {"__db_ref__": 1},
            "db_name": AISBENCH_DB,
        },
        {
            "data_abbr": "gsm8k",
            "id": 11,
            "uuid": "b",
            "success": True,
            "error_info": "",
            "input_tokens": 80,
            "output_tokens": 1,
            "time_points": {"__db_ref__": 2},
            "db_name": AISBENCH_DB,
        },
        {
            "data_abbr": "gsm8k",
            "id": 12,
            "uuid": "c",
            "success": True,
            "input_tokens": 64,
            "output_tokens": 2,
            "time_points": AISBENCH_TP[2],
        },  # an older inline layout
        {
            "data_abbr": "gsm8k",
            "id": 13,
            "uuid": "d",
            "success": False,
            "error_info": "Request timed out",
            "input_tokens": 64,
            "output_tokens": 0,
            "time_points": [1000.2, 1000.9],
        },
        {
            "data_abbr": "gsm8k",
            "id": 14,
            "uuid": "e",
            "success": True,
            "input_tokens": 64,
            "output_tokens": 5,
            "time_points": {"__db_ref__": 99},
            "db_name": AISBENCH_DB,
        },  # killed before the database commit
    ]
    (perf / "gsm8k_details.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    with (perf / "gsm8k.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Performance Parameters", "Stage", "Average", "Min", "Max", "Median", "P75", "P90", "P99", "N"])
        w.writerow(
            ["TTFT", "total", "187.5 ms", "125.0 ms", "250.0 ms", "187.5 ms", "218.75 ms", "237.5 ms", "248.75 ms", 3]
        )
        w.writerow(
            [
                "OutputTokenThroughput",
                "total",
                "6.1 token/s",
                "2.0 token/s",
                "9.0 token/s",
                "6.0 token/s",
                "7.0 token/s",
                "8.0 token/s",
                "8.9 token/s",
                3,
            ]
        )
    (perf / "gsm8k.json").write_text(
        json.dumps(
            {
                "Benchmark Duration": {"total": "900.0 ms"},
                "Total Requests": {"total": 4},
                "Output Token Throughput": {"total": "6.6667 token/s"},
            }
        )
    )
    return perf
