"""The load host's preflight (run/remote/load.py): the same caseledger there (source digest), the run and its
dataset copied up and hash-verified, the real preflight entry point run fresh there, the clock offset.
"""

from __future__ import annotations

import hashlib
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import orjson

from caseledger import redact
from caseledger.case.model import LoadHost
from caseledger.errors import FailureClass, PhaseFailed, RemoteError
from caseledger.ledger.runs import Run
from caseledger.run.remote.link import (
    Clock,
    Link,
    LinkLost,
    anyio_run,
    put_file,
    read_clock,
    remote_dataset_dir,
    remote_run_dir,
    run_script,
    sha256s,
    where,
)
from caseledger.workspace import sha256_file

if TYPE_CHECKING:
    import asyncssh  # imported where used (services/remote.py): a local-only run never pays for it

PREFLIGHT_TIMEOUT_S = 300.0

# the remote side imports package_digest through run/remote/load.py (which re-exports it), where earlier versions
# define it: a load host with an older caseledger answers with its digest (a clear mismatch), not an import error
_DIGEST_PY = (
    "import importlib.metadata as m\nfrom caseledger.run.remote.load import package_digest\n"
    "print(m.version('caseledger'), package_digest())\n"
)


# the raw files' disk, reserved as the controller reserves its own (workspace.reserve: fallocate, size unchanged);
# on the first refusal the files this script created are removed again (their partial reservation freed)
_RESERVE_PY = (
    "import os, shutil, sys\nfrom caseledger.workspace import reserve\nmade = []\n"
    "for path, n in zip(sys.argv[1::2], sys.argv[2::2]):\n"
    "    new = not os.path.exists(path)\n"
    "    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)\n"
    "    try:\n        ok = reserve(fd, int(n))\n    finally:\n        os.close(fd)\n"
    "    made += [path] if new else []\n"
    "    if not ok:\n"
    "        for p in made:\n"
    "            if os.path.getsize(p) == 0:\n                os.unlink(p)\n"
    "        print('full', shutil.disk_usage(os.path.dirname(path)).free, path)\n"
    "        sys.exit(0)\n"
    "print('ok')\n"
)


class CopiedFiles(TypedDict):
    """What copy_verified did: the files it copied (names), each input's sha256 there (first 16 hex digits)."""

    copied: list[str]
    sha256: dict[str, str]


class HostPreflight(TypedDict):
    """One load host's preflight record (the evidence's load_host, or one of its "hosts")."""

    host: str
    run_dir: str
    caseledger: dict[str, str]
    files: CopiedFiles
    preflight: dict[str, Any]  # JSON: the remote preflight's checks, as it printed them
    clock: Clock


class PreflightHosts(TypedDict):
    """The preflight record with load.hosts: one HostPreflight per host."""

    hosts: list[HostPreflight]


def package_digest() -> str:
    """sha256 over this caseledger's source files (relative path and content): equal on both hosts means the
    load host runs the same client code."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _local_files(run: Run, host: LoadHost) -> dict[str, Path]:
    """remote path -> local file: the run's copy of its case and the dataset it names."""
    ws, rdir, ddir = run.workspace, remote_run_dir(run, host), remote_dataset_dir(run, host)
    local_ds = ws.dataset_dir(run.meta.dataset())
    return {
        f"{rdir}/run.json": run.paths.run_json,
        f"{rdir}/case.json": run.paths.case,
        f"{ddir}/identity.json": local_ds / "identity.json",
        f"{ddir}/entries.jsonl": local_ds / "entries.jsonl",
    }


async def copy_verified(conn: asyncssh.SSHClientConnection, run: Run, host: LoadHost) -> CopiedFiles:
    """Copy the run and its dataset to the load host where missing or different; every file hash-checked there."""
    files = _local_files(run, host)
    want = {r: sha256_file(p) for r, p in files.items()}
    have = await sha256s(conn, list(files))
    copied = []
    for r, p in files.items():
        if have.get(r) != want[r]:
            await put_file(conn, p, r)
            copied.append(Path(r).name)
    if copied:
        have = await sha256s(conn, list(files))
    bad = [Path(r).name for r in files if have.get(r) != want[r]]
    if bad:
        raise RemoteError(
            f"copied {', '.join(bad)} to the load host, but its sha256 there differs",
            "check the load host's disk (load.host.workdir), then resume",
        )
    return {"copied": copied, "sha256": {Path(r).name: want[r][:16] for r in files}}


async def _version(conn: asyncssh.SSHClientConnection, host: LoadHost) -> dict[str, str]:
    status, out = await run_script(conn, f"cd / && {shlex.quote(host.python)} -c {shlex.quote(_DIGEST_PY)} 2>&1")
    words = out.decode(errors="replace").split()
    if status != 0 or len(words) != 2:
        raise RemoteError(
            f"{host.python} on the load host cannot import caseledger (exit {status}: {' '.join(words)[-160:]})",
            "install this caseledger there, or point load.host.python at an interpreter that has it",
        )
    return {"version": words[0], "digest": words[1]}


# JSON: the remote preflight's checks, parsed from its last output line
async def _preflight(conn: asyncssh.SSHClientConnection, run: Run, host: LoadHost) -> dict[str, Any]:
    """The real preflight entry point, fresh, on the load host (sockets forbidden there as here)."""
    rdir = remote_run_dir(run, host)
    status, out = await run_script(
        conn, f"cd / && {shlex.quote(host.python)} -m caseledger.run.preflight {shlex.quote(rdir)} 2>/dev/null"
    )
    lines = out.decode(errors="replace").strip().splitlines()
    try:
        res = orjson.loads(lines[-1]) if lines else {}
    except orjson.JSONDecodeError:
        res = {}
    if status != 0 or not isinstance(res, dict) or not res.get("ok"):
        err = res.get("error") if isinstance(res, dict) else None
        raise RemoteError(
            redact.cut(f"preflight on the load host failed: {err or (lines[-1:] or ['no output'])[0]}", 300),
            "fix the cause on the load host, then resume; nothing was sent",
        )
    checks: dict[str, Any] = res.get("checks") or {}  # JSON: the remote preflight's answer
    return checks


def preflight(run: Run) -> HostPreflight | PreflightHosts:
    """Preflight on the load host (load.host; with load.hosts on each, {"hosts": [...]}): the same caseledger
    there (source digest), the run and its dataset copied and hash-verified, the real preflight entry point run
    fresh there, and the clock offset. PhaseFailed (before_model) names the host and the fix."""
    if run.case.load.hosts:
        return {"hosts": [_preflight_host(run, host) for host, _ in run.case.load.host_shares()]}
    host = run.case.load.host
    assert host is not None
    return _preflight_host(run, host)


def _preflight_host(run: Run, host: LoadHost) -> HostPreflight:
    async def main() -> HostPreflight:
        link = Link(host, budget_s=min(host.reconnect_s, 30.0))
        try:
            version = await link.call(lambda c: _version(c, host), timeout_s=60)
            mine = package_digest()
            if version["digest"] != mine:
                raise RemoteError(
                    f"the load host runs another caseledger ({version['version']}, source digest "
                    f"{version['digest'][:12]}…; here {mine[:12]}…)",
                    "install this caseledger there, or point load.host.python at an interpreter that imports it",
                )
            files = await link.call(lambda c: copy_verified(c, run, host), timeout_s=PREFLIGHT_TIMEOUT_S)
            checks = await link.call(lambda c: _preflight(c, run, host), timeout_s=PREFLIGHT_TIMEOUT_S)
            clock = await link.call(lambda c: read_clock(c, host), timeout_s=30)
        finally:
            await link.drop()
        return {
            "host": where(host),
            "run_dir": remote_run_dir(run, host),
            "caseledger": version,
            "files": files,
            "preflight": checks,
            "clock": clock,
        }

    try:
        return anyio_run(main)
    except (RemoteError, LinkLost) as e:
        msg = e.message if isinstance(e, RemoteError) else f"load host {where(host)} unreachable: {e}"
        fix = e.fix if isinstance(e, RemoteError) else "check the link to load.host, then resume"
        raise PhaseFailed(
            f"load host {where(host)}: {msg}"[:400], FailureClass.BEFORE_MODEL, f"{fix}; 0 model requests were sent"
        ) from None


async def reserve_raw(link: Link, host: LoadHost, need: dict[str, int]) -> None:
    """Reserve the disk each raw file on the load host will need (path there -> bytes) before any client there is
    started, as the controller does for its own (run/load/ends.py:reserve_raw): a full disk there fails the load
    phase `disk` with nothing sent. The directories exist (the caller made them)."""
    args = " ".join(f"{shlex.quote(path)} {int(n)}" for path, n in need.items())
    status, out = await link.call(
        lambda c: run_script(c, f"cd / && {shlex.quote(host.python)} -c {shlex.quote(_RESERVE_PY)} {args} 2>&1"),
        timeout_s=60,
    )
    words = out.decode(errors="replace").strip().split(" ", 2)
    if status == 0 and words[:1] == ["ok"]:
        return
    if status == 0 and words[0] == "full" and len(words) == 3 and words[1].isdigit():
        free, path = int(words[1]), words[2]
        raise PhaseFailed(
            f"disk full on load host {where(host)}: cannot reserve {need.get(path, 0) / 1e6:.3g} MB for the raw "
            f"records at {path} ({free / 1e6:.3g} MB free there); no formal request was sent",
            FailureClass.DISK,
            f"free disk space on that host under its workdir {host.workdir} (or freeze a case whose load host "
            "workdir is on a larger disk), then resume: the load starts from its first request",
            evidence={"disk_host": where(host), "disk_path": path, "disk_need_bytes": need.get(path, 0)},
        )
    raise RemoteError(
        redact.cut(f"reserving the raw records' disk on the load host failed (exit {status}: {out[-200:]!r})", 300),
        "check load.host.python and its workdir there, then resume; nothing was sent",
    )
