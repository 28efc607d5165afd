"""Self-contained HTML reports, one file a person opens in a browser: a run's here, a scenario's and a campaign's
beside their views (views.html, campaign.html), with the helpers and rules below.

No network at view time and no script: the style is inline, the charts are matplotlib figures inlined as SVG
(plots.svg: text drawn as paths, so no font is fetched). Every text that comes from the ledger is masked
(caseledger.redact, the same masking the markdown and text answers get) and then HTML-escaped; the finished
page is masked once more as the last line of defence. Rendering is pure: callers read the ledger and hand the
models and figures in.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from caseledger import redact
from caseledger.outcome.decide import DecisionRecord
from caseledger.outcome.flags import Flag
from caseledger.outcome.summary import Headline

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1400px;color:#1b1f24;
padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d0d7de}
table{border-collapse:collapse;margin:8px 0;font-size:13px}
th,td{border:1px solid #d0d7de;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa}td.id{white-space:nowrap}td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.best td{background:#e6f4ea}tr.breaks td{background:#fdecea}
.answer{font-size:16px;padding:8px 12px;background:#f6f8fa;border-left:4px solid #0969da;margin:12px 0}
ul.flags{list-style:none;padding:0}ul.flags li{padding:2px 0 2px 22px;position:relative}
ul.flags li:before{position:absolute;left:0;font-weight:bold}
ul.flags li.ok:before{content:"\\2713";color:#1a7f37}ul.flags li.warn:before{content:"!";color:#cf222e}
li.warn{color:#cf222e}figure{margin:12px 0}figure svg{max-width:100%;height:auto}
figcaption{font-size:12px;color:#57606a}.muted{color:#57606a;font-size:12px}
"""


def e(value: object) -> str:
    """A ledger text for HTML: masked (its secrets become ***), then escaped."""
    return html.escape(redact.mask("—" if value is None else fmt(value)))


def fmt(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e6 else f"{value:.0f}"
    return str(value)


_ID = re.compile(r"[rcgp]-[0-9a-f]{6,64}")  # a run, case or campaign id: kept on one line


@dataclass(frozen=True)
class Chart:
    """A figure rendered to an <svg> element (plots.svg) with its caption."""

    caption: str
    svg: str


def table(header: Sequence[str], rows: Iterable[Sequence[object]], classes: Sequence[str] | None = None) -> str:
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        cells = "".join(
            f'<td class="n">{e(c)}</td>'
            if isinstance(c, int | float) and not isinstance(c, bool)
            else f'<td class="id">{e(c)}</td>'
            if isinstance(c, str) and _ID.fullmatch(c)
            else f"<td>{e(c)}</td>"
            for c in row
        )
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def flag_list(flags: Sequence[Flag]) -> str:
    items = []
    for f in flags:
        details = "".join(f'<li class="{"warn" if f.warn else "ok"}">{e(d)}</li>' for d in f.details)
        sub = f'<ul class="flags">{details}</ul>' if details else ""
        items.append(f'<li class="{"warn" if f.warn else "ok"}">{e(f.text)}{sub}</li>')
    return f'<ul class="flags">{"".join(items)}</ul>'


def charts(figures: Sequence[Chart]) -> str:
    if not figures:
        return '<p class="muted">No chart: matplotlib is not importable, or nothing was measured yet.</p>'
    # the SVG comes from matplotlib (it escapes the labels it was given, which were masked by the caller)
    return "".join(f"<figure>{c.svg}<figcaption>{e(c.caption)}</figcaption></figure>" for c in figures)


def page(title: str, body: list[str]) -> str:
    doc = (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(title)}</title><style>{STYLE}</style></head><body>\n"
        + "\n".join(body)
        + '\n<p class="muted">Written by caseledger from the ledger; regenerate with '
        "<code>caseledger report --html</code>. Self-contained: no script, no network.</p>\n</body></html>\n"
    )
    return redact.mask(doc)


def evidence(by_subject: dict[str, list[Flag]]) -> list[str]:
    out = ["<h2>Evidence</h2>"]
    if not by_subject:
        out.append('<p class="muted">No result yet: nothing to check.</p>')
    for subject, flags in by_subject.items():
        warn = sum(f.warn for f in flags)
        out.append(f"<h3>{e(subject)}{' — ' + e(f'{warn} flag(s)') if warn else ''}</h3>{flag_list(flags)}")
    return out


_HEAD_COLS: tuple[tuple[str, str], ...] = (
    ("window", "window"),
    ("rule", "rule"),
    ("requests", "requests"),
    ("ok", "ok"),
    ("duration s", "duration_s"),
    ("meets minimums", "meets_minimums"),
    ("output tok/s", "output_tok_s"),
    ("tok/s/card", "output_tok_s_per_card"),
    ("TTFT p50 ms", "ttft_p50_ms"),
    ("TTFT p99 ms", "ttft_p99_ms"),
    ("TPOT p50 ms", "tpot_p50_ms"),
    ("TPOT p99 ms", "tpot_p99_ms"),
    ("E2E p99 ms", "e2e_p99_ms"),
    ("AL", "al"),
)


def render_run(
    run_id: str,
    meta: dict[str, object],
    headlines: Sequence[Headline],
    decision: DecisionRecord | None,
    failures: dict[str, int],
    flags: list[Flag],
    figures: Sequence[Chart],
    report_md: str,
) -> str:
    """A run: its header, decision and reason, figures of both windows, failures, evidence and latency CDFs."""
    body = [f"<h1>Run {e(run_id)}</h1>", table(["field", "value"], [[k, v] for k, v in meta.items()])]
    body.append("<h2>Decision</h2>")
    if decision is None:
        body.append("<p>No decision recorded.</p>")
    else:
        body.append(f'<div class="answer">{e(decision.outcome)}: {e(decision.reason)}</div>')
        body.append(
            table(
                ["fact", "value"],
                [
                    ["metric", f"{decision.primary_metric} on {decision.window} ({decision.direction})"],
                    ["candidate", decision.candidate.value if decision.candidate else None],
                    ["baseline", decision.baseline_ref],
                    ["relative improvement", decision.relative_improvement],
                    ["enough to decide", decision.enough_to_decide],
                    *[["missing", m] for m in decision.missing],
                    *[[f"limit {v.limit}", f"{fmt(v.value)} <= {v.bound:g}: {v.verdict}"] for v in decision.limits],
                ],
            )
        )
    body.append("<h2>Figures</h2>")
    rows = [h.model_dump() for h in headlines]
    body.append(table([c for c, _ in _HEAD_COLS], [[d[f] for _, f in _HEAD_COLS] for d in rows]))
    if failures:
        body.append(table(["failed requests by class", "requests"], sorted(failures.items())))
    body += evidence({run_id: flags} if flags else {})
    body += ["<h2>Charts</h2>", charts(figures)]
    body.append(f'<p class="muted">Every figure by window, with its definition: {e(report_md)}</p>')
    return page(f"caseledger run {run_id}", body)
