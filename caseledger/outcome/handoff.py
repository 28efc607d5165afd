"""HANDOFF.md: a few lines for the next agent session, derived from the ledger (never authoritative).

Regenerated at every state change by whoever changed the state. Details are referenced by id, never
pasted; deleting the file loses nothing (`caseledger handoff` and every state change regenerate it).
"""

from __future__ import annotations

from datetime import UTC, datetime

from caseledger import ledger, procs, redact
from caseledger.case.store import remember_secrets
from caseledger.errors import CaseledgerError, quoted
from caseledger.ledger import authorization, queue
from caseledger.ledger.runs import Run, damaged_line, scan_runs
from caseledger.ledger.state import RunState, RunView, fold
from caseledger.records import read_jsonl
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
            v = fold(ws, Run(paths=ws.run(meta.run_id), meta=meta, workspace=ws))  # run.json read once, by the scan
        except CaseledgerError as e:  # a damaged case.json or events file: named below, the others shown
            damaged.append(e.message)
            continue
        if meta.run_id == exiting:
            v.controller_alive = False
        views.append(v)
    lines = [f"# HANDOFF — written {utc_now()[:19]}Z from ledger/; may be stale (a process that died wrote "
             "nothing since): read caseledger://handoff or run `caseledger handoff` for a fresh one",
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
    camps = _campaigns(ws)
    lines = head + [line for line, _, _ in camps] + _scenario_rows(ws, same, rows) + _other_scenarios(views, latest)
    for f in sorted(ws.services_dir.glob("*.json")) if ws.services_dir.exists() else []:
        st = read_json_or_none(f) or {}
        if "adapter" not in st:
            continue  # not a service record (file-hashes.json, the hash cache)
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
    done = [p for p, ph in latest.phases.items() if ph.state.value == "done"]  # ran: reused and skipped did not
    last_done = done[-1] if done else "none"
    lines.append(f"latest run: {latest.run_id} case {latest.case_id}: {latest.state.value}"
                 + (f" [{latest.failure_class}]" if latest.failure_class else "")
                 + f"; last completed phase {last_done}")
    problems = _problems(views, latest)
    if problems:
        lines.append("open problems:")
        lines += [f"- {p}" for p in problems[:4]]
    lines.append(f"next: {_campaign_next(ws, camps, latest) or _next(latest)}")
    text = "\n".join(lines) + "\n"
    while (len(text.encode()) > MAX_BYTES or len(lines) > MAX_LINES) and len(lines) > 4 and rows == 0:
        lines.pop(-2)  # last resort, with no scenario rows left: drop detail above the next call
        if lines[-2] == "open problems:":
            lines.pop(-2)  # its items are gone: no empty header
        text = "\n".join(lines) + "\n"
    return text


MAX_ROWS = 8  # scenario rows shown; the rest are counted (summarize(scenario=...) has them all)
ACTIVE_S = 6 * 3600  # another scenario with a run this recent (or one running) is active: it is named too
MAX_OTHERS = 4


def _other_scenarios(views: list[RunView], latest: RunView) -> list[str]:
    """Every other active scenario (a run in the last hours, or one running), most recent first, one line each:
    its latest run, state and decision, and the call that shows it whole."""
    now = datetime.now(UTC).timestamp()
    newest: dict[str, RunView] = {}
    for v in views:
        if v.scenario != latest.scenario:
            newest[v.scenario] = v
    out = []
    for name, v in sorted(newest.items(), key=lambda kv: kv[1].meta.created_utc, reverse=True):
        try:
            created = datetime.fromisoformat(v.meta.created_utc.replace("Z", "+00:00")).timestamp()
        except ValueError:  # no creation time recorded: only a running one counts as active
            created = 0.0
        if v.state not in (RunState.RUNNING, RunState.CREATED) and now - created > ACTIVE_S:
            continue
        dec = (v.decision or {}).get("outcome")
        out.append(f"also active: scenario {name}: latest {v.run_id} {v.state.value}"
                   + (f" [{v.failure_class}]" if v.failure_class else "") + (f" -> {dec}" if dec else "")
                   + f"; summarize(scenario='{name}')")
    return out[:MAX_OTHERS]


def _scenario_rows(ws: Workspace, views: list[RunView], max_rows: int = MAX_ROWS) -> list[str]:
    """The scenario in a few lines, from the same view summarize(scenario=...) answers with: per case its
    change against the baseline, latest valid run, decision metric and verdict; the best within limits."""
    # the controller refreshes HANDOFF.md before the first formal request: these stay off its hot path
    from caseledger.outcome.decide import broken  # lazy: pulls metrics and numpy (~40 ms)
    from caseledger.outcome.summary import scenario_view  # lazy: pulls metrics and numpy (~40 ms)

    name = views[-1].scenario
    try:
        view = scenario_view(ws, name)
    except CaseledgerError:  # runs of cases not frozen here (imported): no scenario rows
        return [f"scenario: {name}"]
    out = [f"scenario {name}: {len(view.rows)} case(s), {view.primary_metric} on {view.window}"
           + (f", limits {', '.join(view.limits)}" if view.limits else "")]
    for r in view.rows[:max_rows]:
        verdict = r.decision or r.state
        if r.limits and (br := broken(r.limits)):
            verdict += f" ({br})"
        metric = f"{r.metric:.4g}" if r.metric is not None else "no result"
        out.append(f"  {r.change}: {r.run_id or '-'} {metric} -> {verdict}{' (best)' if r.best else ''}")
    if len(view.rows) > max_rows:
        out.append(f"  +{len(view.rows) - max_rows} more: summarize(scenario='{name}')")
    best = next((r for r in view.rows if r.best), None)
    if best is not None:
        out.append(f"best within every limit: {best.change} {best.case_id} ({best.run_id})")
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


def _campaign_next(ws: Workspace, camps: list[tuple[str, str, bool]], latest: RunView) -> str | None:
    """Follow a campaign whose driver is alive; after one that ran the latest run, its answer."""
    alive = next((gid for _, gid, up in camps if up), None)
    if alive:
        return f"phase_status(run_id='{alive}', wait_s=60) until it says campaign complete"
    for _, gid, _ in camps:
        ids = read_json_or_none(ws.campaigns_dir / gid / "points.json") or []
        if any(isinstance(p, dict) and p.get("case_id") == latest.case_id for p in ids):
            return f"summarize(run_ids=['{gid}']): the campaign's answer (its points are not decided one by one)"
    return None


def _campaigns(ws: Workspace) -> list[tuple[str, str, bool]]:
    """One line per active campaign (its driver alive, or ended in the last hours), most recent first: (line,
    id, driver alive). Read from its files: the answer itself is summarize(run_ids=[id])."""
    d = ws.campaigns_dir
    if not d.is_dir():
        return []
    now = datetime.now(UTC).timestamp()
    found = []
    for c in d.glob("g-*"):
        info = read_json_or_none(c / "driver.json")
        if not isinstance(info, dict):
            continue
        alive = procs.alive(info)
        ended = info.get("ended_utc")
        try:
            at = datetime.fromisoformat(str(ended or info.get("started_utc")).replace("Z", "+00:00")).timestamp()
        except ValueError:
            at = 0.0
        if not alive and now - at > ACTIVE_S:
            continue
        names = [line for line in read_jsonl(c / "policy.jsonl").items if isinstance(line, dict)]
        name = str(names[-1].get("name", "")) if names else ""
        state = "driver alive: it starts every next point" if alive else f"driver ended ({info.get('outcome')})"
        found.append((at, f"campaign {c.name} {name}: {state}; summarize(run_ids=['{c.name}'])", c.name, alive))
    return [(line, gid, up) for _, line, gid, up in sorted(found, reverse=True)[:MAX_OTHERS]]


def _next(v: RunView) -> str:
    if v.state == RunState.SUCCEEDED:
        dec = (v.decision or {}).get("outcome")
        return (f"summarize(run_ids=['{v.run_id}']) then freeze the next candidate with parent "
                f"{v.case_id if dec != 'close' else (v.meta.parent_case or v.case_id)}")
    return v.next_call


def refresh(ws: Workspace, exiting: str | None = None) -> str:
    """Write HANDOFF.md and return it; the values of the workspace's secrets masked (the ledger's text was
    masked when recorded; this also covers text an older version recorded unmasked)."""
    remember_secrets(ws)
    text = redact.mask(render(ws, exiting))
    atomic_write(ws.handoff, text)
    return text


