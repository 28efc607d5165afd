"""Errors: one tree under CaseledgerError, context as attributes, str() unchanged; the JSONL reader never raises."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import orjson
import pytest

import caseledger.errors as errors
from caseledger.errors import (
    AisbenchImportError,
    CaseledgerError,
    FailureClass,
    PhaseFailed,
    RemoteError,
    ResultConflict,
)
from caseledger.ledger.event_types import UnknownEvent
from caseledger.ledger.events import read_events
from caseledger.records import JsonLines, ReadResult, read_jsonl, read_records
from caseledger.workspace import RunPaths


def _defined_classes() -> dict[str, type]:
    return {n: c for n, c in vars(errors).items() if inspect.isclass(c) and c.__module__ == errors.__name__}


def test_every_class_in_errors_is_a_caseledger_error_except_failure_class() -> None:
    classes = _defined_classes()
    assert {"ResultConflict", "RemoteError", "AisbenchImportError", "PhaseFailed", "FailureClass"} <= set(classes)
    for name, cls in classes.items():
        if name in ("FailureClass", "FailureEvidence"):  # what a failure names and carries, not errors
            assert not issubclass(cls, BaseException)
            continue
        assert issubclass(cls, CaseledgerError), name
        assert cls.__doc__, f"{name} has no docstring"
        assert name in (errors.__doc__ or ""), f"{name} is missing from the tree in errors.py's docstring"


def test_moved_errors_keep_their_names_and_old_import_paths() -> None:
    from caseledger.importers import AisbenchImportError as from_importers
    from caseledger.importers.aisbench import AisbenchImportError as from_aisbench
    from caseledger.metrics import ResultConflict as from_metrics
    from caseledger.services import remote

    assert from_metrics is ResultConflict
    assert remote.RemoteError is RemoteError
    assert from_importers is from_aisbench is AisbenchImportError
    assert issubclass(AisbenchImportError, ValueError)  # was a ValueError before the move: callers may rely on it


def test_failure_classes_are_the_ones_docs_failures_tabulates_and_lowercase_names() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "failures.md").read_text()
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", doc, re.MULTILINE))  # the table's first column
    assert documented == {m.value for m in FailureClass}, documented ^ {m.value for m in FailureClass}
    for m in FailureClass:
        assert m == m.value and str(m) == m.value and f"{m}" == m.value
        assert m.name == m.value.upper()


def test_phase_failed_keeps_a_failure_class_and_str_is_unchanged() -> None:
    e = PhaseFailed("warmup: 0 of 4 requests succeeded", "service", "check the service log")
    assert isinstance(e.failure_class, FailureClass) and e.failure_class is FailureClass.SERVICE
    assert e.failure_class == "service"  # compares equal to the string event logs carry
    assert str(e) == "warmup: 0 of 4 requests succeeded; check the service log"
    assert (e.message, e.fix, e.run_id, e.phase) == (
        "warmup: 0 of 4 requests succeeded",
        "check the service log",
        None,
        None,
    )
    assert orjson.loads(orjson.dumps({"failure_class": e.failure_class})) == {"failure_class": "service"}

    bare = PhaseFailed("no end file", FailureClass.END_UNKNOWN)
    assert bare.failure_class is FailureClass.END_UNKNOWN and str(bare) == "no end file" and bare.fix == ""

    with pytest.raises(ValueError, match="not_a_class"):
        PhaseFailed("x", "not_a_class")


def test_context_is_attributes_not_text() -> None:
    e = PhaseFailed("boom", "collect", "reprocess", run_id="r-0001", phase="postprocess")
    assert (e.run_id, e.phase, e.failure_class) == ("r-0001", "postprocess", FailureClass.COLLECT)
    assert str(e) == "boom; reprocess"
    plain = CaseledgerError("plain", run_id="r-0002")
    assert (plain.run_id, plain.phase, str(plain)) == ("r-0002", None, "plain")
    assert str(RemoteError("ssh to u@h:22 failed", "check sshd")) == "ssh to u@h:22 failed; check sshd"
    assert str(AisbenchImportError("no x_details.jsonl in /d")) == "no x_details.jsonl in /d"
    with pytest.raises(TypeError):
        CaseledgerError("m", "fix", "r-0003")  # context is keyword-only


# ------------------------------------------------------------------------------------------------ JSONL


def test_jsonl_reports_a_torn_last_line_and_counts_a_bad_middle_line(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"i": 0}\n{"i": 1, broken\n\n{"i": 2}\n{"i": 3, "tor')
    got = read_jsonl(path)
    assert got == JsonLines(items=[{"i": 0}, {"i": 2}], torn_tail=True, bad_lines=1)


def test_jsonl_a_complete_bad_last_line_is_bad_not_torn(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"i": 0}\nnot json\n')
    assert read_jsonl(path) == JsonLines(items=[{"i": 0}], torn_tail=False, bad_lines=1)


def test_jsonl_a_last_line_without_newline_that_parses_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"i": 0}\n{"i": 1}')
    assert read_jsonl(path) == JsonLines(items=[{"i": 0}, {"i": 1}])


def test_jsonl_missing_and_empty_files_read_as_empty(tmp_path: Path) -> None:
    assert read_jsonl(tmp_path / "absent.jsonl") == JsonLines()
    (tmp_path / "empty.jsonl").write_bytes(b"")
    assert read_jsonl(tmp_path / "empty.jsonl") == JsonLines()


def test_records_and_events_readers_share_the_jsonl_reader(tmp_path: Path) -> None:
    raw = tmp_path / "raw.jsonl"
    raw.write_bytes(b'{"i": 0}\n???\n{"i": 1}\n{"i": 2')
    assert read_records(raw) == ReadResult(records=[{"i": 0}, {"i": 1}], torn_tail=True, bad_lines=1)

    paths = RunPaths(tmp_path / "run")
    paths.events.parent.mkdir(parents=True, exist_ok=True)
    paths.events.write_bytes(b'{"seq": 1}\n{oops}\n{"seq": 2}\n{"seq": 3, "ty')
    log = read_events(paths)  # lines of no known type: kept as such, in order
    assert [(type(e), e.seq) for e in log.events] == [(UnknownEvent, 1), (UnknownEvent, 2)]
    assert (log.torn_tail, log.bad_lines) == (True, 1)
