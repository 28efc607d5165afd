"""Authorization modes: paused (freeze and preflight only), single (one run, then paused), auto.

Fails closed: a missing file is the default (auto, a new workspace runs), but a file that cannot be read or
names an unknown mode is 'paused' until a person sets a mode again. 'single' is claimed atomically: of two
start_run calls arriving together, one gets the run and the other is refused.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal, cast

import orjson

from caseledger.errors import CaseInvalid, NotAuthorized, quoted
from caseledger.workspace import Workspace, lock_fd, utc_now, write_json

Mode = Literal["paused", "single", "auto"]
MODES: tuple[Mode, ...] = ("paused", "single", "auto")
DEFAULT: Mode = "auto"  # a new workspace runs; `caseledger authorize paused` stops new load
_FIX = "a person runs `caseledger authorize single` (one run) or `caseledger authorize auto`, then start_run again"


def read_mode(ws: Workspace) -> tuple[Mode, str | None]:
    """(mode, problem): problem names a damaged file, which reads as 'paused'."""
    try:
        data = ws.authorization_file.read_bytes()
    except FileNotFoundError:
        return DEFAULT, None
    except OSError as e:
        return "paused", f"ledger/authorization.json cannot be read ({quoted(e)})"
    try:
        d = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        return "paused", f"ledger/authorization.json is damaged ({quoted(e)})"
    if not isinstance(d, dict) or d.get("mode") not in MODES:
        got = d.get("mode") if isinstance(d, dict) else d
        return "paused", f"ledger/authorization.json names no known mode (got {quoted(got, 40)})"
    return cast(Mode, d["mode"]), None


def current_mode(ws: Workspace) -> Mode:
    return read_mode(ws)[0]


def set_mode(ws: Workspace, mode: str, why: str = "set by caseledger authorize") -> Mode:
    if mode not in MODES:
        raise CaseInvalid(
            f"unknown authorization mode '{quoted(mode)}'; known: {', '.join(MODES)}",
            "caseledger authorize paused|single|auto",
        )
    write_json(ws.authorization_file, {"mode": mode, "since_utc": utc_now(), "why": why})
    return current_mode(ws)


def check_start(ws: Workspace) -> Mode:
    """The mode when it allows a service change or a formal load; NotAuthorized (with the fix) otherwise."""
    mode, problem = read_mode(ws)
    if problem is not None:
        raise NotAuthorized(f"{problem}: treated as 'paused' (no service change, no formal load)", _FIX)
    if mode == "paused":
        raise NotAuthorized(
            "authorization is 'paused': freeze and preflight are allowed, no service change and no formal load", _FIX
        )
    return mode


@contextmanager
def _locked(ws: Workspace) -> Iterator[None]:
    """The ledger directory itself is the lock: a refused call leaves no lock file behind."""
    if not ws.ledger.is_dir():
        yield  # no ledger yet: no authorization file, the default mode; nothing to race for
        return
    fd = os.open(ws.ledger, os.O_RDONLY | os.O_DIRECTORY)
    try:
        lock_fd(fd, ws.ledger)  # bounded: a stuck holder is named (LockTimeout), never waited on forever
        yield
    finally:
        os.close(fd)  # releases the lock


@contextmanager
def claim(ws: Workspace, run_id: str) -> Iterator[Mode]:
    """Check and take the right to start `run_id` atomically: 'single' turns to 'paused' inside the lock, so
    a second caller arriving together is refused; if the start fails, 'single' is given back."""
    with _locked(ws):
        mode = check_start(ws)
        if mode == "single":
            set_mode(ws, "paused", why=f"single run {run_id} started")
    try:
        yield mode
    except BaseException:
        if mode == "single":
            with _locked(ws):
                if current_mode(ws) == "paused":
                    set_mode(ws, "single", why=f"given back: run {run_id} did not start")
        raise
