"""The run-level result models: counts checked, stalls and host CPU, schedule, trace replay, conversations,
both windows, the inputs and their hashes, and the Result itself."""

from __future__ import annotations

from pydantic import Field

from caseledger.metrics._models import (
    Distribution,
    FrozenModel,
    NativeRule,
    NotObserved,
    WindowResult,
)


class CounterCheck(FrozenModel):
    """A server counter's delta over the formal load against the per-request sum it should equal."""

    counter: str = Field(description="Prometheus counter name")
    delta: float = Field(description="After minus before the formal load")
    per_request_sum: float = Field(description="Sum of the same count over every request's usage")
    agrees: bool = Field(description="delta == per_request_sum")
    text: str = Field(description="The comparison in words")


class RequestChecks(FrozenModel):
    """The server's per-request counts checked (DEFINITIONS['count_checks'])."""

    checked: int = Field(description="Successful requests whose counts were checked")
    invalid: int = Field(description="Requests that failed a check (excluded from every figure)")
    by_reason: dict[str, int] = Field(description="Requests per failed rule (a request may fail several)")
    examples: list[str] = Field(description="The first invalid requests, with their counts")
    max_invalid_share: float = Field(description="case.measurement.evidence.max_invalid_share as applied")
    counters: list[CounterCheck] = Field(description="Counter deltas against per-request sums")


class Stall(FrozenModel):
    """A span in which the load client made no progress at all (its event loop did not run): SIGSTOP, a
    starved CPU, a blocking call. Requests in flight meanwhile have late timestamps."""

    start_s: float = Field(description="Stall start, seconds after the first send")
    duration_s: float = Field(description="How long the client's event loop did not run")


class HostLoad(FrozenModel):
    """CPU of the load client's host during the formal load, sampled by the controller from /proc."""

    samples: int = Field(description="Samples inside the span")
    cores: int = Field(description="CPUs of the host")
    span_s: float = Field(description="Seconds the samples cover")
    other_share: float = Field(
        description="CPU used by processes other than the load client, the service and "
        "caseledger's own, as a share of all cores"
    )
    ours_share: float = Field(description="CPU of the load client, the service and caseledger, share of all cores")
    client_share: float = Field(description="CPU of the load client alone, share of one core")
    steal_share: float = Field(description="CPU stolen by the hypervisor, share of all cores")
    load1_max: float = Field(description="Highest 1-minute load average seen")
    top: list[str] = Field(
        default_factory=list,
        description="The other processes that took the most CPU over the samples, e.g. 'pid 4242 cc1 38%' (share of "
        "all cores)",
    )
    text: str = Field(description="The figures in one line")


class Schedule(FrozenModel):
    """How closely the load client kept a fixed schedule (a rate, or a replayed trace): every request sent,
    successful or not, against the time it was due."""

    requests: int = Field(description="Requests whose record carries its due time (sched_ns)")
    arrival_error: Distribution | NotObserved = Field(
        description="send_ns - sched_ns per request, ms (positive: sent late)"
    )
    late_over_1ms: int = Field(description="Requests sent more than 1 ms after they were due")
    text: str = Field(description="The figures in one line")


class TraceRequest(FrozenModel):
    """One replayed trace request: what the trace planned to share beside what the server reported cached."""

    i: int = Field(description="Formal request index")
    trace_row: int = Field(description="Row of the trace file (0-based request line)")
    planned_shared_tokens: int = Field(
        description="Chat tokens of its prompt an earlier request planned to share (0 for the first)"
    )
    cached_tokens: int | None = Field(description="usage.prompt_tokens_details.cached_tokens (null: not reported)")
    prompt_tokens: int | None = Field(description="usage.prompt_tokens (null: not reported)")
    ok: bool = Field(description="The request succeeded")


class TraceReplay(FrozenModel):
    """Cached tokens of a replayed trace against its shared blocks, per request and in sum."""

    requests: int = Field(description="Requests that carry a trace row")
    with_cached_tokens: int = Field(description="Successful ones whose usage carried cached_tokens")
    planned_shared_tokens: int = Field(description="Planned shared tokens summed over those requests")
    cached_tokens: int = Field(description="Cached tokens summed over those requests")
    cached_at_least_planned: int = Field(description="Requests whose cached tokens reach their planned share")
    cached_below_planned: int = Field(
        description="Requests cached below their plan (evicted, another slot, or the earlier request not yet "
        "prefilled when this one arrived)"
    )
    per_request: list[TraceRequest] = Field(description=f"Every request, in order (the first {10_000:,} only)")
    text: str = Field(description="The sums in one line")


class TurnFigures(FrozenModel):
    """One turn index across the conversations (turn 0 = every conversation's first request)."""

    turn: int = Field(description="Turn index, 0-based")
    requests: int = Field(description="Turns of this index recorded")
    ok: int = Field(description="Of them, successful")
    ttft_ms_p50: float | None = Field(description="TTFT p50 of the successful ones, ms (null: none)")
    ttft_ms_mean: float | None = Field(description="TTFT mean of the successful ones, ms (null: none)")
    prompt_tokens_mean: float | None = Field(description="usage.prompt_tokens mean (null: not reported)")
    planned_shared_tokens_mean: float | None = Field(
        description="planned_shared_tokens mean: the history as the server counted it after the previous turn "
        "(null for turn 0)"
    )
    cached_tokens_mean: float | None = Field(description="usage cached_tokens mean (null: not reported)")
    cached_over_planned: float | None = Field(
        description="sum cached / sum planned shared tokens of the successful turns reporting both (null: none)"
    )


class SessionFigures(FrozenModel):
    """One conversation: how many of its turns were sent and how long it lasted."""

    session: int = Field(description="Conversation index")
    turns_planned: int = Field(description="Turns the dataset gave it")
    turns_recorded: int = Field(description="Turns with a raw record (sent and ended, or cancelled)")
    turns_ok: int = Field(description="Successful turns")
    complete: bool = Field(description="Every planned turn succeeded")
    duration_s: float = Field(description="First turn's send to the last recorded turn's end, s")


class Conversations(FrozenModel):
    """Multi-turn figures (dataset.sessions): by turn index and by conversation."""

    sessions: int = Field(description="Conversations with at least one record")
    complete: int = Field(description="Conversations whose planned turns all succeeded")
    incomplete: int = Field(
        description="Conversations cut short: a turn failed, or the load ended (cancel, kill) "
        "before their last turn; their later turns were never sent"
    )
    turns_recorded: int = Field(description="Turns with a raw record")
    turns_planned: int = Field(description="Turns the recorded conversations planned")
    duration_s: Distribution | NotObserved = Field(description="Conversation duration, s")
    by_turn: list[TurnFigures] = Field(description="Per turn index")
    per_session: list[SessionFigures] = Field(description=f"Every conversation (the first {10_000:,} only)")
    text: str = Field(description="The figures in one line")


class Windows(FrozenModel):
    whole: WindowResult = Field(description="First send to last end, all requests")
    native: WindowResult = Field(description="Steady state by the rule in params")

    def of(self, name: str) -> WindowResult:
        """The window named by a decision or a campaign ('whole' or 'native')."""
        if name == "whole":
            return self.whole
        if name == "native":
            return self.native
        raise KeyError(f"no window {name!r}: 'whole' or 'native'")


class ConcurrencySeries(FrozenModel):
    """Client-side concurrency over time as a step series (value holds from t_s[k] until t_s[k+1])."""

    t_s: list[float] = Field(description="Change points, seconds after the first send")
    c: list[int] = Field(description="Concurrency from each change point on")
    peak: int = Field(description="Highest concurrency")
    bucketed: bool = Field(description="True when compacted to fixed buckets holding each bucket's maximum")


class Failures(FrozenModel):
    total: int = Field(description="Failed requests (ok=false) in the raw file")
    by_class: dict[str, int] = Field(description="Failed requests by error_class")
    first_error: dict[str, str] = Field(description="First error text seen per class")
    note: str = Field(description="How failed requests enter the figures")


class Inputs(FrozenModel):
    """What the result was computed from."""

    raw_path: str = Field(description="Raw file relative to the run directory")
    raw_sha256: str | None = Field(description="sha256 of the raw file bytes read (null: records passed in memory)")
    records_sha256: str = Field(description="sha256 of the parsed record columns (independent of file layout)")
    records: int = Field(description="Complete records read")
    torn_tail: bool = Field(description="The last line was cut mid-write and skipped")
    bad_lines: int = Field(description="Unparsable lines before the last one (skipped)")
    case_sha256: str = Field(description="sha256 of the case's canonical JSON")
    anchor: dict[str, str | int] | None = Field(description="load/anchor.json: wall_utc and mono_ns")
    metrics_before_sha256: str | None = Field(description="sha256 of load/metrics_before.txt (null: absent)")
    metrics_after_sha256: str | None = Field(description="sha256 of load/metrics_after.txt (null: absent)")


class Params(FrozenModel):
    native_rule: NativeRule = Field(description="Rule selecting the native window")
    native_ratio: float | None = Field(description="sglang rule: share of peak concurrency (null for aisbench)")
    spec_decode: str = Field(description="Counter family requested (case.measurement.spec_decode)")


class Result(FrozenModel):
    """Figures computed from raw records by one processor version with one set of parameters."""

    processor_version: str = Field(description="Version of the processor that computed this result")
    params: Params = Field(description="Processing parameters")
    params_key: str = Field(description="Directory key of the parameters, e.g. 'aisbench' or 'sglang-r0.9'")
    inputs: Inputs = Field(description="Inputs and their hashes")
    inputs_key: str = Field(description="Short hash of inputs: same inputs + params -> same result directory")
    scenario: str = Field(description="case.scenario")
    cards: int = Field(description="case.target.cards")
    requests: int = Field(description="Requests in the raw file")
    ok: int = Field(description="Successful requests")
    failed: int = Field(description="Failed requests")
    failures: Failures = Field(description="Failed requests by class; excluded from latency and token figures")
    definitions: dict[str, str] = Field(description="Metric name -> formula used by this processor version")
    notes: list[str] = Field(description="Run-level notes (torn tail, exclusions)")
    concurrency: ConcurrencySeries = Field(description="Concurrency over time")
    windows: Windows = Field(description="The whole and the native window, each with all its figures")
    checks: RequestChecks | None = Field(None, description="The server's counts checked (null: older processor)")
    stalls: list[Stall] = Field(default_factory=list, description="Load client stalls (load/stalls.jsonl)")
    host: HostLoad | NotObserved = Field(
        default_factory=lambda: NotObserved(reason="not sampled"),
        description="CPU of the load client's host over the whole window (load/host.jsonl)",
    )
    schedule: Schedule | None = Field(
        None, description="Arrival error against the schedule (null: the load had no schedule, rate unlimited)"
    )
    trace: TraceReplay | None = Field(
        None, description="Replayed trace: planned shared vs cached tokens (null: not a trace dataset)"
    )
    sessions: Conversations | None = Field(
        None, description="Multi-turn conversations: figures by turn and by conversation (null: not a sessions dataset)"
    )
