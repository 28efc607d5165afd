"""HANDOFF.md: a few lines for the next agent session, derived from the ledger (never authoritative).

Regenerated at every state change by whoever changed the state; a read (caseledger://handoff, `caseledger
handoff`) writes it only when a line other than the first (the time) changed. Details are referenced by id, never
pasted; deleting the file loses nothing (`caseledger handoff` and every state change regenerate it).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from caseledger import ledger, procs, redact
from caseledger.campaign.store import campaign_of
from caseledger.campaign.view import campaign_view
from caseledger.case.store import remember_secrets
from caseledger.errors import CaseledgerError, quoted
from caseledger.ledger import authorization, calls, queue
from caseledger.ledger.index import Index, RunRow, open_index, row_of
from caseledger.ledger.runs import damaged_line, load_run
from caseledger.ledger.state import RunState, RunView, fold
from caseledger.outcome.decide import broken
from caseledger.records import read_jsonl
from caseledger.views.scenario import ScenarioView, scenario_view
from caseledger.workspace import Workspace, atomic_write, read_json_or_none, utc_now

MAX_BYTES = 1024
MAX_LINES = 25


def render(ws: Workspace, exiting: str | None = None, *, verify: bool = True) -> str:
    """exiting: a run whose controller is writing this as its last act (counted as gone). verify: the index
    compares a slice of its rows with their files (see ledger/index.py); without, only new, changed and live
    runs are read (the refresh after a change this process made, e.g. the controller's before each phase)."""
    with open_index(ws, quick=not verify) as idx:
        return _render(ws, idx, exiting)


def _render(ws: Workspace, idx: Index, exiting: str | None) -> str:
    damaged = idx.damaged()
    rows = idx.recent(RECENT)
    latest: RunView | None = None
    while rows and latest is None:  # the newest run, folded live (the others as the index folded them)
        try:
            rid = rows[-1].run_id  # folded by this sync when it changed or is live; else from its files
            latest = idx.views.get(rid) or fold(ws, load_run(ws, rid))
        except CaseledgerError as e:  # a damaged case.json or events file: named below, the others shown
            damaged.append(e.message)
            rows.pop()
    lines = [
        f"# HANDOFF — written {utc_now()[:19]}Z from ledger/; may be stale (a process that died wrote "
        "nothing since): read caseledger://handoff or run `caseledger handoff` for a fresh one",
        f"authorization: {authorization.current_mode(ws)}",
    ]
    if damaged:
        lines.append(quoted(damaged_line(damaged), 300))
    if latest is None:
        lines += ["no runs yet", f"next: {calls.first_case()}"]
        return "\n".join(lines) + "\n"
    if latest.run_id == exiting:  # its controller is writing this as it exits: shown as gone (the view is shared)
        latest = replace(latest, controller_alive=False)
    rows[-1] = row_of(latest)
    view = _view(ws, idx, latest.scenario)
    others = _other_scenarios(ws, idx, latest.scenario)
    camps = _campaigns(ws)
    tail = _tail(ws, latest, rows, camps)
    text = ""
    for n in range(MAX_ROWS, -1, -1):  # as many scenario rows as fit the handoff's size, compacted if need be
        for compact in (False, True):
            text = _compose(lines, view, tail, n, others, camps, compact)
            if len(text.encode()) <= MAX_BYTES and text.count("\n") <= MAX_LINES:
                return text
    return text


RECENT = 40  # runs whose problems the handoff lists


def _view(ws: Workspace, idx: Index, name: str) -> ScenarioView | str:
    """The scenario's view (as summarize(scenario=...) answers), or its bare name when it has none here."""
    try:
        return scenario_view(ws, name, idx)
    except CaseledgerError:  # runs of cases not frozen here (imported): no scenario rows
        return name


def _compose(
    head: list[str],
    view: ScenarioView | str,
    tail: list[str],
    n_rows: int,
    others: list[tuple[str, str]],
    camps: list[Camp],
    compact: bool,
) -> str:
    if compact:  # every active campaign and scenario still named, on one line each
        camp_lines = [f"campaigns: {', '.join(f'{g} ({word})' for _, g, _, word in camps)}"] if camps else []
        other_lines = [f"also active: {'; '.join(short for _, short in others)}"] if others else []
    else:
        camp_lines, other_lines = [line for line, *_ in camps], [line for line, _ in others]
    lines = head + camp_lines + _scenario_rows(view, n_rows) + other_lines + tail
    text = "\n".join(lines) + "\n"
    keep = len(head) + len(camp_lines) + len(_scenario_rows(view, n_rows)) + len(other_lines)
    while (len(text.encode()) > MAX_BYTES or len(lines) > MAX_LINES) and len(lines) - 1 > keep and n_rows == 0:
        lines.pop(-2)  # last resort, with no scenario rows left: drop detail above the next call (never a name of
        if lines[-2] == "open problems:":  # an active scenario or campaign)
            lines.pop(-2)  # its items are gone: no empty header
        text = "\n".join(lines) + "\n"
    return text


def _tail(ws: Workspace, latest: RunView, rows: list[RunRow], camps: list[Camp]) -> list[str]:
    """The lines below the scenario rows: services, queues, the owner, the latest run, its problems, next."""
    lines: list[str] = []
    for f in sorted(ws.services_dir.glob("*.json")) if ws.services_dir.exists() else []:
        st = read_json_or_none(f) or {}
        if "adapter" not in st:
            continue  # not a service record (file-hashes.json, the hash cache)
        proc = st.get("proc") or {}
        if st.get("ssh") and proc:  # no SSH round trip from a handoff: say where it runs, status checks it
            where = f"remote pid {proc.get('pid')} on {st['ssh'].get('host')} (liveness: phase_status/service)"
        else:
            where = f"alive pid {proc.get('pid')}" if procs.alive(proc) else "stopped"
        lines.append(
            f"service {f.stem}: {st.get('adapter')} {st.get('identity')} {where} (from case {st.get('case_id')})"
        )

    for key, ids in queue.all_queues(ws).items():
        lines.append(f"queue {key}: {', '.join(ids[:4])}" + (f" (+{len(ids) - 4})" if len(ids) > 4 else ""))
    lease = ledger.read_lease(ws, latest.meta.target_key) if latest.meta.target_key else None
    held = f"held by {lease.run_id}" if lease and lease.live() else "free"
    lines.append(
        f"owner: target {latest.meta.target_key} {held}; controller of {latest.run_id} "
        f"{'alive' if latest.controller_alive else 'gone'}"
    )
    done = [p for p, ph in latest.phases.items() if ph.state.value == "done"]  # ran: reused and skipped did not
    last_done = done[-1] if done else "none"
    lines.append(
        f"latest run: {latest.run_id} case {latest.case_id}: {latest.state.value}"
        + (f" [{latest.failure_class}]" if latest.failure_class else "")
        + f"; last completed phase {last_done}"
    )
    problems = _problems(rows, latest)
    if problems:
        lines.append("open problems:")
        lines += [f"- {p}" for p in problems[:4]]
    lines.append(f"next: {_campaign_next(ws, camps, latest) or _next(latest)}")
    return lines


MAX_ROWS = 8  # scenario rows shown; the rest are counted (summarize(scenario=...) has them all)
Camp = tuple[str, str, bool, str]  # a campaign's handoff line, its id, its driver alive, its state in a word
ACTIVE_S = 6 * 3600  # another scenario with a run this recent (or one running or queued) is active: it is named too


def _other_scenarios(ws: Workspace, idx: Index, current: str) -> list[tuple[str, str]]:
    """Every other active scenario (a run in the last hours, one running, or a case queued), most recent first:
    (its line: latest run, state and decision, and the call that shows it whole; the same in a few words)."""
    since = datetime.fromtimestamp(datetime.now(UTC).timestamp() - ACTIVE_S, UTC).isoformat(timespec="milliseconds")
    out: list[tuple[str, str]] = []
    seen = {current}
    for r in idx.active(since.replace("+00:00", "Z")):
        if r.scenario in seen:
            continue
        seen.add(r.scenario)
        fc = f" [{r.failure_class}]" if r.failure_class else ""
        dec = f" -> {r.decision}" if r.decision else ""
        view = _view(ws, idx, r.scenario) if campaign_of(ws, r.case_id) else None
        if isinstance(view, ScenarioView) and view.campaign:  # a campaign's point: the campaign's answer, not a run's
            dec = (
                f" -> campaign {view.campaign} {'complete' if view.complete else 'so far'}: {short_answer(view.answer)}"
            )
        out.append(
            (
                f"also active: scenario {r.scenario}: latest {r.run_id} {r.state}{fc}{dec}; "
                + calls.summarize(scenario=r.scenario),
                f"{r.scenario} ({r.run_id} {r.state}{dec})",
            )
        )
    scenario_of = idx.cases() if queue.all_queues(ws) else {}
    for key, ids in queue.all_queues(ws).items():
        for cid in ids:
            name = scenario_of.get(cid)
            if name and name not in seen:
                seen.add(name)
                out.append(
                    (
                        f"also active: scenario {name}: {cid} queued on {key}; {calls.summarize(scenario=name)}",
                        f"{name} ({cid} queued)",
                    )
                )
    return out


def short_answer(answer: str | None) -> str:
    """A campaign's answer in its first words: 'winner C=4', 'tie within noise: C=2 and C=4', ..."""
    return quoted((answer or "").split(" (")[0], 110)


def _scenario_rows(view: ScenarioView | str, max_rows: int = MAX_ROWS) -> list[str]:
    """The scenario in a few lines, from the same view summarize(scenario=...) answers with: per case its
    change against the baseline, latest valid run, decision metric and verdict; the best within limits."""
    if isinstance(view, str):
        return [f"scenario: {view}"]
    name = view.scenario
    out = [
        f"scenario {name}: {len(view.rows)} case(s), {view.primary_metric} on {view.window}"
        + (f", limits {', '.join(view.limits)}" if view.limits else "")
    ]
    # the rows the answer rests on first (the winner, a tie, the best), then measured ones, then cases never run
    rows = sorted(
        view.rows,
        key=lambda r: (not (r.best or r.campaign_verdict in ("winner", "tie", "uncertain")), r.run_id is None),
    )
    for r in rows[:max_rows]:
        verdict = r.campaign_verdict or r.decision or r.state
        if r.limits and (br := broken(r.limits)):
            verdict += f" ({br})"
        if r.why:  # an insufficient decision says why (a distorted window names who took the host)
            verdict += f" ({quoted(r.why, 90)})"
        unsure = [f"{v.limit} met in {v.met} runs" for v in r.limits if v.verdict == "uncertain" and v.met]
        if unsure:
            verdict += f" (uncertain: {', '.join(unsure)})"
        metric = f"{r.metric:.4g}" if r.metric is not None else "no result"
        runs = f" over {r.runs} runs" if r.campaign_verdict and r.runs > 1 else ""
        what = r.case_id if r.campaign_verdict else (r.run_id or "-")
        out.append(f"  {r.change}: {what} {metric}{runs} -> {verdict}{' (best)' if r.best else ''}")
    if len(view.rows) > max_rows:
        out.append(f"  +{len(view.rows) - max_rows} more: {calls.summarize(scenario=name)}")
    best = next((r for r in view.rows if r.best), None)
    if view.campaign is not None:
        out.append(
            f"campaign {view.campaign} {'complete' if view.complete else 'so far'}: {quoted(view.answer or '', 110)}"
        )
    elif best is not None:
        out.append(f"best within every limit: {best.change} {best.case_id} ({best.run_id})")
    return out


def _problems(rows: list[RunRow], latest: RunView) -> list[str]:
    """Failed runs nothing superseded: not a later run of the same case, not a run of a child case."""
    latest_per_case: dict[str, RunRow] = {}
    for r in rows:
        latest_per_case[r.case_id] = r
    children = {r.parent_case for r in rows if r.parent_case}
    out = []
    for r in latest_per_case.values():
        if r.state in (RunState.FAILED, RunState.END_UNKNOWN) and r.case_id not in children:
            then = (
                ""
                if r.run_id == latest.run_id
                else f" -> {quoted((r.next_call or '').split(' — ')[0].split('; ')[0], 90)}"
            )
            out.append(f"{r.run_id}: {quoted(r.blocker or r.state or '', 200)}{then}")  # latest: see next
    return out


def _campaign_next(ws: Workspace, camps: list[Camp], latest: RunView) -> str | None:
    """Follow a campaign whose driver is alive; after one that ran the latest run, its answer."""
    alive = next((gid for _, gid, up, _ in camps if up), None)
    if alive:
        return calls.wait(alive)
    stopped = next((gid for _, gid, _, word in camps if word.startswith("stopped")), None)
    if stopped:
        return calls.continue_campaign(stopped)
    gid = campaign_of(ws, latest.case_id)  # the latest run is a campaign's point (active or not): its answer
    if gid is not None:
        return calls.campaign_answer(gid)
    return None


def _campaigns(ws: Workspace) -> list[Camp]:
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
        word, state = campaign_state(ws, c.name, alive, str(info.get("outcome") or ""))
        found.append((at, f"campaign {c.name} {name}: {state}", c.name, alive, word))
    return [(line, gid, up, word) for _, line, gid, up, word in sorted(found, reverse=True)]


def campaign_state(ws: Workspace, gid: str, alive: bool, outcome: str) -> tuple[str, str]:
    """(the word, the line) of a campaign for the handoff, from its view (the one truth): running, complete, or
    stopped with the points it has left and the call that continues it; never 'active' for a finished one."""
    try:
        v = campaign_view(ws, gid)
    except CaseledgerError:
        return "unreadable", f"unreadable; {calls.summarize([gid])} names why"
    left = sum(r.status in ("queued", "pending", "running") for r in v.rows)
    measured = sum(r.runs > 0 for r in v.rows)
    if alive:
        return "running", f"running ({measured}/{len(v.rows)} points measured); {calls.wait(gid)}"
    if v.complete:
        return "complete", f"complete: {short_answer(v.answer)}; {calls.summarize([gid])}"
    why = f" ({quoted(outcome, 80)})" if outcome and outcome != "complete" else ""
    return (
        f"stopped, {left} point(s) left",
        f"stopped with {left} point(s) left{why}; {calls.start_run(gid)} continues it",
    )


def _next(v: RunView) -> str:
    if v.state == RunState.SUCCEEDED:
        dec = v.decision.outcome if v.decision else None
        return calls.run_succeeded(v.run_id, v.case_id if dec != "close" else (v.meta.parent_case or v.case_id))
    return v.next_call


def refresh(ws: Workspace, exiting: str | None = None, *, verify: bool = False) -> str:
    """Write HANDOFF.md and return it; the values of the workspace's secrets masked (the ledger's text was
    masked when recorded; this also covers text an older version recorded unmasked). verify: see render
    (a writer refreshing after its own change does not: its writes are in the index already)."""
    remember_secrets(ws)
    text = redact.mask(render(ws, exiting, verify=verify))
    if _body(_read_or_none(ws.handoff)) != _body(text):  # the same lines but the time: nothing to write
        atomic_write(ws.handoff, text)
    return text


def _read_or_none(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):  # missing or damaged: written again
        return None


def _body(text: str | None) -> str | None:
    """HANDOFF.md without its first line (the time it was written)."""
    return None if text is None else text.partition("\n")[2]
