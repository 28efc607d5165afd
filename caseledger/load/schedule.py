"""The load schedule: which entry each formal request sends, where, when, with which body. Pure, no I/O.

`build_schedule` turns the frozen case, the dataset entries, the run salt and the dataset identity into N
request specs: entry i -> request i, route i % len(endpoints), a scheduled send offset from the arrival
process, and the request body encoded once. `schedule_from_run_dir` is the single entry point used by both
the load client and preflight (which calls it in a fresh process with sockets forbidden), so what
preflight proves is exactly what the load sends.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import orjson

from caseledger import engines
from caseledger.case.model import Case
from caseledger.datasets import DatasetIdentity, Entry, load_entries, load_identity, render_prompt
from caseledger.errors import CaseInvalid
from caseledger.ledger.runs import Run, read_run

Api = Literal["chat", "completions"]
PATHS: dict[str, str] = {"chat": "/chat/completions", "completions": "/completions"}


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request as the client sends it. Also built by the warmup / route_verify / cache phases."""

    i: int  # request index in schedule order (0..N-1 for the formal load)
    entry: int  # dataset entry index
    route: int  # endpoint index in case.target.endpoints
    offset_s: float  # scheduled send time after the load start; 0 for all when rate is unlimited
    url: str  # full URL: base_url + /chat/completions or /completions
    body: bytes  # JSON body, encoded once here so the hot loop never serializes
    input_tokens_body: int | None = None  # body tokens from the dataset (what we built)
    input_tokens_chat: int | None = None  # chat-template tokens from the dataset
    trace_row: int | None = None  # source 'trace': the request's row in the trace file
    planned_shared_tokens: int | None = None  # source 'trace': chat tokens an earlier request planned to share
    max_tokens: int | None = None  # what the body asks for (the context check of preflight)
    # dataset.sessions: turn `turn` of conversation `session` (of `turns`), sent think_s after the previous turn's
    # response ended; its body holds the new user message only, the client puts the conversation so far before it.
    # prompt_bound: the most prompt tokens the turn can carry (its history's messages and replies at max_tokens)
    session: int | None = None
    turn: int | None = None
    turns: int | None = None
    think_s: float = 0.0
    prompt_bound: int | None = None


@dataclass(frozen=True)
class Schedule:
    """The formal load of one run, fully determined by case + entries + salt."""

    specs: tuple[RequestSpec, ...]
    concurrency: int
    timeout_s: float
    api_key_env: str | None
    arrival: str
    rate: float | None
    seed: int  # seed of the arrival process (from dataset.seed and the run salt)
    max_event_bytes: int  # the largest SSE event a response may send (load.max_event_bytes)
    # dataset.sessions: each conversation's spec indices in turn order (None: independent requests)
    sessions: tuple[tuple[int, ...], ...] | None = None
    processes: int = 1  # load.processes: client processes the formal load is dealt to (load/parts.py)

    @property
    def scheduled(self) -> bool:
        """Requests leave at planned times (a rate, or a replayed trace): each record then carries its due time."""
        return self.rate is not None or self.arrival == "trace"

    @property
    def planned(self) -> int:
        return len(self.specs)

    def digest(self) -> str:
        """sha256 over every spec (url, offset, body): equal digests, same requests at the same times."""
        h = hashlib.sha256()
        for s in self.specs:
            h.update(orjson.dumps([s.i, s.entry, s.route, s.offset_s, s.url]))
            if s.session is not None:  # independent requests keep the digest they had before sessions
                h.update(orjson.dumps([s.session, s.turn, s.think_s]))
            h.update(hashlib.sha256(s.body).digest())
        return h.hexdigest()


def request_url(base_url: str, api: Api) -> str:
    return base_url.rstrip("/") + PATHS[api]


def draft_counts_per_chunk(case: Case) -> bool:
    """Ask for llama.cpp's `timings_per_token` (cumulative draft counts on every chunk, from which the load
    client counts each request's verify steps): only where the server is known to honour it, an engine whose
    profile says its responses carry per-request draft counts (measurement.spec_decode names it) and the
    reference target; other engines get no unknown field."""
    named = engines.PROFILES.get(case.measurement.spec_decode)
    return (named is not None and named.per_request_drafts) or case.service.traits.timings_per_token


def request_body(
    api: Api, model: str, prompt: str, max_tokens: int, ignore_eos: bool, timings_per_token: bool = False
) -> bytes:
    """The streaming request body (OpenAI-compatible); usage in every chunk where the server supports it."""
    body: dict[str, Any] = {"model": model}  # JSON: the request body
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    body.update(
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        ignore_eos=ignore_eos,
        temperature=0,
    )
    if timings_per_token:
        body["timings_per_token"] = True
    return orjson.dumps(body)


def arrival_seed(dataset_seed: int, salt: str | None) -> int:
    """Seed of the arrival process: the same run (dataset seed + salt) reproduces the same schedule."""
    digest = hashlib.sha256(f"arrival|{dataset_seed}|{salt or ''}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def arrival_offsets(n: int, rate: float | None, arrival: str, burstiness: float, seed: int) -> list[float]:
    """Scheduled send offsets in seconds; the first request goes at 0.

    constant: i / r. poisson: exponential gaps with mean 1/r. gamma: gaps with shape = burstiness and
    mean 1/r (shape 1 is poisson; lower is burstier). rate None: all 0, concurrency alone limits.
    """
    if arrival == "trace":
        raise CaseInvalid(
            "load.arrival 'trace' takes its offsets from the dataset's trace rows",
            "build the schedule with build_schedule, which reads them from the entries",
        )
    if rate is None:
        return [0.0] * n
    if arrival == "constant":
        return [k / rate for k in range(n)]
    # lazy: numpy only for random arrivals; a closed-loop or constant-rate load client never imports it
    import numpy as np
    from numpy.random import default_rng  # lazy: numpy.random, a submodule numpy loads on first use

    rng = default_rng(seed)
    if arrival == "poisson":
        gaps = rng.exponential(1.0 / rate, n - 1)
    elif arrival == "gamma":
        gaps = rng.gamma(burstiness, 1.0 / (rate * burstiness), n - 1)
    else:
        raise CaseInvalid(f"unknown load.arrival '{arrival}'", "use one of: constant, poisson, gamma")
    return [0.0, *np.cumsum(gaps).tolist()]


def build_schedule(case: Case, entries: Sequence[Entry], salt: str | None, identity: DatasetIdentity) -> Schedule:
    """N request specs from the frozen case and its dataset entries. Pure and deterministic."""
    load = case.load
    n = load.requests
    if len(entries) < n:
        raise CaseInvalid(
            f"dataset has {len(entries)} entries but load.requests is {n}: one entry per formal request",
            "raise dataset.entries to at least load.requests (or leave it null) and freeze again, "
            "or lower load.requests",
        )
    endpoints = case.target.endpoints
    api: Api = case.target.api
    seed = arrival_seed(case.dataset.seed, salt)
    if load.arrival == "trace":
        offsets = [float(e.get("arrival_s", 0.0)) * load.time_scale for e in entries[:n]]
    else:
        offsets = arrival_offsets(n, load.rate, load.arrival, load.burstiness, seed)
    urls = [request_url(ep.base_url, api) for ep in endpoints]
    per_chunk = draft_counts_per_chunk(case)
    specs: list[RequestSpec] = []
    for i in range(n):
        e = entries[i]
        route = i % len(endpoints)
        prompt = render_prompt(e, salt, identity)
        # load.max_tokens, else the entry's own (drawn, or its trace row's output_length)
        max_tokens = load.max_tokens if load.max_tokens is not None else e["output_tokens"]
        trace = "trace_row" in e
        if "session" in e:
            specs.append(
                _turn_spec(
                    i,
                    e,
                    route,
                    urls[route],
                    body=request_body(api, endpoints[route].model, prompt, max_tokens, load.ignore_eos, per_chunk),
                    max_tokens=max_tokens,
                )
            )
            continue
        specs.append(
            RequestSpec(
                i=i,
                entry=e["i"],
                route=route,
                offset_s=offsets[i],
                url=urls[route],
                body=request_body(api, endpoints[route].model, prompt, max_tokens, load.ignore_eos, per_chunk),
                input_tokens_body=e["body_tokens"],
                input_tokens_chat=e["chat_tokens"],
                trace_row=e.get("trace_row") if trace else None,
                planned_shared_tokens=e["expected_cached_tokens"] if trace else None,
                max_tokens=max_tokens,
            )
        )
    return Schedule(
        sessions=_conversations(specs) if case.dataset.sessions is not None else None,
        specs=tuple(_bounded(specs)) if case.dataset.sessions is not None else tuple(specs),
        concurrency=load.concurrency,
        timeout_s=load.timeout_s,
        api_key_env=case.target.api_key_env,
        arrival=load.arrival,
        rate=load.rate,
        seed=seed,
        max_event_bytes=load.max_event_bytes,
        processes=load.total_processes,
    )


REPLY_SLACK = 8  # tokens a reply may take beyond its max_tokens in the history: end-of-turn markers, re-tokenizing


def _turn_spec(i: int, e: Entry, route: int, url: str, *, body: bytes, max_tokens: int) -> RequestSpec:
    turn = int(e.get("turn", 0))
    return RequestSpec(
        i=i,
        entry=e["i"],
        route=route,
        offset_s=0.0,
        url=url,
        body=body,
        input_tokens_body=e["body_tokens"],
        # turn 0 is the message alone; later turns carry the server's replies, counted by the server
        input_tokens_chat=e["chat_tokens"] if turn == 0 else None,
        max_tokens=max_tokens,
        session=int(e.get("session", 0)),
        turn=turn,
        turns=int(e.get("turns", 1)),
        think_s=float(e.get("think_s", 0.0)),
        prompt_bound=e["chat_tokens"],
    )


def _bounded(specs: list[RequestSpec]) -> list[RequestSpec]:
    """Each turn's prompt_bound: its own message plus every earlier turn's message and reply (at max_tokens)."""
    out: list[RequestSpec] = []
    carried: dict[int, int] = {}
    for s in specs:
        before = carried.get(s.session or 0, 0)
        out.append(replace(s, prompt_bound=before + (s.prompt_bound or 0)))
        carried[s.session or 0] = before + (s.prompt_bound or 0) + (s.max_tokens or 0) + REPLY_SLACK
    return out


def _conversations(specs: list[RequestSpec]) -> tuple[tuple[int, ...], ...]:
    """Spec indices of each conversation, in turn order; conversations in the order of their first turn."""
    by: dict[int, list[int]] = {}
    for k, s in enumerate(specs):
        by.setdefault(s.session or 0, []).append(k)
    return tuple(tuple(sorted(v, key=lambda k: specs[k].turn or 0)) for v in by.values())


def schedule_from_run_dir(run_dir: Path) -> Schedule:
    """The formal load schedule of a run directory: the one entry point of the load client and preflight."""
    return schedule_of(read_run(Path(run_dir)))


def schedule_of(run: Run) -> Schedule:
    """The formal load schedule of a run already read (its case, dataset and salt)."""
    meta, case = run.meta, run.case
    if meta.salt is not None and not case.load.salt:
        raise CaseInvalid(
            f"run {meta.run_id} has a salt but the case sets load.salt false",
            "the run's salt must be null when load.salt is false; recreate the run",
        )
    entries = load_entries(run.workspace, meta.dataset())
    identity = load_identity(run.workspace, meta.dataset())
    return build_schedule(case, entries, meta.salt, identity)


RECORD_BYTES, TOKEN_BYTES = 2048, 48  # room one raw record takes: fields and error text, per output token
MAX_RESERVED_TOKENS = 32768  # longer answers reserve this much; past it a full disk stops the load cleanly


def raw_bytes_needed(run: Run) -> int:
    """Disk the formal load's raw records need (reserved before the first send; checked at preflight). Without
    load.max_tokens each request asks for its own length (drawn, a file line's or a trace row's): the
    dataset's identity holds the longest."""
    case = run.case
    asked = case.load.max_tokens or load_identity(run.workspace, run.meta.dataset()).output_tokens
    return case.load.requests * (RECORD_BYTES + TOKEN_BYTES * min(asked, MAX_RESERVED_TOKENS))
