"""What the OS lets a service's launch carry: argv and environment sizes, checked at freeze.

execve(2) refuses with E2BIG an argument or variable longer than MAX_ARG_STRLEN (32 pages on Linux) and an
argv plus environment larger than the argument space (getconf ARG_MAX: a quarter of the stack limit). A case
over either would freeze, then fail at every start and every resume the same way; so freeze refuses it.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from caseledger.case.model import Case
from caseledger.case.service import ENV_REF
from caseledger.procs import INHERITED_ENV, INHERITED_ENV_PREFIXES

MAX_ARG_STRLEN = 32 * 4096  # Linux: one argv element or NAME=value, its NUL included
POINTER = 8  # execve counts a pointer per string besides the strings
REMOTE_SCRIPT = 512  # the launch script around a remote service's quoted argv (services/remote.py launch_async)
EXEC_SPACE_CAP = 6 * 1024 * 1024  # Linux >= 4.13: at most 3/4 of _STK_LIM (8 MiB), whatever the stack limit


def arg_max() -> int:
    """This host's argument space for argv plus environment (bytes): getconf ARG_MAX, within the kernel's cap
    (an unlimited stack makes sysconf report more than execve accepts)."""
    try:
        n = os.sysconf("SC_ARG_MAX")
    except (ValueError, OSError):
        n = -1
    return min(n, EXEC_SPACE_CAP) if n > 0 else MAX_ARG_STRLEN


@dataclass(frozen=True)
class _Launch:
    argv_field: str  # as the delta spells it: service.argv, service.components.<name>.argv
    env_field: str
    argv: Sequence[str]
    env: Mapping[str, str]
    remote: bool


def _launches(case: Case) -> list[_Launch]:
    sv = case.service
    out = [
        _Launch(
            f"service.components.{c.name}.argv", f"service.components.{c.name}.env", c.argv, c.env, c.ssh is not None
        )
        for c in sv.components
    ]
    if sv.traits.runs_case_argv and not sv.components:
        out.append(_Launch("service.argv", "service.env", sv.argv, sv.env, sv.ssh is not None))
    if sv.identity_command:  # runs locally, with the service's environment
        out.append(_Launch("service.identity_command", "service.env", sv.identity_command, sv.env, False))
    return out


def _fix(field: str) -> str:
    return (
        f"shrink {field}: pass large settings in a file the engine reads (a config file named in argv, or an "
        "env entry naming its path), then freeze again; nothing was written"
    )


def _size(s: str) -> int:
    return len(s.encode(errors="surrogatepass")) + 1


def _e2big(what: str, size: int) -> str:
    return (
        f"{what} is {size:,} bytes, over the {MAX_ARG_STRLEN:,} bytes one string may hold (MAX_ARG_STRLEN): the "
        "service would never start (E2BIG)"
    )


def launch_problem(case: Case, environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(message, fix) when a process of the case's service could not be started (E2BIG), else None.

    Counted as execve counts: every string with its NUL, and a pointer each; a '${NAME}' reference by the
    caller's value where it is set now; a local process's environment with what it inherits (INHERITED_ENV).
    A remote process's argv also travels quoted in one shell command, which is one string."""
    environ = os.environ if environ is None else environ
    inherited = {k: v for k, v in environ.items() if k in INHERITED_ENV or k.startswith(INHERITED_ENV_PREFIXES)}
    for ln in _launches(case):
        env = {k: environ.get(m.group(1), v) if (m := ENV_REF.fullmatch(v)) else v for k, v in ln.env.items()}
        for k, v in env.items():
            if (n := _size(f"{k}={v}")) > MAX_ARG_STRLEN:
                now = f" (with the value of {ln.env[k]} now)" if ln.env[k] != v else ""
                return _e2big(f"{ln.env_field}.{k}{now}", n), _fix(f"{ln.env_field}.{k}")
        for i, a in enumerate(ln.argv):
            if (n := _size(a)) > MAX_ARG_STRLEN:
                return _e2big(f"{ln.argv_field}[{i}]", n), _fix(f"{ln.argv_field}[{i}]")
        if ln.remote and (n := _size(shlex.join(ln.argv)) + REMOTE_SCRIPT) > MAX_ARG_STRLEN:
            return _e2big(f"{ln.argv_field}, quoted into the remote shell command,", n), _fix(ln.argv_field)
        full = env if ln.remote else {**inherited, **env}  # a remote login's own variables are not known here
        n_argv = sum(_size(a) + POINTER for a in ln.argv) + POINTER
        n_env = sum(_size(f"{k}={v}") + POINTER for k, v in full.items()) + POINTER
        if n_argv + n_env > (limit := arg_max()):
            first = ln.env_field if n_env >= n_argv else ln.argv_field
            return (
                f"{first}: argv ({n_argv:,} bytes) and environment ({n_env:,} bytes) come to "
                f"{n_argv + n_env:,} bytes at launch, over this host's {limit:,} (getconf ARG_MAX): the service "
                "would never start (E2BIG)",
                _fix(first),
            )
    return None
