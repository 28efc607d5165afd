"""Helpers the test modules share, in one place: waiting on a condition, counting at the reference target, the
target's launch argv, the fault matrix's recording and its run facts, and the campaign of the knee tests.

Fixtures and pytest's hooks stay in tests/conftest.py; what a test module calls goes here, never into another test
module (a test module imports helpers, not tests)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from caseledger.case.plan import PHASES, Phase
from tests.conftest import free_port, knee_base, ref_draft, stats

if TYPE_CHECKING:
    import pytest
    from mcp.types import CallToolResult

    from caseledger.campaign.view import CampaignView
    from caseledger.tools import StatusResult
    from caseledger.workspace import Workspace


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


# ------------------------------------------------------------------------------------- the fault matrix's cells

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
    from caseledger.ledger.events import read_events

    return Counter(
        e["phase"]
        for e in read_events(ws.run(run_id)).events
        if e["type"] == "phase_ended" and e["data"].get("outcome") in ("done", "reused", "skipped")
    )


def clients(ws: Workspace, run_id: str) -> int:
    """How many load clients were started for the formal load (one, whatever was killed)."""
    from caseledger.ledger.events import read_events

    return sum(e["type"] == "load_client_started" for e in read_events(ws.run(run_id)).events)


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


def fake_run(ws: Workspace, rid: str, created: str) -> None:
    """A run directory as create_run writes it (run.json and the hash-checked case copy), without a process."""
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
