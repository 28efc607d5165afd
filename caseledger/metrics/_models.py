"""The result schema: every figure, its window, and the definition it was computed with.

A figure that could not be computed is a `NotObserved` value with the reason, serialized as
{"value": "NOT_OBSERVED", "reason": ...}; never a zero. Every figure lives inside exactly one window
(`Result.windows.whole` or `Result.windows.native`), so no figure mixes windows.

This module: the figures of one window. The run-level models (checks, host, trace, sessions, the Result)
are in _result, the definitions of every figure in _definitions.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from caseledger.case.metrics import THROUGHPUT_FIGURES, Figure, Metric
from caseledger.engines import SPEC_DECODE
from caseledger.records import RATIO_MAX as RATIO_MAX  # re-exported: the metrics' names
from caseledger.records import RATIO_MIN_EXCLUSIVE as RATIO_MIN_EXCLUSIVE
from caseledger.records import NativeRule as NativeRule

# v6: accelerator samples per window, a device shared with a foreign process distorts it; v5: arrival error against
# the schedule, trace replay planned vs cached; v4: server counts checked, stalls and host CPU flag distorted
# windows, rate noise in time
PROCESSOR_VERSION = "v7"
# Chunks of one request closer than this came from one engine step: a verify step of speculative decoding streams
# its accepted tokens within tens of microseconds, and a decode step of a real engine takes milliseconds.
STEP_GAP_MS = 1.0
"""Version of the code that turns raw records into results; results are stored per version."""

WindowRule = Literal["whole", NativeRule]
"""The rule that selected a window: 'whole' for the whole window, else the native rule."""
NATIVE_RULES: tuple[NativeRule, ...] = get_args(NativeRule)
"""The native rules ('aisbench', 'sglang'), in the order they are listed to users."""


class FrozenModel(BaseModel):
    """The base of every result model, and of the campaign view: immutable, unknown keys refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class NotObserved(FrozenModel):
    """A figure that was not observed, with the reason. Never a zero."""

    value: Literal["NOT_OBSERVED"] = Field(default="NOT_OBSERVED", description="Marker: this figure has no value")
    reason: str = Field(description="Why the figure could not be computed")


class Distribution(FrozenModel):
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


class Throughput(FrozenModel):
    """A rate over one window's duration, with the per-card figure and the numbers it came from."""

    unit: str = Field(description="'tok/s' or 'req/s'; per_card is the same unit per card")
    value: float = Field(description="numerator / duration_s")
    per_card: float = Field(description="value / cards (case.target.cards)")
    numerator: float = Field(description="Tokens or requests credited to the window")
    duration_s: float = Field(description="Window duration in seconds (the divisor)")
    cards: int = Field(description="Accelerator cards (the per-card divisor)")
    text: str = Field(description="The computation written out, e.g. '655360 tok / 113.4630 s = 5776.0 tok/s'")


class Ratio(FrozenModel):
    """A ratio of two observed numbers, with the formula and the numbers shown."""

    formula: str = Field(description="Formula in words, e.g. 'output tokens / verify steps (Δdrafts)'")
    numerator: float = Field(description="Numerator as observed")
    denominator: float = Field(description="Denominator as observed")
    value: float = Field(description="The ratio (for 1 + a/b forms: 1 + numerator/denominator)")
    text: str = Field(description="The numbers written out, e.g. '655360 / 113463 = 5.7760'")


class CounterDelta(FrozenModel):
    """One Prometheus counter read before and after the load (summed over label sets)."""

    name: str = Field(description="Exposition name as read from /metrics")
    before: float = Field(description="Value in load/metrics_before.txt")
    after: float = Field(description="Value in load/metrics_after.txt")
    delta: float = Field(description="after - before")


class Latency(FrozenModel):
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
    itl_step: Distribution | NotObserved = Field(
        default=NotObserved(reason="not computed by processor versions before v7 (reprocess_raw computes it)"),
        description="Gaps between engine steps: chunk gaps of at least STEP_GAP_MS, pooled (ms); under "
        "speculative decoding the tokens of one verify step arrive together and count as one step",
    )


class TokenAgreement(FrozenModel):
    """Server prompt tokens against the dataset's planned chat tokens, request by request: equal on every
    request means the dataset's tokenizer and template are the server's, and the case's input length is the
    one measured."""

    compared: int = Field(description="Successful requests with both counts")
    equal: int = Field(description="Of those, requests whose usage.prompt_tokens equals the planned chat tokens")
    max_abs_diff: int = Field(description="Largest |server - planned| over the compared requests")
    mean_diff: float = Field(description="Mean (server - planned) over the compared requests")


class Tokens(FrozenModel):
    """Per-request token counts of the successful requests of one window."""

    input_body: Distribution | NotObserved = Field(description="Body tokens before the chat template (dataset)")
    input_chat: Distribution | NotObserved = Field(description="Chat-template prompt tokens (dataset)")
    prompt: Distribution | NotObserved = Field(description="Server usage.prompt_tokens")
    output: Distribution | NotObserved = Field(description="Server usage.completion_tokens")
    prompt_vs_planned: TokenAgreement | NotObserved = Field(
        default_factory=lambda: NotObserved(reason="not computed (results written before this figure existed)"),
        description="Server usage.prompt_tokens against the dataset's planned chat tokens, per request",
    )


class Throughputs(FrozenModel):
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
    fig: Throughput | Distribution | NotObserved = getattr(
        throughput if figure in THROUGHPUT_FIGURES else latency, figure
    )
    return fig


def value_in(latency: Latency, throughput: Throughputs, m: Metric) -> float | NotObserved:
    """A registered metric's value (NOT_OBSERVED with the reason when its figure has none)."""
    fig = figure_in(latency, throughput, m.figure)
    if isinstance(fig, NotObserved):
        return fig
    if isinstance(fig, Throughput) == (m.kind == "rate") and m.stat in type(fig).model_fields:
        value: float = getattr(fig, m.stat)
        return value
    return NotObserved(reason=f"{m.name}: {m.figure} has no {m.stat}")


class CacheFigures(FrozenModel):
    """Prefix-cache figures of one window, from usage.prompt_tokens_details.cached_tokens."""

    denominator: str = Field(description="What the hit ratio divides by")
    requests_with_cached_tokens: int = Field(
        description="Successful requests whose usage reported cached_tokens (a report of 0 included)"
    )
    requests_with_cache_hits: int | None = Field(
        None, description="Successful requests with cached_tokens > 0 (null: computed before it was counted)"
    )
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


class PositionAcceptance(FrozenModel):
    """Acceptance at one draft position: verify steps whose draft was accepted up to and including it."""

    position: int = Field(description="Draft position, 0 = the first drafted token")
    accepted: float = Field(description="Verify steps whose draft token at this position was accepted")
    verify_steps: float = Field(description="Verify steps (the denominator)")
    rate: float = Field(description="accepted / verify_steps")


class SpecPerRequest(FrozenModel):
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


class SpecDecode(FrozenModel):
    """Speculative-decoding figures of one window: from per-request counts (every window) and from the
    /metrics counter deltas (whole window only: the snapshots bracket the whole load)."""

    requested: str = Field(description=f"case.measurement.spec_decode: {' | '.join(SPEC_DECODE)}")
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


class Interval(FrozenModel):
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


class DeviceFigures(FrozenModel):
    """One accelerator over a window's samples (load/accel.jsonl); a figure the tool never gave is null."""

    index: str = Field(description="Device index as the vendor tool numbers it")
    uuid: str = Field(description="Device UUID")
    samples: int = Field(description="Samples of this device inside the window")
    util_pct_mean: float | None = Field(description="Mean utilisation, % (null: not reported)")
    util_pct_max: float | None = Field(description="Highest utilisation, % (null: not reported)")
    mem_used_mib_max: float | None = Field(description="Most device memory used, MiB (null: not reported)")
    mem_total_mib: float | None = Field(description="Device memory, MiB (null: not reported)")
    power_w_mean: float | None = Field(description="Mean power draw, W (null: not reported)")
    power_w_max: float | None = Field(description="Highest power draw, W (null: not reported)")
    clock_mhz_mean: float | None = Field(
        description="Mean core clock, MHz: nvidia-smi's SM clock, rocm-smi's sclk (null: not reported, as by npu-smi)"
    )
    processes: list[str] = Field(
        description="Processes seen on the device, most memory each: 'pid 4121 70000 MiB (service)' or "
        "'pid 4242 9500 MiB (other)'"
    )
    used_by_service: bool = Field(description="A process of the service (or caseledger's own) was seen on it")
    others: list[str] = Field(
        description="The processes on it that are neither the service's nor caseledger's, e.g. 'pid 4242 9500 MiB'"
    )
    text: str = Field(description="The device's figures in one line")


class Accelerators(FrozenModel):
    """The service host's accelerators over a window, sampled by the controller through the vendor's tool."""

    tool: str = Field(description="The vendor tool read, e.g. 'nvidia-smi'")
    samples: int = Field(description="Samples inside the window")
    devices: list[DeviceFigures] = Field(description="Every device the tool listed")
    note: str | None = Field(description="Why no device was judged for other processes (null: each was)")
    text: str = Field(description="The figures in one line")


class WindowResult(FrozenModel):
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
    accelerators: Accelerators | NotObserved = Field(
        default_factory=lambda: NotObserved(reason="computed by an older processor"),
        description="The service host's accelerators over the window (load/accel.jsonl)",
    )

    def value(self, m: Metric) -> float | NotObserved:
        """A registered metric's value on this window (caseledger.case.metrics)."""
        return value_in(self.latency, self.throughput, m)

    def number(self, m: Metric) -> float | None:
        """The same, None where NOT_OBSERVED."""
        v = self.value(m)
        return None if isinstance(v, NotObserved) else v
