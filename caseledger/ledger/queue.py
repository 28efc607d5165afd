"""The explicit queue of prepared cases per target: nothing waits silently.

Under `auto`, a case whose preflight passed may be queued while another run holds the target; the
controller that releases the lease starts the first queued case. The queue is a small JSON file per
target key, visible in phase_status and HANDOFF.md.
"""

from __future__ import annotations

from typing import Any

from caseledger.workspace import Workspace, flocked, read_json_or_none, utc_now, write_json


def _path(ws: Workspace, key: str) -> Any:
    return ws.queue_dir / f"{key}.json"


def entries(ws: Workspace, key: str) -> list[dict[str, Any]]:  # JSON: queue entries
    return list((read_json_or_none(_path(ws, key)) or {}).get("entries", []))


def push(ws: Workspace, key: str, case_id: str, behind: str | None) -> int:
    """Queue case_id on the target; returns its position (1 = next)."""
    with flocked(ws.queue_dir / f"{key}.lock"):
        items = entries(ws, key)
        if not any(e["case_id"] == case_id for e in items):
            items.append({"case_id": case_id, "queued_utc": utc_now(), "behind_run": behind})
            write_json(_path(ws, key), {"target_key": key, "entries": items})
        return next(n for n, e in enumerate(items, 1) if e["case_id"] == case_id)


def pop(ws: Workspace, key: str) -> dict[str, Any] | None:  # JSON: a queue entry
    with flocked(ws.queue_dir / f"{key}.lock"):
        items = entries(ws, key)
        if not items:
            return None
        first, rest = items[0], items[1:]
        write_json(_path(ws, key), {"target_key": key, "entries": rest})
        return first


def all_queues(ws: Workspace) -> dict[str, list[str]]:
    d = ws.queue_dir
    if not d.exists():
        return {}
    out = {}
    for p in sorted(d.glob("*.json")):
        ids = [e["case_id"] for e in (read_json_or_none(p) or {}).get("entries", [])]
        if ids:
            out[p.stem] = ids
    return out
