"""Who may start what, set what and reach where: the host's policy, an allow list for each thing a case can make
caseledger do on this host.

A case can name a program to run (`service.argv` of the command adapter, a component's argv, an external
service's `identity_command`), hosts to log in to over SSH (`service.ssh`, a component's ssh, `load.host`,
`target.lease_host`), environment for the processes it starts (`service.env`, a component's env), variables of
the server's own environment to pass on (`target.api_key_env`, a `'${NAME}'` value in an env) and addresses the
controller and load client send requests (and the API key) to (`target.endpoints`, `metrics_url`, health URLs).
Whoever may freeze and start a case may therefore do each of these. The policy that allows them lives on the
host, in a file no tool writes: `$CASELEDGER_POLICY`, else `~/.config/caseledger/policy.json`
(`$XDG_CONFIG_HOME` honoured). It is read at every start, so a person's edit applies to the next run.

    {"programs": ["/opt/llama.cpp/bin/llama-server", "vllm"], "ssh_hosts": ["bench@gpu-7"],
     "env": ["VLLM_CACHE_ROOT"], "secret_env": ["VLLM_API_KEY"], "target_hosts": ["gpu-7:8000"]}

Every list allows by name; nothing is denied by pattern, because a list of dangerous variables is never complete
(OPENSSL_CONF, GCONV_PATH, PYTHONSTARTUP and NODE_OPTIONS all load code). An env name outside SAFE_ENV and the
policy's `env` is refused. A target at a loopback port of a service caseledger itself starts on this host needs
no entry (that service is the one the policy let start); any other address must be in `target_hosts`.

With a policy file, it applies to every caller. Without one, a local caller (the CLI, an MCP server on stdio:
the agent that launched it already runs as this user) may do anything, as before; a caller over HTTP
(`caseledger mcp --http`, and every process it starts: CASELEDGER_CALLER=http) may start nothing but
caseledger's own reference target and load client, set only SAFE_ENV, pass on no variable and reach only that
target. A damaged policy file allows nothing (fails closed).
"""

from __future__ import annotations

import ipaddress
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from caseledger.errors import NotAuthorized, quoted

if TYPE_CHECKING:
    from caseledger.case.model import Case

POLICY_ENV = "CASELEDGER_POLICY"
CALLER_ENV = "CASELEDGER_CALLER"  # "http": set by the HTTP server in its own environment, inherited by its children
CALLERS = ("local", "http")

# Variables any caller may set in a case's env: they pick devices and thread counts or keep a library offline, and
# none of them names a file, a library or a command to load (docs/agents.md lists them).
SAFE_ENV = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "ASCEND_RT_VISIBLE_DEVICES",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "TOKENIZERS_PARALLELISM",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "VLLM_CPU_KVCACHE_SPACE",
        "VLLM_CPU_OMP_THREADS_BIND",
    }
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
    env: list[str] = Field(
        default_factory=list,
        description="Variables a case's service.env (and a component's env) may set, beyond the safe set every "
        "caller has (CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS, ...: caseledger.run.admission.policy.SAFE_ENV)",
    )
    loader_env: list[str] = Field(
        default_factory=list, description="The earlier name of `env`: its names are allowed the same way"
    )
    secret_env: list[str] = Field(
        default_factory=list,
        description="Variables of this host's environment a case may pass on: target.api_key_env (sent as the "
        "Bearer key to the target) and '${NAME}' values in an env",
    )
    target_hosts: list[str] = Field(
        default_factory=list,
        description="Addresses a case's target may be at (endpoints, metrics_url, health URLs): 'host' (any port) "
        "or 'host:port'; 'loopback' is 127.0.0.0/8, ::1 and localhost. A loopback port of a service caseledger "
        "starts on this host needs no entry.",
    )


Kind = Literal["program", "ssh host", "env", "secret", "target host"]
POLICY_KEY: dict[Kind, str] = {
    "program": "programs",
    "ssh host": "ssh_hosts",
    "env": "env",
    "secret": "secret_env",
    "target host": "target_hosts",
}
SAID: dict[Kind, str] = {  # how a refusal names each kind
    "program": "program",
    "ssh host": "ssh host",
    "env": "variable",
    "secret": "passes on the server's variable",
    "target host": "target address",
}


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


def _fix(path: Path, kinds: list[Kind]) -> str:
    keys = ", ".join(dict.fromkeys(POLICY_KEY[k] for k in kinds))
    return (
        f"a person on this host adds it to {keys} in {path} (JSON; no tool writes it), then starts again; or "
        "drop it from the case; docs/agents.md 'Who may run what'"
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
            'write it as {"programs": [...], "ssh_hosts": [...], "env": [...], "secret_env": [...], '
            '"target_hosts": [...]}',
        ) from None


Ask = tuple[Kind, str, str, bool]  # (kind, value, field, on a remote host)


def asks(case: Case) -> Iterator[Ask]:
    """What the case would make caseledger start, set, pass on or reach: (kind, value, field, on a remote host)."""
    from caseledger.case.service import ENV_REF  # lazy: the MCP server imports this module at start (CALLER_ENV)

    sv = case.service
    units = [(sv.argv, sv.env, sv.ssh, "service")]
    units += [(c.argv, c.env, c.ssh, f"service.components '{c.name}'") for c in sv.components]
    for argv, env, ssh, field in units:
        if sv.traits.runs_case_argv and argv:
            yield "program", argv[0], f"{field}.argv[0]", ssh is not None
            if ssh is not None:
                yield "ssh host", f"{ssh.user}@{ssh.host}", f"{field}.ssh", True
        for k, v in env.items():
            yield "env", k, f"{field}.env", False
            if m := ENV_REF.fullmatch(v):
                yield "secret", m.group(1), f"{field}.env.{k}", False
    if sv.identity_command:
        yield "program", sv.identity_command[0], "service.identity_command[0]", False
    if case.target.api_key_env:
        yield "secret", case.target.api_key_env, "target.api_key_env", False
    yield from _addresses(case)
    if case.load.host is not None:
        yield "ssh host", f"{case.load.host.user}@{case.load.host.host}", "load.host", True
    if case.target.lease_host is not None:
        lh = case.target.lease_host
        yield "ssh host", f"{lh.user}@{lh.host}", "target.lease_host", True


def _addresses(case: Case) -> Iterator[Ask]:
    """Every address the controller or the load client sends to, as 'host:port' (loopback as 'loopback')."""
    t, sv = case.target, case.service
    urls = [(e.base_url, f"target.endpoints[{i}].base_url") for i, e in enumerate(t.endpoints)]
    urls += [(t.metrics_url, "target.metrics_url")] if t.metrics_url else []
    urls += [(sv.health_url, "service.health_url")] if sv.health_url else []
    urls += [(c.health_url, f"service.components '{c.name}'.health_url") for c in sv.components if c.health_url]
    for url, field in urls:
        yield "target host", address(url), field, False


def address(url: str) -> str:
    """'http://localhost:8080/v1' -> 'loopback:8080'; 'https://gpu-7/v1' -> 'gpu-7:443'."""
    u = urlsplit(url)
    host = (u.hostname or "").lower()
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    port = u.port or (443 if u.scheme == "https" else 80)
    return f"{'loopback' if loopback else host}:{port}"


def own_ports(case: Case) -> set[str]:
    """The loopback addresses of the service caseledger starts on this host for this case: the policy allowed
    the service (or it is caseledger's reference target), so sending to it needs no target_hosts entry."""
    sv = case.service
    if not sv.traits.launched or sv.ssh is not None or any(c.ssh is not None for c in sv.components):
        return set()
    mine = {address(e.base_url) for e in case.target.endpoints}
    return {a for a in mine if a.startswith("loopback:")}


def _resolved(program: str) -> str | None:
    found = shutil.which(program)
    return os.path.realpath(found) if found else None


def allows(policy: Policy, kind: Kind, value: str, remote: bool) -> bool:
    if kind == "env":
        return value in SAFE_ENV or value in policy.env or value in policy.loader_env
    if kind == "secret":
        return value in policy.secret_env
    if kind == "target host":
        return value in policy.target_hosts or value.rpartition(":")[0] in policy.target_hosts
    if kind == "ssh host":
        return value in policy.ssh_hosts or value.partition("@")[2] in policy.ssh_hosts
    if value in policy.programs:
        return True
    if remote:  # a path on another host: only as written
        return False
    mine = _resolved(value)
    return mine is not None and any(_resolved(p) == mine for p in policy.programs)


def check(case: Case, action: str = "start_run") -> None:
    """NotAuthorized naming everything of the case the host's policy does not allow (programs, SSH logins, env
    names, passed-on variables, target addresses), the policy file and how to change it; nothing is written
    before this passes."""
    own = own_ports(case)
    wanted = [a for a in asks(case) if not (a[0] == "target host" and a[1] in own)]
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
        said = "; ".join(f"{f} {SAID[k]} '{quoted(v, 120)}' is not allowed" for k, v, f in dict.fromkeys(denied))
        raise NotAuthorized(f"{action} refused: {said} ({where})", _fix(path, [k for k, _, _ in denied]))
