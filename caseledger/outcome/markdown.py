"""The markdown pieces of report.md: cells and tables, and one window's section (its extent, latency, tokens,
throughput, prefix cache, speculative decoding, failures and notes). NOT_OBSERVED prints with its reason."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from caseledger.metrics import (
    Distribution,
    NotObserved,
    PositionAcceptance,
    Ratio,
    Throughput,
    TokenAgreement,
    WindowResult,
)

_Dist = Callable[[WindowResult], Distribution | NotObserved]
_DIST_ROWS: tuple[tuple[_Dist, str], ...] = (
    (lambda w: w.latency.ttft, "TTFT"),
    (lambda w: w.latency.tpot, "TPOT"),
    (lambda w: w.latency.itl, "ITL (chunk gaps)"),
    (lambda w: w.latency.itl_token_aware, "ITL (token-aware)"),
    (lambda w: w.latency.e2e, "E2E"),
)
_TOKEN_ROWS: tuple[tuple[_Dist, str], ...] = (
    (lambda w: w.tokens.input_body, "input tokens (body)"),
    (lambda w: w.tokens.input_chat, "input tokens (chat template)"),
    (lambda w: w.tokens.prompt, "prompt tokens (server)"),
    (lambda w: w.tokens.output, "output tokens (server)"),
)
_RATE_ROWS: tuple[tuple[Callable[[WindowResult], Throughput | NotObserved], str], ...] = (
    (lambda w: w.throughput.request, "request throughput"),
    (lambda w: w.throughput.output, "output token throughput"),
    (lambda w: w.throughput.input, "input token throughput"),
    (lambda w: w.throughput.total, "total token throughput"),
)


def _f(x: float, digits: int = 4) -> str:
    if float(x).is_integer() and abs(x) < 1e15:
        return str(int(x))
    return f"{x:.{digits}f}"


def _agreement_line(a: TokenAgreement | NotObserved) -> str:
    """One line: did the server count the prompt tokens the dataset planned, request by request?"""
    if isinstance(a, NotObserved):
        return f"Server prompt tokens vs planned chat tokens: {_no(a)}"
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


def _window_head(w: WindowResult) -> str:
    if not w.found:
        return f"**{w.name}** ({w.rule}): no window — {w.reason}"
    params = ", ".join(f"{k}={v}" for k, v in w.params.items())
    return (
        f"**{w.name}** ({w.rule}{'; ' + params if params else ''}): {w.requests} requests "
        f"({w.ok} ok, {w.failed} failed), {_f(w.duration_s or 0.0)} s from {_f(w.start_s or 0.0)} s to "
        f"{_f(w.end_s or 0.0)} s, divisor {w.cards} card(s)"
    )


def _dist_table(w: WindowResult, rows: tuple[tuple[_Dist, str], ...]) -> list[str]:
    body: list[list[object]] = []
    for pick, label in rows:
        d = pick(w)
        if isinstance(d, Distribution):
            body.append([label, d.unit, d.mean, d.min, d.p50, d.p75, d.p90, d.p99, d.max, d.count])
        else:
            body.append([label, _no(d), "", "", "", "", "", "", "", ""])
    return table(["metric", "unit", "mean", "min", "p50", "p75", "p90", "p99", "max", "count"], body)


def _rate_row(label: str, t: Throughput | NotObserved) -> list[object]:
    if isinstance(t, NotObserved):
        return [label, _no(t), "", ""]
    return [label, f"{_f(t.value)} {t.unit}", f"{_f(t.per_card)} {t.unit}/card", t.text]


def _ratio_row(label: str, r: Ratio | NotObserved) -> list[object]:
    if isinstance(r, NotObserved):
        return [label, _no(r), "", ""]
    return [label, _f(r.value), r.formula, r.text]


def window_section(w: WindowResult) -> list[str]:
    """A window's section of report.md: its extent, latency, tokens, throughput, prefix cache, speculative
    decoding, failures and notes."""
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
    out += ["", f"Latency ({w.name} window, successful requests only):", ""]
    out += _dist_table(w, _DIST_ROWS)
    out += ["", f"Tokens per request ({w.name} window):", ""]
    out += _dist_table(w, _TOKEN_ROWS)
    out += ["", _agreement_line(w.tokens.prompt_vs_planned)]
    out += [
        "",
        f"Throughput ({w.name} window, over {_f(w.duration_s or 0.0)} s, per card = / {w.cards}):",
        "",
    ]
    out += table(
        ["metric", "value", "per card", "computation"],
        [_rate_row(label, pick(w)) for pick, label in _RATE_ROWS],
    )
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


def _cache_section(w: WindowResult) -> list[str]:
    out: list[str] = []
    cache = w.cache
    out += ["", f"Prefix cache ({w.name} window; denominator: {cache.denominator}):", ""]
    out += table(
        ["figure", "value"],
        [
            ["requests with cached_tokens", cache.requests_with_cached_tokens],
            ["cached tokens min / mean / max", _mmm(cache.cached_tokens)],
            ["hit ratio min / mean / max", _mmm(cache.hit_ratio)],
            ["hit ratio p50 / p90 / p99", _pct(cache.hit_ratio)],
            ["case.cache.min_hit_ratio", cache.min_hit_ratio],
            ["share of requests meeting it", cache.share_meeting_min],
        ],
    )
    out += [
        "",
        *table(
            ["metric", "value", "per card", "computation"],
            [
                _rate_row("nominal input throughput", cache.nominal_input_throughput),
                _rate_row("uncached (recomputed) input throughput", cache.uncached_input_throughput),
            ],
        ),
    ]
    return out


def _spec_section(w: WindowResult) -> list[str]:
    out: list[str] = []
    spec = w.spec_decode
    per = spec.per_request
    out += [
        "",
        f"Speculative decoding ({w.name} window; requested {spec.requested}, source {spec.source or '—'}):",
        "",
    ]
    out += table(
        ["figure", "value", "formula", "numbers"],
        [
            _ratio_row("AL, per-request counts", per.acceptance_length),
            _ratio_row("strict acceptance rate, per-request counts", per.acceptance_rate),
            _ratio_row("1 + accepted / verify steps, per-request", per.acceptance_length_accepted),
            _ratio_row("AL, counters (whole window only)", spec.acceptance_length),
            _ratio_row("1 + Δaccepted / Δdrafts, counters", spec.acceptance_length_counters),
            _ratio_row("strict acceptance rate, counters", spec.acceptance_rate),
        ],
    )
    span = (
        "—"
        if per.start_s is None or per.end_s is None
        else f"{_f(per.start_s)} s to {_f(per.end_s)} s after the first send"
    )
    out += [
        "",
        f"Per-request counts cover {per.requests} successful request(s) of this window ({per.requests_with_counts} "
        f"with draft counts, {per.requests_with_steps} with verify steps), sending and ending within {span}.",
    ]
    if spec.agreement:
        verdict = "agree" if spec.agree else "DISAGREE: both are shown above"
        out += ["", f"Counters vs per-request counts ({verdict}):", *[f"- {line}" for line in spec.agreement]]
    positions = _positions(per.by_position, spec.by_position_counters)
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


def _positions(
    per: list[PositionAcceptance] | NotObserved, counters: list[PositionAcceptance] | NotObserved
) -> list[list[object]]:
    """One row per draft position seen by either source; empty when neither has any."""
    mine = {p.position: p for p in per} if isinstance(per, list) else {}
    theirs = {p.position: p for p in counters} if isinstance(counters, list) else {}

    def cell(p: PositionAcceptance | None, whole: list[PositionAcceptance] | NotObserved) -> object:
        if p is None:
            return whole if isinstance(whole, NotObserved) else "—"
        return f"{_f(p.rate)} ({_f(p.accepted)} / {_f(p.verify_steps)})"

    return [[k, cell(mine.get(k), per), cell(theirs.get(k), counters)] for k in sorted(set(mine) | set(theirs))]


def _mmm(d: Distribution | NotObserved) -> str:
    if isinstance(d, NotObserved):
        return _no(d)
    return f"{_f(d.min)} / {_f(d.mean)} / {_f(d.max)}"


def _pct(d: Distribution | NotObserved) -> str:
    if isinstance(d, NotObserved):
        return _no(d)
    return f"{_f(d.p50)} / {_f(d.p90)} / {_f(d.p99)}"
