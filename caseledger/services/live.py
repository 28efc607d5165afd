"""The service caseledger recorded on a target and its live process: the state file
(ledger/services/<target_key>.json), liveness, the read-back checks behind reuse (argv, health, ports, held
files, environment), health probes and stop. A remote service goes through remote.py (SSH)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
from pydantic import ConfigDict, TypeAdapter, ValidationError, with_config
from typing_extensions import TypedDict  # pydantic validates it on Python 3.11

from caseledger import procs
from caseledger.case.model import Case
from caseledger.case.service import SSH
from caseledger.datasets import dataset_id_for
from caseledger.errors import PhaseFailed
from caseledger.ledger import keepers
from caseledger.ledger.evidence import ComponentRecord, ServiceRecord
from caseledger.services import net, remote
from caseledger.services.adapter import host_port
from caseledger.services.identity import (
    DeclaredFile,
    ModelFile,
    Unit,
    compare_argv,
    intended_argv,
    intended_identity,
    sha_of,
    units,
    value_hash,
)
from caseledger.services.kinds import adapter_of
from caseledger.workspace import (
    Workspace,
    read_json_or_none,
    utc_now,
    write_json,
)


def state_path(ws: Workspace, key: str) -> Path:
    return ws.services_dir / f"{key}.json"


@with_config(ConfigDict(extra="allow"))  # a key this model does not know is kept, never dropped on rewrite
class ServiceState(TypedDict, total=False):
    """ledger/services/<target_key>.json: the service caseledger started on a target, as written by
    adapters._record_start and updated by the read-back checks, mark_warm and stop (JSON on disk)."""

    adapter: str
    proc: procs.ProcRef | None  # {pid, start_time, host}: host is the SSH host of a remote one; None once stopped
    identity: str  # the intended identity it was started with
    intended_argv: list[str]
    effective_argv: list[str]  # read back from the live process
    env: dict[str, str]  # the environment shown (secrets masked)
    env_sha256: dict[str, str]  # declared env keys, value hashes only
    case_id: str
    started_utc: str
    starts: int  # processes started on this target key so far
    log: str
    model_files: list[ModelFile]
    files: list[DeclaredFile]
    cwd: str
    ssh: dict[str, Any]  # JSON: the SSH login (the SSH model) of a remote service
    engine_version: str | None
    engine: str | None  # engines.detect's answer: 'llamacpp (argv: llama-server)'
    warmed_by: str  # the run that warmed it and verified its routes since it started
    routes_verified_for: str  # the dataset id those routes' token counts were verified with
    stopped_utc: str
    stop_error: str
    kept_by: str  # the workspace that started the process and keeps it, when another one (services/kept.py)


_STATE = TypeAdapter(ServiceState)


def read_state(ws: Workspace, key: str) -> ServiceState:
    """The recorded service on a target key, validated against the state model; empty when none was recorded
    (or the file is unreadable, or holds no service state)."""
    raw = read_json_or_none(state_path(ws, key))
    if not raw:
        return {}
    try:
        return _STATE.validate_python(raw)
    except ValidationError:
        return {}  # as an unreadable file: a start then finds the port held and names it (adapters._clear_target)


def remote_of(st: ServiceState) -> remote.Remote | None:
    """The SSH login of a recorded service, or None for a local one."""
    return remote.Remote(SSH.model_validate(st["ssh"])) if st.get("ssh") else None


def proc_alive(st: ServiceState) -> bool:
    rem = remote_of(st)
    if rem is None:
        return procs.alive(st["proc"])
    try:
        return rem.alive(st["proc"])
    except remote.RemoteError:
        return False  # unreachable counts as not live here; a start then fails on the same connection, named


def live_service(ws: Workspace, key: str) -> ServiceState | None:
    st = read_state(ws, key)
    if st and st.get("proc") and proc_alive(st):
        return st
    return None


def live_state(ws: Workspace, case: Case, key: str) -> tuple[bool, bool, bool]:
    """(this case's service is live on the target, it was warmed and its routes verified since it started, with
    this case's dataset): what a run's plan is derived from at start_run, by the same check the service phase
    reuses it on (identity, then verify), for every component; no request is sent."""
    if not adapter_of(case).launched:
        return False, False, False
    warm = routes = True
    dataset = dataset_id_for(case)
    for u in units(case):
        st = read_state(ws, u.key(key))
        try:
            want = intended_identity(ws, case, u)
        except PhaseFailed:  # a declared file is missing: the service phase names it
            return False, False, False
        if st.get("identity") != want or verify(st, case, u)[0] is not None:
            return False, False, False
        warm = warm and bool(st.get("warmed_by"))
        routes = routes and st.get("routes_verified_for") == dataset
    return True, warm, warm and routes


def mark_warm(ws: Workspace, key: str, evidence: ServiceRecord, run_id: str, dataset_id: str) -> None:
    """Record that run_id warmed the service instances of this service evidence (every component) and verified
    their routes' token counts with this dataset (a restart forgets both)."""
    for comp in evidence.processes:
        k = comp.key if isinstance(comp, ComponentRecord) else key
        st = read_state(ws, k)
        proc = st.get("proc")
        if comp.pid is not None and proc is not None and proc["pid"] == comp.pid:
            st["warmed_by"] = run_id
            st["routes_verified_for"] = dataset_id
            write_json(state_path(ws, k), st)


def check_live(ws: Workspace, case: Case, key: str) -> str | None:
    """None when every process recorded for this target is still the case's (see verify); else what is
    wrong. External endpoints are not ours to check beyond their health (route verification covers them)."""
    if not adapter_of(case).launched:
        return None
    for u in units(case):
        problem = verify(read_state(ws, u.key(key)), case, u)[0]
        if problem is not None:
            return f"{u.name}: {problem}" if u.name else problem
    return None


def verify(st: ServiceState, case: Case, unit: Unit) -> tuple[str | None, list[str]]:
    """(problem or None, effective argv) of a recorded process: pid and start time alive, the argv read back
    unchanged, health answering, (locally) the routes' ports held by it, and the files and environment it
    really runs with as recorded at its start (see effective_problem). The one check behind reuse, the plan's
    live state and the re-verification before and after the formal load."""
    proc = st.get("proc")
    if not proc:
        return "no live service is recorded for this target", []
    pid = int(proc["pid"])
    if not proc_alive(st):
        return f"the service (pid {pid}) is gone", []
    if remote_of(st) is None and procs.stopped(st["proc"]):
        return f"the service (pid {pid}) is stopped (SIGSTOP): alive but doing no work", []
    eff = _cmdline(st, pid) or []
    diff = compare_argv(intended_argv(case, unit), eff)
    if diff is not None:
        return f"the service (pid {pid}) runs another argv: {diff}", eff
    if not health_ok(unit.health_url):
        return f"the service (pid {pid}) does not answer health at {unit.health_url}", eff
    rem = remote_of(st)
    if rem is None:
        return owner_problem(case, unit, pid) or effective_problem(st, unit, pid), eff
    if not (st.get("files") or st.get("env_sha256")):
        return None, eff  # nothing more to read back (no extra SSH round trip)
    try:
        view = remote_view(rem, pid, [f["real_path"] for f in st.get("files") or []])
    except remote.RemoteError as e:
        return f"cannot read the service (pid {pid}) back on {rem.ssh.host}: {e.message}", eff
    return effective_problem(st, unit, pid, view), eff


@dataclass(frozen=True)
class ProcView:
    """What one process holds and runs with, read on its own host (procs locally, one SSH script remotely)."""

    held: list[procs.HeldFile]
    environ: dict[str, str] | None
    stat: Callable[[str], tuple[int, int] | None]  # (dev, inode) a path names now on that host
    sha256: Callable[[str], str]  # hash of a file on that host (e.g. /proc/PID/map_files/...: as it was loaded)


def local_view(pid: int) -> ProcView:
    def stat(path: str) -> tuple[int, int] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    return ProcView(procs.held_files(pid), procs.environ(pid), stat, sha_of)


def remote_view(rem: remote.Remote, pid: int, paths: list[str]) -> ProcView:
    got = rem.probe(pid, paths)
    stats = got["stat"]

    def stat(path: str) -> tuple[int, int] | None:
        s = stats.get(path)
        return (s[0], s[1]) if s else None

    def sha(path: str) -> str:
        try:
            return rem.sha256([path]).get(path, "unreadable")
        except remote.RemoteError:
            return "unreadable"

    return ProcView(got["held"], got["environ"], stat, sha)


def effective_problem(st: ServiceState, unit: Unit, pid: int, view: ProcView | None = None) -> str | None:
    """What the live local process holds and runs with, against its intended identity, field by field: every
    declared file with `held` must be open or mapped by it as this very file (same inode, not replaced since),
    every model file of its argv it holds must not have been replaced on disk since it loaded, and each
    declared env variable must have the intended value (compared by hash; values are never recorded). Every
    difference is named, joined by '; '."""
    v = view or local_view(pid)
    held = v.held
    out: list[str] = []
    by_inode = {(h["dev"], h["inode"]): h for h in held}
    for f in st.get("files") or []:
        real = f.get("real_path")
        now = v.stat(real) if real else None
        mine = by_inode.get(now) if now else None
        if mine is not None and not mine["replaced"]:
            continue
        same_name = [h for h in held if real and h["path"] == real]
        if same_name:  # held, but the path now names another file: it loaded the old one
            out.append(
                f"files {f['path']}: intended sha256 {f['sha256'][:16]}…, pid {pid} holds the file that path "
                f"named when it loaded, sha256 {v.sha256(same_name[0]['via'])[:16]}… (replaced on disk since)"
            )
        elif f.get("held"):
            ext = Path(real or f["path"]).suffix
            others = [h for h in held if ext and h["path"].endswith(ext)]
            what = (
                ", it holds " + ", ".join(f"{h['path']} (sha256 {v.sha256(h['via'])[:16]}…)" for h in others[:3])
                if others
                else f", it holds no {ext or 'such'} file"
            )
            out.append(f"files {f['path']}: intended sha256 {f['sha256'][:16]}…, not open or mapped by pid {pid}{what}")
    for m in st.get("model_files") or []:
        real = str((Path(st.get("cwd") or "/") / m["path"]).resolve())
        stale = [h for h in held if h["path"] == real and h["replaced"]]
        if stale:
            out.append(
                f"{m['option']} {m['path']}: intended sha256 {m['sha256'][:16]}…, pid {pid} maps the file that "
                f"path named when it loaded, sha256 {v.sha256(stale[0]['via'])[:16]}… (replaced on disk since)"
            )
    want = st.get("env_sha256") or {}
    if want:
        have = v.environ
        if have is not None:
            for k, h in want.items():
                got = value_hash(have[k]) if k in have else None
                if got != h:
                    out.append(
                        f"env {k}: intended sha256 {h}, pid {pid} runs with " + (f"sha256 {got}" if got else "it unset")
                    )
    return "; ".join(out) or None


def _cmdline(st: ServiceState, pid: int) -> list[str] | None:
    rem = remote_of(st)
    if rem is None:
        return procs.cmdline(pid)
    try:
        return rem.cmdline(pid)
    except remote.RemoteError:
        return None


def terminate(st: ServiceState) -> bool:
    """Stop the recorded process (locally or over SSH); False when none is recorded or it was already gone."""
    proc = st.get("proc")
    if not proc:
        return False
    rem = remote_of(st)
    return procs.terminate(proc) if rem is None else rem.terminate(proc)


def owner_problem(case: Case, unit: Unit, pid: int) -> str | None:
    """None when every route port of the process is listened on by `pid` (or its session); else what is wrong.
    The health check alone cannot tell our service from another one on the same port."""
    for r in unit.routes:
        host, port = host_port(case.target.endpoints[r].base_url)
        ours, owners = procs.owns_port(pid, port)
        if not ours:
            who = f"pid {', '.join(str(o) for o in sorted(owners))}" if owners else "no process visible on this host"
            return f"{host}:{port} is served by {who}, not by the service caseledger started (pid {pid})"
    return None


def health_ok(url: str, timeout: float = 2.0, client: httpx.Client | None = None) -> bool:
    try:
        r = client.get(url, timeout=timeout) if client is not None else net.get(url, timeout=timeout)
        return r.status_code == 200
    except httpx.HTTPError:
        return False


class HealthWait:
    """Probing a starting service's health until it answers: one HTTP client for the whole wait (a new one per
    probe would also cost a round of connection set-up each time, while vLLM compiles for two minutes), probes every
    0.1 s at first, backing off to every 0.5 s (a slow start is found at most 0.5 s late)."""

    def __init__(self, url: str) -> None:
        self.url, self.t0 = url, time.monotonic()
        self.client = net.client()

    def ok(self) -> bool:
        return health_ok(self.url, timeout=1.0, client=self.client)

    def pause(self) -> None:
        time.sleep(min(0.5, 0.1 + (time.monotonic() - self.t0) / 20))

    def __enter__(self) -> HealthWait:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()


def stop(ws: Workspace, key: str) -> bool:
    """Stop the service this workspace keeps on `key` (True when a live process was stopped). One it reuses from
    the workspace that keeps it (`kept_by`) is left running: only its record here is dropped."""
    st = read_state(ws, key)
    if not st or not st.get("proc"):
        return False
    if st.get("kept_by"):
        st["proc"] = None
        write_json(state_path(ws, key), st)
        return False
    try:
        stopped = terminate(st)
    except remote.RemoteError as e:  # keep the ref: the process may still run on an unreachable host
        st["stop_error"] = str(e)
        write_json(state_path(ws, key), st)
        return False
    keepers.forget(key, st["proc"])
    st["stopped_utc"] = utc_now()
    st["proc"] = None
    write_json(state_path(ws, key), st)
    return stopped


def stop_all(ws: Workspace) -> list[str]:
    """Stop every service this workspace keeps: those in its ledger, then any process the host-wide record says it
    started that its ledger no longer names (a ledger deleted or replaced: pid and start time still prove it)."""
    out = []
    if ws.services_dir.exists():
        for p in ws.services_dir.glob("*.json"):
            if stop(ws, p.stem):
                out.append(p.stem)
    for k in keepers.kept_by(ws):
        if procs.elsewhere(k["proc"]):
            continue  # on another host: its ledger record spoke for it above (stopped, or its stop_error kept)
        if procs.alive(k["proc"]) and procs.terminate(k["proc"]):
            out.append(k["key"])
        keepers.forget(k["key"], k["proc"])
    return out
