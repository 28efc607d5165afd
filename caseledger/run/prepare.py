"""The phases before the formal load that send requests: warmup, route_verify, cache_prepare. Each returns its
evidence model (ledger/evidence.py) or raises PhaseFailed with a failure class."""

from __future__ import annotations

import time

import anyio

from caseledger import datasets, services
from caseledger.case.model import Case
from caseledger.errors import FailureClass, PhaseFailed
from caseledger.ledger.evidence import (
    CacheCheck,
    CachePrepareEvidence,
    NotRun,
    RouteCheck,
    RouteVerifyEvidence,
    Sent,
    TokenTruth,
    WarmupEvidence,
)
from caseledger.ledger.runs import Run
from caseledger.load.auth import api_key_of, refuse_auth
from caseledger.load.client import run_requests
from caseledger.load.schedule import RequestSpec, request_body, request_url
from caseledger.records import RawRecord


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


def _send(run: Run, specs: list[RequestSpec], concurrency: int, phase: str) -> tuple[list[RawRecord], float]:
    case = run.case
    t0 = time.monotonic()
    recs = anyio.run(
        lambda: run_requests(
            specs,
            concurrency,
            phase,
            api_key=api_key_of(case),
            timeout_s=case.load.timeout_s,
            max_event_bytes=case.load.max_event_bytes,
            run_id=run.run_id,
        )
    )
    return recs, time.monotonic() - t0


def _lat_sum(recs: list[RawRecord]) -> float:
    return sum((r["end_ns"] - r["send_ns"]) / 1e9 for r in recs)


def warmup(run: Run, routes: list[int] | None = None) -> WarmupEvidence | NotRun:
    """Warmup requests spread over `routes` (None: every route)."""
    case = run.case
    n = case.warmup.requests
    rs = routes if routes is not None else list(range(len(case.target.endpoints)))
    if not rs:
        return NotRun(outcome="reused", reason="no route's process changed: every one kept its warm caches")
    picks = [(rs[k % len(rs)], k, f"warmup-{run.run_id}-{k}") for k in range(n)]
    recs, wall = _send(run, _specs(run, picks, case.warmup.max_tokens), case.warmup.concurrency, "warmup")
    ok = sum(r["ok"] for r in recs)
    if ok == 0:
        refuse_auth(case, "warmup", [r["status"] for r in recs])
        err = next((r["error"] for r in recs if r["error"]), "no response")
        raise PhaseFailed(
            f"warmup: 0 of {n} requests succeeded ({err})",
            FailureClass.SERVICE,
            "check the service log; resume retries warmup without restarting a healthy service",
        )
    out = WarmupEvidence(requests=n, ok=ok, wall_s=round(wall, 3), latency_sum_s=round(_lat_sum(recs), 3))
    return out if routes is None else out.model_copy(update={"routes": rs})  # unset: every route


def route_verify(run: Run, only: list[int] | None = None) -> RouteVerifyEvidence:
    """/models and one request per route (`only`: those routes), its prompt tokens checked against the plan."""
    case = run.case
    ks = only if only is not None else list(range(len(case.target.endpoints)))
    models = {k: services.served_models(case, k) for k in ks}
    routes: dict[int, RouteCheck] = {}
    picks = [(k, k, f"route-{run.run_id}-{k}") for k in ks]
    recs, wall = _send(run, _specs(run, picks, 1), max(1, len(picks)), "route_verify")
    counted = datasets.load_identity(run.workspace, run.meta.dataset()).chat_template_counted
    for rec in recs:
        if not rec["ok"]:
            refuse_auth(case, f"route {rec['route']}", [rec["status"]])
            raise PhaseFailed(
                f"route {rec['route']} did not answer a request: {rec['error']}",
                FailureClass.SERVICE,
                "check that route's service",
            )
        k = rec["route"]
        routes[k] = RouteCheck(
            route=k,
            base_url=case.target.endpoints[k].base_url,
            models=models[k],
            ok=rec["ok"],
            tokens=_token_truth(case, rec, counted),
        )
    out = RouteVerifyEvidence(routes=[routes[k] for k in ks], wall_s=round(wall, 3))
    return out if only is None else out.model_copy(update={"only_changed_routes": ks})  # unset: every route


def _token_truth(case: Case, rec: RawRecord, counted: bool) -> TokenTruth:
    """The route's verify request: the chat tokens the dataset planned against the prompt tokens the server
    counted. Unequal means the dataset's tokenizer is not the served model's: the run would measure another
    input length than the case says, so it stops here, before any formal request."""
    planned, server = rec["input_tokens_chat"], rec["prompt_tokens"]
    if not counted:
        compared = (
            "no: the dataset counts the body only (target.api completions or dataset.chat_template "
            "false), the server adds its template"
        )
    elif server is None:
        compared = "no: the server sent no usage.prompt_tokens"
    elif server != planned:
        raise PhaseFailed(
            f"dataset tokenizer ≠ server tokenizer on route {rec['route']}: planned {planned} chat "
            f"tokens, server counted {server}",
            FailureClass.DATASET,
            "freeze a case with dataset.tokenizer = the served model's tokenizer (its Hugging Face "
            "directory or its GGUF file)",
        )
    else:
        compared = "equal"
    return TokenTruth(planned_chat=planned, server_prompt=server, compared=compared)


def cache_prepare(run: Run, seed: bool) -> CachePrepareEvidence:
    """Seed each prefix group on every route (`seed`), then check the hit ratio against cache.min_hit_ratio."""
    case = run.case
    target = case.cache.min_hit_ratio or 0.0
    ident = datasets.load_identity(run.workspace, run.meta.dataset())
    groups = max(1, min(case.dataset.prefix_groups, ident.entries))
    routes = len(case.target.endpoints)
    seeded = None
    if seed:
        picks = [(r, g, f"seed-{run.run_id}") for r in range(routes) for g in range(groups)]
        recs, wall = _send(run, _specs(run, picks, 1), max(1, min(len(picks), case.load.concurrency)), "cache_seed")
        seeded = Sent(
            requests=len(recs),
            ok=sum(r["ok"] for r in recs),
            wall_s=round(wall, 3),
            latency_sum_s=round(_lat_sum(recs), 3),
        )
    picks = [
        (r, (r * case.cache.check_requests + k) % groups + groups * (k + 1), f"check-{run.run_id}-{k}")
        for r in range(routes)
        for k in range(case.cache.check_requests)
    ]
    recs, wall = _send(run, _specs(run, picks, 1), max(1, min(len(picks), case.load.concurrency)), "cache_check")
    ratios = []
    for r in recs:
        if r["ok"] and r["prompt_tokens"] and r["cached_tokens"] is not None:
            ratios.append(r["cached_tokens"] / r["prompt_tokens"])
        else:
            ratios.append(0.0)
    check = CacheCheck(
        requests=len(recs),
        wall_s=round(wall, 3),
        latency_sum_s=round(_lat_sum(recs), 3),
        hit_ratios=[round(x, 4) for x in ratios],
        cached_tokens=[r["cached_tokens"] for r in recs],
        prompt_tokens=[r["prompt_tokens"] for r in recs],
        denominator="server prompt_tokens (chat-template tokens)",
    )
    low = [x for x in ratios if x < target]
    if low:
        raise PhaseFailed(
            f"cache check: {len(low)}/{len(ratios)} requests below {target} (min {min(ratios):.4f})",
            FailureClass.SERVICE,
            "seed again (resume) or check the engine's prefix caching flags",
        )
    out = CachePrepareEvidence(target_ratio=target, mode="seed+check" if seed else "check", check=check)
    return out if seeded is None else out.model_copy(update={"seed": seeded})  # unset: a check only
