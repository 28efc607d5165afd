"""Ensure a service: bring the target to the case's identity through its adapter, and read back what actually runs.

reference: the embedded reference target (`python -m caseledger.target serve`), started detached.
command:   an argv from the case, started locally or, with service.ssh, on another host over SSH (remote.py),
           both through one launcher seam (launch.py); the effective argv is read back from /proc (on the
           host that runs it) and compared.
external:  an already-running endpoint; probed, never started or stopped.

Every launch is an argv list, never a shell string: case fields must not become shell syntax.
The live service started by caseledger on a target is recorded in ledger/services/<target_key>.json
so a later run can reuse it (same identity) instead of restarting it and losing warm caches. A remote service's
record carries its SSH login (paths only) and its proc ref names the SSH host, so liveness, read-back and stop go
through remote.py for it (procs.alive answers False for another host).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, TypedDict
from urllib.parse import urlsplit

import httpx2 as httpx
import orjson

from caseledger import engines, procs, redact
from caseledger.case.model import Case
from caseledger.case.service import SSH
from caseledger.errors import FailureClass, PhaseFailed, quoted
from caseledger.ledger import keepers
from caseledger.ledger.evidence import ComponentRecord, FileEvidence, ServiceRecord
from caseledger.load.auth import api_key_of, auth_header, refuse_auth
from caseledger.services import net, remote
from caseledger.services.external import listeners
from caseledger.services.identity import (
    DeclaredFile,
    ModelFile,
    Unit,
    case_env,
    compare_argv,
    defining_files,
    engine_evidence,
    identity_of,
    intended_argv,
    model_files,
    resolve_env,
    units,
    value_hash,
)
from caseledger.services.kept import Kept, adopted, kept_elsewhere, reuse_problem
from caseledger.services.kinds import adapter_of
from caseledger.services.launch import Launcher, LocalLauncher, SshLauncher, wait_health
from caseledger.services.live import (
    ServiceState,
    effective_problem,
    health_ok,
    live_service,
    owner_problem,
    read_state,
    state_path,
    terminate,
    verify,
)
from caseledger.workspace import (
    Workspace,
    canonical_json,
    sha256_bytes,
    utc_now,
    write_json,
)


def ensure(ws: Workspace, case: Case, key: str, case_id: str, allow_start: bool) -> ServiceRecord:
    """Bring the target to the case's service identity, process by process: a live process with its identity
    is kept (its warm caches with it), any other is (re)started. Returns the evidence (outcome reused|done);
    with components, one record per component and the routes whose processes changed."""
    if not adapter_of(case).launched:
        return _external(case, identity_of(case))
    us = units(case)
    if not us[0].name:
        return _ensure_unit(ws, case, us[0], key, case_id, allow_start)
    comps = []
    for u in us:  # in list order, each healthy before the next (a router after its workers)
        ev = _ensure_unit(ws, case, u, u.key(key), case_id, allow_start)
        comps.append(
            ComponentRecord(
                name=u.name, role=u.role, key=u.key(key), routes=list(u.routes), **ev.model_dump(exclude_unset=True)
            )
        )
    restarted = [c.name for c in comps if c.outcome != "reused"]
    every = range(len(case.target.endpoints))
    changed = sorted({r for c in comps if c.outcome != "reused" for r in (c.routes or every)})
    return ServiceRecord(
        outcome="reused" if not restarted else "done",
        identity="s-" + sha256_bytes(canonical_json([c.identity for c in comps]))[:12],
        components=comps,
        restarted=restarted,
        reused=[c.name for c in comps if c.outcome == "reused"],
        changed_routes=changed,
        verified_by="each component: live process cmdline, held files, env + health",
    )


def _ensure_unit(ws: Workspace, case: Case, u: Unit, key: str, case_id: str, allow_start: bool) -> ServiceRecord:
    files = model_files(ws, case, u)
    defines = defining_files(ws, u)
    _refuse_changed_files(u, defines)
    want = identity_of(case, files, u, defines)
    live = live_service(ws, key)
    intended = intended_argv(case, u)
    if live and live.get("identity") == want:
        reused = _reuse(live, case, u, want, intended, files)
        if reused is not None:
            return reused
    other = kept_elsewhere(ws, key)
    if other is not None:  # another workspace's service answers here: used when it is this case's, never stopped
        return _adopt(ws, case, u, key, other, want, intended, files)
    if not allow_start:
        raise PhaseFailed(
            f"no live process with {u.label}'s identity and authorization forbids a service change",
            FailureClass.SERVICE,
            "caseledger authorize single (or auto), then resume",
        )
    _clear_target(key, live, u)
    if u.ssh is not None:
        try:
            return _start_remote(ws, case, u, u.ssh, key, case_id, want, intended, defines)
        except remote.RemoteError as e:
            raise PhaseFailed(e.message, FailureClass.SERVICE, e.fix) from None
    return _start_local(ws, case, u, key, case_id, want, intended, files, defines)


def _refuse_changed_files(u: Unit, defines: list[DeclaredFile]) -> None:
    """Fail before any start when a declared file's bytes on disk are not the ones the case pins."""
    bad = next((f for f in defines if "disk_sha256" in f), None)
    if bad is not None:
        raise PhaseFailed(
            f"{u.label}: files {quoted(bad['path'])} hashes to {bad['disk_sha256'][:16]}… on disk, the "
            f"case pins {bad['sha256'][:16]}…",
            FailureClass.SERVICE,
            "put the pinned file in place, or freeze a case pinning the file on disk",
        )


def _reuse(
    live: ServiceState, case: Case, u: Unit, want: str, intended: list[str], files: list[ModelFile]
) -> ServiceRecord | None:
    """The evidence of keeping a live process that has the wanted identity, or None when it no longer verifies."""
    problem, eff = verify(live, case, u)
    if problem is not None or live.get("proc") is None:  # verify finds no problem only in a recorded live process
        return None
    return _reused(live, want, intended, files, eff)


def _reused(
    live: ServiceState, want: str, intended: list[str], files: list[ModelFile], eff: list[str]
) -> ServiceRecord:
    """The evidence of a verified live process kept as it is (this workspace's, or one another keeps)."""
    proc = live.get("proc")
    assert proc is not None
    owner = live.get("kept_by")
    return ServiceRecord(
        outcome="reused",
        identity=want,
        intended_argv=intended,
        effective_argv=eff,
        model_files=[dict(f) for f in files],
        pid=proc["pid"],
        starts=live.get("starts", 1 if owner is None else 0),
        **_effective_evidence(live),
        verified_by="live process cmdline + health" + (f" (started and kept by workspace {owner})" if owner else ""),
        **({"kept_by": owner} if owner else {}),
        **_where(live),
    )


def _adopt(
    ws: Workspace,
    case: Case,
    u: Unit,
    key: str,
    other: Kept,
    want: str,
    intended: list[str],
    files: list[ModelFile],
) -> ServiceRecord:
    """Reuse the live service another workspace keeps on this key when it is this case's and verifies (recorded
    here marked kept_by: warmed, re-verified and reused like this workspace's own, never stopped by it); else fail,
    naming its workspace, case and pid and the fix. start_run and resume refuse such a start before it gets here
    (kept.refuse_kept_elsewhere): this is the same rule under the run's lease."""
    why, eff = reuse_problem(other, ws, case, u, want)
    if why is not None:
        msg, fix = other.refusal(why)
        raise PhaseFailed(msg, FailureClass.SERVICE, fix)
    st = adopted(other, read_state(ws, key))
    write_json(state_path(ws, key), st)
    return _reused(st, want, intended, files, eff)


def _clear_target(key: str, live: ServiceState | None, u: Unit) -> None:
    """Stop the previous service this workspace started here; refuse when a process no workspace of this host
    records starting answers health (caseledger measures only a process it started)."""
    if live and live.get("kept_by"):  # its keeper's record is gone (host directory cleared): still not ours to stop
        proc = live.get("proc")
        raise PhaseFailed(
            f"{u.label} on this target (pid {proc['pid'] if proc else '?'}) is kept by workspace {live['kept_by']} "
            "and cannot be used as this case's; caseledger never stops a service another workspace keeps",
            FailureClass.SERVICE,
            f"caseledger target stop --workspace {live['kept_by']}, then resume",
        )
    if live:
        try:
            terminate(live)
        except remote.RemoteError as e:
            raise PhaseFailed(f"cannot stop the previous service: {e.message}", FailureClass.SERVICE, e.fix) from None
        keepers.forget(key, live.get("proc"))
    if health_ok(u.health_url, timeout=0.5):
        raise PhaseFailed(
            f"{u.health_url} already answers health, {_served_by(u)}, and no workspace of this host records "
            "starting it",
            FailureClass.SERVICE,
            "stop that process or use adapter 'external' for it",
        )


def _served_by(u: Unit) -> str:
    """Who listens on the unit's health port, as far as this host shows."""
    if u.ssh is not None:
        return f"on {u.ssh.host}"
    port = urlsplit(u.health_url).port
    owners = procs.listeners(port) if port else set()
    return f"served by pid {', '.join(map(str, sorted(owners)))}" if owners else "by no process visible on this host"


def _start_local(
    ws: Workspace,
    case: Case,
    u: Unit,
    key: str,
    case_id: str,
    want: str,
    intended: list[str],
    files: list[ModelFile],
    defines: list[DeclaredFile],
) -> ServiceRecord:
    """Launch a process on this host, wait for its health, then check it is ours and runs the case's identity."""
    env, shown_env = resolve_env(case, u)
    launcher = LocalLauncher(ws.root, u.label, ws.services_dir / f"{key}.log")
    extra: ServiceState = {
        "model_files": files,
        "files": defines,
        "cwd": str(ws.root),
        "env_sha256": {k: value_hash(v) for k, v in env.items() if k in u.env},
    }
    state = _launch(ws, key, case, case_id, u, launcher, want, intended, env, shown_env, extra)
    pid = launcher.ref["pid"]
    problem = owner_problem(case, u, pid)
    if problem is not None:  # health answered, but from someone else's process: ours lost the port
        launcher.kill()
        raise PhaseFailed(
            problem,
            FailureClass.SERVICE,
            "another process serves this port: stop it, or give this case another port; "
            "caseledger never measures a process it did not start",
        )
    eff = _confirm(ws, key, state, u, launcher, case)
    return ServiceRecord(
        outcome="done",
        identity=want,
        intended_argv=intended,
        effective_argv=eff,
        model_files=[dict(f) for f in files],
        pid=pid,
        starts=state["starts"],
        **_effective_evidence(state),
        verified_by="live process cmdline + health",
        env=shown_env,
    )


class _Effective(TypedDict, total=False):
    """Keyword arguments of a ServiceRecord: the effective identity besides the argv."""

    files: list[FileEvidence]
    env_sha256: dict[str, str]
    engine_version: str | None
    engine: str | None


def _effective_evidence(st: ServiceState) -> _Effective:
    """The effective identity a component's evidence shows besides its argv: declared files (hash, held), env
    value hashes, engine version. Nothing for the single-process form without declared files."""
    out: _Effective = {}
    if st.get("files"):
        out["files"] = [FileEvidence(path=f["path"], sha256=f["sha256"], held=f["held"]) for f in st["files"]]
    if st.get("env_sha256"):
        out["env_sha256"] = st["env_sha256"]
    if st.get("engine_version"):
        out["engine_version"] = st["engine_version"]
    if st.get("engine"):
        out["engine"] = st["engine"]
    return out


def _launch(
    ws: Workspace,
    key: str,
    case: Case,
    case_id: str,
    u: Unit,
    launcher: Launcher,
    want: str,
    intended: list[str],
    env: dict[str, str],
    shown_env: dict[str, str],
    extra: ServiceState,
) -> ServiceState:
    """Spawn the process, record it on the target (counting starts; `extra` holds what the form adds: files, env
    hashes, its working directory or SSH login), then wait for its health."""
    ref = launcher.spawn(intended, env)
    prev = read_state(ws, key)
    state: ServiceState = {
        **extra,
        "adapter": case.service.adapter,
        "proc": ref,
        "identity": want,
        "intended_argv": intended,
        "env": shown_env,
        "case_id": case_id,
        "started_utc": utc_now(),
        "starts": int(prev.get("starts", 0)) + 1,
        "log": launcher.shown_log,
    }
    write_json(state_path(ws, key), state)
    keepers.record(ws, key, case_id, want, ref)  # host-wide: another workspace meeting it knows whose it is
    wait_health(launcher, u)
    return state


def _confirm(ws: Workspace, key: str, state: ServiceState, u: Unit, launcher: Launcher, case: Case) -> list[str]:
    """Read a just-started process back on its host: record its effective argv, check the files and environment
    it really runs with (see effective_problem), record the engine's version and the engine detected (checked
    against service.engine); the effective argv. At the first difference the process is stopped and the start
    fails, naming it."""
    pid, where = launcher.ref["pid"], launcher.where
    eff = launcher.cmdline() or []
    state["effective_argv"] = eff
    write_json(state_path(ws, key), state)
    diff = compare_argv(state["intended_argv"], eff)
    if diff is not None:
        launcher.kill()
        raise PhaseFailed(
            f"effective service argv{where} differs from the intended one: {diff}",
            FailureClass.SERVICE,
            "fix the launcher so the live process runs the case's argv (no appended overrides)",
        )
    problem = effective_problem(state, u, pid, launcher.view([f["real_path"] for f in state.get("files") or []]))
    if problem is not None:  # it runs, but not with the files or environment the case says
        launcher.kill()
        raise PhaseFailed(
            f"{u.label} (pid {pid}{where}) differs from its intended identity: {problem}",
            FailureClass.SERVICE,
            "fix the launcher or the case's files so the process loads what the case declares; the process was stopped",
        )
    state["engine_version"], state["engine"] = engine_evidence(u, eff, case.target.metrics_url)
    if case.service.traits.reference_config:  # the embedded target, whichever engine's names it serves
        state["engine"] = f"reference (serving {case.service.reference.metrics_as}'s names)"
    declared, seen = case.service.engine, engines.detected_name(state["engine"])
    if declared is not None and seen is not None and seen != declared:
        launcher.kill()
        raise PhaseFailed(
            f"{u.label} (pid {pid}{where}) is {state['engine']}, not the service.engine '{declared}' the case "
            f"declares: freeze a case with service.engine '{seen}' (or null), or an argv that starts {declared}",
            FailureClass.SERVICE,
            f"freeze the case again with service.engine '{seen}' (or null), or with an argv that starts {declared}; "
            "the process was stopped",
        )
    write_json(state_path(ws, key), state)
    return eff


class _Where(TypedDict, total=False):
    """Keyword arguments of a ServiceRecord: where a remote service runs."""

    host: str
    ssh: dict[str, Any]  # JSON: the SSH model, as the evidence records it
    host_key: str


def _where(st: ServiceState) -> _Where:
    """Evidence of where a recorded service runs: nothing extra locally; host, login and host-key policy remotely."""
    if not st.get("ssh"):
        return {}
    ssh = SSH.model_validate(st["ssh"])
    return {
        "host": ssh.host,
        "ssh": ssh.model_dump(mode="json"),
        "host_key": f"verified against {ssh.known_hosts}"
        if ssh.known_hosts
        else "NOT verified (service.ssh.accept_unknown_host_key: true)",
    }


def _start_remote(
    ws: Workspace,
    case: Case,
    u: Unit,
    ssh: SSH,
    key: str,
    case_id: str,
    want: str,
    intended: list[str],
    defines: list[DeclaredFile],
) -> ServiceRecord:
    """Launch a command-adapter process on ssh.host, wait for health, compare the effective argv."""
    _refuse_key_in_workspace(ws, ssh)
    env, shown_env = case_env(case, u)
    launcher = SshLauncher(ssh, remote.log_path(key))
    extra: ServiceState = {
        "ssh": ssh.model_dump(mode="json"),
        "files": defines,
        "env_sha256": {k: value_hash(v) for k, v in env.items()},
    }
    state = _launch(ws, key, case, case_id, u, launcher, want, intended, env, shown_env, extra)
    eff = _confirm(ws, key, state, u, launcher, case)
    return ServiceRecord(
        outcome="done",
        identity=want,
        intended_argv=intended,
        effective_argv=eff,
        pid=launcher.ref["pid"],
        starts=state["starts"],
        verified_by="remote /proc cmdline over ssh + health",
        env=shown_env,
        **_effective_evidence(state),
        **_where(state),
    )


def _refuse_key_in_workspace(ws: Workspace, ssh: SSH) -> None:
    """A private key inside the workspace would travel with it (copies, archives): refuse it before any login."""
    key_file = Path(ssh.key_path).expanduser().resolve()
    if key_file.is_relative_to(ws.root.resolve()):
        raise PhaseFailed(
            f"service.ssh.key_path {ssh.key_path} lies inside the workspace",
            FailureClass.SERVICE,
            "move the private key out of the workspace and point service.ssh.key_path at it",
        )


def served_models(case: Case, k: int) -> list[str]:
    """The model ids route k's /models answers with (the case's key sent); PhaseFailed when it does not
    answer (service) or refuses the key (auth), or when the case's model is not among them."""
    ep = case.target.endpoints[k]
    try:
        r = net.get(ep.base_url.rstrip("/") + "/models", timeout=10, headers=auth_header(api_key_of(case)))
        refuse_auth(case, f"route {k} /models", [r.status_code])
        r.raise_for_status()
        ids = [m.get("id") for m in r.json().get("data", [])]
    except (httpx.HTTPError, ValueError) as e:
        raise PhaseFailed(
            f"route {k} ({ep.base_url}) does not answer /models: {quoted(e)}",
            FailureClass.SERVICE,
            "start the service or fix target.endpoints",
        ) from None
    if ep.model not in ids:
        raise PhaseFailed(
            f"route {k} ({ep.base_url}) serves {quoted(ids)}, not '{ep.model}'",
            FailureClass.SERVICE,
            "fix target.endpoints[].model or the routing",
        )
    return ids


def _external(case: Case, want: str) -> ServiceRecord:
    seen = [{"base_url": ep.base_url, "models": served_models(case, k)} for k, ep in enumerate(case.target.endpoints)]
    ident_out = None
    if case.service.identity_command:
        env, _ = resolve_env(case)  # the same minimal environment as a launched service
        try:
            ident_out = redact.cut(
                subprocess.run(
                    case.service.identity_command, capture_output=True, timeout=30, env=env, check=True
                ).stdout.decode(errors="replace"),
                2000,
            )
        except (OSError, subprocess.SubprocessError) as e:
            raise PhaseFailed(
                f"identity_command failed: {e}", FailureClass.SERVICE, "fix service.identity_command"
            ) from None
    # over the masked output: a secret it printed is neither recorded nor hashed
    live = "s-" + sha256_bytes(orjson.dumps({"models": seen, "identity": ident_out}))[:12]
    found, note = listeners(case)
    service = "; ".join(x.line() for x in found) if found else f"NOT_OBSERVED ({note})"
    rec = ServiceRecord(
        outcome="done",
        identity=want,
        live_identity=live,
        endpoints=seen,
        identity_output=ident_out,
        verified_by="/v1/models probe" + (" + identity_command" if ident_out else "") + f"; service: {service}",
    )
    if found:
        rec.listeners = found
    if note:
        rec.listeners_note = note
    return rec
