"""Service processes on another host over SSH: launch detached, read /proc back, check liveness, stop.

asyncssh does the I/O (async at the edge); `Remote` is the sync face the controller uses: every call runs one
connection under `anyio.run` and, where it can, one remote command. A remote command costs far more than the
connection (the login shell reads its rc files on every exec), so each operation is a single fixed script.

Security: a remote command line is built from constant script text, integers, and `shlex.quote` of each argv
element and path: case fields never become shell syntax. Environment values travel on the channel's stdin
(encrypted, never on a command line that `ps` shows). The private key is referenced by path and handed to
asyncssh; its content is never read here, logged, or written anywhere.
"""

from __future__ import annotations

import re
import shlex
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

import anyio

from caseledger import procs
from caseledger.case.service import SSH
from caseledger.errors import RemoteError as RemoteError  # defined in errors; callers use remote.RemoteError

if TYPE_CHECKING:
    import asyncssh  # imported where used: a local-only controller does not pay for it (~0.2 s)

CONNECT_TIMEOUT_S = 10.0  # TCP connect + handshake + auth: an unreachable host fails fast, with its name
COMMAND_TIMEOUT_S = 30.0

_MARK = "--caseledger-remote--"  # separates what rc files print from the command's own output
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # fullmatch

T = TypeVar("T")


def where(ssh: SSH) -> str:
    return f"{ssh.user}@{ssh.host}:{ssh.port}"


def log_path(target_key: str) -> str:
    """The remote service log of a target (outside any workspace: it lives on the service's host)."""
    return f"/tmp/caseledger-{target_key}.log"


def _existing(path: str, what: str, ssh: SSH, field: str) -> str:
    p = Path(path).expanduser()
    if not p.is_file():
        raise RemoteError(
            f"ssh {what} {path} for {where(ssh)} does not exist or is not a file",
            f"point service.ssh.{field} at the {what} on the controller's host (freeze a new case)",
        )
    return str(p)


@asynccontextmanager
async def connect(ssh: SSH) -> AsyncIterator[asyncssh.SSHClientConnection]:
    """An authenticated connection; every failure is a RemoteError naming user@host:port and the fix."""
    import asyncssh  # lazy: a local-only run never pays for SSH (~0.2 s)

    key = _existing(ssh.key_path, "private key", ssh, "key_path")
    known = _existing(ssh.known_hosts, "known_hosts file", ssh, "known_hosts") if ssh.known_hosts else None
    at = where(ssh)
    try:
        # config=None and agent_path=None: the case is the only source of the login (no ~/.ssh/config, no agent)
        conn = await asyncssh.connect(
            ssh.host,
            ssh.port,
            username=ssh.user,
            client_keys=[key],
            known_hosts=known,
            config=None,
            agent_path=None,
            preferred_auth="publickey",
            connect_timeout=CONNECT_TIMEOUT_S,
        )
    except asyncssh.HostKeyNotVerifiable as e:
        raise RemoteError(
            f"host key of {ssh.host}:{ssh.port} is not verified by {ssh.known_hosts} ({e.reason})",
            f"check the host's fingerprint, then add it (ssh-keyscan -p {ssh.port} {ssh.host} >> "
            f"{ssh.known_hosts}) or fix service.ssh.known_hosts",
        ) from None
    except asyncssh.PermissionDenied:
        raise RemoteError(
            f"sshd at {ssh.host}:{ssh.port} refused user {ssh.user} with key {ssh.key_path}",
            f"authorize the key's public half for {ssh.user} on {ssh.host}, or fix service.ssh.user/key_path",
        ) from None
    except asyncssh.KeyImportError as e:
        raise RemoteError(
            f"cannot load private key {ssh.key_path} for {at}: {e}",
            "use an unencrypted private key file in OpenSSH or PEM format",
        ) from None
    except (TimeoutError, asyncssh.ConnectionLost) as e:
        raise RemoteError(
            f"no SSH answer from {at} within {CONNECT_TIMEOUT_S:g}s ({type(e).__name__})",
            "check that sshd runs there and the network allows it, or fix service.ssh.host/port",
        ) from None
    except OSError as e:
        why = (
            "connection refused (nothing listens there)"
            if isinstance(e, ConnectionRefusedError)
            else f"unknown host ({e})"
            if isinstance(e, socket.gaierror)
            else str(e)
        )
        raise RemoteError(
            f"cannot reach sshd at {at}: {why}",
            "start sshd on that host and port, or fix service.ssh.host/port (freeze a new case)",
        ) from None
    except asyncssh.Error as e:
        raise RemoteError(f"ssh to {at} failed: {e.reason}", "check sshd's log on that host") from None
    try:
        yield conn
    finally:
        conn.close()
        await conn.wait_closed()


async def run_script(conn: asyncssh.SSHClientConnection, script: str, stdin: str | None = None) -> tuple[int, bytes]:
    """(exit status, stdout after the mark) of a script run by the remote login shell."""
    res = await conn.run(
        f"printf '%s\\n' {_MARK}\n{script}",
        input=stdin.encode() if stdin is not None else None,
        encoding=None,
        check=False,
    )
    out = res.stdout if isinstance(res.stdout, bytes) else b""
    _, sep, after = out.partition(_MARK.encode() + b"\n")
    status = res.exit_status if res.exit_status is not None else 255
    return status, after if sep else b""


def _parse_stat(data: bytes) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) from /proc/PID/stat (split after the last ')')."""
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return fields[0].decode(), int(fields[19])
    except (IndexError, ValueError):
        return None


async def _stat(conn: asyncssh.SSHClientConnection, pid: int) -> tuple[str, int] | None:
    status, out = await run_script(conn, f"cat /proc/{int(pid)}/stat")
    return _parse_stat(out) if status == 0 else None


def _alive_from(stat: tuple[str, int] | None, ref: Mapping[str, Any]) -> bool:
    if stat is None or stat[0] == "Z":
        return False
    return ref.get("start_time") in (None, 0, stat[1])


async def launch_async(
    conn: asyncssh.SSHClientConnection, argv: list[str], env: dict[str, str], log: str
) -> tuple[int, int]:
    """Start argv detached (own session, stdin /dev/null, output appended to log); (pid, start time)."""
    for k, v in env.items():
        if not _ENV_NAME.fullmatch(k) or "\n" in v or "\0" in v:
            raise RemoteError(
                f"service.env.{k}: a remote environment needs a plain name and a one-line value",
                "fix service.env in a new case",
            )
    # $! is the service itself: without job control the background child is no group leader, so setsid
    # makes it a session leader in place (no fork) and every later exec keeps the pid.
    script = "\n".join(
        [
            "command -v setsid >/dev/null 2>&1 || exit 98",
            f"( umask 077 && : >> {shlex.quote(log)} ) || exit 96",
            'while IFS= read -r kv && [ -n "$kv" ]; do export "$kv" || exit 97; done',
            f"setsid {shlex.join(argv)} </dev/null >> {shlex.quote(log)} 2>&1 &",
            'p=$!; echo "$p"; cat /proc/"$p"/stat 2>/dev/null; exit 0',
        ]
    )
    # an empty line ends the variables: asyncssh sends no EOF for empty input, so stdin is never left open
    status, out = await run_script(conn, script, stdin="".join(f"{k}={v}\n" for k, v in env.items()) + "\n")
    if status == 98:
        raise RemoteError("setsid is not installed on the service host", "install util-linux there")
    if status == 96:
        raise RemoteError(f"cannot write the remote log {log}", "free that path or fix its permissions")
    if status == 97:
        raise RemoteError("the remote shell refused an environment variable", "fix service.env in a new case")
    first, _, rest = out.partition(b"\n")
    if status != 0 or not first.strip().isdigit():
        raise RemoteError(
            f"remote launch printed no pid (exit {status})", "the login shell must be POSIX (sh, bash, dash, zsh)"
        )
    parsed = _parse_stat(rest)
    return int(first), parsed[1] if parsed else 0


async def cmdline_async(conn: asyncssh.SSHClientConnection, pid: int) -> list[str] | None:
    status, out = await run_script(conn, f"cat /proc/{int(pid)}/cmdline")
    if status != 0:
        return None
    return [a.decode(errors="replace") for a in out.split(b"\0") if a]


async def terminate_async(conn: asyncssh.SSHClientConnection, ref: Mapping[str, Any], grace_s: float) -> bool:
    """TERM the process group (or the process), KILL after grace_s; one remote script, checked by start time."""
    polls = max(1, int(grace_s * 10))
    want = int(ref.get("start_time") or 0)
    # the same rule as procs.alive: same pid AND same start time, a zombie is not alive
    script = "\n".join(
        [
            f"p={int(ref['pid'])}; want={want}",
            "alive() { s=$(sed 's/.*) //' /proc/$p/stat 2>/dev/null) || return 1; set -- $s; "
            '[ "$1" != Z ] && { [ "$want" = 0 ] || [ "${20}" = "$want" ]; }; }',
            "alive || { echo gone; exit 0; }",
            "for sig in TERM KILL; do",
            "  kill -s $sig -- -$p 2>/dev/null || kill -s $sig $p 2>/dev/null",
            f"  i=0; while alive && [ $i -lt {polls} ]; do sleep 0.1; i=$((i+1)); done",
            "  alive || { echo stopped; exit 0; }",
            "done",
            "echo alive",
        ]
    )
    _, out = await run_script(conn, script)
    return out.strip() == b"stopped"


async def probe_async(conn: asyncssh.SSHClientConnection, pid: int, paths: list[str]) -> Probe:
    """What pid on the host maps and holds open, the (dev, inode) of each path, and its environment: one script.
    See parse_probe; environment values are returned to the caller to hash, never logged."""
    quoted_paths = " ".join(shlex.quote(x) for x in paths)
    script = "\n".join(
        [
            f"p={int(pid)}",
            "echo '#maps'; cat /proc/$p/maps 2>/dev/null",
            'echo \'#fd\'; for f in /proc/$p/fd/*; do t=$(readlink "$f" 2>/dev/null) || continue; case "$t" in /*) '
            's=$(stat -L -c \'%d %i %F\' "$f" 2>/dev/null) && printf \'%s\\t%s\\t%s\\n\' "$s" "$f" "$t";; esac; done',
            f"echo '#stat'; for q in {quoted_paths}; do stat -L -c '%d %i %s %Y' -- \"$q\" 2>/dev/null || echo -; done"
            if paths
            else "echo '#stat'",
            "echo '#env'; tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null",
        ]
    )
    _, out = await run_script(conn, script)
    return parse_probe(out.decode(errors="replace"), pid, paths)


class Probe(TypedDict):
    """What one probe script read on the host about a process and some paths."""

    held: list[procs.HeldFile]  # files it maps or holds open
    stat: dict[str, list[int] | None]  # path -> [dev, inode, size, mtime], None when it cannot be read
    environ: dict[str, str]  # its environment, for the caller to hash (never logged)


def parse_probe(text: str, pid: int, paths: list[str]) -> Probe:
    """The probe script's output, section by section (#maps, #fd, #stat, #env)."""
    part: dict[str, list[str]] = {"maps": [], "fd": [], "stat": [], "env": []}
    cur = None
    for line in text.split("\n"):
        if line in ("#maps", "#fd", "#stat", "#env"):
            cur = line[1:]
        elif cur is not None and line:
            part[cur].append(line)
    held = procs.mapped_files(part["maps"], pid)
    for line in part["fd"]:
        st, fd, target = [*line.split("\t"), "", ""][:3]
        bits = st.split(" ", 2)
        if len(bits) < 3 or bits[2] not in ("regular file", "regular empty file"):
            continue
        key = (int(bits[0]), int(bits[1]))
        held.setdefault(
            key,
            {
                "path": target.removesuffix(" (deleted)"),
                "dev": key[0],
                "inode": key[1],
                "replaced": target.endswith(" (deleted)"),
                "via": fd,
            },
        )
    stats: dict[str, list[int] | None] = {}
    for path, line in zip(paths, part["stat"], strict=False):
        bits = line.split()
        stats[path] = [int(b) for b in bits] if len(bits) == 4 else None
    for h in held.values():  # a path replaced by rename is not "(deleted)" when another name still links it
        now = stats.get(h["path"])
        if now is not None and (now[0], now[1]) != (h["dev"], h["inode"]):
            h["replaced"] = True
    env = dict(kv.split("=", 1) for kv in part["env"] if "=" in kv)
    return {"held": list(held.values()), "stat": stats, "environ": env}


async def sha256_async(conn: asyncssh.SSHClientConnection, paths: list[str]) -> dict[str, str]:
    """sha256 of files on the host (sha256sum), path -> hex; missing or unreadable ones are left out."""
    if not paths:
        return {}
    status, out = await run_script(
        conn,
        "command -v sha256sum >/dev/null || exit 98\nsha256sum -- "
        + " ".join(shlex.quote(x) for x in paths)
        + " 2>/dev/null",
    )
    if status == 98:
        raise RemoteError("sha256sum is not installed on the host", "install coreutils there")
    got: dict[str, str] = {}
    for line in out.decode(errors="replace").splitlines():
        digest, _, name = line.partition("  ")
        if len(digest) == 64:
            got[name] = digest
    return got


class Remote:
    """The sync face for the controller: one SSH connection per call (anyio.run), closed before returning."""

    def __init__(self, ssh: SSH) -> None:
        self.ssh = ssh

    def _call(
        self, fn: Callable[[asyncssh.SSHClientConnection], Awaitable[T]], timeout_s: float = COMMAND_TIMEOUT_S
    ) -> T:
        import asyncssh  # lazy: a local-only run never pays for SSH (~0.2 s)

        async def main() -> T:
            try:
                with anyio.fail_after(CONNECT_TIMEOUT_S + timeout_s):
                    async with connect(self.ssh) as conn:
                        try:
                            return await fn(conn)
                        except RemoteError as e:  # connect's own errors already name the login
                            raise RemoteError(f"{where(self.ssh)}: {e.message}", e.fix) from None
            except TimeoutError:
                raise RemoteError(
                    f"a remote command on {where(self.ssh)} took over {timeout_s:g}s", "check the host's load and sshd"
                ) from None
            except (asyncssh.Error, OSError) as e:
                raise RemoteError(
                    f"ssh to {where(self.ssh)} broke: {type(e).__name__}: {e}",
                    "check the host and its sshd, then resume",
                ) from None

        return anyio.run(main)

    def check(self) -> None:
        """Connect and authenticate only (RemoteError names the problem and the fix)."""
        self._call(lambda conn: run_script(conn, "true"))

    def launch(self, argv: list[str], env: dict[str, str], log: str) -> tuple[int, int]:
        """Start argv detached on the host; (pid, start time)."""
        return self._call(lambda conn: launch_async(conn, argv, env, log))

    def cmdline(self, pid: int) -> list[str] | None:
        """The live argv of pid from /proc on the host, or None when it is gone."""
        return self._call(lambda conn: cmdline_async(conn, pid))

    def start_time(self, pid: int) -> int | None:
        stat = self._call(lambda conn: _stat(conn, pid))
        return stat[1] if stat else None

    def alive(self, ref: Mapping[str, Any] | None) -> bool:
        """True when the referenced process runs on this host (same pid AND start time, not a zombie)."""
        if not ref or "pid" not in ref or ref.get("host") not in (None, self.ssh.host):
            return False
        return _alive_from(self._call(lambda conn: _stat(conn, int(ref["pid"]))), ref)

    def terminate(self, ref: Mapping[str, Any], grace_s: float = 5.0) -> bool:
        """TERM then KILL; True when this call stopped it, False when it was already gone (or would not die)."""
        return self._call(lambda conn: terminate_async(conn, ref, grace_s), timeout_s=2 * grace_s + COMMAND_TIMEOUT_S)

    def probe(self, pid: int, paths: list[str]) -> Probe:
        """The held files, the paths' (dev, inode, size, mtime) and the environment of pid on the host."""
        return self._call(lambda conn: probe_async(conn, pid, paths))

    def sha256(self, paths: list[str]) -> dict[str, str]:
        """sha256 of files on the host, path -> hex (unreadable ones left out)."""
        return self._call(lambda conn: sha256_async(conn, paths), timeout_s=max(COMMAND_TIMEOUT_S, 600.0))

    def tail(self, log: str, n_bytes: int = 400) -> str:
        """The last bytes of a remote log ('' when it cannot be read)."""
        _, out = self._call(lambda conn: run_script(conn, f"tail -c {int(n_bytes)} -- {shlex.quote(log)}"))
        return out.decode(errors="replace")
