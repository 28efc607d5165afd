"""A campaign's answer as a self-contained HTML page (the helpers and the rules of outcome.html)."""

from __future__ import annotations

from collections.abc import Sequence

from caseledger.campaign.planner import pm
from caseledger.campaign.view import CampaignView
from caseledger.outcome.flags import Flag
from caseledger.outcome.html import Chart, charts, e, evidence, page, table


def render_campaign(view: CampaignView, flags: dict[str, list[Flag]], figures: Sequence[Chart]) -> str:
    """A campaign: its answer, progress, every point, the Pareto frontier, evidence and charts."""
    p = view.progress
    refused = f", {e(p.get('refused'))} refused by the host" if p.get("refused") else ""
    body = [
        f'<h1>Campaign {e(view.name)} <span class="muted">{e(view.campaign_id)}</span></h1>',
        f"<p>scenario {e(view.scenario)}; {e(view.search)}; {e(view.objective)}; limits "
        f"{e(', '.join(view.limits) or 'none')}</p>",
        f'<div class="answer">{"campaign complete: " if view.complete else "so far: "}{e(view.answer)}</div>',
        f"<p>points: {e(p.get('measured'))} measured, {e(p.get('running'))} running, "
        f"{e((p.get('queued') or 0) + (p.get('pending') or 0))} queued or pending, {e(p.get('skipped'))} skipped, "
        f"{e(p.get('given_up'))} given up{refused}; {e(p.get('runs'))} runs, {e(p.get('service_starts'))} service "
        f"start(s), {e(p.get('elapsed_s'))} s</p>",
    ]
    body += [f"<p>note: {e(n)}</p>" for n in view.notes]
    body += [f"<p>pool {e(x)}</p>" for x in view.pool]
    header = [
        "point",
        "case",
        "status",
        "runs",
        "objective (mean)",
        "noise",
        "run to run",
        "limits",
        "meets",
        "tok/s per user",
        "tok/s per card",
        "Pareto",
        "why",
    ]
    rows, classes = [], []
    for r in view.rows:
        mark = " (winner)" if r.case_id == view.winner else " (tie)" if r.case_id in view.tie else ""
        rows.append(
            [
                r.label + mark,
                r.case_id,
                r.status,
                r.runs,
                r.metric_mean,
                pm(r.noise_rel) if r.noise_rel is not None else None,
                r.run_to_run,
                "; ".join(f"{k} {v}" for k, v in r.limits.items()) or None,
                r.meets,
                r.per_user_tok_s,
                r.per_card_tok_s,
                r.pareto,
                r.why,
            ]
        )
        classes.append("best" if r.pareto else "breaks" if r.meets is False else "")
    body += ["<h2>Points</h2>", table(header, rows, classes)]
    body.append("<h2>Pareto frontier</h2>")
    body.append(
        f"<p>{e(', '.join(view.pareto) or 'no measured point within every limit yet')} "
        '<span class="muted">(output tok/s per card against tok/s per user, within limits)</span></p>'
    )
    body += evidence(flags)
    body += ["<h2>Charts</h2>", charts(figures)]
    return page(f"caseledger campaign {view.name}", body)
