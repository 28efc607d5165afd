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
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2 as httpx
import orjson

from caseledger import procs
from caseledger.case.model import ENV_REF, SSH, Case
from caseledger.errors import FailureClass, PhaseFailed, quoted
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


def intended_argv(case: Case) -> list[str]:
    host, port = host_port(case.target.endpoints[0].base_url)
    model = case.target.endpoints[0].model
    if case.service.adapter == "reference":
        cfg = canonical_json(case.service.reference.model_dump(mode="json")).decode()
        return [sys.executable, "-m", "caseledger.target", "serve", "--host", host, "--port", str(port),
                "--model", model, "--config-json", cfg]
    if case.service.adapter == "command":
        fill = {"{host}": host, "{port}": str(port), "{model}": model}
        spec = case.service.speculative
        if spec is not None:  # {draft_model}, {spec_type}, {draft_max}: the case validates each is set where used
            fill.update({"{" + k + "}": str(v) for k, v in spec.model_dump().items() if v is not None})
        out = []
        for arg in case.service.argv:
            filled = arg
            for k, v in fill.items():
                filled = filled.replace(k, v)
            out.append(filled)
        return out
    return []


# Options naming a model file, whose content hash joins the service identity (llama.cpp: target and draft).
MODEL_FILE_OPTIONS = ("-m", "--model", "-md", "--model-draft", "--spec-draft-model")
_HASHES_FILE = "file-hashes.json"


def model_files(ws: Workspace, case: Case) -> list[dict[str, Any]]:
    """Model files named in a local command adapter's argv (MODEL_FILE_OPTIONS), with their sha256.

    Hashes are cached under ledger/services by path, size, mtime and inode, so a 250 MB model is read once,
    not at every run. A remote service's files are not read (empty list)."""
    if case.service.adapter != "command" or case.service.ssh is not None:
        return []
    argv = intended_argv(case)
    cache_path = ws.services_dir / _HASHES_FILE
    cache: dict[str, Any] = read_json_or_none(cache_path) or {}
    out: list[dict[str, Any]] = []
    changed = False
    for opt, value in itertools.pairwise(argv):
        if opt not in MODEL_FILE_OPTIONS:
            continue
        path = Path(value)
        if not path.is_file():
            continue
        real = str(path.resolve())
        st = path.stat()
        key = [st.st_size, st.st_mtime_ns, st.st_ino]
        hit = cache.get(real)
        if not (isinstance(hit, dict) and hit.get("stat") == key):
            hit = {"stat": key, "sha256": sha256_file(path)}
            cache[real] = hit
            changed = True
        out.append({"option": opt, "path": value, "bytes": st.st_size, "sha256": hit["sha256"]})
    if changed:
        write_json(cache_path, cache)
    return out


def base_env() -> dict[str, str]:
    """The caller's harmless variables (procs.INHERITED_ENV, LC_*), nothing else."""
    return {k: v for k, v in os.environ.items() if k in INHERITED_ENV or k.startswith(INHERITED_ENV_PREFIXES)}


def resolve_env(case: Case) -> tuple[dict[str, str], dict[str, str]]:
    """(env for the child, what may be recorded: references stay references, values of refs never copied).

    The child gets base_env() plus exactly the case's service.env; the reference target also gets PYTHONPATH
    pointing at this package, so `python -m caseledger.target` imports this checkout (it is caseledger's
    own code, not the caller's setting)."""
    own, shown = case_env(case)
    env = base_env()
    if case.service.adapter == "reference":
        env["PYTHONPATH"] = procs.PKG_PARENT
    return {**env, **own}, shown


def case_env(case: Case) -> tuple[dict[str, str], dict[str, str]]:
    """Only the case's variables, references resolved (a remote service gets these, not the controller's env)."""
    env: dict[str, str] = {}
    shown: dict[str, str] = {}
    for k, v in case.service.env.items():
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


def _options(argv: list[str]) -> list[tuple[str, str | None]]:
    """Option/value pairs after the program part (tokens before the first '-' option are the program)."""
    i = next((n for n, a in enumerate(argv) if a.startswith("-") and a not in ("-m",) and n > 0
              and argv[n - 1] != "-m"), len(argv))
    # skip a python -m module prefix
    out: list[tuple[str, str | None]] = []
    args = argv[i:]
    n = 0
    while n < len(args):
        a = args[n]
        if a.startswith("-"):
            if "=" in a:
                k, v = a.split("=", 1)
                out.append((k, v))
            elif n + 1 < len(args) and not args[n + 1].startswith("-"):
                out.append((a, args[n + 1]))
                n += 1
            else:
                out.append((a, None))
        else:
            out.append(("", a))
        n += 1
    return out


def compare_argv(intended: list[str], effective: list[str]) -> str | None:
    """None when equal in options; else which argument differs (e.g. an appended override)."""
    if intended == effective:
        return None
    a, b = _options(intended), _options(effective)
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
    (identity, then _verify); no request is sent."""
    if case.service.adapter == "external":
        return False, False
    st = read_json_or_none(_state_path(ws, key)) or {}
    if st.get("identity") != identity_of(case, model_files(ws, case)) or _verify(st, case)[0] is not None:
        return False, False
    return True, bool(st.get("warmed_by"))


def mark_warm(ws: Workspace, key: str, pid: int, run_id: str) -> None:
    """Record that run_id warmed this service instance and verified its routes (a restart forgets it)."""
    st = read_json_or_none(_state_path(ws, key)) or {}
    if (st.get("proc") or {}).get("pid") == pid:
        st["warmed_by"] = run_id
        write_json(_state_path(ws, key), st)


def check_live(ws: Workspace, case: Case, key: str) -> str | None:
    """None when the service recorded for this target is still the case's service (see _verify); else what
    is wrong. External endpoints are not ours to check beyond their health (route verification covers them)."""
    if case.service.adapter == "external":
        return None
    return _verify(read_json_or_none(_state_path(ws, key)) or {}, case)[0]


def _verify(st: dict[str, Any], case: Case) -> tuple[str | None, list[str]]:
    """(problem or None, effective argv) of a recorded service: pid and start time alive, the argv read back
    unchanged, health answering and (locally) the port held by it. The one check behind reuse, the plan's
    live state and the re-verification before and after the formal load."""
    proc = st.get("proc")
    if not proc:
        return "no live service is recorded for this target", []
    pid = int(proc["pid"])
    if not _proc_alive(st):
        return f"the service (pid {pid}) is gone", []
    eff = _cmdline(st) or []
    diff = compare_argv(intended_argv(case), eff)
    if diff is not None:
        return f"the service (pid {pid}) runs another argv: {diff}", eff
    if not health_ok(case.service.health_url or ""):
        return f"the service (pid {pid}) does not answer health at {case.service.health_url}", eff
    return (None if _remote_of(st) is not None else _owner_problem(case, pid)), eff


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


def identity_of(case: Case, files: list[dict[str, Any]] | None = None) -> str:
    """The intended service identity; `files` (model_files) adds each model file's option and sha256."""
    body: dict[str, Any] = {
        "adapter": case.service.adapter,
        "argv": intended_argv(case)[1:] if case.service.adapter == "reference" else intended_argv(case),
        "env": case.service.env, "endpoints": [e.model_dump() for e in case.target.endpoints]}
    if files:  # the same argv over other weights is another service
        body["files"] = [{"option": f["option"], "sha256": f["sha256"]} for f in files]
    ssh = case.service.ssh
    if ssh is not None:  # the same argv on another host is another service (local identities are unchanged)
        body["ssh"] = {"host": ssh.host, "port": ssh.port, "user": ssh.user}
    return "s-" + sha256_bytes(canonical_json(body))[:12]


def _owner_problem(case: Case, pid: int) -> str | None:
    """None when the target's port is listened on by `pid` (or its session); else what is wrong. The health
    check alone cannot tell our service from another one on the same port."""
    host, port = host_port(case.target.endpoints[0].base_url)
    ours, owners = procs.owns_port(pid, port)
    if ours:
        return None
    who = f"pid {', '.join(str(o) for o in sorted(owners))}" if owners else "no process visible on this host"
    return f"{host}:{port} is served by {who}, not by the service caseledger started (pid {pid})"


def health_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        r = httpx.get(url, timeout=timeout)
        return r.status_code == 200
    except httpx.HTTPError:
        return False


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


def ensure(ws: Workspace, case: Case, key: str, case_id: str, allow_start: bool) -> dict[str, Any]:
    """Bring the target to the case's service identity. Returns the evidence dict (outcome reused|done)."""
    if case.service.adapter == "external":
        return _external(case, identity_of(case))
    files = model_files(ws, case)
    want = identity_of(case, files)
    live = live_service(ws, key)
    intended = intended_argv(case)
    if live and live.get("identity") == want:
        problem, eff = _verify(live, case)
        if problem is None:
            return {"outcome": "reused", "identity": want, "intended_argv": intended, "effective_argv": eff,
                    "model_files": files, "pid": live["proc"]["pid"], "starts": live.get("starts", 1),
                    "verified_by": "live process cmdline + health", **_where(live)}
    if not allow_start:
        raise PhaseFailed("no live service with the case's identity and authorization forbids a service change",
                          FailureClass.SERVICE, "caseledger authorize single (or auto), then resume")
    if live:
        try:
            _terminate(live)
        except remote.RemoteError as e:
            raise PhaseFailed(f"cannot stop the previous service: {e.message}", FailureClass.SERVICE, e.fix) from None
    host, port = host_port(case.target.endpoints[0].base_url)
    if health_ok(case.service.health_url or "", timeout=0.5):
        raise PhaseFailed(f"{host}:{port} already answers health but is not a service caseledger started",
                          FailureClass.SERVICE, "stop that process or use adapter 'external' for it")
    if case.service.ssh is not None:
        try:
            return _start_remote(ws, case, case.service.ssh, key, case_id, want, intended)
        except remote.RemoteError as e:
            raise PhaseFailed(e.message, FailureClass.SERVICE, e.fix) from None
    env, shown_env = resolve_env(case)
    log = ws.services_dir / f"{key}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as lf:
        try:
            p = subprocess.Popen(intended, stdin=subprocess.DEVNULL, stdout=lf, stderr=lf, env=env,
                                 start_new_session=True, close_fds=True)
        except OSError as e:
            raise PhaseFailed(f"cannot start service argv[0] {intended[0]!r}: {e}", FailureClass.SERVICE,
                              "fix service.argv in a new case") from None
    ref = {"pid": p.pid, "start_time": procs.start_time(p.pid) or 0, "host": procs.me()["host"]}
    state = _record_start(ws, key, case, case_id, ref, want, intended, shown_env, str(log))
    deadline = time.monotonic() + case.service.health_timeout_s
    while time.monotonic() < deadline:
        if p.poll() is not None:
            tail = log.read_bytes()[-400:].decode(errors="replace").strip().splitlines()[-1:] or [""]
            raise PhaseFailed(f"service exited with code {p.returncode} before health: {tail[0]}", FailureClass.SERVICE,
                              f"read {log}; fix the case's service and resume")
        if health_ok(case.service.health_url or "", timeout=1.0):
            break
        time.sleep(0.1)
    else:
        procs.terminate(ref)
        raise PhaseFailed(f"service not healthy at {case.service.health_url} after {case.service.health_timeout_s}s",
                          FailureClass.SERVICE, "raise service.health_timeout_s or check the service log")
    problem = _owner_problem(case, p.pid)
    if problem is not None:  # health answered, but from someone else's process: ours lost the port
        procs.terminate(ref)
        raise PhaseFailed(problem, FailureClass.SERVICE,
                          "another process serves this port: stop it, or give this case another port; "
                          "caseledger never measures a process it did not start")
    eff = _confirm_argv(ws, key, state, procs.cmdline(p.pid) or [], lambda: procs.terminate(ref), "")
    return {"outcome": "done", "identity": want, "intended_argv": intended, "effective_argv": eff,
            "model_files": files, "pid": p.pid, "starts": state["starts"],
            "verified_by": "live process cmdline + health", "env": shown_env}


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


def _where(st: dict[str, Any]) -> dict[str, Any]:
    """Evidence of where a recorded service runs: nothing extra locally; host, login and host-key policy remotely."""
    if not st.get("ssh"):
        return {}
    ssh = SSH.model_validate(st["ssh"])
    return {"host": ssh.host, "ssh": ssh.model_dump(mode="json"),
            "host_key": f"verified against {ssh.known_hosts}" if ssh.known_hosts
            else "NOT verified (service.ssh.accept_unknown_host_key: true)"}


def _start_remote(ws: Workspace, case: Case, ssh: SSH, key: str, case_id: str, want: str,
                  intended: list[str]) -> dict[str, Any]:
    """Launch the command adapter's argv on ssh.host, wait for health, compare the effective argv."""
    key_file = Path(ssh.key_path).expanduser().resolve()
    if key_file.is_relative_to(ws.root.resolve()):
        raise PhaseFailed(f"service.ssh.key_path {ssh.key_path} lies inside the workspace", FailureClass.SERVICE,
                          "move the private key out of the workspace and point service.ssh.key_path at it")
    rem = remote.Remote(ssh)
    env, shown_env = case_env(case)
    log = remote.log_path(key)
    try:
        pid, started = rem.launch(intended, env, log)
    except remote.RemoteError as e:
        raise PhaseFailed(f"cannot start the service: {e.message}", FailureClass.SERVICE, e.fix) from None
    ref = {"pid": pid, "start_time": started, "host": ssh.host}  # another host: procs.alive says False
    state = _record_start(ws, key, case, case_id, ref, want, intended, shown_env, f"{ssh.user}@{ssh.host}:{log}",
                          ssh=ssh.model_dump(mode="json"))
    deadline = time.monotonic() + case.service.health_timeout_s
    next_probe = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        if health_ok(case.service.health_url or "", timeout=1.0):
            break
        if time.monotonic() >= next_probe:  # each probe is a remote exec: about once a second
            if not rem.alive(ref):
                tail = rem.tail(log).strip().splitlines()[-1:] or [""]
                raise PhaseFailed(f"service on {ssh.host} exited before health: {tail[0]}", FailureClass.SERVICE,
                                  f"read {state['log']}; fix the case's service and resume")
            next_probe = time.monotonic() + 1.0
        time.sleep(0.1)
    else:
        rem.terminate(ref)
        raise PhaseFailed(f"service on {ssh.host} not healthy at {case.service.health_url} after "
                          f"{case.service.health_timeout_s}s", FailureClass.SERVICE,
                          f"raise service.health_timeout_s or read {state['log']}")
    eff = _confirm_argv(ws, key, state, rem.cmdline(pid) or [], lambda: rem.terminate(ref), f" on {ssh.host}")
    return {"outcome": "done", "identity": want, "intended_argv": intended, "effective_argv": eff, "pid": pid,
            "starts": state["starts"], "verified_by": "remote /proc cmdline over ssh + health", "env": shown_env,
            **_where(state)}


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


def _external(case: Case, want: str) -> dict[str, Any]:
    seen = [{"base_url": ep.base_url, "models": served_models(case, k)} for k, ep in enumerate(case.target.endpoints)]
    ident_out = None
    if case.service.identity_command:
        env, _ = resolve_env(case)  # the same minimal environment as a launched service
        try:
            ident_out = subprocess.run(case.service.identity_command, capture_output=True, timeout=30, env=env,
                                       check=True).stdout.decode(errors="replace")[:2000]
        except (OSError, subprocess.SubprocessError) as e:
            raise PhaseFailed(f"identity_command failed: {e}", FailureClass.SERVICE,
                              "fix service.identity_command") from None
    live = "s-" + sha256_bytes(orjson.dumps({"models": seen, "identity": ident_out}))[:12]
    return {"outcome": "done", "identity": want, "live_identity": live, "endpoints": seen,
            "identity_output": ident_out,
            "verified_by": "/v1/models probe" + (" + identity_command" if ident_out else "")}
