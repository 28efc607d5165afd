"""A scenario's answer as a self-contained HTML page (the helpers and the rules of outcome.html)."""

from __future__ import annotations

from collections.abc import Sequence

from caseledger.outcome.flags import Flag
from caseledger.outcome.html import Chart, charts, e, evidence, fmt, page, table
from caseledger.views.scenario import ScenarioView


def render_scenario(view: ScenarioView, flags: dict[str, list[Flag]], figures: Sequence[Chart]) -> str:
    """A scenario: one row per case with the limit verdicts and the decision, the best case, evidence, charts."""
    best = next((r for r in view.rows if r.best), None)
    body = [
        f"<h1>Scenario {e(view.scenario)}</h1>",
        f"<p>{e(len(view.rows))} case(s); decision metric {e(view.primary_metric)} on the {e(view.window)} window "
        f"({e(view.direction.replace('_', ' '))}); limits {e(', '.join(view.limits) or 'none')}; swept "
        f"{e(view.swept or 'several fields')}</p>",
        '<div class="answer">'
        + (f"best within limits: {e(best.change)} ({e(best.case_id)})" if best else "best within limits: none yet")
        + "</div>",
    ]
    header = [
        "change",
        "case",
        "run",
        "runs",
        "state",
        "decision",
        "metric",
        "TTFT p50/p99 ms",
        "TPOT p50/p99 ms",
        "E2E p50/p99 ms",
        "limits",
        "settle",
    ]
    rows, classes = [], []
    for r in view.rows:
        lim = "; ".join(f"{v.limit} {fmt(v.value)} <= {v.bound:g}: {v.verdict}" for v in r.limits) or "—"
        rows.append(
            [
                r.change,
                r.case_id,
                r.run_id,
                r.runs,
                r.state,
                r.decision,
                r.metric,
                *(f"{fmt(r.ms(f'{f}_p50_ms'))}/{fmt(r.ms(f'{f}_p99_ms'))}" for f in ("ttft", "tpot", "e2e")),
                lim,
                r.settle,
            ]
        )
        classes.append("best" if r.best else "breaks" if any(v.verdict == "breaks" for v in r.limits) else "")
    body += ["<h2>Cases</h2>", table(header, rows, classes), f'<p class="muted">{e(view.decisions)}</p>']
    body += evidence(flags)
    body += ["<h2>Charts</h2>", charts(figures)]
    return page(f"caseledger scenario {view.scenario}", body)
