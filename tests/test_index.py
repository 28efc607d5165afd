"""The ledger's derived index (ledger/index.sqlite): deleting, damaging or contradicting it changes no answer; a
write is seen by the next read; HANDOFF.md names every active scenario. The ledgers are written in the ledger's
formats by bench/bench_ledger.py's build (cases frozen for real, one result per case from the real processor)."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench.bench_ledger import build
from caseledger.case.phases import Phase
from caseledger.errors import FailureClass
from caseledger.ledger import indexdb
from caseledger.ledger.event_types import PhaseEnded, PhaseEndedData
from caseledger.ledger.events import append_event
from caseledger.ledger.index import open_index
from caseledger.ledger.view import PhaseState
from caseledger.tools import phase_status, summarize
from caseledger.views import handoff
from caseledger.workspace import Workspace


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> tuple[Workspace, dict[str, Any]]:
    root = tmp_path_factory.mktemp("index") / "ws"
    info = build(root, 60, scenarios=3, cases_per=3, active=2)
    return Workspace(root), info


def _stamp(text: str) -> str:
    return re.sub(r"written \S+Z", "written <t>", text)


def answers(ws: Workspace, info: dict[str, Any]) -> dict[str, str]:
    """Every read the index serves, as the agent sees it."""
    out = {
        "status": phase_status(ws).text(),
        "status_run": phase_status(ws, info["some_run"]).text(),
        "handoff": _stamp(handoff.render(ws)),
        "handoff_quick": _stamp(handoff.render(ws, verify=False)),
    }
    for name in [*info["active"], *info["inactive"]]:
        view = summarize(ws, [], scenario=name)
        out[f"summarize {name}"] = view.text()
        assert view.scenario is not None
        out[f"rows {name}"] = view.scenario.model_dump_json()
    return out


def index_path(ws: Workspace) -> Path:
    return indexdb.path_of(ws.ledger)


def drop_index(ws: Workspace) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(str(index_path(ws)) + suffix).unlink(missing_ok=True)


def test_the_views_show_every_run_with_its_result(ledger: tuple[Workspace, dict[str, Any]]) -> None:
    ws, info = ledger
    view = summarize(ws, [], scenario=info["active"][0]).scenario
    assert view is not None and len(view.rows) == 3
    assert all(r.run_id and r.metric is not None and r.state == "succeeded" for r in view.rows)
    assert sum(r.runs for r in view.rows) == sum(
        1
        for d in ws.runs_dir.iterdir()
        if orjson.loads((d / "run.json").read_bytes())["scenario"] == info["active"][0]
        and (d / "decision.json").exists()
    )
    with open_index(ws) as idx:
        assert idx.count() == len(list(ws.runs_dir.iterdir()))


def test_deleting_the_index_changes_no_answer(ledger: tuple[Workspace, dict[str, Any]]) -> None:
    ws, info = ledger
    before = answers(ws, info)
    drop_index(ws)
    assert answers(ws, info) == before
    assert index_path(ws).exists()  # rebuilt by the reads


@pytest.mark.parametrize("damage", ["garbage", "truncated", "schema", "table"])
def test_a_damaged_index_is_rebuilt_and_changes_no_answer(
    ledger: tuple[Workspace, dict[str, Any]], damage: str
) -> None:
    ws, info = ledger
    before = answers(ws, info)
    path = index_path(ws)
    if damage == "garbage":
        drop_index(ws)
        path.write_bytes(b"not a database " * 100)
    elif damage == "truncated":
        with sqlite3.connect(path) as c:
            c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        data = path.read_bytes()
        drop_index(ws)
        path.write_bytes(data[: len(data) // 3])
    elif damage == "schema":
        with sqlite3.connect(path) as c:
            c.execute("UPDATE meta SET value='0' WHERE key='schema'")
    else:
        with sqlite3.connect(path) as c:
            c.execute("DROP TABLE runs")
    assert answers(ws, info) == before
    with open_index(ws) as idx:
        assert idx.count() == len(list(ws.runs_dir.iterdir()))
        assert any("rebuilt" in text for _, text in idx.notes()) or damage == "table"


def test_a_file_changed_behind_the_index_is_repaired_and_noted(ledger: tuple[Workspace, dict[str, Any]]) -> None:
    ws, info = ledger
    rid = info["some_run"]
    answers(ws, info)  # the index is in step
    paths = ws.run(rid)
    saved = paths.events.read_bytes(), paths.decision.read_bytes()
    try:
        # by hand, as no caseledger writer would: the decide phase's end and its decision are gone
        lines = saved[0].splitlines(keepends=True)
        paths.events.write_bytes(b"".join(lines[:-2]))
        paths.decision.unlink()
        with open_index(ws) as idx:
            row = next(r for r in idx.of_case(orjson.loads(paths.run_json.read_bytes())["case_id"]) if r.run_id == rid)
            assert (row.state, row.decision) != ("succeeded", "baseline")
            assert row.state == phase_status(ws, rid).state  # the files' answer
            assert any(rid in text for _, text in idx.notes())
    finally:
        paths.events.write_bytes(saved[0])
        paths.decision.write_bytes(saved[1])
    with open_index(ws) as idx:
        assert next(r for r in idx.recent(1000) if r.run_id == rid).state == "succeeded"


def test_an_event_is_seen_by_the_next_quick_read(ledger: tuple[Workspace, dict[str, Any]]) -> None:
    ws, info = ledger
    latest = info["latest"]
    handoff.render(ws)
    append_event(
        ws,
        ws.run(latest),
        PhaseEnded(
            phase=Phase.PREFLIGHT,
            attempt=1,
            error="ImportError in the bench",
            data=PhaseEndedData(outcome=PhaseState.FAILED, failure_class=FailureClass.BEFORE_MODEL),
        ),
    )
    try:
        with open_index(ws, quick=True) as idx:
            row = next(r for r in idx.recent(1) if r.run_id == latest)
        assert (row.state, row.failure_class) == (phase_status(ws, latest).state, "before_model")
    finally:
        lines = ws.run(latest).events.read_bytes().splitlines(keepends=True)
        ws.run(latest).events.write_bytes(b"".join(lines[:-1]))


def test_a_new_run_directory_is_listed_and_a_removed_one_forgotten(
    ledger: tuple[Workspace, dict[str, Any]], tmp_path: Path
) -> None:
    ws, info = ledger
    with open_index(ws) as idx:
        n = idx.count()
    src = ws.runs_dir / info["some_run"]
    moved = tmp_path / src.name
    src.rename(moved)
    try:
        with open_index(ws, quick=True) as idx:
            assert idx.count() == n - 1 and all(r.run_id != src.name for r in idx.recent(10_000))
    finally:
        moved.rename(src)
    with open_index(ws, quick=True) as idx:
        assert idx.count() == n


def test_every_active_scenario_is_named_in_the_handoff(tmp_path: Path) -> None:
    # the newest 40 runs are all of one scenario: the other active one is named all the same; an old one is not
    info = build(tmp_path / "ws", 120, scenarios=3, cases_per=2, active=2, blocked=True, recent=100)
    ws = Workspace(tmp_path / "ws")
    first, second = info["active"]
    with open_index(ws) as idx:
        assert {r.scenario for r in idx.recent(40)} == {second}
        assert first in {r.scenario for r in idx.recent(80)}
    text = handoff.refresh(ws)
    assert f"scenario {second}:" in text and first in text, text
    assert info["inactive"][0] not in text
    assert len(text.encode()) <= handoff.MAX_BYTES and text.count("\n") <= handoff.MAX_LINES
    # the newest first: the latest scenario's rows, then the other active one
    assert text.index(second) < text.index(first)


@pytest.mark.integration
def test_cli_index_rebuild(ledger: tuple[Workspace, dict[str, Any]]) -> None:
    ws, info = ledger
    before = answers(ws, info)
    p = subprocess.run(
        [sys.executable, "-m", "caseledger", "index", "--rebuild", "--workspace", str(ws.root), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    out = orjson.loads(p.stdout)
    assert out["runs"] == len(list(ws.runs_dir.iterdir())) and out["damaged"] == []
    assert answers(ws, info) == before


def test_a_ledger_that_cannot_hold_the_index_is_read_through_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = build(tmp_path / "ws", 12, scenarios=1, cases_per=2, active=1)
    ws = Workspace(tmp_path / "ws")
    expected = phase_status(ws).text(), phase_status(ws, info["some_run"]).text(), _stamp(handoff.render(ws))
    drop_index(ws)
    from caseledger.ledger import index as index_mod

    monkeypatch.setattr(index_mod, "writable", lambda ledger: False)  # as a read-only ledger answers (not to root)
    assert (phase_status(ws).text(), phase_status(ws, info["some_run"]).text(), _stamp(handoff.render(ws))) == expected
    assert not index_path(ws).exists()
