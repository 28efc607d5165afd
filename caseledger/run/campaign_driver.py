"""The campaign's driver: a detached process that asks the planner, starts each next point through the same core as
start_run, waits for it, and asks again until the campaign is complete; no agent round trip between points.

It holds ledger/campaigns/<id>/driver.lock (one driver per campaign); it survives nothing and needs to: every
fact is in the ledger, so a new driver (start_run or resume of the campaign) continues where one died. A point
whose run failed at a repairable phase (its controller lost, the service, the collector, an overload) is
resumed at that phase, never measured again; a running point is waited for, never started twice. A paused
authorization, a target held by another owner (another campaign), or a service another workspace keeps on the
target that is not the point's (services/kept.py) starts no point: the driver waits, and status says why.

    python -m caseledger.run.campaign_driver WORKSPACE CAMPAIGN_ID
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from caseledger import procs
from caseledger.campaign import planner, pool
from caseledger.campaign.model import Scalar
from caseledger.campaign.planner import PointObs
from caseledger.campaign.search import REQUESTS, STRATEGIES, Observed, service_axes, space_size
from caseledger.campaign.store import (
    Campaign,
    add_point,
    all_campaigns,
    driver_events,
    driver_file,
    driver_lock,
    events_file,
    host_refusals,
    load_campaign,
)
from caseledger.campaign.view import (
    account,
    campaign_view,
    costs_of,
    current_standing,
    search_open,
    service_key,
)
from caseledger.case.metrics import METRICS
from caseledger.case.model import Case
from caseledger.case.phases import Phase
from caseledger.case.store import load_case
from caseledger.errors import CaseledgerError, NotAuthorized, TargetHeld
from caseledger.ledger import authorization, indexdb
from caseledger.ledger import event_types as et
from caseledger.ledger.events import append_driver_event
from caseledger.ledger.runs import RunMeta, load_run
from caseledger.ledger.state import PhaseState, RunState, RunView, fold
from caseledger.run.admission.admit import check_start
from caseledger.run.admission.envcheck import CHART_ENV
from caseledger.run.controller import DRIVEN_BY
from caseledger.run.preflight import spawn_ahead
from caseledger.run.resume import resume
from caseledger.run.start import drop_unhanded, launch, spawn_controller_ahead, wait_for
from caseledger.views import handoff
from caseledger.workspace import Workspace, read_json_or_none, utc_now, write_json

WAIT_S = 1.0  # between looks at a paused authorization or a held target
RUN_TIMEOUT_S = 7 * 86_400.0  # a point runs as long as its case says; the driver only waits
RESUMES_PER_RUN = 2
DISTORTED_PAUSE_S, DISTORTED_PAUSE_MAX_S = 10.0, 60.0  # before repeating a point a busy host distorted
# before sending an overloaded point's load again (429/503 answers): doubled per attempt without a result
OVERLOAD_BACKOFF_S, OVERLOAD_BACKOFF_MAX_S = 5.0, 120.0
# a workspace with less free space than this starts and resumes no point (each would fail [disk] at once and spend
# the point's attempts): the driver waits for space, since freeing it is the one thing to do
DISK_FLOOR_BYTES = 16 << 20
# failure classes a resume repairs without a changed case (DESIGN.md: failure classes and what resume does)
_REPAIRABLE = {"service", "collect", "end_unknown", "overload", "disk"}


def event(ws: Workspace, gid: str, ev: et.DriverEvent) -> None:
    append_driver_event(events_file(ws, gid), ev)


def stamp(ws: Workspace, gid: str) -> tuple[int, ...]:
    """A cheap mark that changes when a waiting reader should look again: the driver starts or ends (the campaign
    is complete, or it stopped), or it waits or was refused (something needs the reader). Points starting and
    ending are progress, not news: a reader waits through them (each answer is one tool call of an agent)."""
    try:
        st = Path(driver_file(ws, gid)).stat()
        out = [st.st_size, st.st_mtime_ns]
    except OSError:
        out = [0, 0]
    news = (et.DriverStarted, et.DriverEnded, et.Waiting, et.PointRefused, et.ResumeRefused, et.HostRefused)
    return (*out, sum(1 for e in driver_events(ws, gid) if isinstance(e, news)))


def _resumable(ws: Workspace, run_id: str) -> bool:
    v = fold(ws, load_run(ws, run_id))
    if v.controller_alive or v.state not in (RunState.FAILED, RunState.END_UNKNOWN):
        return False
    cls = "end_unknown" if v.state == RunState.END_UNKNOWN else (v.failure_class.value if v.failure_class else "")
    return cls in _REPAIRABLE


def _step(ws: Workspace, gid: str, resumed: dict[str, int]) -> str:
    """One look at the campaign: wait for a running point, resume a repairable one, start the next; returns
    'done' when complete, 'wait' when it must wait, 'went' when it did something."""
    camp = load_campaign(ws, gid)
    if camp.pool:
        return _step_pool(ws, camp, resumed)
    pl, obs, extra, mine = current_standing(ws, camp)
    for o in obs:
        if o.active:
            wait_for(ws, o.active, "end", RUN_TIMEOUT_S)
            return "went"
    for o in obs:
        rid = (extra[o.case_id].run_ids or [""])[-1]
        if (o.runs == 0 and o.case_id in pl.given_up) or o.refused is not None:
            continue  # its attempts are spent (a resent load is an attempt), or the host refused it: the planner says
        if o.runs == 0 and rid and resumed.get(rid, 0) < RESUMES_PER_RUN and _resumable(ws, rid):
            if _refused_by_host(ws, gid, o.case_id, load_case(ws, o.case_id), o.label):
                return "went"  # a resume would start its service again: the same check as a start
            _back_off(ws, gid, o)
            return _resume_point(ws, gid, o, rid, resumed)
    if not pl.next:
        if not search_open(ws, camp):
            return "done"
        owed = _propose(ws, camp, obs, mine)
        if isinstance(owed, str):
            return owed
        cid, why = owed  # repeats the running service owes before the search leaves it
    else:
        cid, why = pl.next[0]
    point = camp.point(cid)
    o = next(x for x in obs if x.case_id == cid)
    _back_off(ws, gid, o)
    if o.bad_runs and (o.last_problem or "").startswith("distorted"):
        # a contended host distorted its last run: repeating at once measures the same contention
        pause = min(DISTORTED_PAUSE_MAX_S, DISTORTED_PAUSE_S * o.bad_runs)
        _note_wait(ws, gid, f"{o.label}: last run distorted ({o.last_problem}); {pause:.0f} s before repeating it")
        time.sleep(pause)
    case = load_case(ws, cid)
    if _refused_by_host(ws, gid, cid, case, point.label if point else cid):
        return "went"  # the planner leaves it out now: the next look goes on with the others
    try:
        pre, ctl = _take_ahead(gid, case)
        view = launch(ws, cid, case, ahead=pre, controller_ahead=ctl)
    except (NotAuthorized, TargetHeld) as e:
        _note_wait(ws, gid, e.message, e.fix)
        return "wait"
    except CaseledgerError as e:
        event(ws, gid, et.PointRefused(case_id=cid, error=e.message))
        return "wait"
    label = point.label if point else cid
    event(ws, gid, et.PointStarted(case_id=cid, run_id=view.run_id, label=label, why=why))
    end = wait_for(ws, view.run_id, "end", RUN_TIMEOUT_S, progress=lambda v: _after_window(gid, v, case))
    event(ws, gid, et.PointEnded(case_id=cid, run_id=view.run_id, state=end.state.value))
    return "went"


def _resume_point(ws: Workspace, gid: str, o: PointObs, rid: str, resumed: dict[str, int]) -> str:
    """Resume a point's repairable run and wait for it: 'went'; 'wait' when the resume was refused before anything
    ran (a paused authorization, a held target, a service another workspace keeps there), which spends none of the
    point's resumes and is said in status."""
    announced: list[bool] = []

    def accepted(_: RunView | None = None) -> None:  # its controller runs: the resume counts from here
        if not announced:
            announced.append(True)
            resumed[rid] = resumed.get(rid, 0) + 1
            event(ws, gid, et.PointResumed(case_id=o.case_id, run_id=rid, label=o.label))

    try:
        resume(ws, rid, wait=True, timeout_s=RUN_TIMEOUT_S, progress=accepted)
    except (NotAuthorized, TargetHeld) as e:
        _note_wait(ws, gid, e.message, e.fix)
        return "wait"
    except CaseledgerError as e:
        accepted()  # refused otherwise (the lease host, the policy): an attempt, as it always was
        event(ws, gid, et.ResumeRefused(run_id=rid, error=e.message))
    return "went"


POOL_POLL_S = 0.2  # between looks at a pool's running points


def _step_pool(ws: Workspace, camp: Campaign, resumed: dict[str, int]) -> str:
    """A pool's look: every free target gets a point (the one its live service already serves first); a failed
    run is resumed on its own target; when nothing can start, wait until one of the running points ends. A point
    runs on one target at a time (the planner never names a running point), so none is measured twice."""
    gid = camp.campaign_id
    pl, obs, _, mine = current_standing(ws, camp)
    chk = pool.check(ws, camp, mine)
    for t, why in chk.refused.items():
        _note_once(ws, gid, t, et.TargetRefused(target=t, why=why))
    running = {o.active: o for o in obs if o.active}
    on = {m.run_id: pool.target_of(camp, m.case_id) for m in mine}
    busy = {on[r] for r in running if r in on}
    healthy, down = _pool_health(ws, camp, mine, chk.refused)
    free = [t for t in healthy if t not in busy] or [t for t in down if t not in busy and not healthy]
    if _resume_pool(ws, camp, obs, mine, on, free, resumed):
        return "went"
    wanted = pl.next
    if not wanted and free and search_open(ws, camp):
        got = _propose(ws, camp, obs, mine)
        if isinstance(got, str):
            return got  # a point was proposed, or the search ended: ask again
        wanted = [got]  # repeats the running service owes first
    went = False
    taken: set[str] = set()
    barred = host_refusals(ws, gid)  # a point the host refused on a target is not started there again
    for t in free:
        mine_t = [w for w in _for_target(wanted, obs, t, healthy) if _case_on(camp, w[0], t) not in barred]
        cid = _pick(ws, camp, mine_t, t, taken, mine, on)
        if cid is None:
            continue
        point = camp.point(cid)
        assert point is not None
        case_id = point.on[t]
        if _refused_by_host(ws, gid, case_id, load_case(ws, case_id), point.label, t):
            went = True  # recorded: the next look leaves it out on this target
            continue
        try:
            view = launch(ws, case_id, load_case(ws, case_id))
        except (NotAuthorized, TargetHeld) as e:
            _note_wait(ws, gid, f"{t}: {e.message}", e.fix)
            continue
        except CaseledgerError as e:
            event(ws, gid, et.PointRefused(case_id=case_id, target=t, error=e.message))
            continue
        taken.add(cid)
        why = dict(wanted).get(cid, "")
        event(ws, gid, et.PointStarted(case_id=case_id, run_id=view.run_id, label=point.label, target=t, why=why))
        went = True
    if went:
        return "went"
    if running:
        _wait_any(ws, list(running))
        return "went"
    if not wanted and not search_open(ws, camp):
        return "done"
    return "wait"


def _case_on(camp: Campaign, cid: str, t: str) -> str:
    point = camp.point(cid)
    return point.on.get(t, cid) if point is not None else cid


def _refused_by_host(ws: Workspace, gid: str, case_id: str, case: Case, label: str, target: str = "") -> bool:
    """The one check of every start (run/admission/admit.py), made before a point is launched: a point the host refuses
    (its policy does not allow what the point would start; caseledger's environment) is recorded once with the
    words and the fix, and fails at once: every view shows why, and the driver never tries it again (a launch
    would refuse it every second). A paused authorization or a held target stay waits (launch says those)."""
    try:
        on = f" on pool target '{target}'" if target else ""
        check_start(f"campaign {gid}", [(f"point '{label}'{on}", case)])
    except CaseledgerError as e:
        event(ws, gid, et.HostRefused(case_id=case_id, label=label, target=target, error=e.message, fix=e.fix))
        return True
    return False


def _pool_health(
    ws: Workspace, camp: Campaign, mine: list[RunMeta], refused: dict[str, str]
) -> tuple[list[str], list[str]]:
    """(healthy, down) targets of the pool, in its order, the refused left out. Down: its latest run failed in
    its service or lost its end (the target went away); points go to the others while any is healthy."""
    latest: dict[str, RunMeta] = {}
    for m in mine:
        latest[pool.target_of(camp, m.case_id)] = m
    healthy: list[str] = []
    down: list[str] = []
    for t in (x.name for x in camp.pool):
        if t in refused:
            continue
        last = latest.get(t)
        v = fold(ws, load_run(ws, last.run_id)) if last is not None else None
        gone = (
            v is not None
            and not v.controller_alive
            and (
                v.state == RunState.END_UNKNOWN
                or (v.state == RunState.FAILED and v.failure_class is not None and v.failure_class.value == "service")
            )
        )
        (down if gone else healthy).append(t)
    return healthy, down


def _resume_pool(
    ws: Workspace,
    camp: Campaign,
    obs: list[PointObs],
    mine: list[RunMeta],
    on: dict[str, str],
    free: list[str],
    resumed: dict[str, int],
) -> bool:
    """Resume a point's repairable failed run on its own target when that target is free (at most
    RESUMES_PER_RUN times; then the point starts again on any target)."""
    for o in obs:
        point = camp.point(o.case_id)
        if o.runs or o.active or point is None or o.refused is not None:
            continue
        rid = next((m.run_id for m in reversed(mine) if m.case_id in point.case_ids), "")
        if not rid or on.get(rid) not in free or resumed.get(rid, 0) >= RESUMES_PER_RUN or not _resumable(ws, rid):
            continue
        refused = None
        try:
            resume(ws, rid)
        except (NotAuthorized, TargetHeld) as e:  # refused before anything ran: no resume spent, none announced
            _note_wait(ws, camp.campaign_id, f"{on[rid]}: {e.message}", e.fix)
            return False
        except CaseledgerError as e:
            refused = e.message
        resumed[rid] = resumed.get(rid, 0) + 1
        event(ws, camp.campaign_id, et.PointResumed(case_id=o.case_id, run_id=rid, label=o.label, target=on[rid]))
        if refused is not None:
            event(ws, camp.campaign_id, et.ResumeRefused(run_id=rid, error=refused))
        return True
    return False


def _for_target(
    wanted: list[tuple[str, str]], obs: list[PointObs], t: str, healthy: list[str]
) -> list[tuple[str, str]]:
    """What target t may run of the wanted points: a control's run goes to a target it ran on before (another
    target's level is no drift: campaign/drift.py), unless none of those is healthy."""
    by = {o.case_id: o for o in obs}
    out = []
    for cid, why in wanted:
        ran = by[cid].targets if cid in by else []
        if why.startswith("control") and ran and t not in ran and any(x in healthy for x in ran):
            continue
        out.append((cid, why))
    return out


def _pick(
    ws: Workspace,
    camp: Campaign,
    wanted: list[tuple[str, str]],
    t: str,
    taken: set[str],
    mine: list[RunMeta],
    on: dict[str, str],
) -> str | None:
    """The point target t runs next: the first wanted one its live service already serves (no start), else the
    first wanted one; none already taken by another target in this look."""
    left = [cid for cid, _ in wanted if cid not in taken]
    if not left:
        return None
    last = next((m for m in reversed(mine) if on.get(m.run_id) == t), None)
    if last is not None:
        live = service_key(load_case(ws, last.case_id))
        for cid in left:
            p = camp.point(cid)
            if p is not None and t in p.on and service_key(load_case(ws, p.on[t])) == live:
                return cid
    return left[0]


def _wait_any(ws: Workspace, run_ids: list[str]) -> None:
    """Until one of these runs has ended (its controller gone), looking every POOL_POLL_S."""
    while True:
        for rid in run_ids:
            v = fold(ws, load_run(ws, rid))
            if v.state.value not in ("running", "created") and not v.controller_alive:
                return
        time.sleep(POOL_POLL_S)


_NOTED: set[tuple[str, str, str]] = set()


def _note_once(ws: Workspace, gid: str, what: str, ev: et.DriverEvent) -> None:
    if (gid, ev.type, what) not in _NOTED:
        _NOTED.add((gid, ev.type, what))
        event(ws, gid, ev)


def _propose(ws: Workspace, camp: Campaign, obs: list[PointObs], mine: list[RunMeta]) -> str | tuple[str, str]:
    """The campaign's strategy proposes its next point from what was measured: frozen now, with why (the next
    look at the planner runs it); or the search has ended (converged, the space measured whole, a budget of service
    starts or minutes spent): recorded. A proposal that would leave the running service waits for the repeats
    that service owes (planner.before_leaving): (case id, why) of the first, which the caller runs."""
    higher = METRICS[camp.decision.primary_metric].higher_is_better
    observed = [
        Observed(
            values=o.values,
            value=o.mean,
            meets=o.meets,
            breach=max((lo.mean / lo.bound - 1 for lo in o.limits.values() if lo.mean is not None), default=0.0),
            label=o.label,
            service_key=o.service_key,
            running=o.active is not None,
        )
        for o in obs
    ]
    # the service identity running now: the one of the latest valid run (its load-only neighbours come first)
    live = max(((o.when[-1], o.service_key) for o in obs if o.when), default=(None, None))[1]
    full = load_case(ws, camp.base_case).load.requests
    strategy = STRATEGIES[camp.search.kind]
    got = strategy(camp.axes, camp.search, higher, observed, live, camp.constraints, full_requests=full)
    if got is None:
        why = (
            f"its last screen (N={full}) is measured: {len(obs)} points in all"
            if camp.search.kind == "halving"
            else f"converged: it proposes only measured points or service identities it left ({len(obs)} of "
            f"{space_size(camp.axes):g} in the space)"
        )
        event(ws, camp.campaign_id, et.SearchEnded(points=len(camp.points), why=why))
        return "went"
    if live is not None and _leaves(camp, got.values, obs, live):
        owed = planner.before_leaving(obs, camp.repeats, higher, live)
        if owed:
            return owed[0]
    refused = _over_budget(ws, camp, mine, got.values, obs, live)
    if refused is not None:  # its run would pass the budget: the search ends there (until a larger budget)
        budget = camp.budget.model_dump(mode="json")
        event(ws, camp.campaign_id, et.SearchEnded(points=len(camp.points), why=refused, budget=budget))
        return "went"
    point = add_point(ws, camp, got.values, got.why)
    event(ws, camp.campaign_id, et.PointProposed(case_id=point.case_id, label=point.label, why=got.why))
    return "went"


def _leaves(camp: Campaign, values: dict[str, Scalar], obs: list[PointObs], live: str) -> bool:
    """A proposal with other service-axis values than the running service's points: it needs a start."""
    on_live = next((o for o in reversed(obs) if o.service_key == live and o.when), None)
    svc = service_axes(camp.axes)
    return on_live is None or any(values.get(a.path) != on_live.values.get(a.path) for a in svc)


def _over_budget(
    ws: Workspace, camp: Campaign, mine: list[RunMeta], values: dict[str, Scalar], obs: list[PointObs], live: str | None
) -> str | None:
    """Why a proposal's run would pass the budget (the rule of every planned run: view.current_standing); it needs a
    start when it changes the running service's identity (a service axis differs from the live point's)."""
    if not camp.budget.given():
        return None
    start = live is None or _leaves(camp, values, obs, live)
    minutes = None
    if camp.budget.minutes is not None:
        base = load_case(ws, camp.base_case)
        n = values.get(REQUESTS, base.load.requests)  # a halving screen's N, else the base's
        minutes = costs_of(ws)(base).run_s(int(n), start) / 60  # not frozen yet: the base's service, or its kin
    return account(ws, camp, mine).refusal(start=start, minutes=minutes)


def _complete(ws: Workspace, gid: str) -> str:
    """The driver's outcome when nothing is left to run (HANDOFF.md names it): at its budget, with why and the
    budget spent."""
    if not load_campaign(ws, gid).budget.given():
        return "complete"
    view = campaign_view(ws, gid)
    return f"complete at its budget: {view.budget_end}; {view.budget}" if view.budget_end else "complete"


def _back_off(ws: Workspace, gid: str, o: PointObs) -> None:
    """An overloaded target (its last attempt failed [overload]) gets time before the point's load is sent again:
    OVERLOAD_BACKOFF_S, doubled per attempt without a result, at most OVERLOAD_BACKOFF_MAX_S."""
    if not o.bad_runs or "[overload]" not in (o.last_problem or ""):
        return
    pause = min(OVERLOAD_BACKOFF_MAX_S, OVERLOAD_BACKOFF_S * 2 ** (o.bad_runs - 1))
    _note_wait(ws, gid, f"{o.label}: the target was overloaded ({o.bad_runs} attempt(s)); {pause:.0f} s before again")
    time.sleep(pause)


# The next point's preflight process, spawned once this point's formal window has closed: its imports (the
# load schedule, the collector's numpy and models; most of a preflight's CPU) then overlap this point's collector,
# which runs on one core, instead of the next point's start, where the controller and the load client import.
# It still gets its run only at launch and checks it from disk, sockets forbidden, like any preflight.
# campaign -> (its next point's preflight and controller, spawned ahead while the current point post-processes,
# with the variables they were given)
_AHEAD: dict[str, tuple[subprocess.Popen[bytes], subprocess.Popen[bytes], frozenset[str]]] = {}
_WINDOW_CLOSED = (PhaseState.DONE, PhaseState.REUSED, PhaseState.SKIPPED, PhaseState.FAILED, PhaseState.UNKNOWN)


def _after_window(gid: str, view: RunView, case: Case) -> None:
    if gid not in _AHEAD and view.phases[Phase.LOAD].state in _WINDOW_CLOSED:
        keep = frozenset(case.env_names())
        got = procs.launcher().ahead(lambda: (spawn_ahead(keep), spawn_controller_ahead(keep), keep))
        if got is not None:  # none in the caller's process (procs.InProcess): its points start there
            _AHEAD[gid] = got


def _take_ahead(gid: str, case: Case) -> tuple[subprocess.Popen[bytes] | None, subprocess.Popen[bytes] | None]:
    """The waiting preflight and controller processes, if they were spawned with every variable this case names
    (else they are stopped, and launch spawns them with the right environment)."""
    got = _AHEAD.pop(gid, None)
    if got is None:
        return None, None
    pre, ctl, keep = got
    if case.env_names() <= keep:
        return pre, ctl
    drop_unhanded(pre)
    drop_unhanded(ctl)
    return None, None


_LAST_WAIT: dict[str, str] = {}


def _note_wait(ws: Workspace, gid: str, why: str, fix: str = "") -> None:
    """A 'waiting' event (why, and the refusal's fix when it named one): status shows it while the driver waits."""
    if _LAST_WAIT.get(gid) != why:  # one event per reason, not one per second
        _LAST_WAIT[gid] = why
        event(ws, gid, et.Waiting(why=why, fix=fix) if fix else et.Waiting(why=why))


def drive(ws: Workspace, gid: str) -> int:
    lock = driver_lock(ws, gid).open("a")
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another driver of this campaign is at work
    before = read_json_or_none(driver_file(ws, gid)) or {}
    write_json(
        driver_file(ws, gid),
        {**procs.me(), "started_utc": utc_now(), "first_started_unix": before.get("first_started_unix", time.time())},
    )
    event(ws, gid, et.DriverStarted(pid=procs.me()["pid"]))
    # a process of its own (not the caller's, whose signals and env are not ours: procs.InProcess):
    # `caseledger target stop` ends it through `finally`, recorded; its points' controllers leave the chart to it
    procs.launcher().adopt(sigterm=_stopped, env={DRIVEN_BY: gid})
    resumed: dict[str, int] = {}
    outcome = "complete"
    try:
        while True:
            if authorization.current_mode(ws) == "paused":
                # in the caller's process nothing could lift the pause while this loop holds the caller
                procs.launcher().own_process(
                    "an inline campaign driver met a paused authorization: it would wait for ever"
                )
                _note_wait(ws, gid, "authorization paused: no new point starts")
                time.sleep(WAIT_S)
                continue
            if _waiting_for_disk(ws, gid):
                time.sleep(WAIT_S)
                continue
            try:
                step = _step(ws, gid, resumed)
            except (OSError, sqlite3.OperationalError) as e:  # the disk filled during the step: wait for space
                if not _full(e):
                    raise
                step = "wait"
            if step == "done":
                outcome = _complete(ws, gid)
                break
            if step == "wait":
                time.sleep(WAIT_S)
            else:  # something ran: a wait for the same reason as before is news again
                _LAST_WAIT.pop(gid, None)
    except _Stop:
        outcome = "stopped (SIGTERM): start_run or resume of the campaign starts a new driver"
    except Exception as e:  # a bug here must not lose the ledger's facts: say so and stop
        outcome = f"driver error: {type(e).__name__}: {e}"
        raise
    finally:
        info = read_json_or_none(driver_file(ws, gid)) or {}
        write_json(driver_file(ws, gid), {**info, "ended_utc": utc_now(), "outcome": outcome})
        event(ws, gid, et.DriverEnded(outcome=outcome))
        if gid in _AHEAD:  # the campaign ended (or the driver failed) before the next point: nothing to check
            pre, ctl, _ = _AHEAD.pop(gid)
            drop_unhanded(pre)
            drop_unhanded(ctl)
        with contextlib.suppress(OSError, CaseledgerError):
            handoff.refresh(ws)
        _draw_charts(ws, gid)
    return 0


# campaign -> (when its driver began to wait for disk space (monotonic), the bytes free then)
_DISK_WAIT: dict[str, tuple[float, int]] = {}


def _full(e: OSError | sqlite3.OperationalError) -> bool:
    """A full disk (or quota) said by the OS or by SQLite (the index)."""
    if isinstance(e, sqlite3.OperationalError):
        return indexdb.disk_full(e)
    return e.errno in (errno.ENOSPC, errno.EDQUOT)


def _waiting_for_disk(ws: Workspace, gid: str) -> bool:
    """True while the workspace's disk has less than DISK_FLOOR_BYTES free. The wait is recorded when it ends
    (an event written on a full disk would fail): how long, and how much was free at its start."""
    free = shutil.disk_usage(ws.ledger).free
    if free < DISK_FLOOR_BYTES:
        _DISK_WAIT.setdefault(gid, (time.monotonic(), free))
        return True
    if gid in _DISK_WAIT:
        since, at_start = _DISK_WAIT.pop(gid)
        event(ws, gid, et.DiskWaited(seconds=round(time.monotonic() - since, 1), free_bytes_at_start=at_start))
    return False


class _Stop(BaseException):
    """SIGTERM to the driver: it starts no further point (a running point's run goes on, in its own process)."""


def _stopped(signum: int, frame: object) -> None:
    raise _Stop


def stop_drivers(ws: Workspace) -> list[str]:
    """Stop every live campaign driver of this workspace (before its services, which it would start again);
    returns the campaign ids whose driver was stopped."""
    stopped = []
    for gid in all_campaigns(ws):
        ref = read_json_or_none(driver_file(ws, gid))
        if ref is not None and procs.alive(ref):
            procs.terminate(ref, grace_s=5.0)
            stopped.append(gid)
    return stopped


def _draw_charts(ws: Workspace, gid: str) -> None:
    """The campaign's charts (its Pareto frontier, its scenarios'), drawn once the driver ends so the next summarize
    finds them on disk (not between points: the drawing would share the cores with the next point's formal window;
    the controllers of driven points skip it). Last, at the lowest CPU priority; a failure is noted in the driver's
    log."""
    if os.environ.get(CHART_ENV) == "0":
        return  # no chart is wanted (nor in the caller's process, no place for nice 19): summarize draws in memory
    try:
        procs.launcher().niced(lambda: _draw(ws, gid))
    except Exception as e:  # a derived file: the campaign's facts stand whatever fails here
        print(f"driver: scenario chart not drawn: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


def _draw(ws: Workspace, gid: str) -> None:
    from caseledger.views.chart import draw_campaign, draw_scenario  # lazy: numpy and matplotlib, only now

    draw_campaign(ws, campaign_view(ws, gid))
    _, obs, _, _ = current_standing(ws, load_campaign(ws, gid))
    for scenario in sorted({load_case(ws, o.case_id).scenario for o in obs}):
        draw_scenario(ws, scenario)


def spawn(ws: Workspace, gid: str, keep: set[str]) -> int:
    """Start the campaign's detached driver; returns its pid once driver.json names it (or after 10 s). Inline
    (procs.InProcess): the driver's loop runs here, its points there too, and returns when the campaign ends."""
    part = procs.Part(
        "caseledger.run.campaign_driver",
        [str(ws.root), gid],
        driver_file(ws, gid).parent / "driver.log",
        here=lambda: _drive_here(ws, gid),
        env=procs.child_env(keep=keep),
    )
    ref = procs.launcher().start(part)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and procs.alive(ref):
        info = read_json_or_none(driver_file(ws, gid)) or {}
        if info.get("pid") == ref["pid"]:
            break
        time.sleep(0.02)
    return ref["pid"]


def _drive_here(ws: Workspace, gid: str) -> None:
    try:
        drive(ws, gid)
    finally:  # driver.json then says gone: no reader takes the caller's pid for a live driver
        info = read_json_or_none(driver_file(ws, gid)) or {}
        write_json(driver_file(ws, gid), {**info, "gone_utc": utc_now()})


if __name__ == "__main__":
    sys.exit(drive(Workspace(Path(sys.argv[1])), sys.argv[2]))
