"""The ends of a formal load, shared by its four ways of running (run/load/ends.py): a load found gone without an
end file, and confirm_end's count of the raw records against the end file. In-process on a run directory as the
controller writes it; no client is started (a test that started one would fail on the missing service)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from caseledger.errors import FailureClass, PhaseFailed
from caseledger.ledger import event_types as et
from caseledger.ledger.evidence import LoadEnd
from caseledger.ledger.runs import Run, read_run
from caseledger.run.load import ends, one
from caseledger.workspace import Workspace, write_json
from tests.helpers import load_draft, make_run_dir, report_records

pytestmark = pytest.mark.fast


def _run(tmp_path: Path, records: int, anchor: bool) -> Run:
    ws = Workspace(tmp_path / "ws")
    paths = make_run_dir(ws, load_draft(9, 8, 2))  # port 9 (discard): nothing may be sent
    paths.load_dir.mkdir(parents=True)
    with paths.raw.open("wb") as f:
        for rec in report_records()[:records]:
            f.write(orjson.dumps(rec) + b"\n")
    if anchor:
        write_json(paths.load_anchor, {"wall_ns": 1, "mono_ns": 1})
    return read_run(paths.root, ws)


def _events() -> tuple[list[et.RunEvent], et.Emit]:
    seen: list[et.RunEvent] = []
    return seen, seen.append


def test_a_load_that_started_and_lost_its_client_fails_end_unknown_and_starts_no_client(tmp_path: Path) -> None:
    """The anchor says the formal load began; no record, no end file, no client: nothing is sent again."""
    run = _run(tmp_path, records=0, anchor=True)
    seen, emit = _events()
    with pytest.raises(PhaseFailed) as e:
        one.load(run, 1, emit)
    assert e.value.failure_class == FailureClass.END_UNKNOWN, e.value
    assert "exited without an end file: 0 of 8 requests recorded" in str(e.value)
    assert not run.paths.load_pid.exists() and not run.paths.load_go.exists() and seen == []


def test_a_resumed_load_whose_client_is_gone_ends_partial_on_its_records(tmp_path: Path) -> None:
    run = _run(tmp_path, records=3, anchor=True)
    seen, emit = _events()
    got = one.load(run, 2, emit)
    assert got.partial and got.done == 3 and got.never_sent is not None, got
    assert run.paths.load_partial.exists() and seen == []


def test_a_first_attempt_whose_client_is_gone_fails_and_keeps_its_records(tmp_path: Path) -> None:
    run = _run(tmp_path, records=3, anchor=False)
    with pytest.raises(PhaseFailed) as e:
        one.load(run, 1, _events()[1])
    assert e.value.failure_class == FailureClass.END_UNKNOWN and "3 of 8 requests recorded" in str(e.value)
    assert not run.paths.load_partial.exists() and run.paths.raw.read_bytes().count(b"\n") == 3


def _end(done: int) -> LoadEnd:
    return {"planned": 8, "sent": 8, "done": done, "ok": done, "failed": 0}


def test_confirm_counts_the_raw_records_against_the_end_file(tmp_path: Path) -> None:
    run = _run(tmp_path, records=8, anchor=True)
    got = ends.confirmed(run.paths, _end(8))
    assert got.records == 8 and got.all_accounted and got.processes is None and got.raw_sha256
    assert ends.confirmed(run.paths, _end(8), processes=2).processes == 2
    with pytest.raises(PhaseFailed) as e:
        ends.confirmed(run.paths, _end(7))
    assert e.value.failure_class == FailureClass.END_UNKNOWN and "raw records 8 != end file done 7" in str(e.value)
