"""One target across workspaces (issue 57, item 3): a service that workspace A started and keeps on a target is
known host-wide. Workspace B's start on that target reuses it when it is B's identity (verified, never stopped by
B), and is otherwise refused naming A's workspace, case and pid and the one fix; B's campaign never gives a point
up over it: it measures on A's service, or waits, saying so in status, until the target is free."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from caseledger import procs, services
from caseledger.campaign.store import driver_events
from caseledger.campaign.view import CampaignView
from caseledger.errors import TargetHeld
from caseledger.ledger import authorization, keepers
from caseledger.ledger.evidence import ServiceRecord
from caseledger.ledger.runs import scan_runs
from caseledger.run.campaign_driver import stop_drivers
from caseledger.services.kept import cwd_bound
from caseledger.tools import freeze_any, freeze_case, start_any, start_run, status_any
from caseledger.tools.campaigns import CampaignFrozen
from caseledger.workspace import Workspace
from tests.conftest import free_port, knee_base, stats, tree_digest
from tests.helpers import cell, until_complete


def test_an_argv_path_read_from_each_workspace_must_be_the_same_file(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d, text in ((a, "one"), (b, "two")):
        (d / "tpl").mkdir(parents=True)
        (d / "tpl" / "chat.jinja").write_text(text)
        (d / "same.json").write_text("{}")
    argv = ["/usr/bin/server", "--port", "8000", '{"a": 1}', "--config=same.json"]
    assert cwd_bound(argv, a, b) is None  # absolute, plain words, JSON, same bytes under a relative path
    assert cwd_bound([*argv, "--chat-template", "tpl/chat.jinja"], a, b) == "tpl/chat.jinja"
    assert cwd_bound([*argv, "--chat-template=tpl/chat.jinja"], a, b) == "tpl/chat.jinja"
    (b / "only-here").write_text("x")
    assert cwd_bound([*argv, "only-here"], a, b) == "only-here"  # one side lacks it: not the same file


# ------------------------------------------------------------------------------------ two workspaces, one target

N = 16  # formal requests per run
SLOTS_A, SLOTS_OTHER = 64, 32  # the reference target's slots: A's service identity, and another one


def _workspace(root: Path) -> Workspace:
    w = Workspace(root)
    (w.root / "cases").mkdir(parents=True)
    authorization.set_mode(w, "auto")
    return w


def _base(port: int, slots: int, scenario: str) -> dict[str, Any]:
    d = knee_base(port, scenario, N)
    d["service"]["reference"] = {**d["service"]["reference"], "slots": slots}
    # what is checked is where each point ran, not its figures: a busy host's windows are accepted (as in the pool's)
    d["measurement"] = {"evidence": {"max_other_cpu_share": 1.0}}
    return d


def _campaign(port: int, slots: int, name: str) -> dict[str, Any]:
    """Two load points (C=1, C=2) on one service identity: a grid, one valid run per point (plus the control's)."""
    return {
        "campaign": {
            "name": name,
            "base": _base(port, slots, name),
            "axes": [{"path": "load.concurrency", "values": [1, 2]}],
            "search": {"kind": "grid"},
            "repeats": {"runs": 1, "settle_runs": 1, "budget": 0},
            # one valid run per point is the check: a contended host's ~10% move of a control is no drift here
            "decision": {"primary_metric": "output_throughput", "min_effect": 0.25},
        }
    }


def _service_of(ws: Workspace, run_id: str) -> ServiceRecord:
    """The run's service evidence; a record with no pid when its service phase failed (it wrote none)."""
    return ServiceRecord.read(ws.run(run_id).phase_file("service")) or ServiceRecord(outcome="skipped")


def _measured_every_point(v: CampaignView) -> bool:
    return bool(v.rows) and all(r.status == "measured" and r.runs >= 1 for r in v.rows)


@pytest.fixture
def two(tmp_path: Path) -> Iterator[tuple[Workspace, Workspace]]:
    a, b = _workspace(tmp_path / "a"), _workspace(tmp_path / "b")
    yield a, b
    for w in (a, b):  # a failed test must leave no driver starting points and no service running
        stop_drivers(w)
        services.stop_all(w)


@pytest.mark.integration
@pytest.mark.processes  # detached drivers, controllers and services in two workspaces: the point is real processes
def test_a_campaign_reuses_or_waits_for_the_service_another_workspace_keeps_and_measures_every_point(
    two: tuple[Workspace, Workspace], fault_matrix: dict[str, dict[str, bool]]
) -> None:
    a, b = two
    port = free_port()
    # A measures and keeps its service on the port, as any run does (warm, for A's next run)
    fa = freeze_case(a, draft=_base(port, SLOTS_A, "kept"))
    ra = start_run(a, fa.case_id, wait=True)
    assert ra.state == "succeeded", ra.text()
    key = scan_runs(a).metas[0].target_key
    assert key is not None
    kept = keepers.read(key)
    assert kept is not None and kept["workspace"] == str(a.root) and kept["case_id"] == fa.case_id, kept
    pid_a = kept["proc"]["pid"]
    assert procs.alive(kept["proc"]) and stats(port)["pid"] == pid_a

    with cell(fault_matrix, "a service another workspace keeps on the target") as c:
        # 1. B's points have A's identity: measured on A's service, verified, never stopped or started by B
        same = freeze_any(b, draft=_campaign(port, SLOTS_A, "same"))
        assert isinstance(same, CampaignFrozen)
        start_any(b, same.campaign_id)
        v1 = until_complete(b, same.campaign_id, timeout_s=240)
        c.check("state", _measured_every_point(v1), v1.text())
        runs1 = [rid for r in v1.rows for rid in r.run_ids]
        recs = [_service_of(b, rid) for rid in runs1]
        c.check(
            "reuse",
            all(r.outcome == "reused" and r.pid == pid_a and r.kept_by == str(a.root) for r in recs),
            [(r.outcome, r.pid, r.kept_by) for r in recs],
        )
        c.check("starts", v1.progress["service_starts"] == 0, v1.progress)
        c.check("keeper", procs.alive(kept["proc"]) and keepers.read(key) == kept, keepers.read(key))
        c.check("count", stats(port)["by_phase"].get("load", 0) == N * (1 + len(runs1)), stats(port))

        # a plain start of another identity is refused before anything is written, naming A and the one fix
        other = freeze_case(b, draft=_base(port, SLOTS_OTHER, "other"))
        ledger_before = tree_digest(b.ledger / "runs")
        with pytest.raises(TargetHeld) as refused:
            start_run(b, other.case_id)
        shown = str(refused.value)
        named = (str(a.root), fa.case_id, f"pid {pid_a}", f"caseledger target stop --workspace {a.root}")
        c.check("refused", all(x in shown for x in named), shown)
        c.check("tree", tree_digest(b.ledger / "runs") == ledger_before, "a refused start wrote a run")

        # 2. B's points need another identity: the driver waits, status names A (workspace, case, pid, fix)
        diff = freeze_any(b, draft=_campaign(port, SLOTS_OTHER, "other-slots"))
        assert isinstance(diff, CampaignFrozen)
        start_any(b, diff.campaign_id)
        deadline = time.monotonic() + 60
        while not any(e.type == "waiting" for e in driver_events(b, diff.campaign_id)):
            assert time.monotonic() < deadline, driver_events(b, diff.campaign_id)
            time.sleep(0.1)
        time.sleep(3.0)  # several looks of the driver: still waiting, nothing given up, nothing started
        waiting = status_any(b, diff.campaign_id)
        assert isinstance(waiting, CampaignView)
        text = waiting.text()
        c.check("why", waiting.driver_alive and all(x in text for x in named), text)
        c.check("once", len(scan_runs(b).metas) == len(runs1), "a run was created while the target was kept")
        c.check("svc", stats(port)["pid"] == pid_a and procs.alive(kept["proc"]), "B touched A's service")

        # the one fix, run as a person would; B's driver then starts its own service and measures every point
        out = subprocess.run(
            [sys.executable, "-m", "caseledger", "target", "stop", "--workspace", str(a.root), "--json"],
            capture_output=True,
            text=True,
            check=True,
        )
        c.check("stop", orjson.loads(out.stdout)["stopped"] != [], out.stdout)
        v2 = until_complete(b, diff.campaign_id, timeout_s=240)
        c.check("state", _measured_every_point(v2), v2.text())
        c.check("given", not any(r.status == "given_up" for r in (*v1.rows, *v2.rows)), (v1.text(), v2.text()))
        recs2 = [_service_of(b, rid) for r in v2.rows for rid in r.run_ids]
        c.check("starts", v2.progress["service_starts"] == 1 and all(r.kept_by is None for r in recs2), v2.progress)
        now = keepers.read(key)
        c.check("keeper", now is not None and now["workspace"] == str(b.root), now)


@pytest.mark.integration
@pytest.mark.processes
def test_target_stop_in_the_reusing_workspace_leaves_the_keepers_service_running(
    two: tuple[Workspace, Workspace],
) -> None:
    a, b = two
    port = free_port()
    ra = start_run(a, freeze_case(a, draft=_base(port, SLOTS_A, "kept")).case_id, wait=True)
    rb = start_run(b, freeze_case(b, draft=_base(port, SLOTS_A, "kept")).case_id, wait=True)
    assert ra.state == rb.state == "succeeded" and rb.run_id is not None, (ra.text(), rb.text())
    key = scan_runs(a).metas[0].target_key
    assert key is not None
    kept = keepers.read(key)
    assert kept is not None and _service_of(b, rb.run_id).pid == kept["proc"]["pid"]
    assert services.stop_all(b) == [] and procs.alive(kept["proc"])  # B reused it: not B's to stop
    assert services.stop_all(a) == [key] and not procs.alive(kept["proc"]) and keepers.read(key) is None


@pytest.mark.integration
@pytest.mark.processes  # a controller that exits mid-run, its lease lapsing, a resume in a fresh controller
def test_a_resume_that_would_start_the_service_again_is_refused_naming_the_keeper_and_spends_nothing(
    two: tuple[Workspace, Workspace], monkeypatch: pytest.MonkeyPatch
) -> None:
    """B's run lost its controller after warmup and then its service; meanwhile A started and keeps its own service
    on the port. B's resume (which must start the service again) is refused before its lease or any event, naming A
    and the fix; once A's service is stopped, the same resume finishes the run."""
    from caseledger import ledger
    from caseledger.ledger import leases
    from caseledger.ledger.events import read_events
    from caseledger.tools import phase_status, resume
    from tests.conftest import start_with_fault

    monkeypatch.setenv(leases.ENV_LEASE_S, "4")  # B's lapsed lease frees the target for A within seconds
    monkeypatch.setattr(leases, "LEASE_SECONDS", 4.0)
    a, b = two
    port = free_port()
    rb = start_with_fault(
        monkeypatch,
        "controller:exit_after=warmup",
        b,
        freeze_case(b, draft=_base(port, SLOTS_OTHER, "other")).case_id,
        wait=True,
    )
    assert rb.run_id is not None
    rid = rb.run_id
    services.stop_all(b)  # B's service is gone too: a resume must start it again
    key = scan_runs(b).metas[0].target_key
    assert key is not None
    deadline = time.monotonic() + 20
    while (lease := ledger.read_lease(b, key)) is not None and lease.live() and time.monotonic() < deadline:
        time.sleep(0.2)
    ra = start_run(a, freeze_case(a, draft=_base(port, SLOTS_A, "kept")).case_id, wait=True)
    assert ra.state == "succeeded", ra.text()
    kept = keepers.read(key)
    assert kept is not None and kept["workspace"] == str(a.root)

    events_before = len(read_events(b.run(rid)).events)
    with pytest.raises(TargetHeld) as refused:
        resume(b, rid)
    shown = str(refused.value)
    assert str(a.root) in shown and f"pid {kept['proc']['pid']}" in shown, shown
    assert f"caseledger target stop --workspace {a.root}" in shown, shown
    assert len(read_events(b.run(rid)).events) == events_before  # no attempt, no lease taken
    lease = ledger.read_lease(b, key)
    assert lease is None or not lease.live() or lease.run_id != rid, lease

    services.stop_all(a)  # the fix
    done = resume(b, rid, wait=True)
    assert done.state == "succeeded", phase_status(b, rid).text()
    assert _service_of(b, rid).outcome == "done" and _service_of(b, rid).kept_by is None
