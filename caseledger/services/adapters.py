"""Service adapters: bring the target to the case's identity and read back what actually runs.

reference: the embedded reference target (`python -m caseledger.target serve`), started detached.
command:   an argv from the case, started locally or, with service.ssh, on another host over SSH (remote.py);
           the effective argv is read back from /proc (on the host that runs it) and compared.
external:  an already-running endpoint; probed, never started or stopped.

Every launch is an argv list, never a shell string: case fields must not become shell syntax.
The live service started by caseledger on a target is recorded in ledger/services/<target_key>.json
so a later run can reuse it (same identity) instead of restarting it and losing warm caches. A remote service's
record carries its SSH login (paths only) and its proc ref names the SSH host, so liveness, read-back and stop go
through remote.py for it (procs.alive answers False for another host).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2 as httpx
import orjson

from caseledger import procs, redact
from caseledger.case.model import ENV_REF, SSH, Case, FileRef, health_url_of, origin
from caseledger.case.plan import argv_options
from caseledger.errors import FailureClass, PhaseFailed, quoted
from caseledger.ledger.evidence import ComponentRecord, ServiceRecord
from caseledger.load.client import api_key_of, auth_header, refuse_auth
from caseledger.procs import INHERITED_ENV, INHERITED_ENV_PREFIXES
from caseledger.services import remote
from caseledger.workspace import (
    Workspace,
    canonical_json,
    read_json_or_none,
    sha256_bytes,
    sha256_file,
    utc_now,
    write_json,
)


def host_port(base_url: str) -> tuple[str, int]:
    u = urlsplit(base_url)
    return u.hostname or "127.0.0.1", u.port or (443 if u.scheme == "https" else 80)


@dataclass(frozen=True)
class Unit:
    """One process caseledger starts, verifies, reuses and repairs on its own: a component of
    service.components, or (name '') the single process of service.argv."""

    name: str
    role: str
    argv: tuple[str, ...]  # as written in the case (placeholders unfilled)
    env: Mapping[str, str]
    ssh: SSH | None
    routes: tuple[int, ...]  # endpoints it serves (port held by it); the single process: route 0
    health_url: str
    health_timeout_s: float
    files: tuple[FileRef, ...] = ()

    def key(self, target_key: str) -> str:
        """Its record under ledger/services: the target's key, plus '.<name>' for a component."""
        return f"{target_key}.{self.name}" if self.name else target_key

    @property
    def label(self) -> str:
        return f"component '{self.name}' ({self.role})" if self.name else "the service"


def units(case: Case) -> list[Unit]:
    """The processes of the case's service, in start order."""
    eps = case.target.endpoints
    sv = case.service
    if not sv.components:
        return [Unit("", "service", tuple(sv.argv), sv.env, sv.ssh, (0,),
                     sv.health_url or health_url_of(eps[0].base_url), sv.health_timeout_s)]
    return [Unit(c.name, c.role, tuple(c.argv), c.env, c.ssh, tuple(c.routes),
                 c.health_url or health_url_of(eps[c.routes[0]].base_url), c.health_timeout_s, tuple(c.files))
            for c in sv.components]


def intended_argv(case: Case, unit: Unit | None = None) -> list[str]:
    u = unit or units(case)[0]
    route = case.target.endpoints[u.routes[0]] if u.routes else None
    if case.service.adapter == "reference":
        host, port = host_port(case.target.endpoints[0].base_url)
        cfg = canonical_json(case.service.reference.model_dump(mode="json")).decode()
        return [sys.executable, "-m", "caseledger.target", "serve", "--host", host, "--port", str(port),
                "--model", case.target.endpoints[0].model, "--config-json", cfg]
    if case.service.adapter == "command":
        fill: dict[str, str] = {}
        if route is not None:
            host, port = host_port(route.base_url)
            fill = {"{host}": host, "{port}": str(port), "{model}": route.model}
        spec = case.service.speculative
        if spec is not None:  # {draft_model}, {spec_type}, {draft_max}: the case validates each is set where used
            fill.update({"{" + k + "}": str(v) for k, v in spec.model_dump().items() if v is not None})
        out = []
        for arg in u.argv:
            filled = arg
            for k, v in fill.items():
                filled = filled.replace(k, v)
            out.append(filled)
        return out
    return []


# Options naming a model file or directory, whose content hash joins the service identity (llama.cpp: target and
# draft; vLLM: --model DIR).
MODEL_FILE_OPTIONS = ("-m", "--model", "-md", "--model-draft", "--spec-draft-model")
_HASHES_FILE = "file-hashes.json"


def model_files(ws: Workspace, case: Case, unit: Unit | None = None) -> list[dict[str, Any]]:
    """Model files named in a local command adapter's argv (MODEL_FILE_OPTIONS), with their sha256; an option
    naming a directory (vLLM's --model DIR) stands for every regular file directly in it (weights, config,
    tokenizer, chat template), each listed as DIR/NAME.

    Hashes are cached under ledger/services by path, size, mtime and inode, so a 250 MB model is read once,
    not at every run. A remote process's files are not read (empty list)."""
    u = unit or units(case)[0]
    if case.service.adapter != "command" or u.ssh is not None:
        return []
    out: list[dict[str, Any]] = []
    with _HashCache(ws) as cache:
        for opt, value in itertools.pairwise(intended_argv(case, u)):
            if opt not in MODEL_FILE_OPTIONS:
                continue
            path = ws.root / value  # relative paths are in the workspace, where the process starts
            named: list[tuple[str, Path]] = []
            if path.is_file():
                named = [(value, path)]
            elif path.is_dir():
                named = [(f"{value.rstrip('/')}/{p.name}", p) for p in sorted(path.iterdir())
                         if p.is_file() and not p.name.startswith(".")]
            out += [{"option": opt, "path": v, "bytes": p.stat().st_size, "sha256": cache.sha256(p)} for v, p in named]
    return out


def defining_files(ws: Workspace, unit: Unit) -> list[dict[str, Any]]:
    """A component's declared files (weights, layout, config): the pinned hash, or the file's hash on disk
    (local components; relative paths are in the workspace). A pinned hash the file on disk does not have is
    marked 'disk_sha256', and the service phase refuses it before any start."""
    out: list[dict[str, Any]] = []
    if unit.ssh is not None and unit.files:
        return _remote_defining_files(ws, unit, unit.ssh)
    with _HashCache(ws) as cache:
        for f in unit.files:
            row: dict[str, Any] = {"path": f.path, "sha256": f.sha256, "held": f.held}
            if unit.ssh is None:
                path = ws.root / f.path if not Path(f.path).is_absolute() else Path(f.path)
                if not path.is_file():
                    raise PhaseFailed(f"{unit.label}: files path {quoted(f.path)} is not a file on this host",
                                      FailureClass.SERVICE, "fix service.components[].files in a new case")
                disk = cache.sha256(path)
                row["real_path"] = str(path.resolve())
                if f.sha256 is None:
                    row["sha256"] = disk
                elif disk != f.sha256:
                    row["disk_sha256"] = disk
            out.append(row)
    return out


def _remote_defining_files(ws: Workspace, unit: Unit, ssh: SSH) -> list[dict[str, Any]]:
    """defining_files for a component on another host: stat there, sha256sum there for files whose stat the
    cache has not seen (a multi-GB weights file is hashed once, not at every run)."""
    rem = remote.Remote(ssh)
    paths = [f.path for f in unit.files]
    try:
        stats = rem.probe(0, paths)["stat"]  # pid 0: no process, only the paths' stat
        with _HashCache(ws) as cache:
            keys = {p: f"ssh://{ssh.user}@{ssh.host}:{ssh.port}{p}" for p in paths}
            missing = [p for p in paths if stats.get(p) is not None and cache.get(keys[p], stats[p]) is None]
            for p, digest in rem.sha256(missing).items():
                cache.put(keys[p], stats[p], digest)
            hashes = {p: cache.get(keys[p], stats.get(p)) for p in paths}
    except remote.RemoteError as e:
        raise PhaseFailed(f"{unit.label}: cannot read its files on {ssh.host}: {e.message}", FailureClass.SERVICE,
                          e.fix) from None
    out: list[dict[str, Any]] = []
    for f in unit.files:
        disk = hashes.get(f.path)
        if disk is None:
            raise PhaseFailed(f"{unit.label}: files path {quoted(f.path)} is not a readable file on {ssh.host}",
                              FailureClass.SERVICE, "fix service.components[].files in a new case")
        row: dict[str, Any] = {"path": f.path, "sha256": f.sha256 or disk, "held": f.held, "real_path": f.path}
        if f.sha256 is not None and disk != f.sha256:
            row["disk_sha256"] = disk
        out.append(row)
    return out


class _HashCache:
    """sha256 of files cached in ledger/services/file-hashes.json by real path, size, mtime and inode."""

    def __init__(self, ws: Workspace) -> None:
        self.path = ws.services_dir / _HASHES_FILE
        self.data: dict[str, Any] = {}
        self.changed = False

    def __enter__(self) -> _HashCache:
        self.data = read_json_or_none(self.path) or {}
        return self

    def __exit__(self, *exc: object) -> None:
        if self.changed:
            write_json(self.path, self.data)

    def sha256(self, path: Path) -> str:
        real = str(path.resolve())
        st = path.stat()
        key = [st.st_size, st.st_mtime_ns, st.st_ino]
        hit = self.get(real, key)
        if hit is None:
            hit = sha256_file(path)
            self.put(real, key, hit)
        return hit

    def get(self, name: str, stat: list[int] | None) -> str | None:
        hit = self.data.get(name)
        return str(hit["sha256"]) if stat is not None and isinstance(hit, dict) and hit.get("stat") == stat else None

    def put(self, name: str, stat: list[int] | None, digest: str) -> None:
        self.data[name] = {"stat": stat, "sha256": digest}
        self.changed = True


def base_env() -> dict[str, str]:
    """The caller's harmless variables (procs.INHERITED_ENV, LC_*), nothing else."""
    return {k: v for k, v in os.environ.items() if k in INHERITED_ENV or k.startswith(INHERITED_ENV_PREFIXES)}


def resolve_env(case: Case, unit: Unit | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """(env for the child, what may be recorded: references stay references, values of refs never copied).

    The child gets base_env() plus exactly the case's service.env; the reference target also gets PYTHONPATH
    pointing at this package, so `python -m caseledger.target` imports this checkout (it is caseledger's
    own code, not the caller's setting)."""
    own, shown = case_env(case, unit)
    env = base_env()
    if case.service.adapter == "reference":
        env["PYTHONPATH"] = procs.PKG_PARENT
    return {**env, **own}, shown


def case_env(case: Case, unit: Unit | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """Only the case's variables, references resolved (a remote service gets these, not the controller's env)."""
    env: dict[str, str] = {}
    shown: dict[str, str] = {}
    for k, v in (unit or units(case)[0]).env.items():
        m = ENV_REF.fullmatch(v)
        if m:
            if m.group(1) not in os.environ:
                raise PhaseFailed(f"service.env.{k} references ${{{m.group(1)}}}, which is not set",
                                  FailureClass.SERVICE, f"export {m.group(1)} in the environment that starts the run")
            env[k] = os.environ[m.group(1)]
        else:
            env[k] = v
        shown[k] = v
    return env, shown


def compare_argv(intended: list[str], effective: list[str]) -> str | None:
    """None when equal in options; else which argument differs (e.g. an appended override)."""
    if intended == effective:
        return None
    a, b = argv_options(intended), argv_options(effective)
    da: dict[str, list[str | None]] = {}
    db: dict[str, list[str | None]] = {}
    for k, v in a:
        da.setdefault(k, []).append(v)
    for k, v in b:
        db.setdefault(k, []).append(v)
    for k in sorted(set(da) | set(db)):
        if da.get(k) != db.get(k):
            name = k or "(positional)"
            if k not in da:
                return f"effective argv adds {name} {db[k][-1] or ''}".strip() + " (not in the intended argv)"
            if k not in db:
                return f"effective argv lacks {name} {da[k][-1] or ''}".strip()
            return f"{name}: intended {da[k][-1]!r}, effective {db[k][-1]!r}"
    return None


def _state_path(ws: Workspace, key: str) -> Path:
    return ws.services_dir / f"{key}.json"


def _remote_of(st: dict[str, Any]) -> remote.Remote | None:
    """The SSH login of a recorded service, or None for a local one."""
    return remote.Remote(SSH.model_validate(st["ssh"])) if st.get("ssh") else None


def _proc_alive(st: dict[str, Any]) -> bool:
    rem = _remote_of(st)
    if rem is None:
        return procs.alive(st["proc"])
    try:
        return rem.alive(st["proc"])
    except remote.RemoteError:
        return False  # unreachable counts as not live here; a start then fails on the same connection, named


def live_service(ws: Workspace, key: str) -> dict[str, Any] | None:
    st = read_json_or_none(_state_path(ws, key))
    if st and st.get("proc") and _proc_alive(st):
        return dict(st)
    return None


def live_state(ws: Workspace, case: Case, key: str) -> tuple[bool, bool]:
    """(this case's service is live on the target, it was warmed and its routes verified since it started):
    what a run's plan is derived from at start_run, by the same check the service phase reuses it on
    (identity, then _verify), for every component; no request is sent."""
    if case.service.adapter == "external":
        return False, False
    warm = True
    for u in units(case):
        st = read_json_or_none(_state_path(ws, u.key(key))) or {}
        try:
            want = _intended_identity(ws, case, u)
        except PhaseFailed:  # a declared file is missing: the service phase names it
            return False, False
        if st.get("identity") != want or _verify(st, case, u)[0] is not None:
            return False, False
        warm = warm and bool(st.get("warmed_by"))
    return True, warm


def mark_warm(ws: Workspace, key: str, evidence: ServiceRecord, run_id: str) -> None:
    """Record that run_id warmed the service instances of this service evidence (every component) and verified
    their routes (a restart forgets it)."""
    for comp in evidence.processes:
        path = _state_path(ws, comp.key if isinstance(comp, ComponentRecord) else key)
        st = read_json_or_none(path) or {}
        if comp.pid is not None and (st.get("proc") or {}).get("pid") == comp.pid:
            st["warmed_by"] = run_id
            write_json(path, st)


def check_live(ws: Workspace, case: Case, key: str) -> str | None:
    """None when every process recorded for this target is still the case's (see _verify); else what is
    wrong. External endpoints are not ours to check beyond their health (route verification covers them)."""
    if case.service.adapter == "external":
        return None
    for u in units(case):
        problem = _verify(read_json_or_none(_state_path(ws, u.key(key))) or {}, case, u)[0]
        if problem is not None:
            return f"{u.name}: {problem}" if u.name else problem
    return None


def _verify(st: dict[str, Any], case: Case, unit: Unit) -> tuple[str | None, list[str]]:
    """(problem or None, effective argv) of a recorded process: pid and start time alive, the argv read back
    unchanged, health answering, (locally) the routes' ports held by it, and the files and environment it
    really runs with as recorded at its start (see _effective_problem). The one check behind reuse, the plan's
    live state and the re-verification before and after the formal load."""
    proc = st.get("proc")
    if not proc:
        return "no live service is recorded for this target", []
    pid = int(proc["pid"])
    if not _proc_alive(st):
        return f"the service (pid {pid}) is gone", []
    if _remote_of(st) is None and procs.stopped(st["proc"]):
        return f"the service (pid {pid}) is stopped (SIGSTOP): alive but doing no work", []
    eff = _cmdline(st) or []
    diff = compare_argv(intended_argv(case, unit), eff)
    if diff is not None:
        return f"the service (pid {pid}) runs another argv: {diff}", eff
    if not health_ok(unit.health_url):
        return f"the service (pid {pid}) does not answer health at {unit.health_url}", eff
    rem = _remote_of(st)
    if rem is None:
        return _owner_problem(case, unit, pid) or _effective_problem(st, unit, pid), eff
    if not (st.get("files") or st.get("env_sha256")):
        return None, eff  # nothing more to read back (no extra SSH round trip)
    try:
        view = _remote_view(rem, pid, [f["real_path"] for f in st.get("files") or []])
    except remote.RemoteError as e:
        return f"cannot read the service (pid {pid}) back on {rem.ssh.host}: {e.message}", eff
    return _effective_problem(st, unit, pid, view), eff


@dataclass(frozen=True)
class _ProcView:
    """What one process holds and runs with, read on its own host (procs locally, one SSH script remotely)."""

    held: list[procs.HeldFile]
    environ: dict[str, str] | None
    stat: Callable[[str], tuple[int, int] | None]  # (dev, inode) a path names now on that host
    sha256: Callable[[str], str]  # hash of a file on that host (e.g. /proc/PID/map_files/...: as it was loaded)


def _local_view(pid: int) -> _ProcView:
    def stat(path: str) -> tuple[int, int] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    return _ProcView(procs.held_files(pid), procs.environ(pid), stat, _sha_of)


def _remote_view(rem: remote.Remote, pid: int, paths: list[str]) -> _ProcView:
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

    return _ProcView(got["held"], got["environ"], stat, sha)


def _effective_problem(st: dict[str, Any], unit: Unit, pid: int, view: _ProcView | None = None) -> str | None:
    """What the live local process holds and runs with, against its intended identity, field by field: every
    declared file with `held` must be open or mapped by it as this very file (same inode, not replaced since),
    every model file of its argv it holds must not have been replaced on disk since it loaded, and each
    declared env variable must have the intended value (compared by hash; values are never recorded). Every
    difference is named, joined by '; '."""
    v = view or _local_view(pid)
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
            out.append(f"files {f['path']}: intended sha256 {f['sha256'][:16]}…, pid {pid} holds the file that path "
                       f"named when it loaded, sha256 {v.sha256(same_name[0]['via'])[:16]}… (replaced on disk since)")
        elif f.get("held"):
            ext = Path(real or f["path"]).suffix
            others = [h for h in held if ext and h["path"].endswith(ext)]
            what = ", it holds " + ", ".join(f"{h['path']} (sha256 {v.sha256(h['via'])[:16]}…)" for h in others[:3]) \
                if others else f", it holds no {ext or 'such'} file"
            out.append(f"files {f['path']}: intended sha256 {f['sha256'][:16]}…, not open or mapped by pid {pid}{what}")
    for f in st.get("model_files") or []:
        real = str((Path(st.get("cwd") or "/") / f["path"]).resolve())
        stale = [h for h in held if h["path"] == real and h["replaced"]]
        if stale:
            out.append(f"{f['option']} {f['path']}: intended sha256 {f['sha256'][:16]}…, pid {pid} maps the file that "
                       f"path named when it loaded, sha256 {v.sha256(stale[0]['via'])[:16]}… (replaced on disk since)")
    want = st.get("env_sha256") or {}
    if want:
        have = v.environ
        if have is not None:
            for k, h in want.items():
                got = _value_hash(have[k]) if k in have else None
                if got != h:
                    out.append(f"env {k}: intended sha256 {h}, pid {pid} runs with "
                               + (f"sha256 {got}" if got else "it unset"))
    return "; ".join(out) or None


def _value_hash(value: str) -> str:
    return sha256_bytes(value.encode())[:12]


def _sha_of(path: str) -> str:
    try:
        return sha256_file(Path(path))
    except OSError:
        return "unreadable"


def engine_version(unit: Unit) -> str | None:
    """The engine's version as its HTTP API reports it (llama.cpp /props build_info, vLLM /version, SGLang
    /get_server_info version), read once at start and recorded with the process; None when none answers."""
    base = origin(unit.health_url)
    for path, field in (("/props", "build_info"), ("/version", "version"), ("/get_server_info", "version")):
        try:
            r = httpx.get(base + path, timeout=1.0)
            if r.status_code == 200:
                value = r.json().get(field)
                if value:
                    return f"{quoted(value, 120)} ({path})"
        except (httpx.HTTPError, ValueError, AttributeError):
            continue
    return None


def _cmdline(st: dict[str, Any]) -> list[str] | None:
    rem = _remote_of(st)
    pid = int(st["proc"]["pid"])
    if rem is None:
        return procs.cmdline(pid)
    try:
        return rem.cmdline(pid)
    except remote.RemoteError:
        return None


def _terminate(st: dict[str, Any]) -> bool:
    rem = _remote_of(st)
    return procs.terminate(st["proc"]) if rem is None else rem.terminate(st["proc"])


def identity_of(case: Case, files: list[dict[str, Any]] | None = None, unit: Unit | None = None,
                defines: list[dict[str, Any]] | None = None) -> str:
    """The intended identity of one process; `files` (model_files) adds each model file's option and sha256,
    `defines` (defining_files) each declared file's path and sha256."""
    u = unit or units(case)[0]
    body: dict[str, Any] = {
        "adapter": case.service.adapter,
        "argv": intended_argv(case, u)[1:] if case.service.adapter == "reference" else intended_argv(case, u),
        "env": dict(u.env), "endpoints": [e.model_dump() for e in case.target.endpoints]}
    if files:  # the same argv over other weights is another service
        body["files"] = [{"option": f["option"], "sha256": f["sha256"]} for f in files]
    if u.ssh is not None:  # the same argv on another host is another service (local identities are unchanged)
        body["ssh"] = {"host": u.ssh.host, "port": u.ssh.port, "user": u.ssh.user}
    if u.name:  # a component (single-process identities are unchanged)
        body["component"] = {"name": u.name, "role": u.role, "routes": list(u.routes)}
        body["defines"] = [{"path": f["path"], "sha256": f["sha256"]} for f in defines or []]
    return "s-" + sha256_bytes(canonical_json(body))[:12]


def _intended_identity(ws: Workspace, case: Case, unit: Unit) -> str:
    return identity_of(case, model_files(ws, case, unit), unit, defining_files(ws, unit))


def _owner_problem(case: Case, unit: Unit, pid: int) -> str | None:
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
        r = client.get(url, timeout=timeout) if client is not None else httpx.get(url, timeout=timeout)
        return r.status_code == 200
    except httpx.HTTPError:
        return False


class HealthWait:
    """Probing a starting service's health until it answers: one HTTP client for the whole wait (a new one per
    probe builds an SSL context each time: a third of a core while vLLM compiles for two minutes), probes every
    0.1 s at first, backing off to every 0.5 s (a slow start is found at most 0.5 s late)."""

    def __init__(self, url: str) -> None:
        self.url, self.t0 = url, time.monotonic()
        self.client = httpx.Client()

    def ok(self) -> bool:
        return health_ok(self.url, timeout=1.0, client=self.client)

    def pause(self) -> None:
        time.sleep(min(0.5, 0.1 + (time.monotonic() - self.t0) / 20))

    def __enter__(self) -> HealthWait:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()


def stop(ws: Workspace, key: str) -> bool:
    st = read_json_or_none(_state_path(ws, key))
    if not st or not st.get("proc"):
        return False
    try:
        stopped = _terminate(st)
    except remote.RemoteError as e:  # keep the ref: the process may still run on an unreachable host
        st["stop_error"] = str(e)
        write_json(_state_path(ws, key), st)
        return False
    st["stopped_utc"] = utc_now()
    st["proc"] = None
    write_json(_state_path(ws, key), st)
    return stopped


def stop_all(ws: Workspace) -> list[str]:
    out = []
    if ws.services_dir.exists():
        for p in ws.services_dir.glob("*.json"):
            if stop(ws, p.stem):
                out.append(p.stem)
    return out


def ensure(ws: Workspace, case: Case, key: str, case_id: str, allow_start: bool) -> ServiceRecord:
    """Bring the target to the case's service identity, process by process: a live process with its identity
    is kept (its warm caches with it), any other is (re)started. Returns the evidence (outcome reused|done);
    with components, one record per component and the routes whose processes changed."""
    if case.service.adapter == "external":
        return _external(case, identity_of(case))
    us = units(case)
    if not us[0].name:
        return _ensure_unit(ws, case, us[0], key, case_id, allow_start)
    comps = []
    for u in us:  # in list order, each healthy before the next (a router after its workers)
        ev = _ensure_unit(ws, case, u, u.key(key), case_id, allow_start)
        comps.append(ComponentRecord(name=u.name, role=u.role, key=u.key(key), routes=list(u.routes),
                                     **ev.model_dump(exclude_unset=True)))
    restarted = [c.name for c in comps if c.outcome != "reused"]
    every = range(len(case.target.endpoints))
    changed = sorted({r for c in comps if c.outcome != "reused" for r in (c.routes or every)})
    return ServiceRecord(outcome="reused" if not restarted else "done",
                         identity="s-" + sha256_bytes(canonical_json([c.identity for c in comps]))[:12],
                         components=comps, restarted=restarted,
                         reused=[c.name for c in comps if c.outcome == "reused"], changed_routes=changed,
                         verified_by="each component: live process cmdline, held files, env + health")


def _ensure_unit(ws: Workspace, case: Case, u: Unit, key: str, case_id: str, allow_start: bool) -> ServiceRecord:
    files = model_files(ws, case, u)
    defines = defining_files(ws, u)
    bad = next((f for f in defines if "disk_sha256" in f), None)
    if bad is not None:
        raise PhaseFailed(f"{u.label}: files {quoted(bad['path'])} hashes to {bad['disk_sha256'][:16]}… on disk, the "
                          f"case pins {bad['sha256'][:16]}…", FailureClass.SERVICE,
                          "put the pinned file in place, or freeze a case pinning the file on disk")
    want = identity_of(case, files, u, defines)
    live = live_service(ws, key)
    intended = intended_argv(case, u)
    if live and live.get("identity") == want:
        problem, eff = _verify(live, case, u)
        if problem is None:
            return ServiceRecord(outcome="reused", identity=want, intended_argv=intended, effective_argv=eff,
                                 model_files=files, pid=live["proc"]["pid"], starts=live.get("starts", 1),
                                 **_effective_evidence(live), verified_by="live process cmdline + health",
                                 **_where(live))
    if not allow_start:
        raise PhaseFailed(f"no live process with {u.label}'s identity and authorization forbids a service change",
                          FailureClass.SERVICE, "caseledger authorize single (or auto), then resume")
    if live:
        try:
            _terminate(live)
        except remote.RemoteError as e:
            raise PhaseFailed(f"cannot stop the previous service: {e.message}", FailureClass.SERVICE, e.fix) from None
    if health_ok(u.health_url, timeout=0.5):
        raise PhaseFailed(f"{u.health_url} already answers health but is not a service caseledger started",
                          FailureClass.SERVICE, "stop that process or use adapter 'external' for it")
    if u.ssh is not None:
        try:
            return _start_remote(ws, case, u, u.ssh, key, case_id, want, intended, defines)
        except remote.RemoteError as e:
            raise PhaseFailed(e.message, FailureClass.SERVICE, e.fix) from None
    env, shown_env = resolve_env(case, u)
    log = ws.services_dir / f"{key}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as lf:
        try:
            p = subprocess.Popen(intended, stdin=subprocess.DEVNULL, stdout=lf, stderr=lf, env=env, cwd=ws.root,
                                 start_new_session=True, close_fds=True)
        except OSError as e:
            raise PhaseFailed(f"cannot start {u.label}: argv[0] {intended[0]!r}: {e}", FailureClass.SERVICE,
                              "fix service.argv in a new case") from None
    ref = {"pid": p.pid, "start_time": procs.start_time(p.pid) or 0, "host": procs.me()["host"]}
    state = _record_start(ws, key, case, case_id, ref, want, intended, shown_env, str(log),
                          model_files=files, files=defines, cwd=str(ws.root),
                          env_sha256={k: _value_hash(v) for k, v in env.items() if k in u.env})
    deadline = time.monotonic() + u.health_timeout_s
    healthy = False
    with HealthWait(u.health_url) as health:
        while time.monotonic() < deadline:
            if p.poll() is not None:
                tail = log.read_bytes()[-400:].decode(errors="replace").strip().splitlines()[-1:] or [""]
                # the engine's own log line: outside text, the values of the case's secrets masked
                raise PhaseFailed(f"{u.label} exited with code {p.returncode} before health: "
                                  f"{redact.mask(tail[0])}", FailureClass.SERVICE,
                                  f"read {log}; fix the case's service and resume")
            if health.ok():
                healthy = True
                break
            health.pause()
    if not healthy:
        procs.terminate(ref)
        raise PhaseFailed(f"{u.label} not healthy at {u.health_url} after {u.health_timeout_s}s",
                          FailureClass.SERVICE, "raise the health timeout or check the service log")
    problem = _owner_problem(case, u, p.pid)
    if problem is not None:  # health answered, but from someone else's process: ours lost the port
        procs.terminate(ref)
        raise PhaseFailed(problem, FailureClass.SERVICE,
                          "another process serves this port: stop it, or give this case another port; "
                          "caseledger never measures a process it did not start")
    eff = _confirm_argv(ws, key, state, procs.cmdline(p.pid) or [], lambda: procs.terminate(ref), "")
    _confirm_effective(ws, key, state, u, p.pid, _local_view(p.pid), lambda: procs.terminate(ref), "")
    return ServiceRecord(outcome="done", identity=want, intended_argv=intended, effective_argv=eff,
                         model_files=files, pid=p.pid, starts=state["starts"], **_effective_evidence(state),
                         verified_by="live process cmdline + health", env=shown_env)


def _effective_evidence(st: dict[str, Any]) -> dict[str, Any]:
    """The effective identity a component's evidence shows besides its argv: declared files (hash, held), env
    value hashes, engine version. Nothing for the single-process form without declared files."""
    out: dict[str, Any] = {}
    if st.get("files"):
        out["files"] = [{k: f[k] for k in ("path", "sha256", "held")} for f in st["files"]]
    if st.get("env_sha256"):
        out["env_sha256"] = st["env_sha256"]
    if st.get("engine_version"):
        out["engine_version"] = st["engine_version"]
    return out


def _record_start(ws: Workspace, key: str, case: Case, case_id: str, ref: dict[str, Any], want: str,
                  intended: list[str], shown_env: dict[str, str], log: str, **extra: Any) -> dict[str, Any]:
    """Record a service caseledger just started on the target (local or remote), counting starts."""
    prev = read_json_or_none(_state_path(ws, key)) or {}
    state: dict[str, Any] = {
        "adapter": case.service.adapter, "proc": ref, **extra, "identity": want, "intended_argv": intended,
        "env": shown_env, "case_id": case_id, "started_utc": utc_now(), "starts": int(prev.get("starts", 0)) + 1,
        "log": log}
    write_json(_state_path(ws, key), state)
    return state


def _confirm_argv(ws: Workspace, key: str, state: dict[str, Any], eff: list[str], stop: Callable[[], object],
                  where: str) -> list[str]:
    """Record the effective argv read back from the live process; stop it and fail when it differs."""
    state["effective_argv"] = eff
    write_json(_state_path(ws, key), state)
    diff = compare_argv(state["intended_argv"], eff)
    if diff is not None:
        stop()
        raise PhaseFailed(f"effective service argv{where} differs from the intended one: {diff}", FailureClass.SERVICE,
                          "fix the launcher so the live process runs the case's argv (no appended overrides)")
    return eff


def _confirm_effective(ws: Workspace, key: str, state: dict[str, Any], u: Unit, pid: int, view: _ProcView,
                       stop: Callable[[], object], where: str) -> None:
    """Check the files and environment a just-started process really runs with (see _effective_problem); stop it
    and fail when they differ; record the engine's version."""
    problem = _effective_problem(state, u, pid, view)
    if problem is not None:  # it runs, but not with the files or environment the case says
        stop()
        raise PhaseFailed(f"{u.label} (pid {pid}{where}) differs from its intended identity: {problem}",
                          FailureClass.SERVICE, "fix the launcher or the case's files so the process loads what "
                          "the case declares; the process was stopped")
    state["engine_version"] = engine_version(u)
    write_json(_state_path(ws, key), state)


def _where(st: dict[str, Any]) -> dict[str, Any]:
    """Evidence of where a recorded service runs: nothing extra locally; host, login and host-key policy remotely."""
    if not st.get("ssh"):
        return {}
    ssh = SSH.model_validate(st["ssh"])
    return {"host": ssh.host, "ssh": ssh.model_dump(mode="json"),
            "host_key": f"verified against {ssh.known_hosts}" if ssh.known_hosts
            else "NOT verified (service.ssh.accept_unknown_host_key: true)"}


def _start_remote(ws: Workspace, case: Case, u: Unit, ssh: SSH, key: str, case_id: str, want: str,
                  intended: list[str], defines: list[dict[str, Any]]) -> ServiceRecord:
    """Launch a command-adapter process on ssh.host, wait for health, compare the effective argv."""
    key_file = Path(ssh.key_path).expanduser().resolve()
    if key_file.is_relative_to(ws.root.resolve()):
        raise PhaseFailed(f"service.ssh.key_path {ssh.key_path} lies inside the workspace", FailureClass.SERVICE,
                          "move the private key out of the workspace and point service.ssh.key_path at it")
    rem = remote.Remote(ssh)
    env, shown_env = case_env(case, u)
    log = remote.log_path(key)
    try:
        pid, started = rem.launch(intended, env, log)
    except remote.RemoteError as e:
        raise PhaseFailed(f"cannot start the service: {e.message}", FailureClass.SERVICE, e.fix) from None
    ref = {"pid": pid, "start_time": started, "host": ssh.host}  # another host: procs.alive says False
    state = _record_start(ws, key, case, case_id, ref, want, intended, shown_env, f"{ssh.user}@{ssh.host}:{log}",
                          ssh=ssh.model_dump(mode="json"), files=defines,
                          env_sha256={k: _value_hash(v) for k, v in env.items()})
    deadline = time.monotonic() + u.health_timeout_s
    next_probe = time.monotonic() + 0.5
    healthy = False
    with HealthWait(u.health_url) as health:
        while time.monotonic() < deadline:
            if health.ok():
                healthy = True
                break
            if time.monotonic() >= next_probe:  # each probe is a remote exec: about once a second
                if not rem.alive(ref):
                    tail = rem.tail(log).strip().splitlines()[-1:] or [""]
                    raise PhaseFailed(f"service on {ssh.host} exited before health: {redact.mask(tail[0])}",
                                      FailureClass.SERVICE,
                                      f"read {state['log']}; fix the case's service and resume")
                next_probe = time.monotonic() + 1.0
            health.pause()
    if not healthy:
        rem.terminate(ref)
        raise PhaseFailed(f"service on {ssh.host} not healthy at {u.health_url} after "
                          f"{u.health_timeout_s}s", FailureClass.SERVICE,
                          f"raise the health timeout or read {state['log']}")
    eff = _confirm_argv(ws, key, state, rem.cmdline(pid) or [], lambda: rem.terminate(ref), f" on {ssh.host}")
    _confirm_effective(ws, key, state, u, pid, _remote_view(rem, pid, [f["real_path"] for f in defines]),
                       lambda: rem.terminate(ref), f" on {ssh.host}")
    return ServiceRecord(outcome="done", identity=want, intended_argv=intended, effective_argv=eff, pid=pid,
                         starts=state["starts"], verified_by="remote /proc cmdline over ssh + health", env=shown_env,
                         **_effective_evidence(state), **_where(state))


def served_models(case: Case, k: int) -> list[str]:
    """The model ids route k's /models answers with (the case's key sent); PhaseFailed when it does not
    answer (service) or refuses the key (auth), or when the case's model is not among them."""
    ep = case.target.endpoints[k]
    try:
        r = httpx.get(ep.base_url.rstrip("/") + "/models", timeout=10, headers=auth_header(api_key_of(case)))
        refuse_auth(case, f"route {k} /models", [r.status_code])
        r.raise_for_status()
        ids = [m.get("id") for m in r.json().get("data", [])]
    except (httpx.HTTPError, ValueError) as e:
        raise PhaseFailed(f"route {k} ({ep.base_url}) does not answer /models: {quoted(e)}", FailureClass.SERVICE,
                          "start the service or fix target.endpoints") from None
    if ep.model not in ids:
        raise PhaseFailed(f"route {k} ({ep.base_url}) serves {quoted(ids)}, not '{ep.model}'", FailureClass.SERVICE,
                          "fix target.endpoints[].model or the routing")
    return ids


def _external(case: Case, want: str) -> ServiceRecord:
    seen = [{"base_url": ep.base_url, "models": served_models(case, k)} for k, ep in enumerate(case.target.endpoints)]
    ident_out = None
    if case.service.identity_command:
        env, _ = resolve_env(case)  # the same minimal environment as a launched service
        try:
            ident_out = redact.cut(subprocess.run(case.service.identity_command, capture_output=True, timeout=30,
                                                  env=env, check=True).stdout.decode(errors="replace"), 2000)
        except (OSError, subprocess.SubprocessError) as e:
            raise PhaseFailed(f"identity_command failed: {e}", FailureClass.SERVICE,
                              "fix service.identity_command") from None
    # over the masked output: a secret it printed is neither recorded nor hashed
    live = "s-" + sha256_bytes(orjson.dumps({"models": seen, "identity": ident_out}))[:12]
    return ServiceRecord(outcome="done", identity=want, live_identity=live, endpoints=seen, identity_output=ident_out,
                         verified_by="/v1/models probe" + (" + identity_command" if ident_out else ""))
