"""Fault-matrix cells for four minor findings of issue 57, each checked where it is true:
  - read-only callers (summarize, the MCP summarize tool and resources, phase_status, the CLI) write nothing into the
    ledger of a finished run and campaign: paths, mtimes and sha256 of every file the same before and after;
  - a stopped (SIGSTOP) postprocess collector is named by phase_status within a heartbeat: its pid, that it is
    stopped, `kill -CONT PID`; continued, the run ends with nothing re-sent;
  - a torn last line of load/host.jsonl (what a full disk leaves) is flagged by phase_status and reprocess_raw: the
    file, the line, that it is torn, what it means for the figures;
  - summarize's `damaged` lists raw data that no longer hashes as sealed (a scenario's, a campaign's, runs').
Columns beside test_fault_matrix.py's: tree (the reads wrote nothing), first (the first read after the writers
wrote only the derived index), image (the MCP answer still carries its chart), torn (the line is named with its
meaning), reprocess (reprocess_raw names it too), damaged (the list names the tampered file).
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.types import ImageContent

from bench.bench_ledger import build
from caseledger import cli, procs, services
from caseledger.campaign.view import campaign_view
from caseledger.ledger import authorization, indexdb
from caseledger.ledger.index import open_index
from caseledger.ledger.intact import torn_lines
from caseledger.run.campaign_driver import stop_drivers
from caseledger.server import build_server
from caseledger.server.toolset import HEARTBEAT_S
from caseledger.tools import freeze_any, freeze_case, phase_status, reprocess_raw, start_any, start_run, summarize
from caseledger.tools.summarize import chart_png
from caseledger.views.chart import draw_campaign
from caseledger.workspace import RunPaths, Workspace
from tests.conftest import free_port, knee_base, ref_draft, start_with_fault, stats
from tests.helpers import cell, settled, wait_until

SCENARIO = "ref-test"  # ref_draft's


# ------------------------------------------------------------------------------- a finished run and campaign


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Workspace, dict[str, str]]]:
    """Two runs of one scenario (a baseline and a child) and a two-point campaign, all finished (inline: this
    process ran them); (workspace, {'r1', 'r2', 'gid', 'point'}: run ids, the campaign's id, a run of its)."""
    ws = Workspace(tmp_path_factory.mktemp("minors") / "ws")
    (ws.root / "cases").mkdir(parents=True)
    authorization.set_mode(ws, "auto")
    port = free_port()
    try:
        with procs.in_process():
            base = freeze_case(ws, draft=ref_draft(port)).case_id
            r1 = start_run(ws, base, wait=True)
            child = freeze_case(ws, draft=ref_draft(port, load={"requests": 8, "concurrency": 4}), parent=base)
            r2 = start_run(ws, child.case_id, wait=True)
            assert r1.state == r2.state == "succeeded", (r1.text(), r2.text())
            body = {
                "name": "minors",
                "base": knee_base(port, "minors-campaign", 8),
                "axes": [{"path": "load.concurrency", "values": [1, 2]}],
                "search": {"kind": "grid"},
                "repeats": {"runs": 1, "settle_runs": 1, "budget": 0},
                "decision": {"primary_metric": "output_throughput", "limits": {"tpot_p99_ms": 1000.0}},
            }
            gid = freeze_any(ws, draft={"campaign": body}).campaign_id  # type: ignore[union-attr]
            start_any(ws, gid)  # inline: returns when the campaign is complete
        view = summarize(ws, [gid]).campaign
        assert view is not None and view.complete and all(r.run_ids for r in view.rows), view
        yield ws, {"r1": str(r1.run_id), "r2": str(r2.run_id), "gid": gid, "point": view.rows[0].run_ids[0]}
    finally:
        stop_drivers(ws)
        services.stop_all(ws)


def tree(ws: Workspace) -> dict[str, tuple[int, str]]:
    """Every file of the ledger and HANDOFF.md: path -> (mtime_ns, sha256). Not the index's -shm: SQLite's shared
    memory, which every reader of the database writes (its read locks), by SQLite's design; the index's content is
    in index.sqlite and its -wal, which are compared."""
    out = {}
    for p in sorted([ws.handoff, *ws.ledger.rglob("*")]):
        if p.is_file() and not p.name.endswith("-shm"):
            out[str(p.relative_to(ws.root))] = (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def changed(a: dict[str, tuple[int, str]], b: dict[str, tuple[int, str]]) -> list[str]:
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def read_everything(ws: Workspace, ids: dict[str, str]) -> list[int]:
    """Every read-only call on the finished ledger; returns how many images the MCP summarize answers carried."""
    r1, r2, gid = ids["r1"], ids["r2"], ids["gid"]
    summarize(ws, [])  # the latest run is a campaign's point: the campaign's answer
    summarize(ws, [], scenario=SCENARIO)
    summarize(ws, [r1, r2])
    summarize(ws, [gid])
    phase_status(ws)
    phase_status(ws, r1)
    assert cli.main(["summarize", r1, r2, "-w", str(ws.root)]) == 0
    assert cli.main(["report", "--scenario", SCENARIO, "-w", str(ws.root)]) == 0
    images: list[int] = []

    async def mcp() -> None:
        async with Client(build_server(ws)) as c:
            for args in ({}, {"scenario": SCENARIO}, {"run_ids": [r1, r2]}, {"run_ids": [gid]}):
                answer = await c.call_tool("summarize", args)
                assert not answer.is_error, answer
                images.append(sum(isinstance(b, ImageContent) for b in answer.content))
            await c.call_tool("phase_status", {"run_id": r2})
            for uri in (
                "caseledger://handoff",
                f"caseledger://runs/{r1}/report",
                f"caseledger://runs/{r1}/report.html",
                f"caseledger://scenarios/{SCENARIO}",
                f"caseledger://scenarios/{SCENARIO}/report.html",
                f"caseledger://campaigns/{gid}/report.html",
            ):
                await c.read_resource(uri)

    anyio.run(mcp)
    return images


@pytest.mark.integration
def test_read_only_callers_write_nothing_into_the_ledger_of_a_finished_run_and_campaign(
    finished: tuple[Workspace, dict[str, str]], fault_matrix: dict[str, dict[str, bool]], capsys: Any
) -> None:
    ws, ids = finished
    index = {"ledger/index.sqlite", "ledger/index.sqlite-wal"}
    with cell(fault_matrix, "read-only reads of a finished run and campaign") as c:
        before = tree(ws)
        read_everything(ws, ids)
        first = tree(ws)
        # the first read after the writers may bring the derived index in step (a controller or driver that has
        # exited since it last wrote: its row is folded again) and the HANDOFF.md snapshot (outside the ledger);
        # never a report, a chart, an HTML page or run state
        c.check("first", set(changed(before, first)) <= index | {"HANDOFF.md"}, changed(before, first))
        images = read_everything(ws, ids)
        c.check("tree", changed(first, tree(ws)) == [], changed(first, tree(ws)))  # in step: nothing at all
        c.check("image", images == [1, 1, 1, 1], images)  # each answer still carries its chart
    capsys.readouterr()


@pytest.mark.integration
def test_the_campaign_chart_its_driver_draws_is_named_by_summarize_and_read_never_drawn_again(
    finished: tuple[Workspace, dict[str, str]],
) -> None:
    pytest.importorskip("matplotlib")
    ws, ids = finished
    gid = ids["gid"]
    for old in ws.reports_dir.glob(f"campaign-{gid}-*.png"):
        old.unlink()
    assert summarize(ws, [gid]).plot is None  # no writer drew it: none named (the MCP answer draws in memory)
    where = draw_campaign(ws, campaign_view(ws, gid))  # what the driver does when it ends
    assert where is not None and Path(where).read_bytes().startswith(b"\x89PNG")
    drawn_at = Path(where).stat().st_mtime_ns
    s = summarize(ws, [gid])
    assert s.plot == where and chart_png(ws, s) == Path(where).read_bytes() and f"plot: {where}" in s.text()
    assert draw_campaign(ws, campaign_view(ws, gid)) == where and Path(where).stat().st_mtime_ns == drawn_at


def test_a_read_of_an_index_in_step_writes_no_row(tmp_path: Path) -> None:
    """The index is a derived cache readers keep: a sync that finds nothing changed writes nothing, not even the
    row of a live run folded again (as every read does) or the sweep's place."""
    info = build(tmp_path / "ws", 12, scenarios=2, cases_per=2, active=1)
    ws = Workspace(tmp_path / "ws")
    summarize(ws, [], scenario=info["scenario"])  # the index and its derived figures in step
    phase_status(ws)
    with open_index(ws) as idx:
        conn, n = idx.conn, idx.conn.total_changes
        live = conn.execute("SELECT COUNT(*) FROM runs WHERE live=1").fetchone()[0]
    summarize(ws, [], scenario=info["scenario"])
    phase_status(ws)
    with open_index(ws) as idx:
        assert idx.conn is conn  # the kept connection: its count of changes is this thread's whole story
        assert live >= 1 and conn.total_changes == n, (live, conn.total_changes - n)
    assert indexdb.path_of(ws.ledger).exists()


# ------------------------------------------------------------------------------------------ a stopped collector


def _collector_of(run_root: Path) -> int | None:
    """The pid of the run's postprocess collector, found from /proc (not from what caseledger recorded)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"caseledger.metrics" in argv and str(run_root).encode() in argv:
            return int(d.name)
    return None


def _state(pid: int) -> bytes:
    data = Path(f"/proc/{pid}/stat").read_bytes()
    return data[data.rfind(b")") + 2 :].split()[0]


@pytest.mark.integration
@pytest.mark.processes  # the controller and its collector are real processes: the collector is stopped
def test_a_stopped_collector_is_named_within_a_heartbeat_with_its_pid_and_kill_cont(
    ws: Workspace, stop_services: None, monkeypatch: pytest.MonkeyPatch, fault_matrix: dict[str, dict[str, bool]]
) -> None:
    port = free_port()
    case = freeze_case(ws, draft=ref_draft(port))
    with cell(fault_matrix, "collector SIGSTOPped at postprocess") as c:
        r = start_with_fault(monkeypatch, "postprocess:stop", ws, case.case_id)  # the collector stops itself
        assert r.run_id is not None
        root = ws.run(r.run_id).root
        pid = int(wait_until(lambda: _collector_of(root), 90, "the collector"))
        try:
            wait_until(lambda: _state(pid) in (b"T", b"t"), 30, "the collector stopped")
            seen = time.monotonic()
            s = phase_status(ws, r.run_id)
            took = time.monotonic() - seen
            said = f"{s.blocker}\n{s.next_call}"
            c.check("class", s.state == "running" and s.phase == "postprocess" and s.collector_stopped, s.text())
            c.check("svc", "collector (postprocess) stopped (SIGSTOP)" in said and f"pid {pid}" in said, s.text())
            c.check("next", s.next_call.startswith(f"kill -CONT {pid} ") and "resume" not in s.next_call, said)
            c.check("early", took < HEARTBEAT_S and "collector STOPPED" in s.text(), (took, s.text()))
        finally:
            os.kill(pid, signal.SIGCONT)
        s = settled(ws, r.run_id)
        c.check("state", s.state == "succeeded" and s.results_extracted and not s.collector_stopped, s.text())
        c.check("count", stats(port)["by_phase"].get("load") == s.planned == s.sent_all, stats(port))


# --------------------------------------------------------------------------------------------- a torn raw line


@pytest.mark.integration
def test_a_torn_last_line_of_the_hosts_samples_is_flagged_by_status_and_reprocess(
    ws: Workspace, stop_services: None, fault_matrix: dict[str, dict[str, bool]]
) -> None:
    case = freeze_case(ws, draft=ref_draft(free_port()))
    r = start_run(ws, case.case_id, wait=True)
    assert r.run_id is not None and r.state == "succeeded", r.text()
    paths = ws.run(r.run_id)
    with cell(fault_matrix, "torn last line of load/host.jsonl") as c:
        whole = [line for line in paths.load_host.read_bytes().splitlines() if line]
        sample = b'{"mono_ns": 1, "dt_ns": 500000000, "total": 200, "busy": 20, "steal": 0, "ours": 10}'
        whole = whole or [sample]  # an inline load may end before the controller's first sample
        # what a full disk leaves: the last sample cut mid-write, without its newline
        paths.load_host.write_bytes(b"".join(w + b"\n" for w in whole) + sample[:23])
        n = len(whole) + 1
        s = phase_status(ws, r.run_id)
        c.check(
            "torn",
            len(s.torn) == 1
            and s.torn[0].startswith(f"load/host.jsonl line {n} of {n} is torn: cut mid-write")
            and f"rests on the {len(whole)} whole samples" in s.torn[0],
            s.torn,
        )
        c.check("status", f"torn: load/host.jsonl line {n} of {n} is torn" in s.text(), s.text())
        rep = reprocess_raw(ws, r.run_id)
        c.check("reprocess", rep.torn == s.torn and f"torn: {s.torn[0]}" in rep.text(), rep.text())
        c.check("state", phase_status(ws, r.run_id).state == "succeeded")


def test_torn_lines_names_the_file_the_line_and_what_it_means_for_the_figures(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "r-0123abcd")
    paths.load_dir.mkdir(parents=True)
    rec = b'{"i": 0, "ok": true}\n'
    paths.raw.write_bytes(rec + rec + b'{"i": 2, "o' + rec + b'{"i": 3, "ok": tr')  # a line torn, then another
    paths.load_stalls.write_bytes(b'{"start_ns": 1, "end_ns": 2}\n')
    assert torn_lines(paths) == [
        "load/raw.jsonl line 3 of 4 does not parse (cut mid-write, more lines follow); skipped: the request it "
        "recorded is not in the figures, which rest on the 2 whole records",
        "load/raw.jsonl line 4 of 4 is torn: cut mid-write (a full disk, a kill), without its newline; skipped: "
        "the request it recorded is not in the figures, which rest on the 2 whole records",
    ]
    paths.raw.write_bytes(rec)
    assert torn_lines(paths) == []


# ---------------------------------------------------------------------------------------- tampered raw data


def _tamper(path: Path) -> bytes:
    data = path.read_bytes()
    at = data.index(b'"ok":true') + len(b'"ok":')
    path.write_bytes(data[:at] + b"f" + data[at + 1 :])  # one byte: true -> frue
    return data


@pytest.mark.integration
def test_damaged_lists_tampered_raw_data_of_a_scenario_a_campaign_and_runs(
    finished: tuple[Workspace, dict[str, str]], fault_matrix: dict[str, dict[str, bool]]
) -> None:
    ws, ids = finished
    shown = next(r.run_id for r in (summarize(ws, [], scenario=SCENARIO).scenario or _no()).rows if r.run_id)
    point = ids["point"]
    saved = {rid: _tamper(ws.run(rid).raw) for rid in (str(shown), point)}
    try:
        with cell(fault_matrix, "tampered raw data in summarize's damaged") as c:
            said = "/load/raw.jsonl changed after the load ended"
            s = summarize(ws, [], scenario=SCENARIO)
            c.check("damaged", [d.split(said)[0] for d in s.damaged] == [f"ledger/runs/{shown}"], s.damaged)
            c.check("summary", f"damaged ledger entry: ledger/runs/{shown}{said}" in s.text(), s.text())
            g = summarize(ws, [ids["gid"]])
            c.check("damaged", [d.split(said)[0] for d in g.damaged] == [f"ledger/runs/{point}"], g.damaged)
            c.check("summary", f"ledger/runs/{point}{said}" in g.text(), g.text())
            runs = summarize(ws, [ids["r1"], ids["r2"]])
            c.check("damaged", [d.split(said)[0] for d in runs.damaged] == [f"ledger/runs/{shown}"], runs.damaged)
    finally:
        for rid, data in saved.items():
            ws.run(rid).raw.write_bytes(data)
    assert summarize(ws, [], scenario=SCENARIO).damaged == [] and summarize(ws, [ids["gid"]]).damaged == []


def _no() -> Any:
    raise AssertionError("no scenario view")
