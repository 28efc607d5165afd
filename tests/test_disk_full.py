"""A full disk, for real: the workspace on a small tmpfs, filled by a fault hook at a chosen point. Every
served request keeps its raw record, the cause reaches events and status, and resume goes on once space
is free. Needs a tmpfs mount (root); skipped where the machine does not allow one."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from caseledger import services
from caseledger.faults import FILLER, fill_disk
from caseledger.ledger import authorization, read_events
from caseledger.ledger.event_types import DiskWaited, PhaseEnded
from caseledger.tools import freeze_case, phase_status, resume
from caseledger.workspace import Workspace, reserve
from tests.conftest import free_port, ref_draft, start_with_fault
from tests.helpers import by_phase, cell, knee_campaign, until_complete

pytestmark = pytest.mark.integration


@pytest.fixture
def small_ws(tmp_path: Path) -> Iterator[Workspace]:
    mnt = tmp_path / "fs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"no tmpfs mount on this machine ({r.stderr.decode().strip()[:80]}): needs root")
    ws = Workspace(mnt / "ws")
    (ws.root / "cases").mkdir(parents=True)
    authorization.set_mode(ws, "auto")
    try:
        yield ws
    finally:
        services.stop_all(ws)
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def draft(port: int) -> dict[str, object]:
    return ref_draft(
        port,
        service={
            "reference": {
                "prefill_tokens_per_s": 200000,
                "decode_step_s": 0.01,
                "decode_step_per_seq_s": 0.0002,
                "slots": 8,
            }
        },
        dataset={"source": "synthetic", "input_tokens": 64, "output_tokens": 16},
    )


def free_space(ws: Workspace, run_id: str) -> None:
    (ws.run(run_id).root / FILLER).unlink()


@pytest.mark.processes
def test_disk_full_mid_load_keeps_every_served_record_and_resume_finishes(
    small_ws: Workspace, monkeypatch: pytest.MonkeyPatch, fault_matrix: dict[str, dict[str, bool]]
) -> None:
    ws, port = small_ws, free_port()
    case = freeze_case(ws, draft=draft(port))
    # the disk fills after the 3rd record; the client's spare, freed as it exits, is filled again before
    # confirm_end, so the controller meets ENOSPC too
    fills = "load:fill_disk_after=3,controller:fill_disk_before=confirm_end"
    r = start_with_fault(monkeypatch, fills, ws, case.case_id, wait=True, timeout_s=120)
    paths = ws.run(r.run_id)
    with cell(fault_matrix, "disk full mid-load (tmpfs)") as c:
        fs = os.statvfs(paths.root)
        c.check("full", fs.f_bavail * fs.f_frsize < 1 << 20, fs)  # really full (left: the freed spare)
        s = phase_status(ws, r.run_id)
        c.check("class", s.state == "failed" and s.failure_class == "disk" and s.phase == "confirm_end", s.text())
        c.check("next", "disk full (ENOSPC)" in (s.blocker or "") and "free disk space" in s.next_call, s.text())
        # the raw space was reserved before the first send: all 8 served requests have their record
        records = paths.raw.read_bytes().splitlines()
        c.check("raw", len(records) == 8, len(records))
        c.check("count", by_phase(port) == 8, by_phase(port))
        ended = [e for e in read_events(paths).events if isinstance(e, PhaseEnded)]
        c.check("event", any(e.data.failure_class == "disk" for e in ended))
        free_space(ws, r.run_id)
        res = resume(ws, r.run_id, wait=True, timeout_s=120)
        c.check("state", res.state == "succeeded", res.text())
        s = phase_status(ws, r.run_id)
        c.check("resend", s.done == 8 and s.results_extracted and by_phase(port) == 8, s.text())  # none re-sent


@pytest.mark.processes
def test_disk_full_before_the_load_sends_nothing_and_resume_sends_it_once(
    small_ws: Workspace, monkeypatch: pytest.MonkeyPatch, fault_matrix: dict[str, dict[str, bool]]
) -> None:
    ws, port = small_ws, free_port()
    case = freeze_case(ws, draft=draft(port))
    r = start_with_fault(monkeypatch, "controller:fill_disk_before=load", ws, case.case_id, wait=True, timeout_s=120)
    with cell(fault_matrix, "disk full before the load (tmpfs)") as c:
        s = phase_status(ws, r.run_id)
        c.check("class", s.state == "failed" and s.failure_class == "disk" and s.phase == "load", s.text())
        c.check("count", by_phase(port) == 0 and s.sent == 0, by_phase(port))
        c.check("next", s.resume_runs[:1] == ["load"] and not s.next_restarts_service, s.text())
        free_space(ws, r.run_id)
        res = resume(ws, r.run_id, wait=True, timeout_s=120)
        c.check("state", res.state == "succeeded", res.text())
        c.check("once", by_phase(port) == 8, by_phase(port))


def test_raw_space_is_reserved_or_refused(small_ws: Workspace) -> None:
    d = small_ws.root / "r"
    d.mkdir()
    fd = os.open(d / "raw.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        assert reserve(fd, 1 << 20)  # room: reserved, file size unchanged
        assert os.fstat(fd).st_size == 0
        fill_disk(d)
        os.write(fd, b"x" * (1 << 19))  # the reservation holds on a full disk
        assert not reserve(fd, 4 << 20)  # no room for more: refused, not an error
    finally:
        os.close(fd)


@pytest.mark.processes  # the detached driver holds while the disk is full
def test_a_disk_that_fills_mid_campaign_holds_the_driver_until_space_is_free_and_gives_no_point_up(
    small_ws: Workspace, fault_matrix: dict[str, dict[str, bool]]
) -> None:
    """The workspace's disk fills once the campaign's first point has ended and stays full for 4 s: the driver
    starts and resumes no point meanwhile (each would fail [disk] at once and spend its attempts), goes on by
    itself once space is free, and every point is measured; the target counts what the ledger reports."""
    import threading
    import time

    from caseledger.campaign.store import driver_events
    from caseledger.ledger.runs import scan_runs
    from caseledger.tools import freeze_any, start_any
    from tests.conftest import assert_one_answer

    ws, port = small_ws, free_port()
    d = knee_campaign(port, [1, 2, 4], search={"kind": "grid"}, repeats={"runs": 1, "settle_runs": 1, "budget": 0})
    f = freeze_any(ws, draft=d)
    filler = ws.root / "filler"
    filler.mkdir()
    seen: dict[str, int] = {}

    def fill_after_the_first_point() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if any(e.type == "point_ended" for e in driver_events(ws, f.campaign_id)):
                fill_disk(filler)
                seen["at_full"] = len(scan_runs(ws).metas)
                time.sleep(4)
                seen["before_free"] = len(scan_runs(ws).metas)
                (filler / FILLER).unlink()
                return
            time.sleep(0.02)

    t = threading.Thread(target=fill_after_the_first_point, daemon=True)
    with cell(fault_matrix, "disk full mid-campaign (tmpfs)") as c:
        t.start()
        start_any(ws, f.campaign_id)
        view = until_complete(ws, f.campaign_id, timeout_s=120)
        t.join(10)
        c.check("ran", "before_free" in seen, seen)
        # a point launched as the disk filled may fail [disk]; none starts while it stays full
        c.check("held", seen.get("before_free", 99) - seen.get("at_full", 0) <= 1, seen)
        c.check("state", view.complete and all(r.status == "measured" for r in view.rows), view.text())
        runs = sum(len(r.run_ids) for r in view.rows)
        c.check("count", by_phase(port) == sum(r.sent for r in view.rows) == view.progress["sent"] >= 32 * 3, runs)
        waited = [e for e in driver_events(ws, f.campaign_id) if isinstance(e, DiskWaited)]
        c.check("event", len(waited) == 1 and waited[0].seconds >= 2, waited)
        c.check("one", bool(assert_one_answer(ws, f.campaign_id)))
