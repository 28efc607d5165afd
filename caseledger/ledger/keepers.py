"""Which workspace of this host keeps a service on a target: one small record per service key, host-wide.

A workspace records the service it starts in its own ledger (services/live.py: ledger/services/<key>.json) and
keeps it alive for reuse after its run. A workspace cannot see another's ledger, so the same start is recorded
beside the target leases, in host_dir()/services/<key>.json (the lease's key; '<key>.<name>' for a component):
the workspace, the case, the process (pid with its start time: a pid is only the same process with the same start
time) and the identity it was started with. Stopping that process removes the record; a record whose process is
gone is stale and read as no record (the next start on the key overwrites it).

Only the starting workspace writes a key's record, while its run holds the target's lease; readers take it as it
is (written atomically).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError, with_config
from typing_extensions import TypedDict  # pydantic validates it on Python 3.11

from caseledger import procs
from caseledger.ledger.leases import host_dir
from caseledger.workspace import Workspace, read_json_or_none, utc_now, write_json


@with_config(ConfigDict(extra="ignore"))
class Keeper(TypedDict):
    """host_dir()/services/<key>.json (JSON on disk)."""

    key: str  # the service key: the target's lease key, plus '.<name>' for a component
    workspace: str  # the workspace that started the process and keeps it
    case_id: str  # the case it was started for
    identity: str  # the intended identity it was started with
    proc: procs.ProcRef  # {pid, start_time, host}
    started_utc: str


_KEEPER = TypeAdapter(Keeper)


def _dir() -> Path:
    return host_dir() / "services"


def keeper_path(key: str) -> Path:
    return _dir() / f"{key}.json"


def record(ws: Workspace, key: str, case_id: str, identity: str, proc: procs.ProcRef) -> None:
    """Say host-wide that `ws` keeps the process `proc` on `key` (at its start, before it answers health)."""
    keeper: Keeper = {
        "key": key,
        "workspace": str(ws.root),
        "case_id": case_id,
        "identity": identity,
        "proc": proc,
        "started_utc": utc_now(),
    }
    write_json(keeper_path(key), keeper)


def read(key: str) -> Keeper | None:
    """The record of `key` as written (its process may be gone), or None when there is none or it is unreadable."""
    raw: Any = read_json_or_none(keeper_path(key))  # JSON: a Keeper, or anything a damaged file holds
    if not raw:
        return None
    try:
        return _KEEPER.validate_python(raw)
    except ValidationError:
        return None


def same_proc(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    """The same process: pid, start time and host."""
    if not a or not b:
        return False
    return all(a.get(k) == b.get(k) for k in ("pid", "start_time", "host"))


def forget(key: str, proc: Mapping[str, Any] | None) -> None:
    """Remove the record of `key` when it names this process (a record of a later start stays)."""
    cur = read(key)
    if cur is not None and same_proc(cur["proc"], proc):
        keeper_path(key).unlink(missing_ok=True)


def kept_by(ws: Workspace) -> list[Keeper]:
    """The records naming `ws` as the keeper (their processes may be gone)."""
    if not _dir().is_dir():
        return []
    found = (read(p.stem) for p in sorted(_dir().glob("*.json")))
    return [k for k in found if k is not None and k["workspace"] == str(ws.root)]
