"""Who may start what: the host's policy for the programs, SSH logins and loader environment a case makes
caseledger start.

A case can name a program to run (`service.argv` of the command adapter, a component's argv, an external
service's `identity_command`), hosts to log in to over SSH (`service.ssh`, a component's ssh, `load.host`,
`target.lease_host`) and service environment that changes how every program loads (`LD_PRELOAD`,
`PYTHONPATH`, ...). Whoever may freeze and start a case may therefore run those. The policy that allows them
lives on the host, in a file no tool writes: `$CASELEDGER_POLICY`, else `~/.config/caseledger/policy.json`
(`$XDG_CONFIG_HOME` honoured). It is read at every start, so a person's edit applies to the next run.

    {"programs": ["/opt/llama.cpp/bin/llama-server", "vllm"], "ssh_hosts": ["bench@gpu-7"], "loader_env": []}

With a policy file, it applies to every caller. Without one, a local caller (the CLI, an MCP server on stdio:
the agent that launched it already runs as this user) may start anything, as before; a caller over HTTP
(`caseledger mcp --http`, and every process it starts: CASELEDGER_CALLER=http) may start nothing but
caseledger's own reference target and load client. A damaged policy file allows nothing (fails closed).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from caseledger.errors import NotAuthorized, quoted

if TYPE_CHECKING:
    from caseledger.case.model import Case

POLICY_ENV = "CASELEDGER_POLICY"
CALLER_ENV = "CASELEDGER_CALLER"  # "http": set by the HTTP server in its own environment, inherited by its children
CALLERS = ("local", "http")

# Environment that changes how any program loads or what it runs first: never from a case unless allowed.
LOADER_ENV_PREFIXES = ("LD_", "DYLD_", "PYTHON")
LOADER_ENV_NAMES = frozenset(
    {"PATH", "BASH_ENV", "ENV", "NODE_OPTIONS", "PERL5OPT", "PERL5LIB", "RUBYOPT", "RUBYLIB", "GCONV_PATH"}
)


class Policy(BaseModel):
    """The host policy file's content (every list may be left out: nothing of that kind is allowed)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    programs: list[str] = Field(
        default_factory=list,
        description="Executables a case may start: absolute paths, or names found on PATH (compared after "
        "resolving both); on an SSH host the path as the case writes it. An interpreter (sh, python) allows "
        "whatever it is told to run.",
    )
    ssh_hosts: list[str] = Field(
        default_factory=list, description="SSH logins a case may use: 'host' (any user) or 'user@host'"
    )
    loader_env: list[str] = Field(
        default_factory=list, description="Loader variables (LD_PRELOAD, PYTHONPATH, PATH, ...) a case's env may set"
    )


Kind = Literal["program", "ssh host", "loader env"]


def policy_path() -> Path:
    own = os.environ.get(POLICY_ENV)
    if own:
        return Path(own).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "caseledger" / "policy.json"


def caller() -> str:
    got = os.environ.get(CALLER_ENV) or "local"
    if got not in CALLERS:
        raise NotAuthorized(
            f"{CALLER_ENV}='{quoted(got, 40)}' is not a known caller (known: {', '.join(CALLERS)})",
            f"unset {CALLER_ENV}: caseledger's HTTP server sets it for itself and the processes it starts",
        )
    return got


def _fix(path: Path) -> str:
    return (
        f"a person on this host adds it to {path} (JSON: programs, ssh_hosts, loader_env; no tool writes it), "
        "then starts again; README 'Who may run what'"
    )


def load() -> tuple[Policy | None, Path]:
    """(the policy, its path); None when no file is there and none is named. A named file that is missing, or a
    file that is damaged, is refused: it was meant to restrict, so it allows nothing."""
    path = policy_path()
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        if os.environ.get(POLICY_ENV):
            raise NotAuthorized(
                f"{POLICY_ENV}={path} names no file: the host policy cannot be read, so nothing may start",
                f"create {path}, or unset {POLICY_ENV}",
            ) from None
        return None, path
    except OSError as e:
        fix = f"fix the file's permissions: {path}"
        raise NotAuthorized(f"host policy {path} cannot be read ({quoted(e)})", fix) from None
    try:
        return Policy.model_validate(orjson.loads(raw)), path
    except (orjson.JSONDecodeError, ValidationError) as e:
        raise NotAuthorized(
            f"host policy {path} is damaged ({quoted(e, 200)}), so nothing may start",
            'write it as {"programs": [...], "ssh_hosts": [...], "loader_env": [...]}',
        ) from None


def asks(case: Case) -> Iterator[tuple[Kind, str, str, bool]]:
    """What the case would make caseledger start: (kind, value, field, on a remote host)."""
    sv = case.service
    if sv.traits.runs_case_argv:
        units = [(sv.argv, sv.env, sv.ssh, "service")] if sv.argv else []
        units += [(c.argv, c.env, c.ssh, f"service.components '{c.name}'") for c in sv.components]
        for argv, env, ssh, field in units:
            yield "program", argv[0], f"{field}.argv[0]", ssh is not None
            if ssh is not None:
                yield "ssh host", f"{ssh.user}@{ssh.host}", f"{field}.ssh", True
            yield from (("loader env", k, f"{field}.env", False) for k in env if _loader(k))
    else:
        yield from (("loader env", k, "service.env", False) for k in sv.env if _loader(k))
    if sv.identity_command:
        yield "program", sv.identity_command[0], "service.identity_command[0]", False
    if case.load.host is not None:
        yield "ssh host", f"{case.load.host.user}@{case.load.host.host}", "load.host", True
    if case.target.lease_host is not None:
        lh = case.target.lease_host
        yield "ssh host", f"{lh.user}@{lh.host}", "target.lease_host", True


def _loader(name: str) -> bool:
    return name.startswith(LOADER_ENV_PREFIXES) or name in LOADER_ENV_NAMES


def _resolved(program: str) -> str | None:
    found = shutil.which(program)
    return os.path.realpath(found) if found else None


def allows(policy: Policy, kind: Kind, value: str, remote: bool) -> bool:
    if kind == "loader env":
        return value in policy.loader_env
    if kind == "ssh host":
        return value in policy.ssh_hosts or value.partition("@")[2] in policy.ssh_hosts
    if value in policy.programs:
        return True
    if remote:  # a path on another host: only as written
        return False
    mine = _resolved(value)
    return mine is not None and any(_resolved(p) == mine for p in policy.programs)


def check(case: Case, action: str = "start_run") -> None:
    """NotAuthorized naming every program, SSH login and loader variable of the case the host's policy does not
    allow, the policy file and how to change it; nothing is written before this passes."""
    wanted = list(asks(case))
    if not wanted:
        return
    policy, path = load()
    who = caller()
    if policy is None:
        if who == "local":
            return
        policy = Policy()
        where = "the default policy of an HTTP caller: no policy file, so only caseledger's reference target"
    else:
        where = f"host policy {path}"
    denied = [(k, v, f) for k, v, f, remote in wanted if not allows(policy, k, v, remote)]
    if denied:
        said = "; ".join(f"{f} {k} '{quoted(v, 120)}' is not allowed" for k, v, f in denied)
        raise NotAuthorized(f"{action} refused: {said} ({where})", _fix(path))
