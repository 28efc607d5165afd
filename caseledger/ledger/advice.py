"""The blocker of a run at its boundary and the one next call, from its folded view (pure: no I/O)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from caseledger.case.phases import Phase
from caseledger.case.plan import COLLECT_TIMEOUT_S
from caseledger.errors import OUTSIDE_CHARS, FailureClass, quoted
from caseledger.ledger import calls
from caseledger.ledger.view import PhaseView, RunState, RunView

REPEATS_BEFORE_BY_HAND = 3  # attempts of one phase failing the same way, after which resume is no answer


class Advice(NamedTuple):
    blocker: str | None  # what stops the run, at its boundary (None: nothing does)
    next_call: str  # the one call to make next


def advise(v: RunView) -> Advice:
    """The blocker at its boundary and the one next call (the view's own `blocker` and `next_call` unread)."""
    live = _advise_live(v)
    if live is not None:
        return live
    ph = v.phases[v.current] if v.current else None
    err = (ph.error or "") if ph else ""
    if v.steps is not None and v.steps.redo and not err:
        err = f"the service ({', '.join(v.service_gone) or 'its process'}) is gone; the formal load still needs it"
    where = f"{v.current}: {quoted(err, OUTSIDE_CHARS)}" if err else f"{v.current}"
    advice = _NEXT_AFTER.get(v.failure_class) if v.failure_class else None
    return Advice(f"{v.failure_class} at {where}", advice(v, ph) if advice else calls.resume(v.run_id))


def _why_partial(exit_: str | None) -> str:
    """Why a load ended short, from its client's end file (none: the client died without writing it)."""
    if exit_ == "cancelled":  # SIGTERM: `caseledger target stop`, or the controller ending the load
        return "its load was stopped (SIGTERM); the requests in flight are recorded as cancelled"
    return "client died" if exit_ is None else f"the load client ended: {exit_}"


def _advise_live(v: RunView) -> Advice | None:
    """The advice for a run that has not stopped at a failure (finished, partial, running); None otherwise."""
    rid = v.run_id
    if v.state == RunState.SUCCEEDED:
        return Advice(None, calls.run_succeeded(rid))
    if v.state == RunState.PARTIAL:
        return Advice(
            f"partial load: {v.counts.done} of {v.counts.planned} requests recorded ({_why_partial(v.load_exit)})",
            f"{calls.start_run(v.case_id)} for a full load; this run's records stay "
            f"({calls.summarize([rid])} shows them)",
        )
    if v.state == RunState.RUNNING and not v.controller_alive:
        return Advice(
            "controller gone; the load client is still running",
            f"{calls.resume(rid)} re-attaches to the running load client (nothing is re-sent)",
        )
    stopped_part = v.client_stopped or v.controller_stopped or v.collector_stopped
    if v.state == RunState.RUNNING and (stopped_part or v.service_gone):
        stopped = [
            *(["load client"] if v.client_stopped else []),
            *(["controller"] if v.controller_stopped else []),
            *(["collector (postprocess)"] if v.collector_stopped else []),
            *[f"service {g.removesuffix(' stopped (SIGSTOP)')}" for g in v.service_gone if g.endswith("(SIGSTOP)")],
        ]
        gone = [f"service {g}" for g in v.service_gone if not g.endswith("(SIGSTOP)")]
        said = "; ".join(
            [
                *([", ".join(stopped) + " stopped (SIGSTOP)"] if stopped else []),
                *([", ".join(gone) + " gone"] if gone else []),
            ]
        )
        pids = " ".join(str(p) for p in v.stopped_pids)
        if v.controller_stopped or v.client_stopped:  # it never fails by itself; resume waits for the controller
            fix = f"kill -CONT {pids} (SIGCONT: what was stopped goes on, nothing is re-sent); "
        elif v.collector_stopped:  # the controller gives it up after its timeout: postprocess fails [collect]
            fix = (
                f"kill -CONT {pids} (SIGCONT: the results are computed, nothing is re-sent), or let the controller "
                f"give it up ({COLLECT_TIMEOUT_S:g} s after it started: postprocess fails [collect]), then "
                f"{calls.reprocess_raw(rid)} from the raw data; "
            )
        elif pids:  # only the service: the controller's timeouts fail the load, and resume starts it again
            fix = f"kill -CONT {pids} (SIGCONT), or let the load fail and {calls.resume(rid)} (a new service); "
        else:
            fix = f"the service is gone: the controller fails the load, then {calls.resume(rid)}; "
        only_collector = v.collector_stopped and not (v.client_stopped or v.controller_stopped or v.service_gone)
        return Advice(
            f"{said} while the run is at {v.current}: no progress; "
            + ("the raw data is complete, the figures wait for it" if only_collector else "figures would be distorted")
            + (f" (pid {pids})" if pids else ""),
            fix + f"{calls.phase_status(rid)} shows it",
        )
    if v.state in (RunState.RUNNING, RunState.CREATED):
        return Advice(None, calls.wait(rid))
    return None


def _after_before_model(v: RunView, ph: PhaseView | None) -> str:
    return (
        f"fix the cause and check it with {calls.start_run(v.case_id, preflight_only=True)} (no run, no "
        f"lease), then {calls.resume(v.run_id)} (re-runs preflight; 0 model requests sent); a case error "
        "needs freeze_case of a corrected draft"
    )


def _after_collect(v: RunView, ph: PhaseView | None) -> str:
    return calls.repair_figures(v.run_id)


def _after_hot_entry(v: RunView, ph: PhaseView | None) -> str:
    return (
        f"{calls.freeze_draft('draft with the rejected parameter fixed', v.case_id)} then start_run (reuses the "
        f"warm service); or after a client fix {calls.resume(v.run_id)}"
    )


def _after_service(v: RunView, ph: PhaseView | None) -> str:
    if ph is not None and ph.attempt >= REPEATS_BEFORE_BY_HAND:
        return (
            f"by hand: {ph.attempt} attempts of {v.current} failed the same way ({v.failure_class}); read the "
            "service log (ledger/services/*.log) and fix the engine or its case (freeze_case a corrected "
            "draft); `caseledger target stop` stops what caseledger started"
        )
    first = v.steps.first if v.steps else v.current
    return f"{calls.resume(v.run_id)} starts again at {first}" + (
        " (starts the service once, then warmup and what follows)"
        if v.next_restarts_service
        else " (keeps the live service)"
    )


def _after_overload(v: RunView, ph: PhaseView | None) -> str:
    return (
        f"wait for the target to drain, then {calls.resume(v.run_id)} (sends the load again as a new "
        f"attempt; this one's raw data is kept aside), or freeze_case a child with a lower load.rate "
        f"or load.concurrency (parent='{v.case_id}'): the target is rate-limited or saturated, the "
        "case is not wrong"
    )


def _after_internal(v: RunView, ph: PhaseView | None) -> str:
    return (
        f"a caseledger bug at {v.current}: report it with ledger/runs/{v.run_id}/controller.log; the raw "
        f"data is kept; resuming would meet the same bug (after a fix: {calls.resume(v.run_id)})"
    )


def _after_auth(v: RunView, ph: PhaseView | None) -> str:
    return (
        f"set the key named by target.api_key_env in the environment that runs caseledger, then "
        f"{calls.resume(v.run_id)} — keeps the service, repeats the refused phase"
    )


def _after_dataset(v: RunView, ph: PhaseView | None) -> str:
    return (
        f"{calls.freeze_draft('draft with the fix the blocker names', v.case_id)} then start_run "
        "(keeps the live service); resuming this run would fail the same way"
    )


def _after_disk(v: RunView, ph: PhaseView | None) -> str:
    host = ph.data.get("disk_host") if ph is not None else None  # a load host's disk (run/remote/preflight.py)
    disk = f"load host {host}, under its workdir" if host else "the workspace's filesystem"
    return (
        f"free disk space on {disk}, then {calls.resume(v.run_id)} — goes on at "
        f"{v.current}; finished phases and recorded requests are kept, nothing is re-sent"
    )


def _after_end_unknown(v: RunView, ph: PhaseView | None) -> str:
    rid, c = v.run_id, v.counts
    at_load = v.current == Phase.LOAD and v.load_ended != "yes"
    if at_load and v.client_host:
        return (
            f"{calls.resume(rid)} once {v.client_host} is reachable — re-attaches over SSH to the load "
            f"client there (pid and start time), copies the raw records still missing ({c.done} of "
            f"{c.planned} here); never starts a second client, sends nothing again; the lease is kept meanwhile"
        )
    if at_load and not v.client_alive and c.done < c.planned and c.sent:
        return (
            f"{calls.start_run(v.case_id)} for a full measurement: the load client died after "
            f"{c.done} of {c.planned} records ({c.planned - c.sent} never sent); {calls.resume(rid)} only "
            "ends this run as partial (nothing is re-sent)"
        )
    return (
        f"{calls.resume(rid)} — keeps the lease, checks client process, end file and raw count; "
        "sends no formal request again"
    )


_NEXT_AFTER: dict[FailureClass, Callable[[RunView, PhaseView | None], str]] = {
    FailureClass.BEFORE_MODEL: _after_before_model,
    FailureClass.COLLECT: _after_collect,
    FailureClass.HOT_ENTRY: _after_hot_entry,
    FailureClass.SERVICE: _after_service,
    FailureClass.OVERLOAD: _after_overload,
    FailureClass.INTERNAL: _after_internal,
    FailureClass.AUTH: _after_auth,
    FailureClass.DATASET: _after_dataset,
    FailureClass.DISK: _after_disk,
    FailureClass.END_UNKNOWN: _after_end_unknown,
}
"""The one next call after a failure of each class (any other class: resume)."""
