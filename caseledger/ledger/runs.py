"""Runs in the ledger: ids, listing, and lookups by case."""

from __future__ import annotations

import secrets

from caseledger.workspace import Workspace, read_json_or_none


def new_run_id(ws: Workspace) -> str:
    while True:
        rid = "r-" + secrets.token_hex(4)
        if not (ws.runs_dir / rid).exists():
            return rid


def latest_run_of_case(ws: Workspace, case_id: str, *, with_load_end: bool = False,
                       with_results: bool = False) -> str | None:
    for rid in reversed(list_runs(ws)):
        meta = read_json_or_none(ws.run(rid).run_json) or {}
        if meta.get("case_id") != case_id:
            continue
        p = ws.run(rid)
        if with_load_end and not p.load_end.exists():
            continue
        if with_results and not (p.results.exists() and any(p.results.rglob("result.json"))):
            continue
        return rid
    return None


def list_runs(ws: Workspace) -> list[str]:
    """Run ids, oldest first (by creation time recorded in run.json)."""
    if not ws.runs_dir.exists():
        return []
    items = []
    for d in ws.runs_dir.iterdir():
        meta = read_json_or_none(d / "run.json")
        if meta:
            items.append((meta.get("created_utc", ""), d.name))
    return [r for _, r in sorted(items)]
