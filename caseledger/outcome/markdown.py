"""The markdown pieces of report.md: cells and tables, and one window's section (its extent, latency, tokens,
throughput, prefix cache, speculative decoding, failures and notes). NOT_OBSERVED prints with its reason."""

from __future__ import annotations

from collections.abc import Sequence

from caseledger.metrics import (
    Distribution,
    NotObserved,
    PositionAcceptance,
    Throughput,
    TokenAgreement,
)
from caseledger.outcome.figures import Missing, WindowFigures, label


def _f(x: float, digits: int = 4) -> str:
    if float(x).is_integer() and abs(x) < 1e15:
        return str(int(x))
    return f"{x:.{digits}f}"


def _agreement_line(a: TokenAgreement) -> str:
    """One line: did the server count the prompt tokens the dataset planned, request by request?"""
    if a.equal == a.compared:
        return f"Server prompt tokens = planned chat tokens on {a.equal} of {a.compared} requests."
    return (
        f"WARNING: server prompt tokens ≠ planned chat tokens on {a.compared - a.equal} of {a.compared} requests "
        f"(mean server − planned {_f(a.mean_diff, 1)}, max |diff| {a.max_abs_diff}): the dataset's tokenizer is "
        "not the server's, so the input length measured is not the case's; set dataset.tokenizer to the model's "
        "tokenizer (its directory or GGUF file)."
    )


def _no(x: NotObserved) -> str:
    return f"NOT_OBSERVED ({x.reason})"


def _cell(x: object, digits: int = 4) -> str:
    if isinstance(x, NotObserved):
        return _no(x)
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float | int):
        return _f(float(x), digits)
    if x is None:
        return "—"
    return str(x).replace("|", "\\|").replace("\n", " ")


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """A markdown table; each cell printed as `_cell` prints it."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out


def _window_head(w: WindowFigures) -> str:
    if not w.found:
        return f"**{w.name}** ({w.rule}): no window — {w.reason}"
    params = ", ".join(f"{k}={v}" for k, v in w.params.items())
    return (
        f"**{w.name}** ({w.rule}{'; ' + params if params else ''}): {w.requests} requests "
        f"({w.ok} ok, {w.failed} failed), {_f(w.duration_s or 0.0)} s from {_f(w.start_s or 0.0)} s to "
        f"{_f(w.end_s or 0.0)} s, divisor {w.cards} card(s)"
    )


def not_observed_lines(missing: list[Missing]) -> list[str]:
    """A section's NOT_OBSERVED figures: one line per reason, the reason said once."""
    if not missing:
        return []
    return ["", *[f"NOT_OBSERVED ({m.reason}): {'; '.join(label(f) for f in m.figures)}." for m in missing]]


def _dist_table(observed: dict[str, Distribution]) -> list[str]:
    body = [
        [label(name), d.unit, d.mean, d.min, d.p50, d.p75, d.p90, d.p99, d.max, d.count] for name, d in observed.items()
    ]
    header = ["metric", "unit", "mean", "min", "p50", "p75", "p90", "p99", "max", "count"]
    return ["", *table(header, body)] if body else []


def _rate_rows(rates: dict[str, Throughput], names: dict[str, str] | None = None) -> list[list[object]]:
    return [
        [(names or {}).get(k, label(k)), f"{_f(t.value)} {t.unit}", f"{_f(t.per_card)} {t.unit}/card", t.text]
        for k, t in rates.items()
    ]


def _rate_table(rows: list[list[object]]) -> list[str]:
    return ["", *table(["metric", "value", "per card", "computation"], rows)] if rows else []


def window_section(w: WindowFigures) -> list[str]:
    """A window's section of report.md: its extent, latency, tokens, throughput, prefix cache, speculative
    decoding, failures and notes (the figures of outcome.figures, NOT_OBSERVED said once per reason)."""
    out = [f"### Window `{w.name}`", "", _window_head(w), ""]
    out += table(
        [
            "requests",
            "ok",
            "failed",
            "duration s",
            "cards",
            "min requests",
            "meets",
            "min duration s",
            "meets",
            "peak concurrency",
            "mean concurrency",
            "start (UTC)",
        ],
        [
            [
                w.requests,
                w.ok,
                w.failed,
                w.duration_s,
                w.cards,
                w.min_requests,
                w.meets_min_requests,
                w.min_duration_s,
                w.meets_min_duration,
                w.peak_concurrency,
                w.mean_concurrency,
                w.start_utc,
            ]
        ],
    )
    if w.not_observed:
        out += not_observed_lines(w.not_observed)
    out += ["", f"Latency ({w.name} window, successful requests only):"]
    out += _dist_table(w.latency.observed) + not_observed_lines(w.latency.not_observed)
    out += ["", f"Tokens per request ({w.name} window):"]
    out += _dist_table(w.tokens.observed) + not_observed_lines(w.tokens.not_observed)
    if w.prompt_vs_planned is not None:
        out += ["", _agreement_line(w.prompt_vs_planned)]
    out += [
        "",
        f"Throughput ({w.name} window, over {_f(w.duration_s or 0.0)} s, per card = / {w.cards}):",
    ]
    out += _rate_table(_rate_rows(w.throughput.observed)) + not_observed_lines(w.throughput.not_observed)
    out += _cache_section(w)
    out += _spec_section(w)
    if w.failed_by_class:
        out += [
            "",
            "Failed requests in this window by class: " + ", ".join(f"{k}={v}" for k, v in w.failed_by_class.items()),
        ]
    if w.notes:
        out += ["", "Notes:", *[f"- {n}" for n in w.notes]]
    return [*out, ""]


def _cache_section(w: WindowFigures) -> list[str]:
    cache = w.cache
    hits, tokens = cache.observed.get("hit_ratio"), cache.observed.get("cached_tokens")
    below = "—" if cache.below_min is None or hits is None else f"{cache.below_min} of {hits.count}"
    out = ["", f"Prefix cache ({w.name} window; denominator: {cache.denominator}):", ""]
    out += table(
        ["figure", "value"],
        [
            ["requests with cached_tokens", cache.requests_with_cached_tokens],
            ["cached tokens min / mean / max", _mmm(tokens)],
            ["hit ratio min / mean / max", _mmm(hits)],
            ["hit ratio p50 / p90 / p99", _pct(hits)],
            ["case.cache.min_hit_ratio", cache.min_hit_ratio],
            ["share of requests meeting it", cache.share_meeting_min],
            ["requests below it", below],
        ],
    )
    nominal = {k: v for k, v in w.throughput.observed.items() if k == "input_throughput"}
    rows = _rate_rows(nominal, {"input_throughput": "nominal input throughput"}) + _rate_rows(cache.rates)
    return out + _rate_table(rows) + not_observed_lines(cache.not_observed)


def _spec_section(w: WindowFigures) -> list[str]:
    spec = w.spec_decode
    out = ["", f"Speculative decoding ({w.name} window; requested {spec.requested}, source {spec.source or '—'}):"]
    rows: list[list[object]] = [[label(k), _f(r.value), r.formula, r.text] for k, r in spec.ratios.items()]
    out += ["", *table(["figure", "value", "formula", "numbers"], rows)] if rows else []
    out += not_observed_lines(spec.not_observed)
    span = "—" if spec.span_s is None else f"{_f(spec.span_s[0])} s to {_f(spec.span_s[1])} s after the first send"
    out += [
        "",
        f"Per-request counts cover {spec.requests} successful request(s) of this window ({spec.requests_with_counts} "
        f"with draft counts, {spec.requests_with_steps} with verify steps), sending and ending within {span}.",
    ]
    if spec.agreement:
        verdict = "agree" if spec.agree else "DISAGREE: both are shown above"
        out += ["", f"Counters vs per-request counts ({verdict}):", *[f"- {line}" for line in spec.agreement]]
    positions = _positions(spec.by_position, spec.by_position_counters)
    if positions:
        out += ["", *table(["draft position", "per-request: accepted / verify steps", "counters"], positions)]
    if spec.counters:
        out += [
            "",
            *table(
                ["counter", "before", "after", "delta"],
                [[c.name, c.before, c.after, c.delta] for c in spec.counters],
            ),
        ]
    return out


def _positions(per: list[PositionAcceptance], counters: list[PositionAcceptance]) -> list[list[object]]:
    """One row per draft position seen by either source; empty when neither has any ('—': not observed there)."""
    mine = {p.position: p for p in per}
    theirs = {p.position: p for p in counters}

    def cell(p: PositionAcceptance | None) -> object:
        return "—" if p is None else f"{_f(p.rate)} ({_f(p.accepted)} / {_f(p.verify_steps)})"

    return [[k, cell(mine.get(k)), cell(theirs.get(k))] for k in sorted(set(mine) | set(theirs))]


def _mmm(d: Distribution | None) -> str:
    return "—" if d is None else f"{_f(d.min)} / {_f(d.mean)} / {_f(d.max)}"


def _pct(d: Distribution | None) -> str:
    return "—" if d is None else f"{_f(d.p50)} / {_f(d.p90)} / {_f(d.p99)}"
