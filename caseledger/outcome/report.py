"""Reports rendered from saved results: markdown and JSON, never recomputed, never mixing windows.

Every figure is printed inside its window's section with the window's request count, duration and
divisor; NOT_OBSERVED prints with its reason. One window's section and the tables are outcome.markdown's, the
plots live in outcome.plots and the evidence lines in outcome.flags; the markdown report is complete without the
plots.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from caseledger.case.metrics import LIMITS, METRICS
from caseledger.ledger.runs import RunMeta
from caseledger.metrics import NotObserved, Ratio, Result, WindowResult
from caseledger.outcome.decide import DecisionRecord
from caseledger.outcome.figures import headline_lines, window_figures
from caseledger.outcome.flags import evidence_flags
from caseledger.outcome.markdown import table, window_section


# JSON: report.json's time ledger
def _ledger_rows(time_ledger: dict[str, Any]) -> tuple[list[str], list[list[object]]]:
    # per-phase entries ({"phases": {name: {...}}}) become one row per phase
    if isinstance(time_ledger.get("phases"), dict):
        flat: dict[str, Any] = {f"phase {k}": v for k, v in time_ledger["phases"].items()}  # JSON: the time ledger
        flat.update({k: v for k, v in time_ledger.items() if k != "phases"})
        time_ledger = flat
    cols: list[str] = []
    for v in time_ledger.values():
        if isinstance(v, dict):
            cols += [k for k in v if k not in cols]
    if not cols:
        return ["step", "seconds"], [[k, v] for k, v in time_ledger.items()]
    rows: list[list[object]] = []
    for k, v in time_ledger.items():
        rows.append([k, *[v.get(c) for c in cols]] if isinstance(v, dict) else [k, v, *[None] * (len(cols) - 1)])
    return ["step", *cols], rows


# JSON: load/clock.json and the counters' record
def load_host_rows(clock: dict[str, Any] | None, counters_read_by: dict[str, Any] | None) -> dict[str, object]:
    """Header rows of a load client that ran on another host (load.host): where, and how precisely its time
    points map onto the controller's clock (offset and uncertainty from SSH round trips, before and after)."""
    if not clock:
        return {}
    rows: dict[str, object] = {"load host": clock.get("host")}

    def ms(ns: int) -> str:
        return f"{ns / 1e6:.3f} ms"

    for when, label in (("before", "clock offset"), ("after", "clock offset after load")):
        c = clock.get(when)
        if isinstance(c, dict):
            rows[label] = (
                f"{c['offset_ns'] / 1e6:+.3f} ms ± {ms(c['uncertainty_ns'])} (load host − controller; "
                f"{c['rounds']} SSH round trips, shortest {ms(c['rtt_min_ns'])})"
            )
    if isinstance(clock.get("drift_ns"), int):
        rows["clock drift during load"] = f"{clock['drift_ns'] / 1e6:+.3f} ms"
    by = counters_read_by or {}
    for when in ("before", "after"):
        rows[f"/metrics counters {when} the load read by"] = (
            by.get(f"metrics_{when}") or "nobody (load/metrics_*.missing says why)"
        )
    return rows


def lengths_rows(identity: Any) -> dict[str, str]:
    """Header rows for a dataset's realized lengths (input body tokens, output tokens): declared, realized, and a
    text histogram ('lo-hi:count' per bin)."""
    rows: dict[str, str] = {}
    for side, ln in (("input", identity.input_lengths), ("output", identity.output_lengths)):
        if ln is None:
            continue
        declared = ", ".join(f"{k} {v}" for k, v in ln.declared.items())
        edges, counts = ln.histogram.edges, ln.histogram.counts
        bins = " ".join(f"{int(edges[k])}-{int(edges[k + 1]) - 1}:{c}" for k, c in enumerate(counts))
        rows[f"{side} lengths"] = (
            f"declared {declared}; realized min {ln.min} / mean {ln.mean:.1f} / max {ln.max}, "
            f"stdev {ln.stdev:.1f}, p50 {ln.p50:g} p99 {ln.p99:g}; histogram {bins}"
        )
    return rows


def _workload_section(result: Result) -> list[str]:
    """The schedule kept (arrival error) and, for a replayed trace, planned shared vs cached tokens per request."""
    out: list[str] = []
    if result.schedule is not None:
        out += ["## Schedule", "", result.schedule.text, ""]
    tr = result.trace
    if tr is not None:
        out += ["## Trace replay", "", tr.text, ""]
        out += table(
            ["request", "trace row", "planned shared tokens", "cached tokens", "prompt tokens", "ok"],
            [
                [r.i, r.trace_row, r.planned_shared_tokens, r.cached_tokens, r.prompt_tokens, r.ok]
                for r in tr.per_request
            ],
        )
        out.append("")
    if result.sessions is not None:
        out += _sessions_section(result.sessions)
    return out


def _sessions_section(ss: Any) -> list[str]:
    """Conversations: one line, then one row per turn index (TTFT and cached beside the planned history)."""

    def num(x: float | None, fmt: str = ".1f") -> str:
        return "—" if x is None else format(x, fmt)

    out = ["## Conversations", "", ss.text, ""]
    out += table(
        [
            "turn",
            "ok / recorded",
            "TTFT p50 ms",
            "prompt tokens",
            "planned history",
            "cached tokens",
            "cached / planned",
        ],
        [
            [
                t.turn,
                f"{t.ok} / {t.requests}",
                num(t.ttft_ms_p50, ".2f"),
                num(t.prompt_tokens_mean),
                num(t.planned_shared_tokens_mean),
                num(t.cached_tokens_mean),
                num(t.cached_over_planned, ".0%"),
            ]
            for t in ss.by_turn
        ],
    )
    cut = [p for p in ss.per_session if not p.complete]
    if cut:
        out += [
            "",
            "Incomplete: "
            + ", ".join(f"conversation {p.session} ({p.turns_ok} of {p.turns_planned} turns ok)" for p in cut[:20]),
        ]
    out.append("")
    return out


def render_run_md(
    meta: dict[str, object],  # the header rows (summary.report_meta and more)
    result: Result,
    decision: DecisionRecord | None,
    time_ledger: dict[str, Any] | None,  # JSON: the time ledger
) -> str:
    """A complete markdown report of one run from its saved result."""
    title = meta.get("run_id") or "run"
    out = [f"# Run {title}", "", "## Headline", ""]
    if decision is not None:
        out += [f"- decision: {decision.outcome}" + (f": {decision.reason}" if decision.reason else "")]
    for w in (result.windows.whole, result.windows.native):
        lines = headline_lines(window_figures(w))
        out += [f"- {lines[0]}"] + [f"  {x}" for x in lines[1:]]
    out += ["", "## Run", ""]
    out += table(["field", "value"], [[k, v] for k, v in meta.items()])
    out += [
        "",
        f"Processor {result.processor_version}, parameters `{result.params_key}`, inputs "
        f"`{result.inputs_key}`; raw `{result.inputs.raw_path}` sha256 `{result.inputs.raw_sha256 or '—'}` "
        f"({result.inputs.records} records).",
        "",
    ]

    out += _decision_section(decision)
    out += _requests_section(result)
    out += _evidence_section(result)

    out += _workload_section(result)
    out += _windows_section(result)

    out += ["## Concurrency", ""]
    series = result.concurrency
    out += [
        f"Peak {series.peak}; {len(series.t_s)} change points"
        f"{' (bucketed: maximum per bucket)' if series.bucketed else ''}.",
        "",
    ]

    out += ["## Time ledger", ""]
    if time_ledger:
        header, rows = _ledger_rows(time_ledger)
        out += table(header, rows)
    else:
        out.append("No time ledger given.")
    out += ["", "## Definitions", ""]
    out += table(["metric", "definition"], sorted(result.definitions.items()))
    return "\n".join(out) + "\n"


def _decision_section(decision: DecisionRecord | None) -> list[str]:
    out: list[str] = []
    out += ["## Decision", ""]
    if decision is None:
        out += ["No decision recorded.", ""]
    else:
        out += table(
            ["fact", "value"],
            [
                ["load ended", decision.load_ended],
                ["results extracted", decision.results_extracted],
                ["enough to decide", decision.enough_to_decide],
                ["outcome", decision.outcome],
                ["metric", f"{decision.primary_metric} on {decision.window} ({decision.direction})"],
                ["candidate", decision.candidate.value if decision.candidate else None],
                ["baseline", decision.baseline.value if decision.baseline else None],
                ["baseline ref", decision.baseline_ref],
                ["relative improvement", decision.relative_improvement],
                ["min effect", decision.min_effect],
            ],
        )
        out += ["", decision.reason, ""]
        if decision.missing:
            out += ["Missing evidence:", *[f"- {m}" for m in decision.missing], ""]
    return out


def _requests_section(result: Result) -> list[str]:
    out: list[str] = []
    out += ["## Requests and failures", ""]
    out += [
        f"{result.requests} requests: {result.ok} ok, {result.failed} failed. {result.failures.note}.",
        "",
    ]
    if result.failures.by_class:
        out += table(
            ["error class", "requests", "first error"],
            [[k, v, result.failures.first_error.get(k, "")] for k, v in result.failures.by_class.items()],
        )
        out.append("")
    if result.notes:
        out += ["Notes:", *[f"- {n}" for n in result.notes], ""]
    return out


def _windows_section(result: Result) -> list[str]:
    out: list[str] = []
    out += ["## Windows", ""]
    out += table(
        [
            "window",
            "rule",
            "found",
            "start s",
            "end s",
            "duration s",
            "requests",
            "ok",
            "cards",
            "meets min requests",
            "meets min duration",
        ],
        [
            [
                w.name,
                w.rule,
                w.found,
                w.start_s,
                w.end_s,
                w.duration_s,
                w.requests,
                w.ok,
                w.cards,
                w.meets_min_requests,
                w.meets_min_duration,
            ]
            for w in (result.windows.whole, result.windows.native)
        ],
    )
    out += ["", "Figures below are grouped by window; no figure combines two windows.", ""]
    out += window_section(window_figures(result.windows.whole))
    out += window_section(window_figures(result.windows.native))
    return out


T = TypeVar("T")


def _of(fig: T | NotObserved, pick: Callable[[T], object]) -> object:
    return fig if isinstance(fig, NotObserved) else pick(fig)


def _in_window(pick: Callable[[WindowResult], object]) -> Callable[[WindowResult], object]:
    """A figure row: 'no window' when the rule found none, 'NOT_OBSERVED' for a figure without a value."""

    def read(w: WindowResult) -> object:
        if not w.found:
            return "no window"
        v = pick(w)
        return "NOT_OBSERVED" if isinstance(v, NotObserved) else v

    return read


def _metric(name: str) -> Callable[[WindowResult], object]:
    m = METRICS[name] if name in METRICS else LIMITS[name]
    return _in_window(lambda w: w.value(m))


def _ratio(r: Ratio | NotObserved) -> object:
    return _of(r, lambda x: x.value)


_SIDE_ROWS: tuple[tuple[str, Callable[[WindowResult], object]], ...] = (
    ("requests ok", lambda w: w.ok),
    ("duration s", lambda w: w.duration_s),
    ("meets minimums", lambda w: w.meets_min_requests and w.meets_min_duration),
    ("output tok/s", _metric("output_throughput")),
    ("output tok/s/card", _metric("output_throughput_per_card")),
    ("request req/s", _metric("request_throughput")),
    ("total tok/s", _in_window(lambda w: _of(w.throughput.total, lambda f: f.value))),
    ("TTFT p50 ms", _metric("ttft_p50")),
    ("TTFT p99 ms", _metric("ttft_p99")),
    ("TPOT p50 ms", _metric("tpot_p50")),
    ("TPOT p99 ms", _metric("tpot_p99")),
    ("ITL p50 ms", _metric("itl_p50_ms")),
    ("ITL token-aware p50 ms", _in_window(lambda w: _of(w.latency.itl_token_aware, lambda d: d.p50))),
    ("ITL per step p50 ms", _in_window(lambda w: _of(w.latency.itl_step, lambda d: d.p50))),
    ("E2E p50 ms", _metric("e2e_p50")),
    ("E2E p99 ms", _metric("e2e_p99")),
    ("cache hit ratio mean", _in_window(lambda w: _of(w.cache.hit_ratio, lambda d: d.mean))),
    ("uncached input tok/s", _in_window(lambda w: _of(w.cache.uncached_input_throughput, lambda f: f.value))),
    ("AL per-request", _in_window(lambda w: _ratio(w.spec_decode.per_request.acceptance_length))),
    ("acceptance per-request", _in_window(lambda w: _ratio(w.spec_decode.per_request.acceptance_rate))),
    ("AL counters", _in_window(lambda w: _ratio(w.spec_decode.acceptance_length))),
    ("acceptance counters", _in_window(lambda w: _ratio(w.spec_decode.acceptance_rate))),
)


def render_side_by_side(rows: list[tuple[str, str, Result]]) -> str:
    """Runs side by side: one table for the whole windows, one for the native windows; never mixed."""
    header = ["metric", *[f"{run_id} ({case_id})" for run_id, case_id, _ in rows]]
    out: list[str] = []
    for name in ("whole", "native"):
        wins = [r.windows.of(name) for _, _, r in rows]
        rules = sorted({f"{w.rule}" + (f" r={w.params.get('ratio')}" if w.rule == "sglang" else "") for w in wins})
        out += [f"## {name} vs {name}", ""]
        if len(rules) > 1:
            out += [
                f"Warning: the {name} windows use different rules ({', '.join(rules)}); compare with care.",
                "",
            ]
        body = [[label, *[read(w) for w in wins]] for label, read in _SIDE_ROWS]
        out += table(header, body)
        out.append("")
    return "\n".join(out)


def report_json(
    meta: RunMeta,
    result: Result,
    decision: DecisionRecord | None,
    time_ledger: dict[str, Any] | None,  # JSON: the time ledger
) -> dict[str, Any]:  # JSON: report.json
    """The report as JSON: meta, a per-window headline, the full result, the decision and the time ledger."""
    headline: dict[str, dict[str, Any]] = {}  # JSON: report.json's headline
    for name in ("whole", "native"):
        w = result.windows.of(name)
        headline[name] = {label: read(w) for label, read in _SIDE_ROWS}
    return {
        "meta": meta.model_dump(mode="json"),
        "headline": headline,
        "result": result.model_dump(mode="json"),
        "decision": decision.model_dump(mode="json") if decision else None,
        "time_ledger": time_ledger,
    }


def _evidence_section(result: Result) -> list[str]:
    out = ["## Evidence checks", ""]
    for f in evidence_flags(result):
        out.append(("- " if f.bullet else "") + f.text)
        out += [f"- {d}" for d in f.details]
    return [*out, ""]
