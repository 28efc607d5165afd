"""The result schema: every figure, its window, and the definition it was computed with.

A figure that could not be computed is a `NotObserved` value with the reason, serialized as
{"value": "NOT_OBSERVED", "reason": ...}; never a zero. Every figure lives inside exactly one window
(`Result.windows.whole` or `Result.windows.native`), so no figure mixes windows.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from caseledger.case.metrics import Figure, Metric
from caseledger.records import RATIO_MAX as RATIO_MAX  # re-exported: the metrics' names
from caseledger.records import RATIO_MIN_EXCLUSIVE as RATIO_MIN_EXCLUSIVE
from caseledger.records import NativeRule as NativeRule

# v5: arrival error against the schedule, trace replay planned vs cached; v4: server counts checked, stalls and
# host CPU flag distorted windows, rate noise in time
PROCESSOR_VERSION = "v5"
"""Version of the code that turns raw records into results; results are stored per version."""

WindowRule = Literal["whole", NativeRule]
"""The rule that selected a window: 'whole' for the whole window, else the native rule."""
NATIVE_RULES: tuple[NativeRule, ...] = get_args(NativeRule)
"""The native rules ('aisbench', 'sglang'), in the order they are listed to users."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class NotObserved(_Model):
    """A figure that was not observed, with the reason. Never a zero."""

    value: Literal["NOT_OBSERVED"] = Field(default="NOT_OBSERVED", description="Marker: this figure has no value")
    reason: str = Field(description="Why the figure could not be computed")


class Distribution(_Model):
    """Summary of a per-request (or per-gap / per-token) sample."""

    unit: str = Field(description="Unit of every statistic: 'ms' or 'tokens' or 'ratio'")
    count: int = Field(description="Sample size (requests, gaps or tokens, see the metric's definition)")
    mean: float = Field(description="Arithmetic mean")
    min: float = Field(description="Smallest value")
    max: float = Field(description="Largest value")
    p50: float = Field(description="50th percentile (numpy linear interpolation)")
    p75: float = Field(description="75th percentile (numpy linear interpolation)")
    p90: float = Field(description="90th percentile (numpy linear interpolation)")
    p99: float = Field(description="99th percentile (numpy linear interpolation)")


class Throughput(_Model):
    """A rate over one window's duration, with the per-card figure and the numbers it came from."""

    unit: str = Field(description="'tok/s' or 'req/s'; per_card is the same unit per card")
    value: float = Field(description="numerator / duration_s")
    per_card: float = Field(description="value / cards (case.target.cards)")
    numerator: float = Field(description="Tokens or requests credited to the window")
    duration_s: float = Field(description="Window duration in seconds (the divisor)")
    cards: int = Field(description="Accelerator cards (the per-card divisor)")
    text: str = Field(description="The computation written out, e.g. '655360 tok / 113.4630 s = 5776.0 tok/s'")


class Ratio(_Model):
    """A ratio of two observed numbers, with the formula and the numbers shown."""

    formula: str = Field(description="Formula in words, e.g. 'output tokens / verify steps (Δdrafts)'")
    numerator: float = Field(description="Numerator as observed")
    denominator: float = Field(description="Denominator as observed")
    value: float = Field(description="The ratio (for 1 + a/b forms: 1 + numerator/denominator)")
    text: str = Field(description="The numbers written out, e.g. '655360 / 113463 = 5.7760'")


class CounterDelta(_Model):
    """One Prometheus counter read before and after the load (summed over label sets)."""

    name: str = Field(description="Exposition name as read from /metrics")
    before: float = Field(description="Value in load/metrics_before.txt")
    after: float = Field(description="Value in load/metrics_after.txt")
    delta: float = Field(description="after - before")


class Latency(_Model):
    """Latency distributions of the successful requests of one window (ms)."""

    ttft: Distribution | NotObserved = Field(description="Time to first content chunk, per request (ms)")
    e2e: Distribution | NotObserved = Field(description="End-to-end latency, per request (ms)")
    tpot: Distribution | NotObserved = Field(
        description="Time per output token after the first, per request with >= 2 output tokens (ms)"
    )
    itl: Distribution | NotObserved = Field(description="Gaps between consecutive content chunks, pooled (ms)")
    itl_token_aware: Distribution | NotObserved = Field(
        description="Chunk gaps spread over the tokens each chunk carried, pooled per token (ms)"
    )


class TokenAgreement(_Model):
    """Server prompt tokens against the dataset's planned chat tokens, request by request: equal on every
    request means the dataset's tokenizer and template are the server's, and the case's input length is the
    one measured."""

    compared: int = Field(description="Successful requests with both counts")
    equal: int = Field(description="Of those, requests whose usage.prompt_tokens equals the planned chat tokens")
    max_abs_diff: int = Field(description="Largest |server - planned| over the compared requests")
    mean_diff: float = Field(description="Mean (server - planned) over the compared requests")


class Tokens(_Model):
    """Per-request token counts of the successful requests of one window."""

    input_body: Distribution | NotObserved = Field(description="Body tokens before the chat template (dataset)")
    input_chat: Distribution | NotObserved = Field(description="Chat-template prompt tokens (dataset)")
    prompt: Distribution | NotObserved = Field(description="Server usage.prompt_tokens")
    output: Distribution | NotObserved = Field(description="Server usage.completion_tokens")
    prompt_vs_planned: TokenAgreement | NotObserved = Field(
        default_factory=lambda: NotObserved(reason="not computed (results written before this figure existed)"),
        description="Server usage.prompt_tokens against the dataset's planned chat tokens, per request",
    )


class Throughputs(_Model):
    """Rates over one window's duration; per card = / case.target.cards."""

    request: Throughput | NotObserved = Field(description="Successful requests credited to the window / duration")
    output: Throughput | NotObserved = Field(description="Output tokens credited to the window / duration")
    input: Throughput | NotObserved = Field(description="Prompt tokens credited to the window / duration (nominal)")
    total: Throughput | NotObserved = Field(description="(input + output) tokens / duration")
    goodput: Throughput | NotObserved = Field(
        default_factory=lambda: NotObserved(reason="no per-request limits (case.decision.goodput is null)"),
        description="Good requests / duration: successful requests whose own TTFT, TPOT and E2E meet "
        "case.decision.goodput (req/s)",
    )


def figure_in(latency: Latency, throughput: Throughputs, figure: Figure) -> Throughput | Distribution | NotObserved:
    """A registry figure (caseledger.case.metrics) among a window's latency distributions and rates."""
    match figure:
        case "output":
            return throughput.output
        case "request":
            return throughput.request
        case "goodput":
            return throughput.goodput
        case "ttft":
            return latency.ttft
        case "tpot":
            return latency.tpot
        case "itl":
            return latency.itl
        case "e2e":
            return latency.e2e


def value_in(latency: Latency, throughput: Throughputs, m: Metric) -> float | NotObserved:
    """A registered metric's value (NOT_OBSERVED with the reason when its figure has none)."""
    fig = figure_in(latency, throughput, m.figure)
    if isinstance(fig, NotObserved):
        return fig
    if isinstance(fig, Throughput) and m.stat in ("value", "per_card"):
        return fig.value if m.stat == "value" else fig.per_card
    if isinstance(fig, Distribution) and m.stat in ("p50", "p99"):
        return fig.p50 if m.stat == "p50" else fig.p99
    return NotObserved(reason=f"{m.name}: {m.figure} has no {m.stat}")


class CacheFigures(_Model):
    """Prefix-cache figures of one window, from usage.prompt_tokens_details.cached_tokens."""

    denominator: str = Field(description="What the hit ratio divides by")
    requests_with_cached_tokens: int = Field(description="Successful requests whose usage carried cached_tokens")
    cached_tokens: Distribution | NotObserved = Field(description="Cached tokens per request")
    hit_ratio: Distribution | NotObserved = Field(description="cached_tokens / denominator per request")
    min_hit_ratio: float | None = Field(description="case.cache.min_hit_ratio (null: no cache target)")
    share_meeting_min: float | NotObserved = Field(
        description="Share of requests (with a hit ratio) whose hit ratio >= case.cache.min_hit_ratio"
    )
    nominal_input_throughput: Throughput | NotObserved = Field(
        description="All prompt tokens / duration (the same figure as throughput.input)"
    )
    uncached_input_throughput: Throughput | NotObserved = Field(
        description="Prompt tokens not served from cache (recomputed) / duration"
    )


class PositionAcceptance(_Model):
    """Acceptance at one draft position: verify steps whose draft was accepted up to and including it."""

    position: int = Field(description="Draft position, 0 = the first drafted token")
    accepted: float = Field(description="Verify steps whose draft token at this position was accepted")
    verify_steps: float = Field(description="Verify steps (the denominator)")
    rate: float = Field(description="accepted / verify_steps")


class SpecPerRequest(_Model):
    """Speculative-decoding figures of one window from the per-request counts the engine reported."""

    requests: int = Field(description="Successful requests credited to the window (started inside it)")
    requests_with_counts: int = Field(description="Of them, with draft counts (draft_n, draft_n_accepted)")
    requests_with_steps: int = Field(description="Of them, with verify steps counted per request")
    start_s: float | None = Field(description="First send of the counted requests, s after the first send")
    end_s: float | None = Field(description="Last end of the counted requests, s after the first send")
    output_tokens: float | None = Field(description="Sum of usage.completion_tokens (null: unknown)")
    verify_steps: float | None = Field(description="Sum of verify steps (null: not counted)")
    draft_tokens: float | None = Field(description="Sum of draft tokens proposed (null: not reported)")
    accepted_tokens: float | None = Field(description="Sum of draft tokens accepted (null: not reported)")
    acceptance_length: Ratio | NotObserved = Field(
        description="AL = output tokens / verify steps, summed over the window's requests"
    )
    acceptance_length_accepted: Ratio | NotObserved = Field(
        description="1 + accepted tokens / verify steps (llama.cpp's 'mean len'; excludes the first token)"
    )
    acceptance_rate: Ratio | NotObserved = Field(description="Strict acceptance rate = accepted / draft tokens")
    by_position: list[PositionAcceptance] | NotObserved = Field(
        description="Acceptance per draft position from the per-request verify steps"
    )


class SpecDecode(_Model):
    """Speculative-decoding figures of one window: from per-request counts (every window) and from the
    /metrics counter deltas (whole window only: the snapshots bracket the whole load)."""

    requested: str = Field(description="case.measurement.spec_decode: auto | vllm | sglang | llamacpp | none")
    source: str | None = Field(description="Counter family actually read (null: none)")
    counters: list[CounterDelta] = Field(description="Counters read, before/after/delta")
    acceptance_length: Ratio | NotObserved = Field(
        description="AL from counters = output tokens / verify steps, verify steps = Δdrafts (whole window only)"
    )
    acceptance_length_counters: Ratio | NotObserved = Field(
        description="AL from counters alone = 1 + Δaccepted / Δdrafts"
    )
    acceptance_rate: Ratio | NotObserved = Field(description="Strict acceptance rate = Δaccepted / Δdraft_tokens")
    by_position_counters: list[PositionAcceptance] | NotObserved = Field(
        description="Acceptance per draft position = Δaccepted_per_pos{position=k} / Δdrafts"
    )
    per_request: SpecPerRequest = Field(description="The same figures from the per-request counts of this window")
    agreement: list[str] = Field(
        description="Where counters and per-request counts both exist (whole window): each pair of totals, "
        "and whether they are equal"
    )
    agree: bool | None = Field(
        description="True when every compared total is equal; null when nothing could be compared"
    )


class Interval(_Model):
    """A bootstrap confidence interval of one figure: the window's successful requests resampled with
    replacement (seeded, so the same raw data always gives the same interval)."""

    metric: str = Field(description="The figure (case.decision.primary_metric), e.g. 'output_throughput_per_card'")
    point: float = Field(description="The figure as computed from all requests of the window")
    low: float = Field(description="Lower bound of the interval")
    high: float = Field(description="Upper bound of the interval")
    level: float = Field(description="Confidence level, e.g. 0.95")
    half_width_rel: float | None = Field(
        description="(high - low) / 2 / point: the relative noise of the figure; null when point is 0"
    )
    resamples: int = Field(description="Bootstrap resamples")
    seed: int = Field(description="Seed of the resampling")
    requests: int = Field(description="Requests resampled (successful requests of the window)")


class WindowResult(_Model):
    """One window: which requests and which span, whether it meets the case's minimums, and its figures."""

    name: Literal["whole", "native"] = Field(description="Window name")
    rule: WindowRule = Field(description="Rule that selected the window")
    params: dict[str, float | int | str | None] = Field(description="Parameters of the rule as applied")
    found: bool = Field(description="False when the rule found no window (figures are then NOT_OBSERVED)")
    reason: str | None = Field(description="Why no window was found")
    start_s: float | None = Field(description="Window start, seconds after the first send")
    end_s: float | None = Field(description="Window end, seconds after the first send")
    duration_s: float | None = Field(description="end_s - start_s: the divisor of every rate in this window")
    start_utc: str | None = Field(description="Window start as UTC (from load/anchor.json), null without anchor")
    requests: int = Field(description="Requests in the window (successful and failed)")
    ok: int = Field(description="Successful requests in the window")
    failed: int = Field(description="Failed requests in the window")
    failed_by_class: dict[str, int] = Field(description="Failed requests in the window by error_class")
    cards: int = Field(description="Per-card divisor (case.target.cards)")
    min_requests: int = Field(description="The case's minimum successful requests for this window")
    min_duration_s: float = Field(description="The case's minimum duration for this window")
    meets_min_requests: bool = Field(description="ok >= min_requests")
    meets_min_duration: bool = Field(description="duration_s >= min_duration_s")
    peak_concurrency: int = Field(description="Highest concurrency inside the window")
    mean_concurrency: float | NotObserved = Field(description="Time-weighted mean concurrency over the window")
    latency: Latency = Field(description="Latency distributions (ms)")
    tokens: Tokens = Field(description="Token counts per request")
    throughput: Throughputs = Field(description="Rates over duration_s")
    cache: CacheFigures = Field(description="Prefix-cache figures")
    spec_decode: SpecDecode = Field(description="Speculative-decoding figures")
    notes: list[str] = Field(description="What was excluded or derived in this window, and why")
    noise: Interval | NotObserved = Field(
        default_factory=lambda: NotObserved(reason="computed by an older processor"),
        description="Bootstrap confidence interval of case.decision.primary_metric on this window",
    )
    invalid: int = Field(
        0,
        description="Successful requests in the window whose server counts failed a check "
        "(excluded from every figure, like failed ones)",
    )
    distorted: list[str] = Field(
        default_factory=list,
        description="Why the window's figures are not a clean measurement (a stalled load client, a contended "
        "host); empty: none seen. A distorted window is never decided on: repeat the run",
    )

    def value(self, m: Metric) -> float | NotObserved:
        """A registered metric's value on this window (caseledger.case.metrics)."""
        return value_in(self.latency, self.throughput, m)

    def number(self, m: Metric) -> float | None:
        """The same, None where NOT_OBSERVED."""
        v = self.value(m)
        return None if isinstance(v, NotObserved) else v


class CounterCheck(_Model):
    """A server counter's delta over the formal load against the per-request sum it should equal."""

    counter: str = Field(description="Prometheus counter name")
    delta: float = Field(description="After minus before the formal load")
    per_request_sum: float = Field(description="Sum of the same count over every request's usage")
    agrees: bool = Field(description="delta == per_request_sum")
    text: str = Field(description="The comparison in words")


class RequestChecks(_Model):
    """The server's per-request counts checked (DEFINITIONS['count_checks'])."""

    checked: int = Field(description="Successful requests whose counts were checked")
    invalid: int = Field(description="Requests that failed a check (excluded from every figure)")
    by_reason: dict[str, int] = Field(description="Requests per failed rule (a request may fail several)")
    examples: list[str] = Field(description="The first invalid requests, with their counts")
    max_invalid_share: float = Field(description="case.measurement.evidence.max_invalid_share as applied")
    counters: list[CounterCheck] = Field(description="Counter deltas against per-request sums")


class Stall(_Model):
    """A span in which the load client made no progress at all (its event loop did not run): SIGSTOP, a
    starved CPU, a blocking call. Requests in flight meanwhile have late timestamps."""

    start_s: float = Field(description="Stall start, seconds after the first send")
    duration_s: float = Field(description="How long the client's event loop did not run")


class HostLoad(_Model):
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
    text: str = Field(description="The figures in one line")


class Schedule(_Model):
    """How closely the load client kept a fixed schedule (a rate, or a replayed trace): every request sent,
    successful or not, against the time it was due."""

    requests: int = Field(description="Requests whose record carries its due time (sched_ns)")
    arrival_error: Distribution | NotObserved = Field(
        description="send_ns - sched_ns per request, ms (positive: sent late)"
    )
    late_over_1ms: int = Field(description="Requests sent more than 1 ms after they were due")
    text: str = Field(description="The figures in one line")


class TraceRequest(_Model):
    """One replayed trace request: what the trace planned to share beside what the server reported cached."""

    i: int = Field(description="Formal request index")
    trace_row: int = Field(description="Row of the trace file (0-based request line)")
    planned_shared_tokens: int = Field(
        description="Chat tokens of its prompt an earlier request planned to share (0 for the first)"
    )
    cached_tokens: int | None = Field(description="usage.prompt_tokens_details.cached_tokens (null: not reported)")
    prompt_tokens: int | None = Field(description="usage.prompt_tokens (null: not reported)")
    ok: bool = Field(description="The request succeeded")


class TraceReplay(_Model):
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


class TurnFigures(_Model):
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


class SessionFigures(_Model):
    """One conversation: how many of its turns were sent and how long it lasted."""

    session: int = Field(description="Conversation index")
    turns_planned: int = Field(description="Turns the dataset gave it")
    turns_recorded: int = Field(description="Turns with a raw record (sent and ended, or cancelled)")
    turns_ok: int = Field(description="Successful turns")
    complete: bool = Field(description="Every planned turn succeeded")
    duration_s: float = Field(description="First turn's send to the last recorded turn's end, s")


class Conversations(_Model):
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


class Windows(_Model):
    whole: WindowResult = Field(description="First send to last end, all requests")
    native: WindowResult = Field(description="Steady state by the rule in params")

    def of(self, name: str) -> WindowResult:
        """The window named by a decision or a campaign ('whole' or 'native')."""
        if name == "whole":
            return self.whole
        if name == "native":
            return self.native
        raise KeyError(f"no window {name!r}: 'whole' or 'native'")


class ConcurrencySeries(_Model):
    """Client-side concurrency over time as a step series (value holds from t_s[k] until t_s[k+1])."""

    t_s: list[float] = Field(description="Change points, seconds after the first send")
    c: list[int] = Field(description="Concurrency from each change point on")
    peak: int = Field(description="Highest concurrency")
    bucketed: bool = Field(description="True when compacted to fixed buckets holding each bucket's maximum")


class Failures(_Model):
    total: int = Field(description="Failed requests (ok=false) in the raw file")
    by_class: dict[str, int] = Field(description="Failed requests by error_class")
    first_error: dict[str, str] = Field(description="First error text seen per class")
    note: str = Field(description="How failed requests enter the figures")


class Inputs(_Model):
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


class Params(_Model):
    native_rule: NativeRule = Field(description="Rule selecting the native window")
    native_ratio: float | None = Field(description="sglang rule: share of peak concurrency (null for aisbench)")
    spec_decode: str = Field(description="Counter family requested (case.measurement.spec_decode)")


class Result(_Model):
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


DEFINITIONS: dict[str, str] = {
    "ttft": "first content-bearing chunk arrival - send (chunk_ns[0] - send_ns), per successful request, ms",
    "e2e": "response end - send (end_ns - send_ns; end = [DONE]/close after the last chunk), per successful "
    "request, ms",
    "tpot": "(E2E - TTFT) / (completion_tokens - 1) per successful request with "
    "usage.completion_tokens >= 2; undefined for 1-token outputs (excluded, counted in the window notes), ms",
    "itl": "gaps between consecutive content chunks of the same successful request (chunk_ns[j] - "
    "chunk_ns[j-1], j >= 1), pooled over requests, ms",
    "itl_token_aware": "each chunk gap (j >= 1) divided by the tokens chunk j carried and counted once per "
    "token; tokens per chunk from chunk_tokens, or 1 each when the number of content chunks equals "
    "usage.completion_tokens; requests with neither are excluded; chunk 0 belongs to TTFT, ms",
    "input_body": "body tokens before the chat template, from the dataset identity (record input_tokens_body)",
    "input_chat": "chat-template prompt tokens, from the dataset identity (record input_tokens_chat)",
    "prompt": "server usage.prompt_tokens",
    "output": "server usage.completion_tokens",
    "arrival_error": "send_ns - sched_ns of every request of a scheduled load (rate set, or arrival 'trace'), where "
    "sched_ns = the load's start + the request's planned offset on the same monotonic clock, ms",
    "planned_shared_tokens": "trace: the chat tokens of a request's prompt that an earlier request of the run "
    "already sent (the chat-template head, the first word and the run's salt slot, the leading hash-id blocks an "
    "earlier row had); compared with usage cached_tokens per request",
    "sessions": "dataset.sessions: turn k of a conversation is sent after turn k-1's response ended (+ think time) "
    "and carries the earlier user messages and the replies the server streamed; its planned_shared_tokens = turn "
    "k-1's usage.prompt_tokens + usage.completion_tokens (the history the server counted), compared with turn k's "
    "cached_tokens; a conversation is complete when every planned turn succeeded; its duration is its first send to "
    "its last recorded end",
    "prompt_tokens_for_rates": "server usage.prompt_tokens, falling back to input_tokens_chat where the "
    "server gave none",
    "request_throughput": "successful requests credited to the window / window duration",
    "output_throughput": "output tokens (usage.completion_tokens of successful requests) credited to the "
    "window / window duration",
    "input_throughput": "prompt tokens (prompt_tokens_for_rates) of successful requests credited to the "
    "window / window duration (nominal: cached tokens included)",
    "total_throughput": "(input + output tokens) / window duration",
    "per_card": "a throughput / case.target.cards",
    "goodput": "good requests credited to the window / window duration; a successful request is good when its "
    "own TTFT, TPOT and E2E are each <= case.decision.goodput's limits (a limit left null is no condition; a "
    "1-token output has no TPOT and meets a TPOT limit), as vLLM's --goodput and AIPerf's goodput count them",
    "noise": "bootstrap: the window's successful requests resampled with replacement (numpy default_rng, fixed "
    "seed), the decision metric recomputed per resample (rates scale the window figure by the resampled / "
    "observed sum of what they count, divided by the resampled / observed sum of the requests' E2E: the window "
    "of a held concurrency lasts about sum(E2E) / C, so fixed-length outputs still vary in time; percentiles are "
    "taken of the resampled values); the interval is the "
    "(1-level)/2 and (1+level)/2 quantiles of the resampled figures",
    "percentiles": "numpy.percentile, method 'linear' (interpolation between closest ranks)",
    "concurrency": "requests in flight at the client: +1 at send_ns, -1 at end_ns (failed requests "
    "included); at equal timestamps ends are applied before sends",
    "mean_concurrency": "time integral of concurrency over the window / window duration",
    "window_whole": "first send to last end; every request is credited",
    "window_native_aisbench": "AISBench stable stage: P = peak concurrency; from the send of the second "
    "request that brings concurrency to P until the moment concurrency last leaves P; requests that START "
    "inside [start, end] are credited with all their tokens",
    "window_native_sglang": "longest span in which concurrency >= ceil(ratio * P); requests that START "
    "inside are credited for request counts, latency and input tokens; output tokens are credited by "
    "their own chunk timestamps inside the span (chunks of unknown token count get completion_tokens / "
    "chunks each)",
    "cache_hit_ratio": "usage.prompt_tokens_details.cached_tokens / chat-template prompt tokens "
    "(usage.prompt_tokens, falling back to input_tokens_chat), per successful request",
    "uncached_input_throughput": "sum(prompt tokens - cached tokens) of the credited requests / duration: "
    "the input the server recomputed",
    "spec_verify_step": "one target forward pass that verifies a draft: llama.cpp counts it in "
    "spec_decode_num_drafts_total (a decode step without a draft is no verify step), vLLM in "
    "spec_decode_num_drafts_total (one per request per scheduled step with draft tokens), SGLang in "
    "spec_verify_calls_total; per request, a step starts at each chunk whose cumulative draft count rose "
    "(llama.cpp timings.draft_n with timings_per_token; the reference target alike)",
    "spec_acceptance_length": "AL = output tokens / verify steps, output tokens = usage.completion_tokens "
    "(the first token, produced by prefill, and truncated drafts included, as the seeds count it); from "
    "counters: verify steps = Δ drafts counter and output tokens = sum over the whole window's successful "
    "requests; per request: both summed over the window's successful requests",
    "spec_acceptance_length_counters": "1 + Δ accepted tokens / Δ drafts, from counters alone",
    "spec_acceptance_length_accepted": "per request: 1 + accepted tokens / verify steps (llama.cpp's 'mean "
    "len': leaves out the first token and decode steps without a draft)",
    "spec_acceptance_rate": "strict acceptance rate = accepted draft tokens / draft tokens proposed (Δ "
    "counters, or per-request timings.draft_n_accepted / timings.draft_n)",
    "spec_acceptance_by_position": "verify steps whose draft token at position k (0-based) was accepted / "
    "verify steps; counters: Δ accepted_per_pos{position=k} / Δ drafts",
    "spec_scope": "counters are read before and after the formal load, so they cover the whole window only "
    "(warmup and route checks happen before the first snapshot); per-request counts cover any window",
    "spec_agreement": "whole window: per-request sums of the successful requests vs the counter deltas "
    "(which also count failed requests and anything else the server did between the snapshots)",
    "count_checks": "a successful request is invalid when usage.completion_tokens < 0, > the request's "
    "max_tokens, < its content chunks (each carries >= 1 token), or > 4 x content chunks + its accepted draft "
    "tokens + 1 (one token per chunk, up to 4 when an engine sends a character's byte tokens together; not applied "
    "when the counters show speculative decoding without per-request draft counts); or when prompt_tokens <= 0, "
    "cached_tokens < 0 or cached_tokens > prompt_tokens. Invalid requests are excluded from every figure; a window "
    "whose invalid share of its successful requests exceeds measurement.evidence.max_invalid_share has no figures",
    "stall": "a gap of >= 0.2 s in the load client's 50 ms event-loop ticker (load/stalls.jsonl); a window holding "
    "stalls of measurement.evidence.max_stall_s or more in all is distorted",
    "host_other_cpu": "(busy - ours) / all CPU time over the window's samples of /proc (every 0.5 s by the "
    "controller), ours = every process in the sessions of the load client, the service and the controller; above "
    "measurement.evidence.max_other_cpu_share the window is distorted (a contended host)",
    "failures": "a request with ok=false is failed: counted by error_class, excluded from latency, token "
    "and throughput figures, included in concurrency",
}
