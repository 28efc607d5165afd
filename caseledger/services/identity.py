"""A service's intended identity, before anything runs: its processes (units), argv, environment, the files
that define it (hashed, cached by size, mtime and inode) and the identity hash of all of them; comparing an
intended argv with the one read back from a live process."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired

import httpx2 as httpx
from typing_extensions import TypedDict  # pydantic validates these (live.ServiceState) on Python 3.11

from caseledger import engines
from caseledger.case.model import Case
from caseledger.case.plan import argv_options
from caseledger.case.service import ENV_REF, SSH, FileRef
from caseledger.case.target import health_url_of, origin
from caseledger.errors import FailureClass, PhaseFailed, quoted
from caseledger.procs import INHERITED_ENV, INHERITED_ENV_PREFIXES
from caseledger.services import net, remote
from caseledger.services.kinds import adapter_of
from caseledger.workspace import (
    Workspace,
    canonical_json,
    read_json_or_none,
    sha256_bytes,
    sha256_file,
    write_json,
)


class ModelFile(TypedDict):
    """A model file named in a local command's argv (MODEL_FILE_OPTIONS), as its state file and evidence hold it."""

    option: str
    path: str
    bytes: int
    sha256: str


class DeclaredFile(TypedDict):
    """A component's declared file (service.components[].files) with the hash its identity uses."""

    path: str
    sha256: str  # the pinned hash, else the hash on disk
    held: bool  # the live process must hold it open or mapped
    real_path: NotRequired[str]  # the resolved path on the host that runs it
    disk_sha256: NotRequired[str]  # set when the file on disk is not the pinned one: the start is refused


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
        return [
            Unit(
                "",
                "service",
                tuple(sv.argv),
                sv.env,
                sv.ssh,
                (0,),
                sv.health_url or health_url_of(eps[0].base_url),
                sv.health_timeout_s,
            )
        ]
    return [
        Unit(
            c.name,
            c.role,
            tuple(c.argv),
            c.env,
            c.ssh,
            tuple(c.routes),
            c.health_url or health_url_of(eps[c.routes[0]].base_url),
            c.health_timeout_s,
            tuple(c.files),
        )
        for c in sv.components
    ]


def intended_argv(case: Case, unit: Unit | None = None) -> list[str]:
    """The argv the unit's process is started with (the case's adapter fills it in)."""
    u = unit or units(case)[0]
    route = case.target.endpoints[u.routes[0]] if u.routes else None
    return adapter_of(case).argv(case, u.argv, route)


# Options naming a model file or directory, whose content hash joins the service identity: every engine profile's
# (caseledger/engines), each read as `--opt v` and as `--opt=v`; the first positional after a serve word (`vllm
# serve DIR`, `trtllm-serve DIR`) is a model path too.
MODEL_FILE_OPTIONS = engines.weight_options()
SERVE_WORDS = engines.serve_words()


def weight_args(argv: list[str]) -> list[tuple[str, str]]:
    """(option, value) of every argument naming model weights in an argv, in every spelling: `--opt v`,
    `--opt=v`, and the positional path after a serve subcommand (reported as option 'serve')."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        opt, eq, value = a.partition("=")
        if eq and opt in MODEL_FILE_OPTIONS:
            out.append((opt, value))
        elif a in MODEL_FILE_OPTIONS and i + 1 < len(argv):
            out.append((a, argv[i + 1]))
            i += 1
        elif Path(a).name in SERVE_WORDS and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            out.append(("serve", argv[i + 1]))
            i += 1
        i += 1
    return out


_HASHES_FILE = "file-hashes.json"


def model_files(ws: Workspace, case: Case, unit: Unit | None = None) -> list[ModelFile]:
    """Model files named in a local command adapter's argv (MODEL_FILE_OPTIONS), with their sha256; an option
    naming a directory (vLLM's --model DIR) stands for every regular file directly in it (weights, config,
    tokenizer, chat template), each listed as DIR/NAME.

    Hashes are cached under ledger/services by path, size, mtime and inode, so a 250 MB model is read once,
    not at every run. A remote process's files are not read (empty list)."""
    u = unit or units(case)[0]
    if not adapter_of(case).reads_model_files(u.ssh is not None):
        return []
    out: list[ModelFile] = []
    with _HashCache(ws) as cache:
        for opt, value in weight_args(intended_argv(case, u)):
            path = ws.root / value  # relative paths are in the workspace, where the process starts
            named: list[tuple[str, Path]] = []
            if path.is_file():
                named = [(value, path)]
            elif path.is_dir():
                named = [
                    (f"{value.rstrip('/')}/{p.name}", p)
                    for p in sorted(path.iterdir())
                    if p.is_file() and not p.name.startswith(".")
                ]
            out += [{"option": opt, "path": v, "bytes": p.stat().st_size, "sha256": cache.sha256(p)} for v, p in named]
    return out


def defining_files(ws: Workspace, unit: Unit) -> list[DeclaredFile]:
    """A component's declared files (weights, layout, config): the pinned hash, or the file's hash on disk
    (local components; relative paths are in the workspace). A pinned hash the file on disk does not have is
    marked 'disk_sha256', and the service phase refuses it before any start."""
    out: list[DeclaredFile] = []
    if unit.ssh is not None and unit.files:
        return _remote_defining_files(ws, unit, unit.ssh)
    with _HashCache(ws) as cache:
        for f in unit.files:  # a local component here: a remote one with files returned above
            path = ws.root / f.path if not Path(f.path).is_absolute() else Path(f.path)
            if not path.is_file():
                raise PhaseFailed(
                    f"{unit.label}: files path {quoted(f.path)} is not a file on this host",
                    FailureClass.SERVICE,
                    "fix service.components[].files in a new case",
                )
            disk = cache.sha256(path)
            row: DeclaredFile = {
                "path": f.path,
                "sha256": f.sha256 or disk,
                "held": f.held,
                "real_path": str(path.resolve()),
            }
            if f.sha256 is not None and disk != f.sha256:
                row["disk_sha256"] = disk
            out.append(row)
    return out


def _remote_defining_files(ws: Workspace, unit: Unit, ssh: SSH) -> list[DeclaredFile]:
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
        raise PhaseFailed(
            f"{unit.label}: cannot read its files on {ssh.host}: {e.message}", FailureClass.SERVICE, e.fix
        ) from None
    out: list[DeclaredFile] = []
    for f in unit.files:
        disk = hashes.get(f.path)
        if disk is None:
            raise PhaseFailed(
                f"{unit.label}: files path {quoted(f.path)} is not a readable file on {ssh.host}",
                FailureClass.SERVICE,
                "fix service.components[].files in a new case",
            )
        row: DeclaredFile = {"path": f.path, "sha256": f.sha256 or disk, "held": f.held, "real_path": f.path}
        if f.sha256 is not None and disk != f.sha256:
            row["disk_sha256"] = disk
        out.append(row)
    return out


class _HashCache:
    """sha256 of files cached in ledger/services/file-hashes.json by real path, size, mtime and inode."""

    def __init__(self, ws: Workspace) -> None:
        self.path = ws.services_dir / _HASHES_FILE
        self.data: dict[str, Any] = {}  # JSON: the file: name -> {stat, sha256}, any version's entries kept
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
    return {**base_env(), **adapter_of(case).child_env(), **own}, shown


def case_env(case: Case, unit: Unit | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """Only the case's variables, references resolved (a remote service gets these, not the controller's env)."""
    env: dict[str, str] = {}
    shown: dict[str, str] = {}
    for k, v in (unit or units(case)[0]).env.items():
        m = ENV_REF.fullmatch(v)
        if m:
            if m.group(1) not in os.environ:
                raise PhaseFailed(
                    f"service.env.{k} references ${{{m.group(1)}}}, which is not set",
                    FailureClass.SERVICE,
                    f"export {m.group(1)} in the environment that starts the run",
                )
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


def value_hash(value: str) -> str:
    return sha256_bytes(value.encode())[:12]


def sha_of(path: str) -> str:
    try:
        return sha256_file(Path(path))
    except OSError:
        return "unreadable"


def engine_version(unit: Unit) -> tuple[str | None, str | None]:
    """The engine's version as its HTTP API reports it (each engine profile's endpoint and field, e.g. llama.cpp
    /props build_info, vLLM /version), read once at start and recorded with the process, and the path that
    answered; (None, None) when none answers."""
    base = origin(unit.health_url)
    for path, field in engines.version_endpoints():
        try:
            r = net.get(base + path, timeout=1.0)
            if r.status_code == 200:
                value = r.json().get(field)
                if value:
                    return f"{quoted(value, 120)} ({path})", path
        except (httpx.HTTPError, ValueError, AttributeError):
            continue
    return None, None


def metric_names(url: str | None) -> list[str]:
    """The sample names a /metrics page serves (Prometheus text); none when there is no page or it does not answer."""
    if url is None:
        return []
    try:
        r = net.get(url, timeout=1.0)
    except httpx.HTTPError:
        return []
    lines = r.text.splitlines() if r.status_code == 200 else []
    return [ln.split("{", 1)[0].split(" ", 1)[0] for ln in lines if ln and not ln.startswith("#")]


def engine_evidence(unit: Unit, effective_argv: list[str], metrics_url: str | None) -> tuple[str | None, str | None]:
    """(the engine's version, the engine detected: engines.detect over the effective argv, the version path that
    answered and, when neither tells, the /metrics names)."""
    version, path = engine_version(unit)
    found = engines.detect(effective_argv, path)
    return version, found or engines.detect([], None, metric_names(metrics_url))


def identity_of(
    case: Case,
    files: list[ModelFile] | None = None,
    unit: Unit | None = None,
    defines: list[DeclaredFile] | None = None,
) -> str:
    """The intended identity of one process; `files` (model_files) adds each model file's option and sha256,
    `defines` (defining_files) each declared file's path and sha256."""
    u = unit or units(case)[0]
    body: dict[str, Any] = {  # JSON: canonical, hashed: its keys are the identity's definition
        "adapter": case.service.adapter,
        "argv": adapter_of(case).identity_argv(intended_argv(case, u)),
        "env": dict(u.env),
        "endpoints": [e.model_dump() for e in case.target.endpoints],
    }
    if files:  # the same argv over other weights is another service
        body["files"] = [{"option": f["option"], "sha256": f["sha256"]} for f in files]
    if u.ssh is not None:  # the same argv on another host is another service (local identities are unchanged)
        body["ssh"] = {"host": u.ssh.host, "port": u.ssh.port, "user": u.ssh.user}
    if u.name:  # a component (single-process identities are unchanged)
        body["component"] = {"name": u.name, "role": u.role, "routes": list(u.routes)}
        body["defines"] = [{"path": f["path"], "sha256": f["sha256"]} for f in defines or []]
    return "s-" + sha256_bytes(canonical_json(body))[:12]


def intended_identity(ws: Workspace, case: Case, unit: Unit) -> str:
    return identity_of(case, model_files(ws, case, unit), unit, defining_files(ws, unit))
