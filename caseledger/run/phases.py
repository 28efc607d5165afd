"""Phase bodies the controller runs: warmup, route_verify, cache_prepare, load, confirm_end,
postprocess, decide. Each returns its evidence dict or raises PhaseFailed with a failure class."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx2 as httpx
import orjson

from caseledger import datasets, procs, redact, services
from caseledger.case.model import Case, origin
from caseledger.case.plan import Phase
from caseledger.errors import EvidenceChanged, FailureClass, PhaseFailed
from caseledger.faults import checkpoint, fault
from caseledger.ledger.evidence import ServiceRecord
from caseledger.ledger.runs import Run
from caseledger.ledger.state import RESEND_CLASSES, load_counts
from caseledger.load.client import AUTH_STATUSES, api_key_of, client_timing, refuse_auth, run_requests
from caseledger.load.plan import RequestSpec, raw_bytes_needed, request_body, request_url
from caseledger.outcome import summary
from caseledger.procs import child_env
from caseledger.records import RawRecord, read_records
from caseledger.run import remote_load
from caseledger.workspace import PartPaths, RunPaths, read_json_or_none, reserve, sha256_file, write_json


def _specs(run: Run, picks: list[tuple[int, int, str]], max_tokens: int) -> list[RequestSpec]:
    """Requests for (route, entry, salt) picks, built exactly as the formal load builds its bodies."""
    ws, case = run.workspace, run.case
    ident = datasets.load_identity(ws, run.meta.dataset())
    entries = datasets.load_entries(ws, run.meta.dataset())
    out = []
    for n, (route, e, salt) in enumerate(picks):
        ep = case.target.endpoints[route]
        entry = entries[e % len(entries)]
        body = request_body(
            case.target.api, ep.model, datasets.render_prompt(entry, salt, ident), max_tokens, case.load.ignore_eos
        )
        out.append(
            RequestSpec(
                i=n,
                entry=entry["i"],
                route=route,
                offset_s=0.0,
                url=request_url(ep.base_url, case.target.api),
                body=body,
                input_tokens_body=entry["body_tokens"],
                input_tokens_chat=entry["chat_tokens"],
            )
        )
    return out


def _send(case: Case, specs: list[RequestSpec], concurrency: int, phase: str) -> tuple[list[RawRecord], float]:
    t0 = time.monotonic()
    recs = anyio.run(
        lambda: run_requests(
            specs,
            concurrency,
            phase,
            api_key=api_key_of(case),
            timeout_s=case.load.timeout_s,
            max_event_bytes=case.load.max_event_bytes,
        )
    )
    return recs, time.monotonic() - t0


def _lat_sum(recs: list[RawRecord]) -> float:
    return sum((r["end_ns"] - r["send_ns"]) / 1e9 for r in recs)


def warmup(run: Run, routes: list[int] | None = None) -> dict[str, Any]:
    """Warmup requests spread over `routes` (None: every route)."""
    case = run.case
    n = case.warmup.requests
    rs = routes if routes is not None else list(range(len(case.target.endpoints)))
    if not rs:
        return {"outcome": "reused", "reason": "no route's process changed: every one kept its warm caches"}
    picks = [(rs[k % len(rs)], k, f"warmup-{run.run_id}-{k}") for k in range(n)]
    recs, wall = _send(case, _specs(run, picks, case.warmup.max_tokens), case.warmup.concurrency, "warmup")
    ok = sum(r["ok"] for r in recs)
    if ok == 0:
        refuse_auth(case, "warmup", [r["status"] for r in recs])
        err = next((r["error"] for r in recs if r["error"]), "no response")
        raise PhaseFailed(
            f"warmup: 0 of {n} requests succeeded ({err})",
            FailureClass.SERVICE,
            "check the service log; resume retries warmup without restarting a healthy service",
        )
    return {
        "requests": n,
        "ok": ok,
        "wall_s": round(wall, 3),
        "latency_sum_s": round(_lat_sum(recs), 3),
        **({"routes": rs} if routes is not None else {}),
    }


def route_verify(run: Run, only: list[int] | None = None) -> dict[str, Any]:
    """/models and one request per route (`only`: those routes), its prompt tokens checked against the plan."""
    case = run.case
    ks = only if only is not None else list(range(len(case.target.endpoints)))
    routes = {
        k: {"route": k, "base_url": case.target.endpoints[k].base_url, "models": services.served_models(case, k)}
        for k in ks
    }
    picks = [(k, k, f"route-{run.run_id}-{k}") for k in ks]
    recs, wall = _send(case, _specs(run, picks, 1), max(1, len(picks)), "route_verify")
    counted = datasets.load_identity(run.workspace, run.meta.dataset()).chat_template_counted
    for rec in recs:
        routes[rec["route"]]["ok"] = rec["ok"]
        if not rec["ok"]:
            refuse_auth(case, f"route {rec['route']}", [rec["status"]])
            raise PhaseFailed(
                f"route {rec['route']} did not answer a request: {rec['error']}",
                FailureClass.SERVICE,
                "check that route's service",
            )
        routes[rec["route"]]["tokens"] = _token_truth(case, rec, counted)
    return {
        "routes": list(routes.values()),
        "wall_s": round(wall, 3),
        **({"only_changed_routes": ks} if only is not None else {}),
    }


def _token_truth(case: Case, rec: RawRecord, counted: bool) -> dict[str, Any]:
    """The route's verify request: the chat tokens the dataset planned against the prompt tokens the server
    counted. Unequal means the dataset's tokenizer is not the served model's: the run would measure another
    input length than the case says, so it stops here, before any formal request."""
    planned, server = rec["input_tokens_chat"], rec["prompt_tokens"]
    out: dict[str, Any] = {"planned_chat": planned, "server_prompt": server}
    if not counted:
        out["compared"] = (
            "no: the dataset counts the body only (target.api completions or dataset.chat_template "
            "false), the server adds its template"
        )
    elif server is None:
        out["compared"] = "no: the server sent no usage.prompt_tokens"
    elif server != planned:
        raise PhaseFailed(
            f"dataset tokenizer ≠ server tokenizer on route {rec['route']}: planned {planned} chat "
            f"tokens, server counted {server}",
            FailureClass.DATASET,
            "freeze a case with dataset.tokenizer = the served model's tokenizer (its Hugging Face "
            "directory or its GGUF file)",
        )
    else:
        out["compared"] = "equal"
    return out


def cache_prepare(run: Run, seed: bool) -> dict[str, Any]:
    case = run.case
    target = case.cache.min_hit_ratio or 0.0
    ident = datasets.load_identity(run.workspace, run.meta.dataset())
    groups = max(1, min(case.dataset.prefix_groups, ident.entries))
    routes = len(case.target.endpoints)
    out: dict[str, Any] = {"target_ratio": target, "mode": "seed+check" if seed else "check"}
    if seed:
        picks = [(r, g, f"seed-{run.run_id}") for r in range(routes) for g in range(groups)]
        recs, wall = _send(case, _specs(run, picks, 1), max(1, min(len(picks), case.load.concurrency)), "cache_seed")
        out["seed"] = {
            "requests": len(recs),
            "ok": sum(r["ok"] for r in recs),
            "wall_s": round(wall, 3),
            "latency_sum_s": round(_lat_sum(recs), 3),
        }
    picks = [
        (r, (r * case.cache.check_requests + k) % groups + groups * (k + 1), f"check-{run.run_id}-{k}")
        for r in range(routes)
        for k in range(case.cache.check_requests)
    ]
    recs, wall = _send(case, _specs(run, picks, 1), max(1, min(len(picks), case.load.concurrency)), "cache_check")
    ratios = []
    for r in recs:
        if r["ok"] and r["prompt_tokens"] and r["cached_tokens"] is not None:
            ratios.append(r["cached_tokens"] / r["prompt_tokens"])
        else:
            ratios.append(0.0)
    out["check"] = {
        "requests": len(recs),
        "wall_s": round(wall, 3),
        "latency_sum_s": round(_lat_sum(recs), 3),
        "hit_ratios": [round(x, 4) for x in ratios],
        "cached_tokens": [r["cached_tokens"] for r in recs],
        "prompt_tokens": [r["prompt_tokens"] for r in recs],
        "denominator": "server prompt_tokens (chat-template tokens)",
    }
    low = [x for x in ratios if x < target]
    if low:
        raise PhaseFailed(
            f"cache check: {len(low)}/{len(ratios)} requests below {target} (min {min(ratios):.4f})",
            FailureClass.SERVICE,
            "seed again (resume) or check the engine's prefix caching flags",
        )
    return out


def set_aside(run: Run, attempt: int) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(the end file, the previous load attempt's record); a load whose previous attempt failed in a resend class
    (the formal entry rejected every request, or the service died under it) is kept aside, marked, and the
    load/ directory starts empty: the load is sent again."""
    paths = run.paths
    paths.load_dir.mkdir(parents=True, exist_ok=True)
    end = read_json_or_none(paths.load_end)
    prev = read_json_or_none(paths.phase_file("load")) or {}
    if end is not None and prev.get("failure_class") in RESEND_CLASSES:
        old = paths.load_attempt_dir(int(prev.get("attempt", attempt - 1)))
        paths.load_dir.rename(old)
        write_json(
            old / "superseded.json",
            {
                "failure_class": prev.get("failure_class"),
                "error": redact.mask_obj(prev.get("error")),
                "superseded_by_attempt": attempt,
            },
        )
        paths.load_dir.mkdir()
        end = None
    return end, prev


def load(run: Run, attempt: int, event: Callable[..., None]) -> dict[str, Any]:
    """Start (or re-attach to) the load client and wait for it; never start a second client over raw data.
    (load.processes > 1: run/load_parts.py, which the controller calls instead.)

    event(type, **fields) appends an event of this run under its owner's fence."""
    paths, case, planned = run.paths, run.case, run.meta.planned
    end, prev = set_aside(run, attempt)
    if case.load.host is not None:
        return _load_remote(run, attempt, event, prev, end)
    pid = read_json_or_none(paths.load_pid)
    reattached = False
    go = paths.load_go
    if end is None and procs.alive(pid) and go.exists():
        reattached = True  # a client whose formal load started (e.g. under a controller that died): wait for it
    elif end is None:
        n_raw = len(read_records(paths.raw).records)
        started = paths.load_anchor.exists() or n_raw > 0
        if started and attempt > 1:
            return accept_partial(paths, planned, n_raw)
        if n_raw or (paths.raw.exists() and paths.raw.stat().st_size):
            raise PhaseFailed(
                f"load client is gone without an end file after {n_raw} of {planned} records",
                FailureClass.END_UNKNOWN,
                "formal requests are never re-sent automatically; the raw records are kept",
            )
        before_formal_load(run, prev)
        _reserve_raw(paths, case, raw_bytes_needed(run))
        _snapshot(case, paths.metrics_before)
        armed = read_json_or_none(paths.load_armed)
        if armed and procs.alive(armed) and not paths.load_anchor.exists():
            pid = armed  # spawned while preflight ran: it has imported and built its plan already
        else:
            pid = spawn_client(paths, armed=False, case=case)
        go.touch()
        event("load_client_started", phase="load", attempt=attempt, data={"pid": pid["pid"], "armed": pid is armed})
        checkpoint("controller", "during", "load", delay_s=0.5)
    watch = _LoadWatch(run, pid, event)
    while end is None:
        watch.tick()
        if not procs.alive(pid):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(int((pid or {})["pid"]), os.WNOHANG)
            end = read_json_or_none(paths.load_end)
            if end is None:
                time.sleep(0.2)
                end = read_json_or_none(paths.load_end)
            if end is None:
                n = len(read_records(paths.raw).records)
                raise PhaseFailed(
                    f"load client exited without an end file: {n} of {planned} requests done",
                    FailureClass.END_UNKNOWN,
                    "raw records are kept; resume confirms the evidence",
                )
            break
        time.sleep(0.1)
        end = read_json_or_none(paths.load_end)
    watch.close()
    return _load_ended(run, end, prev, {"reattached": reattached, **watch.evidence()})


def before_formal_load(run: Run, prev: dict[str, Any]) -> None:
    """Right before the first formal request (one client process or several): the service re-verified, and what
    an abandoned attempt left queued at the engine drained, so it cannot overlap this load."""
    problem = services.check_live(run.workspace, run.case, run.meta.target_key or "")
    if problem is not None:
        raise PhaseFailed(
            f"before the formal load: {problem}",
            FailureClass.SERVICE,
            "resume starts the service once, then warmup and the load (nothing was sent)",
            evidence={"service_problem": problem},
        )
    if prev.get("failure_class") in RESEND_CLASSES:
        _wait_idle(run.case)


def _load_remote(
    run: Run, attempt: int, event: Callable[..., None], prev: dict[str, Any], end: dict[str, Any] | None
) -> dict[str, Any]:
    """The load client on load.host (run/remote_load.py): started once per run, followed, its raw data copied
    back and sealed; a lost link is end_unknown (the client keeps running, resume re-attaches)."""
    paths, case, planned = run.paths, run.case, run.meta.planned
    extra: dict[str, Any] = {}
    if end is None:
        if remote_load.launched(paths) is None:
            problem = services.check_live(run.workspace, case, run.meta.target_key or "")
            if problem is not None:  # re-verified right before the first formal request
                raise PhaseFailed(
                    f"before the formal load: {problem}",
                    FailureClass.SERVICE,
                    "resume starts the service once, then warmup and the load (nothing was sent)",
                    evidence={"service_problem": problem},
                )
            if prev.get("failure_class") in RESEND_CLASSES:
                _wait_idle(case)
            _counters(run, paths.metrics_before)
        key_env = case.target.api_key_env  # the client's only variable from here: the API key, on the channel
        env = {key_env: os.environ[key_env]} if key_env and key_env in os.environ else {}
        got = remote_load.run_load(run, env, event, attempt)
        end = got.pop("end")
        extra = got
        if end is None:
            n_raw = len(read_records(paths.raw).records)
            if (paths.load_anchor.exists() or n_raw) and attempt > 1:
                return {**accept_partial(paths, planned, n_raw), **extra}
            raise PhaseFailed(
                f"load client on {extra['host']} exited without an end file after {n_raw} of {planned} records",
                FailureClass.END_UNKNOWN,
                "formal requests are never re-sent automatically; the raw records are kept",
            )
    return _load_ended(run, end, prev, {"reattached": bool(extra.get("reattached")), **extra})


def _load_ended(run: Run, end: dict[str, Any], prev: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """The checks after the load client's end file, local or remote; the load evidence."""
    paths, case, planned = run.paths, run.case, run.meta.planned
    read_by = _counters(run, paths.metrics_after)
    if end.get("exit") == "disk_full" and prev.get("failure_class") != FailureClass.DISK:
        raise PhaseFailed(
            f"{end.get('reason')}: {end['done']} of {planned} requests recorded, {planned - end['sent']} never sent",
            FailureClass.DISK,
            "free disk space, then resume: the recorded requests are kept and nothing is re-sent "
            "(the run ends partial)",
        )
    recs = read_records(paths.raw).records  # once: the failure check and the client timing both read them
    if end.get("failed", 0):
        problem = services.check_live(run.workspace, case, run.meta.target_key or "")
        if problem is not None:
            raise PhaseFailed(
                f"the service failed during the formal load: {problem}; {end['failed']} of {end['done']} requests "
                "failed",
                FailureClass.SERVICE,
                "resume starts the service once and sends the load again as a new attempt (this attempt's raw "
                "data is kept aside, marked superseded)",
                evidence={"service_problem": problem},
            )
        check_failures(case, recs)
    return {
        **extra,
        "planned": end["planned"],
        "sent": end["sent"],
        "done": end["done"],
        "ok": end["ok"],
        "failed": end["failed"],
        "metrics_read_by": read_by,
        "client_timing": client_timing(
            recs, case.load.concurrency, case.load.rate is None, read_json_or_none(paths.load_anchor)
        ),
        "raw_sha256": sha256_file(paths.raw) if paths.raw.exists() else None,
    }


def _reserve_raw(paths: RunPaths, case: Case, need: int) -> None:
    """Allocate the disk the raw records will need before the first formal request is sent: a full disk
    then refuses the load with nothing sent, instead of losing the records of requests that were served.
    need: bytes for this raw file (the whole load's, or one process's share of a shared load)."""
    fd = os.open(paths.raw, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        ok = reserve(fd, need)
    finally:
        os.close(fd)
    if not ok:
        free = shutil.disk_usage(paths.load_dir).free
        raise PhaseFailed(
            f"disk full: cannot reserve {need / 1e6:.1f} MB for {paths.raw.relative_to(paths.root)} "
            f"({free / 1e6:.1f} MB free in "
            f"{paths.load_dir}); no formal request was sent",
            FailureClass.DISK,
            "free disk space, then resume: the load starts from its first request",
        )


def accept_partial(paths: RunPaths, planned: int, done: int) -> dict[str, Any]:
    """Resume after the load client died mid-load: keep what finished, re-send nothing.

    Requests sent but not recorded were in flight at the kill (the server may have served them); those never
    sent stay unsent: sending them now would change the load the case describes. The run finishes on the
    records it has and says so (load ended: partial; the decision lists the gap)."""
    counts = load_counts(paths, planned)
    sent = max(counts.sent, done)
    # sent: recorded before each request's first byte left, so the target counted at most this many (a kill
    # between the record and the send is the only difference, microseconds wide)
    partial = {
        "planned": planned,
        "done": done,
        "sent": sent,
        "in_flight_lost": sent - done,
        "never_sent": planned - sent,
        "reason": "load client died without an end file; formal requests are never re-sent",
    }
    write_json(paths.load_partial, partial)
    return {"outcome": "done", "partial": True, **partial}


def spawn_client(paths: RunPaths, armed: bool, case: Case) -> dict[str, Any]:
    """Start the load client detached. Armed: it loads everything, then waits for load/go (or abort)."""
    paths.load_dir.mkdir(parents=True, exist_ok=True)
    env = child_env(keep=case.env_names())  # its API key variable, nothing else of the caller's
    if armed:
        env["CASELEDGER_LOAD_ARMED"] = "1"
    part = [str(paths.part)] if isinstance(paths, PartPaths) else []  # process k of load.processes
    with paths.load_log.open("ab") as lf:
        p = subprocess.Popen(
            [sys.executable, "-m", "caseledger.load", str(paths.root), *part],
            stdin=subprocess.DEVNULL,
            stdout=lf,
            stderr=lf,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    pid = {"pid": p.pid, "start_time": procs.start_time(p.pid) or 0, "host": procs.me()["host"]}
    write_json(paths.load_pid, pid)  # at once: readers must see the client even before it has started up
    if armed:
        write_json(paths.load_armed, pid)
    return pid


def arm_client(run: Run) -> dict[str, Any] | None:
    """Spawn the client early (armed) when this run will send a formal load that has not started yet."""
    paths = run.paths
    if run.meta.load_reuse or run.meta.action(Phase.LOAD) != "run" or run.case.load.host_shares():
        return None  # (a remote client is started in the load phase, after its inputs are copied there)
    if run.case.load.total_processes > 1:
        return None  # several processes are spawned armed by the load phase, which gives them one go
    if paths.load_end.exists() or paths.load_anchor.exists() or (paths.raw.exists() and paths.raw.stat().st_size):
        return None
    if procs.alive(read_json_or_none(paths.load_pid)):
        return None
    return spawn_client(paths, armed=True, case=run.case)


def disarm_client(paths: RunPaths) -> None:
    """An earlier phase failed: the armed client must exit without sending anything."""
    armed = read_json_or_none(paths.load_armed)
    if armed and not paths.load_anchor.exists() and not paths.load_go.exists():
        paths.load_abort.touch()
        procs.terminate(armed, grace_s=2.0)
    for part in paths.load_parts():  # the processes of a shared load, spawned armed by the load phase
        ref = read_json_or_none(part.load_armed)
        if ref and not paths.load_go.exists():
            paths.load_abort.touch()
            procs.terminate(ref, grace_s=2.0)


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
IN_FLIGHT_GAUGES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "llamacpp:requests_processing",
    "llamacpp:requests_deferred",
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
)
IDLE_WAIT_S = 60.0  # how long a resend waits for an engine to finish what an abandoned attempt left


def in_flight(case: Case) -> float | None:
    """Requests the engine reports running or queued, from its /metrics gauges; None when it exposes none."""
    url = case.target.metrics_url or origin(case.target.endpoints[0].base_url) + "/metrics"
    try:
        r = httpx.get(url, timeout=2.0)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    # lazy: metrics pulls numpy; only a resend after a failed attempt reads the gauges, off the hot path
    from caseledger.metrics import parse_prometheus

    found = [v for k, v in parse_prometheus(r.text).items() if k in IN_FLIGHT_GAUGES]
    return sum(found) if found else None


def _wait_idle(case: Case) -> None:
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


STALL_EVENT_S = 1.0  # a load client stopped this long is recorded as an event (status shows it at once)
HOST_SAMPLE_S = 0.5


class _LoadWatch:
    """What the controller sees while the local load client runs: the host's CPU every 0.5 s (load/host.jsonl:
    other processes' share, the client's own, steal, load average) and a client whose process is stopped."""

    def __init__(
        self,
        run: Run,
        client: dict[str, Any] | None,
        event: Callable[..., None],
        more: list[dict[str, Any]] | None = None,
    ) -> None:
        self.paths, self.client, self.event = run.paths, client, event
        self.more = more or []  # the other client processes of a shared load: their CPU is the measurement's
        self.sampler = procs.CpuSampler()
        self.sessions = _our_sessions(run, client, self.more)
        self.next_sample = 0.0
        self.stopped_since: float | None = None  # when the client was first seen stopped (this stop)
        self.recorded = False  # this stop was recorded as an event
        self.stops: list[float] = []  # seconds of each recorded stop
        self.fd = os.open(self.paths.load_host, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def tick(self) -> None:
        now = time.monotonic()
        if now >= self.next_sample:
            self.next_sample = now + HOST_SAMPLE_S
            sample = self.sampler.sample(self.sessions, int(self.client["pid"]) if self.client else None)
            if sample is not None:
                with contextlib.suppress(OSError):  # evidence about the host, never a reason to stop the load
                    os.write(self.fd, orjson.dumps(sample) + b"\n")
        if procs.stopped(self.client) or any(procs.stopped(c) for c in self.more):
            self.stopped_since = now if self.stopped_since is None else self.stopped_since
            if not self.recorded and now - self.stopped_since >= STALL_EVENT_S:
                self.recorded = True
                self.event("load_client_stopped", phase="load", data={"pid": (self.client or {}).get("pid")})
        elif self.stopped_since is not None:
            if self.recorded:
                self.stops.append(round(now - self.stopped_since, 3))
                self.event("load_client_continued", phase="load", data={"stopped_s": self.stops[-1]})
            self.stopped_since, self.recorded = None, False

    def close(self) -> None:
        os.close(self.fd)

    def evidence(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.stops:
            out["client_stopped_s"] = self.stops
        return out


def _our_sessions(run: Run, client: dict[str, Any] | None, more: list[dict[str, Any]] | None = None) -> set[int]:
    """Sessions whose CPU is the measurement's own: the load clients', the service processes' and this
    controller's (each is started in a session of its own, so an engine's workers count with it)."""
    pids = [os.getpid(), *([int(client["pid"])] if client else []), *(int(c["pid"]) for c in more or [])]
    rec = ServiceRecord.read(run.paths.phase_file(Phase.SERVICE))
    pids += [c.pid for c in rec.processes if c.pid is not None] if rec is not None else []
    out = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            out.add(os.getsid(pid))
    return out


def _snapshot(case: Case, dest: Path) -> str | None:
    """Prometheus counters before/after the formal load (spec decode); absence is recorded, not fatal. Who read
    them (this host), or None."""
    url = case.target.metrics_url or origin(case.target.endpoints[0].base_url) + "/metrics"
    try:
        r = httpx.get(url, timeout=5)
        if r.status_code == 200:
            dest.write_text(r.text)
            return f"controller ({procs.me()['host']})"
        dest.with_suffix(".missing").write_text(f"HTTP {r.status_code} from {url}\n")
    except httpx.HTTPError as e:
        dest.with_suffix(".missing").write_text(redact.mask(f"{type(e).__name__}: {e} ({url})\n"))
    return None


def _counters(run: Run, dest: Path) -> str | None:
    """The counters snapshot from the host that can reach /metrics: the controller, else the load host (load.host,
    over SSH). Which host read them, or None (the .missing file says why)."""
    by = _snapshot(run.case, dest)
    if by is None and run.case.load.host_shares():
        by = remote_load.snapshot_metrics(run, dest)
    with contextlib.suppress(OSError):
        old = read_json_or_none(run.paths.load_dir / "metrics_read_by.json") or {}
        write_json(run.paths.load_dir / "metrics_read_by.json", {**old, dest.stem: by})
    return by


def reuse_parent_load(run: Run) -> dict[str, Any]:
    paths, source = run.paths, run.meta.load_reuse
    if source is None:
        raise PhaseFailed(
            f"run {run.run_id} reuses no parent load",
            FailureClass.BEFORE_MODEL,
            "start a new run of the case (start_run)",
        )
    src = run.workspace.run(source).load_dir
    paths.load_dir.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name != "pid.json":
            shutil.copy2(f, paths.load_dir / f.name)
    return {"outcome": "reused", "source_run": source, "raw_sha256": sha256_file(paths.raw)}


def confirm_end(run: Run) -> dict[str, Any]:
    paths, reused = run.paths, bool(run.meta.load_reuse)
    end = read_json_or_none(paths.load_end)
    partial = read_json_or_none(paths.load_partial)
    if end is None and partial is not None:
        n = len(read_records(paths.raw).records)
        if procs.alive(read_json_or_none(paths.load_pid)):
            raise PhaseFailed("load client alive again", FailureClass.END_UNKNOWN, "resume waits for it")
        return {
            "client_gone": True,
            "end_file": False,
            "records": n,
            "planned": partial["planned"],
            "partial": partial,
            "all_accounted": False,
            "raw_sha256": sha256_file(paths.raw),
        }
    if end is None:
        raise PhaseFailed("no end file", FailureClass.END_UNKNOWN, "resume checks the client process and raw records")
    pid = read_json_or_none(paths.load_pid)
    if not reused and run.case.load.host is not None and not remote_load.confirm_gone(run):
        raise PhaseFailed(
            f"load client on {remote_load.where(run.case.load.host)} still alive after its end file",
            FailureClass.END_UNKNOWN,
            "resume waits for it",
        )
    deadline = time.monotonic() + 30
    while not reused and procs.alive(pid) and time.monotonic() < deadline:
        # the client is our child when we started it: reap it so it does not linger as a zombie
        with contextlib.suppress(ChildProcessError):
            os.waitpid(int((pid or {})["pid"]), os.WNOHANG)
        time.sleep(0.05)  # it wrote its end file and is exiting
    if not reused and procs.alive(pid):
        raise PhaseFailed(
            "load client still alive 30 s after its end file", FailureClass.END_UNKNOWN, "resume waits for it"
        )
    n = len(read_records(paths.raw).records)
    if n != end["done"]:
        raise PhaseFailed(
            f"raw records {n} != end file done {end['done']}",
            FailureClass.END_UNKNOWN,
            "resume re-checks; nothing is re-sent",
        )
    return {
        "client_gone": True,
        "end_file": True,
        "records": n,
        "planned": end["planned"],
        "sent": end["sent"],
        "all_accounted": n == end["sent"] == end["planned"],
        "raw_sha256": sha256_file(paths.raw),
    }


def postprocess_env() -> tuple[list[str], dict[str, str]]:

    env = child_env()
    argv = [sys.executable, "-m", "caseledger.metrics"]
    if fault("postprocess", "fail") == "import":
        # test hook: the seeds' incident, a collector whose environment lacks a module (no site-packages)
        argv = [sys.executable, "-S", "-m", "caseledger.metrics"]
    return argv, env


def check_raw(paths: RunPaths, sealed: str | None) -> None:
    """Refuse raw data whose sha256 differs from the one sealed when the load's end was confirmed."""
    if sealed is None:
        return
    now = sha256_file(paths.raw) if paths.raw.is_file() else "missing"
    if now != sealed:
        raise EvidenceChanged(
            f"ledger/runs/{paths.run_id}/load/raw.jsonl changed after the load ended "
            f"(sha256 {now[:12]}… now, {sealed[:12]}… sealed at confirm_end); nothing was recomputed",
            "restore raw.jsonl from a backup (its sha256 is in the confirm_end event); a new measurement "
            "needs start_run",
            run_id=paths.run_id,
            phase=Phase.POSTPROCESS,
        )


def postprocess(paths: RunPaths, extra: list[str] | None = None, *, sealed: str | None = None) -> dict[str, Any]:
    """The processor in a fresh subprocess with an explicit, recorded environment; the original error is kept.
    `sealed`: the raw data's sha256 recorded at confirm_end, checked first."""
    check_raw(paths, sealed)
    argv, env = postprocess_env()
    p = subprocess.run(
        [*argv, str(paths.root), *(extra or [])], capture_output=True, env=env, timeout=600, stdin=subprocess.DEVNULL
    )
    recorded_env = {"interpreter": argv[0], "argv": argv[1:], "PYTHONPATH": env.get("PYTHONPATH", "")}
    if p.returncode != 0:
        err = (p.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise PhaseFailed(
            redact.cut(f"postprocess: {err}", 400),
            FailureClass.COLLECT,
            f"reprocess_raw(run_id='{paths.run_id}') repairs from raw data; no request is re-sent",
        )

    out = orjson.loads(p.stdout.decode().strip().splitlines()[-1])
    return {
        "result": out.get("result"),
        "raw_sha256": out.get("raw_sha256"),
        "env": recorded_env,
        "requests": out.get("requests"),
    }


def decide(run: Run) -> dict[str, Any]:
    rec = summary.decide_run(run)
    return {"decision": rec.get("outcome"), "missing": rec.get("missing", []), "baseline": rec.get("baseline_ref")}
