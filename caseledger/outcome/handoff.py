"""HANDOFF.md: a few lines for the next agent session, derived from the ledger (never authoritative).

Regenerated at every state change by whoever changed the state. Details are referenced by id, never
pasted; deleting the file loses nothing (`caseledger status` regenerates it).
"""

from __future__ import annotations

from caseledger import ledger, procs
from caseledger.case.model import Case
from caseledger.case.plan import delta
from caseledger.case.store import load_case
from caseledger.errors import CaseledgerError, quoted
from caseledger.ledger import authorization, queue
from caseledger.ledger.runs import damaged_line, scan_runs
from caseledger.ledger.state import RunState, RunView, fold
from caseledger.workspace import Workspace, atomic_write, read_json_or_none, utc_now

MAX_BYTES = 1024
MAX_LINES = 25


def render(ws: Workspace, exiting: str | None = None) -> str:
    """exiting: a run whose controller is writing this as its last act (counted as gone)."""
    scan = scan_runs(ws)
    damaged = list(scan.damaged)
    views: list[RunView] = []
    for meta in scan.metas[-40:]:
        try:
            v = fold(ws, meta.run_id)
        except CaseledgerError as e:  # a damaged case.json or events file: named below, the others shown
            damaged.append(e.message)
            continue
        if meta.run_id == exiting:
            v.controller_alive = False
        views.append(v)
    lines = [f"# HANDOFF — generated {utc_now()[:19]}Z from ledger/ (derived; safe to delete)",
             f"authorization: {authorization.current_mode(ws)}"]
    if damaged:
        lines.append(quoted(damaged_line(damaged), 300))
    if not views:
        lines += ["no runs yet", "next: freeze_case(path='cases/<draft>.json'), then start_run(case_id=...)"]
        return "\n".join(lines) + "\n"
    latest = views[-1]
    same = [v for v in views if v.scenario == latest.scenario]
    for rows in range(MAX_ROWS, -1, -1):  # as many scenario rows as fit the handoff's size
        text = _compose(ws, lines, same, latest, views, rows)
        if len(text.encode()) <= MAX_BYTES and text.count("\n") <= MAX_LINES:
            return text
    return text


def _compose(ws: Workspace, head: list[str], same: list[RunView], latest: RunView, views: list[RunView],
             rows: int) -> str:
    lines = head + _scenario_rows(ws, same, rows)
    for f in sorted(ws.services_dir.glob("*.json")) if ws.services_dir.exists() else []:
        st = read_json_or_none(f) or {}
        proc = st.get("proc") or {}
        if st.get("ssh") and proc:  # no SSH round trip from a handoff: say where it runs, status checks it
            where = f"remote pid {proc.get('pid')} on {st['ssh'].get('host')} (liveness: phase_status/service)"
        else:
            where = f"alive pid {proc.get('pid')}" if procs.alive(proc) else "stopped"
        lines.append(f"service {f.stem}: {st.get('adapter')} {st.get('identity')} {where} "
                     f"(from case {st.get('case_id')})")

    for key, ids in queue.all_queues(ws).items():
        lines.append(f"queue {key}: {', '.join(ids[:4])}" + (f" (+{len(ids) - 4})" if len(ids) > 4 else ""))
    lease = ledger.read_lease(ws, latest.meta.target_key) if latest.meta.target_key else None
    held = f"held by {lease.run_id}" if lease and lease.live() else "free"
    lines.append(f"owner: target {latest.meta.target_key} {held}; controller of {latest.run_id} "
                 f"{'alive' if latest.controller_alive else 'gone'}")
    done = [p for p, ph in latest.phases.items() if ph.state.value in ("done", "reused", "skipped")]
    last_done = done[-1] if done else "none"
    lines.append(f"latest run: {latest.run_id} case {latest.case_id}: {latest.state.value}"
                 + (f" [{latest.failure_class}]" if latest.failure_class else "")
                 + f"; last completed phase {last_done}")
    problems = _problems(views, latest)
    if problems:
        lines.append("open problems:")
        lines += [f"- {p}" for p in problems[:4]]
    lines.append(f"next: {_next(latest)}")
    text = "\n".join(lines) + "\n"
    while (len(text.encode()) > MAX_BYTES or len(lines) > MAX_LINES) and len(lines) > 4 and rows == 0:
        lines.pop(-2)  # last resort, with no scenario rows left: drop detail above the next call
        text = "\n".join(lines) + "\n"
    return text


MAX_ROWS = 8  # scenario rows shown; the rest are counted (summarize(scenario=...) has them all)
SHORT = {"load.concurrency": "C", "load.requests": "N", "load.rate": "rate", "dataset.input_tokens": "in",
         "dataset.output_tokens": "out", "load.max_tokens": "max_tokens", "dataset.prefix_ratio": "prefix"}


def _label(base: Case | None, case: Case) -> str:
    """What a case changes against the scenario's baseline, shortest form: 'C=8', 'N=640 C=16'."""
    if base is None:
        return "baseline"
    items = [d for d in delta(base, case) if d.path not in ("dataset.entries",)]
    if not items:
        return "baseline"
    return " ".join(f"{SHORT.get(d.path, d.path.rsplit('.', 1)[-1])}={quoted(d.new, 24)}" for d in items[:3]) + (
        f" +{len(items) - 3}" if len(items) > 3 else "")


def _scenario_rows(ws: Workspace, views: list[RunView], max_rows: int = MAX_ROWS) -> list[str]:
    """The scenario in a few lines: per case its change against the baseline, latest run, decision metric
    and verdict; the best kept case among those that meet every limit."""
    latest: dict[str, RunView] = {}
    for v in views:
        latest[v.case_id] = v  # views are oldest first: the last one of a case is its latest run
    cases: dict[str, Case | None] = {}
    for cid in latest:
        try:
            cases[cid] = load_case(ws, cid)
        except CaseledgerError:
            cases[cid] = None
    first = next(iter(latest))
    base_id = next((cid for cid, c in cases.items() if c is not None and c.parent is None), first)
    base = cases.get(base_id)
    out = [f"scenario {views[-1].scenario}: {len(latest)} case(s), baseline {base_id}"]
    best: tuple[float, str] | None = None
    for k, (cid, v) in enumerate(latest.items()):
        dec = v.decision or {}
        cand = dec.get("candidate") or {}
        value = cand.get("value") if isinstance(cand.get("value"), (int, float)) else None
        broken = [lim["limit"] for lim in dec.get("limits", []) if lim.get("verdict") == "breaks"]
        verdict = dec.get("outcome") or v.state.value
        if broken:
            verdict += f" (breaks {', '.join(broken)})"
        metric = f"{dec.get('primary_metric')} {value:.4g}" if value is not None else "no result"
        case = cases.get(cid)
        if k < max_rows:
            out.append(f"  {_label(base, case) if case else cid}: {v.run_id} {v.state.value}, {metric} -> {verdict}")
        if dec.get("outcome") in ("keep", "baseline") and not broken and value is not None:
            signed = value if dec.get("direction", "higher") == "higher" else -value
            if best is None or signed > best[0]:
                best = (signed, f"{cid} ({v.run_id})")
    if len(latest) > max_rows:
        out.append(f"  +{len(latest) - max_rows} more: summarize(scenario='{views[-1].scenario}')")
    if best is not None:
        out.append(f"best kept (meets every limit): {best[1]}")
    return out


def _problems(views: list[RunView], latest: RunView) -> list[str]:
    """Failed runs nothing superseded: not a later run of the same case, not a run of a child case."""
    latest_per_case: dict[str, RunView] = {}
    for v in views:
        latest_per_case[v.case_id] = v
    children = {v.meta.parent_case for v in views if v.meta.parent_case}
    out = []
    for v in latest_per_case.values():
        if v.state in (RunState.FAILED, RunState.END_UNKNOWN) and v.case_id not in children:
            then = "" if v is latest else f" -> {quoted(v.next_call.split(' — ')[0].split('; ')[0], 90)}"
            out.append(f"{v.run_id}: {quoted(v.blocker or v.state.value, 200)}{then}")  # latest: see next
    return out


def _next(v: RunView) -> str:
    if v.state == RunState.SUCCEEDED:
        dec = (v.decision or {}).get("outcome")
        return (f"summarize(run_ids=['{v.run_id}']) then freeze the next candidate with parent "
                f"{v.case_id if dec != 'close' else (v.meta.parent_case or v.case_id)}")
    return v.next_call


def refresh(ws: Workspace, exiting: str | None = None) -> str:
    text = render(ws, exiting)
    atomic_write(ws.handoff, text)
    return text


