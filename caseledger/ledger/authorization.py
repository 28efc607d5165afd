"""Authorization modes: paused (freeze and preflight only), single (one run, then paused), auto."""

from __future__ import annotations

from typing import Literal, cast

from caseledger.errors import CaseInvalid, NotAuthorized
from caseledger.workspace import Workspace, read_json_or_none, utc_now, write_json

Mode = Literal["paused", "single", "auto"]
MODES: tuple[Mode, ...] = ("paused", "single", "auto")
DEFAULT: Mode = "auto"  # a new workspace runs; `caseledger authorize paused` stops new load


def current_mode(ws: Workspace) -> Mode:
    d = read_json_or_none(ws.authorization_file)
    return cast(Mode, d["mode"]) if d and d.get("mode") in MODES else DEFAULT


def set_mode(ws: Workspace, mode: str, why: str = "set by caseledger authorize") -> Mode:
    if mode not in MODES:
        raise CaseInvalid(f"unknown authorization mode '{mode}'; known: {', '.join(MODES)}",
                          "caseledger authorize paused|single|auto")
    write_json(ws.authorization_file, {"mode": mode, "since_utc": utc_now(), "why": why})
    return current_mode(ws)


def check_start(ws: Workspace) -> Mode:
    mode = current_mode(ws)
    if mode == "paused":
        raise NotAuthorized(
            "authorization is 'paused': freeze and preflight are allowed, no service change and no formal load",
            "a person runs `caseledger authorize single` (one run) or `caseledger authorize auto`, "
            "then start_run again",
        )
    return mode


def consume(ws: Workspace, run_id: str) -> None:
    """'single' allows one run: after it has started, go back to paused."""
    if current_mode(ws) == "single":
        set_mode(ws, "paused", why=f"single run {run_id} started")
