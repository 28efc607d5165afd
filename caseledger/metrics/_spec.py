"""Speculative decoding: from per-request counts (any window) and from two /metrics snapshots (whole only).

Per request, the engine's draft counts (llama.cpp's timings.draft_n / draft_n_accepted, and the verify
steps the load client counted from them chunk by chunk) are summed over a window's successful requests.
The counters are read before and after the formal load, so their deltas belong to the whole window.

The text exposition format is parsed here (it is simple: `name{labels} value [timestamp]`, `#` lines are
comments); samples of one name are summed over their label sets (engines, ranks, models), except the
per-position counter, which is kept per `position` label.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from caseledger.engines import PROFILES, EngineProfile, counting_drafts
from caseledger.metrics._columns import B, RawColumns
from caseledger.metrics._models import (
    CounterDelta,
    NotObserved,
    PositionAcceptance,
    Ratio,
    SpecDecode,
    SpecPerRequest,
)


@dataclass(frozen=True)
class Family:
    """Counter names of one engine. Each role lists accepted names, newest first."""

    drafts: tuple[str, ...]  # verify steps: one per speculative step that verified a draft
    draft_tokens: tuple[str, ...]
    accepted: tuple[str, ...]
    missing_why: str = ""  # why a role has no names for this engine
    per_pos: tuple[str, ...] = ()  # accepted tokens per draft position, labelled position="k"


def _family(p: EngineProfile) -> Family:
    return Family(
        drafts=p.names("spec_drafts"),
        draft_tokens=p.names("spec_draft_tokens"),
        accepted=p.names("spec_accepted"),
        missing_why=p.spec_missing,
        per_pos=p.names("spec_per_pos"),
    )


# The engines whose /metrics counts speculative verify steps (caseledger/engines: one profile each).
FAMILIES: dict[str, Family] = {n: _family(PROFILES[n]) for n in counting_drafts()}

WHOLE_ONLY = "counters cover the whole window only; per_request holds this window's figures"
WHOLE_ONLY_NO_COUNTS = "counters cover the whole run; the engine gave no per-request counts"
_POSITION = re.compile(r'position="(\d+)"')


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


def per_position(text: str, name: str) -> dict[int, float]:
    """Samples of one per-position counter, summed per `position` label value."""
    out: dict[int, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line.startswith(name + "{"):
            continue
        close = _closing_brace(line, len(name))
        m = _POSITION.search(line, 0, close)
        rest = line[close + 1 :].split()
        if close == -1 or m is None or not rest:
            continue
        try:
            value = float(rest[0])
        except ValueError:
            continue
        out[int(m.group(1))] = out.get(int(m.group(1)), 0.0) + value
    return out


def _ratio(
    num: tuple[str, float] | str, den: tuple[str, float] | str, formula: str, plus_one: bool = False
) -> Ratio | NotObserved:
    """num / den (or 1 + num / den) with its numbers written out; a str on either side is the reason it is unknown."""
    if isinstance(num, str):
        return NotObserved(reason=num)
    if isinstance(den, str):
        return NotObserved(reason=den)
    if den[1] == 0:
        during = " during the load" if den[0].startswith("Δ") else " in the window"
        return NotObserved(reason=f"{den[0]} is 0{during}: no speculative step counted")
    value = num[1] / den[1]
    text = f"{_num(num[1])} / {_num(den[1])} = {value:.4f}"
    if plus_one:
        value += 1.0
        text = f"1 + {_num(num[1])} / {_num(den[1])} = {value:.4f}"
    return Ratio(formula=formula, numerator=num[1], denominator=den[1], value=value, text=text)


@dataclass(frozen=True)
class SpecCounters:
    """The whole window's counter figures, and the deltas they came from (for the agreement check)."""

    requested: str
    source: str | None
    counters: list[CounterDelta]
    acceptance_length: Ratio | NotObserved
    acceptance_length_counters: Ratio | NotObserved
    acceptance_rate: Ratio | NotObserved
    by_position: list[PositionAcceptance] | NotObserved
    deltas: dict[str, tuple[str, float]] = field(default_factory=dict)  # role -> (counter name, Δ)


def counters_not_observed(requested: str, reason: str) -> SpecCounters:
    no = NotObserved(reason=reason)
    return SpecCounters(requested, None, [], no, no, no, no)


def spec_counters(
    requested: str,
    before_text: str | None,
    after_text: str | None,
    output_tokens: float | None,
    output_tokens_reason: str = "",
) -> SpecCounters:
    """Counter figures of the whole window; each NOT_OBSERVED with the reason when a counter is missing.

    output_tokens: sum of usage.completion_tokens of the whole window's successful requests (None: unknown).
    """
    if requested == "none":
        return counters_not_observed(requested, "case.measurement.spec_decode is 'none'")
    if before_text is None or after_text is None:
        missing = [
            n
            for n, t in (("load/metrics_before.txt", before_text), ("load/metrics_after.txt", after_text))
            if t is None
        ]
        return counters_not_observed(requested, f"no /metrics snapshot: {', '.join(missing)} absent")
    before, after = parse_prometheus(before_text), parse_prometheus(after_text)
    source = _resolve(requested, before, after)
    if source is None:
        known = ", ".join(sorted(n for f in FAMILIES.values() for n in f.drafts))
        return counters_not_observed(requested, f"no speculative-decoding counters in /metrics (looked for {known})")
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
            deltas[role] = (f"Δ {name}", d)
    out_tok: tuple[str, float] | str
    if output_tokens is None:
        out_tok = output_tokens_reason or "output tokens unknown (no usage.completion_tokens)"
    else:
        out_tok = ("output tokens", output_tokens)
    return SpecCounters(
        requested=requested,
        source=source,
        counters=counters,
        acceptance_length=_ratio(out_tok, deltas["drafts"], "output tokens / verify steps (Δ drafts)"),
        acceptance_length_counters=_ratio(
            deltas["accepted"], deltas["drafts"], "1 + Δ accepted tokens / Δ drafts", plus_one=True
        ),
        acceptance_rate=_ratio(deltas["accepted"], deltas["draft_tokens"], "Δ accepted tokens / Δ draft tokens"),
        by_position=_positions_from_counters(fam, before_text, after_text, deltas["drafts"]),
        deltas={k: v for k, v in deltas.items() if not isinstance(v, str)},
    )


def _positions_from_counters(
    fam: Family, before_text: str, after_text: str, drafts: tuple[str, float] | str
) -> list[PositionAcceptance] | NotObserved:
    if not fam.per_pos:
        return NotObserved(reason="this engine exposes no per-position acceptance counter")
    name = fam.per_pos[0]
    before, after = per_position(before_text, name), per_position(after_text, name)
    if not after:
        return NotObserved(reason=f"counter {name} missing from /metrics")
    if isinstance(drafts, str):
        return NotObserved(reason=drafts)
    if drafts[1] == 0:
        return NotObserved(reason=f"{drafts[0]} is 0 during the load: no speculative step counted")
    return [
        PositionAcceptance(position=k, accepted=d, verify_steps=drafts[1], rate=d / drafts[1])
        for k in sorted(after)
        for d in [after[k] - before.get(k, 0.0)]
    ]


NO_COUNTS = (
    "the engine gave no per-request draft counts (no timings.draft_n in any record): no draft model, "
    "speculative decoding off, or an engine that does not report them per request"
)
NO_STEPS = (
    "verify steps were not counted per request: the server sent no cumulative draft counts on the content "
    "chunks (llama.cpp sends them for the request field timings_per_token, which caseledger sets with "
    "measurement.spec_decode 'llamacpp' and for the reference target)"
)


def per_request(c: RawColumns, okm: B, t0: int, nothing: str) -> SpecPerRequest:
    """Figures of the requests in `okm` (a window's successful requests) from their per-request counts."""
    idx = np.flatnonzero(okm)
    n = int(idx.size)
    drafted, accepted = c.spec_draft_tokens[idx], c.spec_accepted_tokens[idx]
    has = ~np.isnan(drafted) & ~np.isnan(accepted)
    k = int(has.sum())
    adds_up, no_draft = _steps_add_up(c)
    steps_ok = (adds_up | no_draft)[idx] & has
    n_steps = np.where(adds_up, c.n_steps, 0)[idx]
    out = c.completion_tokens[idx]

    counts_why: str | None = None
    if n == 0:
        counts_why = nothing
    elif k == 0:
        counts_why = NO_COUNTS
    elif k < n:
        counts_why = f"{n - k} of {n} successful requests in the window lack per-request draft counts"
    steps_why = counts_why
    if steps_why is None and not steps_ok.all():
        bad = int((c.steps_known[idx] & ~steps_ok).sum())
        steps_why = (
            f"{bad} request(s)' per-chunk draft counts do not add up to their final timings: verify steps unknown"
            if bad
            else NO_STEPS
        )
    out_why = (
        None
        if n == 0 or not np.isnan(out).any()
        else (f"{int(np.isnan(out).sum())} of {n} requests lack usage.completion_tokens")
    )

    tag = f"per-request counts, {n} request{'s' if n != 1 else ''}"
    d_sum = float(drafted.sum()) if counts_why is None else None
    a_sum = float(accepted.sum()) if counts_why is None else None
    v_sum = float(n_steps.sum()) if steps_why is None else None
    o_sum = float(out.sum()) if n and out_why is None else None

    def val(x: float | None, label: str, why: str | None) -> tuple[str, float] | str:
        return (label, x) if x is not None else (why or nothing)

    steps_v = val(v_sum, "verify steps", steps_why)
    acc_v = val(a_sum, "accepted tokens", counts_why)
    return SpecPerRequest(
        requests=n,
        requests_with_counts=k,
        requests_with_steps=int(steps_ok.sum()),
        start_s=float((c.send_ns[idx].min() - t0) / 1e9) if n else None,
        end_s=float((c.end_ns[idx].max() - t0) / 1e9) if n else None,
        output_tokens=o_sum,
        verify_steps=v_sum,
        draft_tokens=d_sum,
        accepted_tokens=a_sum,
        acceptance_length=_ratio(
            val(o_sum, "output tokens", out_why or nothing), steps_v, f"output tokens / verify steps ({tag})"
        ),
        acceptance_length_accepted=_ratio(acc_v, steps_v, f"1 + accepted tokens / verify steps ({tag})", True),
        acceptance_rate=_ratio(
            acc_v, val(d_sum, "draft tokens", counts_why), f"accepted tokens / draft tokens ({tag})"
        ),
        by_position=_by_position(c, okm & adds_up, v_sum, steps_why),
    )


def _steps_add_up(c: RawColumns) -> tuple[B, B]:
    """Per request: do its recorded steps add up to its final draft/accepted totals (a request whose steps do not
    has none), and did it draft nothing (0 steps, consistently)."""
    req_of_step = np.repeat(np.arange(c.n, dtype=np.int64), c.n_steps)
    sum_d = np.bincount(req_of_step, weights=c.step_drafted.astype(np.float64), minlength=c.n)
    sum_a = np.bincount(req_of_step, weights=c.step_accepted.astype(np.float64), minlength=c.n)
    no_draft = (c.spec_draft_tokens == 0) & (c.spec_accepted_tokens == 0)
    adds_up = c.steps_known & (sum_d == c.spec_draft_tokens) & (sum_a == c.spec_accepted_tokens)
    return adds_up, no_draft


def _by_position(
    c: RawColumns, counted: B, v_sum: float | None, steps_why: str | None
) -> list[PositionAcceptance] | NotObserved:
    """Acceptance by draft position over the verify steps of the `counted` requests."""
    if steps_why is not None:
        return NotObserved(reason=steps_why)
    if not v_sum:
        return NotObserved(reason="verify steps is 0 in the window: no speculative step counted")
    sel = np.repeat(counted, c.n_steps)
    acc_steps = c.step_accepted[sel]
    width = int(c.step_drafted[sel].max()) if acc_steps.size else 0
    return [
        PositionAcceptance(position=p, accepted=a, verify_steps=v_sum, rate=a / v_sum)
        for p in range(width)
        for a in [float((acc_steps > p).sum())]
    ]


def per_request_not_observed(reason: str) -> SpecPerRequest:
    no = NotObserved(reason=reason)
    return SpecPerRequest(
        requests=0,
        requests_with_counts=0,
        requests_with_steps=0,
        start_s=None,
        end_s=None,
        output_tokens=None,
        verify_steps=None,
        draft_tokens=None,
        accepted_tokens=None,
        acceptance_length=no,
        acceptance_length_accepted=no,
        acceptance_rate=no,
        by_position=no,
    )


def window_spec(counters: SpecCounters, per: SpecPerRequest, whole: bool) -> SpecDecode:
    """One window's spec figures: the counter figures in the whole window only, per-request ones in both."""
    if not whole:
        reason = WHOLE_ONLY if per.requests_with_counts else WHOLE_ONLY_NO_COUNTS
        no = NotObserved(reason=reason)
        return SpecDecode(
            requested=counters.requested,
            source=counters.source,
            counters=[],
            acceptance_length=no,
            acceptance_length_counters=no,
            acceptance_rate=no,
            by_position_counters=no,
            per_request=per,
            agreement=[],
            agree=None,
        )
    lines: list[str] = []
    equal: list[bool] = []
    for label, mine, role in (
        ("verify steps", per.verify_steps, "drafts"),
        ("draft tokens", per.draft_tokens, "draft_tokens"),
        ("accepted tokens", per.accepted_tokens, "accepted"),
    ):
        theirs = counters.deltas.get(role)
        if mine is None or theirs is None:
            continue
        same = mine == theirs[1]
        equal.append(same)
        verdict = "equal" if same else f"differ by {_num(theirs[1] - mine)}"
        lines.append(
            f"{label}: {_num(mine)} from per-request counts ({per.requests} requests) vs {theirs[0]} "
            f"{_num(theirs[1])}: {verdict}"
        )
    return SpecDecode(
        requested=counters.requested,
        source=counters.source,
        counters=counters.counters,
        acceptance_length=counters.acceptance_length,
        acceptance_length_counters=counters.acceptance_length_counters,
        acceptance_rate=counters.acceptance_rate,
        by_position_counters=counters.by_position,
        per_request=per,
        agreement=lines,
        agree=all(equal) if equal else None,
    )


def not_observed_spec(requested: str, reason: str) -> SpecDecode:
    """Every spec figure NOT_OBSERVED with one reason (a window that was not found)."""
    return window_spec(counters_not_observed(requested, reason), per_request_not_observed(reason), whole=True)
