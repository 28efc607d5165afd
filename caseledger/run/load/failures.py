"""Why a formal load failed: each failed request's cause as a failure class, the load's class when too many
failed, and the wait before a load is sent again until the engine has drained what an abandoned attempt left."""

from __future__ import annotations

import time
from collections import Counter

import httpx2 as httpx
import orjson

from caseledger import engines
from caseledger.case.model import Case
from caseledger.case.target import origin
from caseledger.errors import FailureClass, PhaseFailed
from caseledger.load.auth import AUTH_STATUSES, refuse_auth
from caseledger.records import RawRecord
from caseledger.services import net


def rejection(error: str) -> str:
    """A rejected request's error with the server's own message first: 'HTTP 400: <message>' from a JSON
    body ({"error": {"message": …}}, {"message": …}, {"detail": …}), so what was rejected and why survives
    any cut; the text as it is otherwise."""
    head, sep, body = error.partition(": ")
    try:
        obj = orjson.loads(body) if sep else None
    except orjson.JSONDecodeError:
        return error
    for _ in range(3):
        if isinstance(obj, dict):
            obj = obj.get("error", obj.get("message", obj.get("detail")))
        else:
            break
    return f"{head}: {obj}" if isinstance(obj, str) else error


OVERLOAD_STATUSES = (429, 503)  # rate-limited (429) or saturated (503): the target's state, not the case's
# when failed requests have several causes, the class named first wins a tie
_CAUSE_ORDER = (
    FailureClass.AUTH,
    FailureClass.OVERLOAD,
    FailureClass.HOT_ENTRY,
    FailureClass.SERVICE,
    FailureClass.INTERNAL,
)


def failure_cause(rec: RawRecord) -> FailureClass:
    """Why one formal request failed, as a failure class: 401/403 auth, 429/503 overload, another 4xx hot_entry
    (a parameter the server rejects), an error of the client itself internal, anything else (5xx, timeout,
    reset, a broken or incomplete stream) service."""
    status, kind = rec["status"], rec["error_class"]
    if kind == "http" and status in AUTH_STATUSES:
        return FailureClass.AUTH
    if kind == "http" and status in OVERLOAD_STATUSES:
        return FailureClass.OVERLOAD
    if kind == "http" and status is not None and 400 <= status < 500:
        return FailureClass.HOT_ENTRY
    if kind == "client":
        return FailureClass.INTERNAL
    return FailureClass.SERVICE


_CAUSE_FIX = {
    FailureClass.OVERLOAD: "the target is rate-limited or saturated, the case is not wrong: wait, then resume "
    "(sends the load again as a new attempt), or freeze a child with a lower load.rate or load.concurrency",
    FailureClass.HOT_ENTRY: "the service stays warm: freeze a corrected child case (the plan reuses the service), "
    "or fix the client and resume (re-sends the rejected load only)",
    FailureClass.SERVICE: "resume restarts an unhealthy service, waits until the engine is idle and sends the load "
    "again as a new attempt (this attempt's raw data is kept aside); or raise load.timeout_s in a child case",
    FailureClass.INTERNAL: "a caseledger bug in the load client: report it with load/client.log; the raw data is kept",
}


def check_failures(case: Case, recs: list[RawRecord]) -> None:
    """The formal load failed when more than load.max_failed_share of its requests failed; its class is the
    most common cause (failure_cause). Below the share the failed requests are data: every figure excludes
    them and the decision names them."""
    # a request the client itself was told to stop (SIGTERM/SIGINT: 'cancelled') is no failure of the target
    failed = [r for r in recs if not r["ok"] and not (r["error_class"] == "client" and r["error"] == "cancelled")]
    share, limit = len(failed) / len(recs) if recs else 0.0, case.load.max_failed_share
    if not failed or share <= limit:
        return
    causes = Counter(failure_cause(r) for r in failed)
    cls = max(_CAUSE_ORDER, key=lambda c: (causes[c], -_CAUSE_ORDER.index(c)))
    first = next(r for r in failed if failure_cause(r) == cls)
    kinds = ", ".join(f"{k}={v}" for k, v in sorted(Counter(_kind(r) for r in failed).items()))
    counts = f"{len(failed)} of {len(recs)} failed"
    over = f"{kinds}; {share:.0%} > load.max_failed_share {limit:g}"
    if cls == FailureClass.AUTH:
        refuse_auth(case, "formal load", [r["status"] for r in failed])
        raise PhaseFailed(
            f"formal load: the target refused the credentials ({counts}: {over})",
            cls,
            "check the variable target.api_key_env names: it must hold the key the server expects; "
            "then resume (the service is kept)",
        )
    what = {
        FailureClass.OVERLOAD: "the target is overloaded or rate-limited",
        FailureClass.HOT_ENTRY: "the formal entry rejected the requests",
        FailureClass.SERVICE: "the service did not serve the requests",
        FailureClass.INTERNAL: "the load client failed",
    }[cls]
    # the server's own words first: they survive any cut of the message
    raise PhaseFailed(
        f"formal load: {what} ({counts}): {rejection(first['error'] or '')} ({over})", cls, _CAUSE_FIX[cls]
    )


def _kind(rec: RawRecord) -> str:
    return f"HTTP {rec['status']}" if rec["error_class"] == "http" else str(rec["error_class"])


# /metrics gauges of requests an engine holds (running or queued), per engine family
IN_FLIGHT_GAUGES = engines.in_flight_gauges()  # every engine's gauges of requests running or queued
IDLE_WAIT_S = 60.0  # how long a resend waits for an engine to finish what an abandoned attempt left


def in_flight(case: Case) -> float | None:
    """Requests the engine reports running or queued, from its /metrics gauges; None when it exposes none."""
    url = case.target.metrics_url or origin(case.target.endpoints[0].base_url) + "/metrics"
    try:
        r = net.get(url, timeout=2.0)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    # lazy: metrics pulls numpy; only a resend after a failed attempt reads the gauges, off the hot path
    from caseledger.metrics import parse_prometheus

    found = [v for k, v in parse_prometheus(r.text).items() if k in IN_FLIGHT_GAUGES]
    return sum(found) if found else None


def wait_idle(case: Case) -> None:
    """Before formal requests are sent again after a failed attempt: the engine's in-flight gauges reach 0
    (where it has them), or the load does not start."""
    deadline = time.monotonic() + IDLE_WAIT_S
    busy = in_flight(case)
    while busy and time.monotonic() < deadline:
        time.sleep(0.5)
        busy = in_flight(case)
    if busy:
        raise PhaseFailed(
            f"before the formal load: the engine still holds {busy:g} request(s) {IDLE_WAIT_S:g} s later (its "
            "/metrics in-flight gauges): a new load would overlap that backlog",
            FailureClass.SERVICE,
            "resume restarts the service (nothing was sent); or wait until the engine is idle",
            evidence={"service_problem": f"engine busy with {busy:g} abandoned request(s)"},
        )
