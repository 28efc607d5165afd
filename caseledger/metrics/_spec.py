"""Speculative decoding from two Prometheus /metrics snapshots (before and after the load).

The text exposition format is parsed here (it is simple: `name{labels} value [timestamp]`, `#` lines are
comments); samples of one name are summed over their label sets (engines, ranks, models).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from caseledger.metrics._models import CounterDelta, NotObserved, Ratio, SpecDecode


@dataclass(frozen=True)
class Family:
    """Counter names of one engine. Each role lists accepted names, newest first."""

    drafts: tuple[str, ...]  # verify steps: one per speculative step that verified a draft
    draft_tokens: tuple[str, ...]
    accepted: tuple[str, ...]
    missing_why: str = ""  # why a role has no names for this engine


FAMILIES: dict[str, Family] = {
    # vLLM v1 (vllm/v1/spec_decode/metrics.py): Counters, exposed with the _total suffix.
    "vllm": Family(
        drafts=("vllm:spec_decode_num_drafts_total",),
        draft_tokens=("vllm:spec_decode_num_draft_tokens_total",),
        accepted=("vllm:spec_decode_num_accepted_tokens_total",),
    ),
    # SGLang (python/sglang/srt/metrics/collector.py): the only cumulative spec counter is
    # spec_verify_calls_total (verify steps). spec_accept_length / spec_accept_rate are gauges over the last
    # logging interval, not counters, so accepted and draft tokens cannot be differenced.
    "sglang": Family(
        drafts=("sglang:spec_verify_calls_total",),
        draft_tokens=(),
        accepted=(),
        missing_why="SGLang exposes no cumulative accepted/draft token counters "
        "(sglang:spec_accept_rate and spec_accept_length are last-interval gauges)",
    ),
    # llama.cpp llama-server (tools/server/server-context.cpp, server_task_result_metrics::to_metrics):
    # recent builds expose spec_decode_num_{drafts,draft_tokens,accepted_tokens}_total with the llamacpp:
    # prefix ("drafts" documented there as verification steps). The n_drafted_total /
    # n_drafted_accepted_total names are UNCERTAIN: seen only in third-party scrapers of older builds and
    # kept as fallbacks. llamacpp:n_decode_total excludes speculative decoding and is not a verify count.
    "llamacpp": Family(
        drafts=("llamacpp:spec_decode_num_drafts_total",),
        draft_tokens=("llamacpp:spec_decode_num_draft_tokens_total", "llamacpp:n_drafted_total"),
        accepted=("llamacpp:spec_decode_num_accepted_tokens_total", "llamacpp:n_drafted_accepted_total"),
    ),
}

WHOLE_ONLY = "counters cover the whole window only"


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum of sample values per metric name; comments, blank and malformed lines are skipped."""
    out: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        brace = line.find("{")
        space = _first_space(line)
        if brace != -1 and (space == -1 or brace < space):
            name = line[:brace]
            close = _closing_brace(line, brace)
            if close == -1:
                continue
            rest = line[close + 1 :].split()
        else:
            parts = line.split()
            name, rest = parts[0], parts[1:]
        if not rest:
            continue
        try:
            value = float(rest[0])
        except ValueError:
            continue
        if math.isnan(value):
            continue
        out[name] = out.get(name, 0.0) + value
    return out


def _first_space(line: str) -> int:
    for i, ch in enumerate(line):
        if ch in " \t":
            return i
    return -1


def _closing_brace(line: str, start: int) -> int:
    """Index of the '}' closing the label set, honouring quoted label values with escapes."""
    quoted = False
    i = start + 1
    while i < len(line):
        ch = line[i]
        if quoted:
            if ch == "\\":
                i += 2
                continue
            if ch == '"':
                quoted = False
        elif ch == '"':
            quoted = True
        elif ch == "}":
            return i
        i += 1
    return -1


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.4f}"


def _pick(names: tuple[str, ...], before: dict[str, float], after: dict[str, float]) -> str | None:
    for n in names:
        if n in before and n in after:
            return n
    return None


def _resolve(requested: str, before: dict[str, float], after: dict[str, float]) -> str | None:
    if requested != "auto":
        return requested
    for fam_name, fam in FAMILIES.items():
        if any(_pick((n,), before, after) for n in fam.drafts + fam.draft_tokens + fam.accepted):
            return fam_name
    return None


def not_observed_spec(requested: str, reason: str) -> SpecDecode:
    no = NotObserved(reason=reason)
    return SpecDecode(
        requested=requested,
        source=None,
        counters=[],
        acceptance_length=no,
        acceptance_length_counters=no,
        acceptance_rate=no,
    )


def spec_decode(
    requested: str,
    before_text: str | None,
    after_text: str | None,
    output_tokens: float | None,
    output_tokens_reason: str = "",
) -> SpecDecode:
    """Spec-decode figures of the whole window; each NOT_OBSERVED with the reason when a counter is missing.

    output_tokens: sum of usage.completion_tokens of the whole window's successful requests (None: unknown).
    """
    if requested == "none":
        return not_observed_spec(requested, "case.measurement.spec_decode is 'none'")
    if before_text is None or after_text is None:
        missing = [
            n
            for n, t in (("load/metrics_before.txt", before_text), ("load/metrics_after.txt", after_text))
            if t is None
        ]
        return not_observed_spec(requested, f"no /metrics snapshot: {', '.join(missing)} absent")
    before, after = parse_prometheus(before_text), parse_prometheus(after_text)
    source = _resolve(requested, before, after)
    if source is None:
        known = ", ".join(sorted(n for f in FAMILIES.values() for n in f.drafts))
        return not_observed_spec(requested, f"no speculative-decoding counters in /metrics (looked for {known})")
    fam = FAMILIES[source]
    counters: list[CounterDelta] = []
    deltas: dict[str, tuple[str, float] | str] = {}
    for role, names in (
        ("drafts", fam.drafts),
        ("draft_tokens", fam.draft_tokens),
        ("accepted", fam.accepted),
    ):
        if not names:
            deltas[role] = fam.missing_why or f"{source} exposes no {role} counter"
            continue
        name = _pick(names, before, after)
        if name is None:
            where = "both snapshots" if all(n not in before and n not in after for n in names) else "one snapshot"
            deltas[role] = f"counter {' / '.join(names)} missing from {where}"
            continue
        d = after[name] - before[name]
        counters.append(CounterDelta(name=name, before=before[name], after=after[name], delta=d))
        if d < 0:
            deltas[role] = (
                f"counter {name} went backwards ({_num(before[name])} -> {_num(after[name])}): "
                "server restarted during the load?"
            )
        else:
            deltas[role] = (name, d)

    def ratio(
        num: tuple[str, float] | str, den: tuple[str, float] | str, formula: str, plus_one: bool = False
    ) -> Ratio | NotObserved:
        if isinstance(num, str):
            return NotObserved(reason=num)
        if isinstance(den, str):
            return NotObserved(reason=den)
        if den[1] == 0:
            return NotObserved(reason=f"Δ {den[0]} is 0 during the load: no speculative steps counted")
        value = num[1] / den[1]
        text = f"{_num(num[1])} / {_num(den[1])} = {value:.4f}"
        if plus_one:
            value += 1.0
            text = f"1 + {_num(num[1])} / {_num(den[1])} = {value:.4f}"
        return Ratio(formula=formula, numerator=num[1], denominator=den[1], value=value, text=text)

    out_tok: tuple[str, float] | str
    if output_tokens is None:
        out_tok = output_tokens_reason or "output tokens unknown (no usage.completion_tokens)"
    else:
        out_tok = ("output tokens", output_tokens)
    return SpecDecode(
        requested=requested,
        source=source,
        counters=counters,
        acceptance_length=ratio(out_tok, deltas["drafts"], "output tokens / verify steps (Δ drafts)"),
        acceptance_length_counters=ratio(
            deltas["accepted"], deltas["drafts"], "1 + Δ accepted tokens / Δ drafts", plus_one=True
        ),
        acceptance_rate=ratio(deltas["accepted"], deltas["draft_tokens"], "Δ accepted tokens / Δ draft tokens"),
    )
