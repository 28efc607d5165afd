"""A service that another workspace of this host keeps on the target: used when it is this case's, else named.

ledger/keepers.py says which workspace keeps a live service on a target key. A start from another workspace that
finds one does one of two things:
- reuse it, when its identity is this case's and the owner's record of the process verifies as any reuse does
  (live.verify: pid with start time, argv read back, health, port held, files and environment), and no relative
  path in its argv names another file here than in the owner's working directory. The record is copied into this
  workspace's ledger marked `kept_by`: this workspace then warms, re-verifies and reuses it like its own, and
  never stops it.
- refuse, naming the owner's workspace, case and pid and the one fix, `caseledger target stop --workspace OWNER`.
  A start is refused before any run is written (TargetHeld, as for a held lease), so a campaign's driver waits.
It never stops the other workspace's service itself: that workspace's next run (or its agent's plan) counts on it
being warm, and two campaigns of different identities would stop each other's service between points, every start
then cold (minutes on a large model).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from caseledger import procs
from caseledger.case.model import Case
from caseledger.errors import PhaseFailed, TargetHeld
from caseledger.ledger import keepers
from caseledger.ledger.keepers import Keeper
from caseledger.services.identity import Unit, intended_argv, intended_identity, units
from caseledger.services.kinds import adapter_of
from caseledger.services.live import ServiceState, proc_alive, read_state, state_path, verify
from caseledger.workspace import Workspace


@dataclass(frozen=True)
class Kept:
    """A live service another workspace keeps on a key: its host-wide record, and the owner's ledger record of the
    same process ({} when that record is unreadable or names another process)."""

    keeper: Keeper
    state: ServiceState

    @property
    def workspace(self) -> str:
        return self.keeper["workspace"]

    def refusal(self, why: str) -> tuple[str, str]:
        """(message, fix) of a start this service keeps from the target."""
        k = self.keeper
        msg = (
            f"target '{k['key']}' is kept by workspace {k['workspace']}: its service (case {k['case_id']}, pid "
            f"{k['proc']['pid']}, started {k['started_utc']}) {why}; caseledger never stops a service another "
            "workspace keeps"
        )
        fix = (
            f"caseledger target stop --workspace {k['workspace']} (stops that workspace's campaign drivers and the "
            "services it started), then start again; a campaign's driver waits and starts the point by itself"
        )
        return msg, fix


def kept_elsewhere(ws: Workspace, key: str) -> Kept | None:
    """The live service another workspace keeps on `key`, or None (none recorded, this workspace's own, or gone)."""
    k = keepers.read(key)
    if k is None or k["workspace"] == str(ws.root):
        return None
    try:
        owner = read_state(Workspace(Path(k["workspace"])), key)
    except OSError:  # the owner's ledger cannot be read (moved, permissions): the host record alone names it
        owner = {}
    st = owner if keepers.same_proc(owner.get("proc"), k["proc"]) else {}
    alive = proc_alive(st) if st else procs.alive(k["proc"])
    return Kept(k, st) if alive else None


def reuse_problem(kept: Kept, ws: Workspace, case: Case, u: Unit, want: str) -> tuple[str | None, list[str]]:
    """(why this case may not use the kept service as its own, or None; the effective argv read back)."""
    have = kept.keeper["identity"]
    if have != want:
        return f"runs service identity {have}, this case's is {want}", []
    if not kept.state:
        where = state_path(Workspace(Path(kept.workspace)), kept.keeper["key"])
        return f"has this case's identity but is not recorded in {where}, so it cannot be verified", []
    if u.ssh is None:  # a remote process's relative paths are in its login's home, the same for every workspace
        there = Path(kept.state.get("cwd") or kept.workspace)
        moved = cwd_bound(intended_argv(case, u), there, ws.root)
        if moved is not None:
            return f"reads {moved} from {there}, another file than {ws.root / moved}", []
    return verify(kept.state, case, u)


def cwd_bound(argv: list[str], there: Path, here: Path) -> str | None:
    """The first relative path in `argv` (a word, or an option's value after '=') that names a file or directory
    in either working directory and not the same content in both; None when the argv reads the same from both.
    The identity hashes the argv as text: `./t.jinja` is one identity whatever file it names."""
    for word in argv:
        for value in (word, word.partition("=")[2]):
            if not value or value.startswith("-") or Path(value).is_absolute():
                continue
            a, b = there / value, here / value
            if not (_exists(a) or _exists(b)):
                continue
            if not (_exists(a) and _exists(b) and _same(a, b)):
                return value
    return None


def _exists(p: Path) -> bool:
    try:
        return p.exists()
    except OSError:  # e.g. a word too long for a file name (a JSON config on the argv)
        return False


def _same(a: Path, b: Path) -> bool:
    """One file or directory, or two regular files with the same bytes."""
    if a.resolve() == b.resolve():
        return True
    if not (a.is_file() and b.is_file()) or a.stat().st_size != b.stat().st_size:
        return False
    return hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest()


def adopted(kept: Kept, prev: ServiceState) -> ServiceState:
    """This workspace's record of a kept service it reuses: the owner's record marked `kept_by`, without what the
    owner's runs did with it (warmed, routes verified) and with this workspace's count of its own starts."""
    st: ServiceState = {**kept.state, "kept_by": kept.workspace}
    st.pop("warmed_by", None)
    st.pop("routes_verified_for", None)
    st.pop("starts", None)
    if "starts" in prev:
        st["starts"] = prev["starts"]
    return st


def refuse_kept_elsewhere(ws: Workspace, case: Case, key: str) -> None:
    """TargetHeld when another workspace keeps a live service on this case's target that this case may not use
    (reuse_problem); checked by start_run and resume before any run state is written, so a campaign waits."""
    if not adapter_of(case).launched:
        return
    for u in units(case):
        kept = kept_elsewhere(ws, u.key(key))
        if kept is None:
            continue
        try:
            want = intended_identity(ws, case, u)
        except PhaseFailed:  # a declared file is missing: the service phase names it
            return
        why, _ = reuse_problem(kept, ws, case, u, want)
        if why is not None:
            raise TargetHeld(*kept.refusal(why))
