"""The scenario PNG is a derived file named by its view's digest, drawn by writers (the end of a run, a campaign's
driver; here draw_view, what they call): summarize names it only when it is on disk and whole, and writes none;
deleting or damaging it, or the index, changes no answer but that name; a new result names a new PNG and the old one
goes; the index connection kept open per thread is reopened when the file is replaced."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from bench.bench_ledger import build
from caseledger.ledger import indexdb
from caseledger.ledger.event_types import OutcomeData, RunEnded
from caseledger.ledger.events import append_event
from caseledger.ledger.index import open_index
from caseledger.tools import summarize
from caseledger.tools.summarize import chart_png
from caseledger.views.chart import draw_view, scenario_plot_path
from caseledger.workspace import Workspace

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> tuple[Workspace, dict[str, Any]]:
    root = tmp_path_factory.mktemp("plots") / "ws"
    info = build(root, 30, scenarios=2, cases_per=3, active=1)
    return Workspace(root), info


def _drawn(ws: Workspace, name: str) -> str:
    """The scenario's PNG as a writer draws it (draw_view)."""
    view = summarize(ws, [], scenario=name).scenario
    assert view is not None
    where = draw_view(ws, view)
    assert where is not None
    return where


def test_summarize_names_only_a_png_a_writer_drew_and_draws_none(ledger: tuple[Workspace, dict[str, Any]]) -> None:
    ws, info = ledger
    name = info["inactive"][0]
    for f in ws.reports_dir.glob(f"scenario-{name}-*.png"):
        f.unlink()
    quick = summarize(ws, [], scenario=name)
    assert quick.plot is None and not list(ws.reports_dir.glob(f"scenario-{name}-*.png"))  # nothing drawn, none named
    png = chart_png(ws, quick)  # drawn in memory for whoever shows it, never written
    assert png is not None and png.startswith(b"\x89PNG") and not list(ws.reports_dir.glob(f"scenario-{name}-*.png"))
    where = _drawn(ws, name)
    again = summarize(ws, [], scenario=name)
    assert again.plot == where and chart_png(ws, again) == Path(where).read_bytes()  # read from disk
    assert again.model_copy(update={"plot": None}).model_dump_json() == quick.model_dump_json()


@pytest.mark.parametrize("damage", ["deleted", "truncated", "garbage", "index deleted"])
def test_a_missing_or_damaged_png_is_not_named_and_its_writer_draws_it_again(
    ledger: tuple[Workspace, dict[str, Any]], damage: str
) -> None:
    ws, info = ledger
    name = info["inactive"][0]
    path = Path(_drawn(ws, name))
    before = summarize(ws, [], scenario=name)
    assert before.plot == str(path)
    png = path.read_bytes()
    if damage == "deleted":
        path.unlink()
    elif damage == "truncated":
        path.write_bytes(png[: len(png) // 2])
    elif damage == "garbage":
        path.write_bytes(b"not a png" * 50)
    else:
        for suffix in ("", "-wal", "-shm"):
            Path(str(indexdb.path_of(ws.ledger)) + suffix).unlink(missing_ok=True)
    after = summarize(ws, [], scenario=name)
    assert after.model_dump(exclude={"plot"}) == before.model_dump(exclude={"plot"})
    assert after.plot == (before.plot if damage == "index deleted" else None)  # a file that is not whole is not named
    assert _drawn(ws, name) == str(path)
    png_after = path.read_bytes()
    assert png_after.startswith(b"\x89PNG") and png_after.endswith(b"IEND\xaeB`\x82")
    assert summarize(ws, [], scenario=name).model_dump_json() == before.model_dump_json()
    assert len(list(ws.reports_dir.glob(f"scenario-{name}-*.png"))) == 1


def test_a_new_result_names_a_new_png_and_the_old_one_goes(ledger: tuple[Workspace, dict[str, Any]]) -> None:
    ws, info = ledger
    name = info["scenario"]  # the live run's scenario
    first = _drawn(ws, name)
    run = ws.run(info["latest"])  # the running run ends, failed: its row (state, decision) changes the view
    append_event(ws, run, RunEnded(data=OutcomeData(outcome="failed:load")), owner="bench")
    (run.root / "controller.pid.json").unlink(missing_ok=True)
    view = summarize(ws, [], scenario=name).scenario
    assert view is not None and scenario_plot_path(ws, view) != first
    second = _drawn(ws, name)
    assert second != first and Path(second).exists() and not Path(first).exists()
    assert summarize(ws, [], scenario=name).plot == second


def test_the_kept_connection_is_reopened_when_the_index_file_is_replaced(
    ledger: tuple[Workspace, dict[str, Any]],
) -> None:
    ws, _ = ledger
    path = indexdb.path_of(ws.ledger)
    with open_index(ws) as idx:
        first = idx.conn
        n = idx.count()
    with open_index(ws) as idx:
        assert idx.conn is first  # kept: no checkpoint per call
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    with open_index(ws) as idx:
        assert idx.conn is not first and idx.count() == n and path.exists()


SUMMARIZE_CHILD = """
import json, sys, anyio
from mcp import Client
from caseledger.server import build_server
from caseledger.workspace import Workspace
async def main():
    async with Client(build_server(Workspace(sys.argv[1]))) as c:
        r = await c.call_tool("summarize", {"scenario": sys.argv[2]})
    print(json.dumps({"error": r.is_error, "images": [b.type for b in r.content if b.type == "image"],
                      "matplotlib": any(m.startswith("matplotlib") for m in sys.modules)}))
anyio.run(main)
"""


@pytest.mark.processes  # the detached controller draws the chart
@pytest.mark.integration
def test_the_controller_draws_the_chart_after_a_run_so_a_first_mcp_summarize_only_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CASELEDGER_CHART_AFTER_RUN", "1")  # the product's default (the suite sets 0)
    import subprocess
    import sys
    import time

    from caseledger import procs, services
    from caseledger.ledger import authorization
    from caseledger.tools import freeze_case, start_run
    from caseledger.workspace import read_json_or_none
    from tests.conftest import free_port, ref_draft

    ws = Workspace(tmp_path / "ws")
    (ws.root / "cases").mkdir(parents=True)
    authorization.set_mode(ws, "auto")
    try:
        cid = freeze_case(ws, draft=ref_draft(free_port(), scenario="ref-drawn")).case_id
        r = start_run(ws, cid, wait=True)
        assert r.state == "succeeded", r.text()
        controller = read_json_or_none(ws.run(str(r.run_id)).controller_pid)
        deadline = time.monotonic() + 60
        while procs.alive(controller) and time.monotonic() < deadline:  # it draws after the run's outcome
            time.sleep(0.1)
        assert not procs.alive(controller)
        quick = summarize(ws, [], scenario="ref-drawn")
        assert quick.plot is not None and Path(quick.plot).read_bytes().startswith(b"\x89PNG")  # this view's chart
        p = subprocess.run(
            [sys.executable, "-c", SUMMARIZE_CHILD, str(ws.root), "ref-drawn"], capture_output=True, text=True
        )
        assert p.returncode == 0, p.stderr[-2000:]
        out = json.loads(p.stdout.strip().splitlines()[-1])
        assert out == {"error": False, "images": ["image"], "matplotlib": False}  # attached, never drawn in the call
    finally:
        services.stop_all(ws)


@pytest.mark.integration
def test_a_chart_that_cannot_be_drawn_is_noted_and_never_fails_the_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess
    import sys

    monkeypatch.setenv("CASELEDGER_CHART_AFTER_RUN", "1")  # the product's default (the suite sets 0)
    (tmp_path / "cases").mkdir()
    code = (
        "import sys; from caseledger.run.controller import draw_chart; from caseledger.workspace import Workspace; "
        "draw_chart(Workspace(sys.argv[1]), 'no-such-scenario'); print('returned')"
    )
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip() == "returned", p.stderr[-2000:]
    assert "controller: scenario chart not drawn: " in p.stderr
    off = {**os.environ, "CASELEDGER_CHART_AFTER_RUN": "0"}  # no drawing tried at all
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=off)
    assert p.returncode == 0 and p.stdout.strip() == "returned" and "not drawn" not in p.stderr, p.stderr[-2000:]
    assert not (tmp_path / "ledger" / "reports").exists() or not list((tmp_path / "ledger" / "reports").iterdir())
