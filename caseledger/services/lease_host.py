"""Target leases kept in a directory on another host over SSH (target.lease_host, or service.ssh's host).

The same lease as ledger/leases.py (owner, expiry renewed by heartbeats, strictly increasing fence), held in
one file per target on the lease host, so controllers on different hosts (or in containers with different
host directories) see one owner. Each operation is ONE fixed shell script over ONE SSH exec: `flock` on the
target's lock file there, read the lease's header line, decide, write the new lease to a temporary file and
`mv` it over the old one (atomic in the directory), print the host's clock and the lease. The expiry is
judged on the lease host's clock, so two controllers with skewed clocks still agree.

The lease file: a header line `FENCE RUN_ID EXPIRES_MS` (`-` for no run; the script trusts only it) and the
lease's JSON (owner, workspace, the load client's ref, a claim token) on the next line. Latency: a process
keeps one connection per lease host (a background event loop), so a heartbeat is one exec on a warm
connection; start_run pays the SSH handshake once per process.

Security: the script is constant text; the directory, key, run id and numbers are quoted or validated. The
lease JSON travels on stdin. The private key is referenced by path (services.remote.connect).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import re
import shlex
import threading
import time
from typing import TYPE_CHECKING

import orjson

from caseledger.case.service import SSH
from caseledger.errors import RemoteError
from caseledger.ledger.leases import Lease
from caseledger.services.remote import COMMAND_TIMEOUT_S, CONNECT_TIMEOUT_S, connect, run_script, where

if TYPE_CHECKING:
    import asyncssh

DEFAULT_DIR = "$HOME/.local/state/caseledger/leases"  # expanded by the remote login shell
ENV_DIR = "CASELEDGER_LEASE_HOST_DIR"  # the directory on the lease host when the case names none (tests set it)
_KEY = re.compile(r"t-[0-9a-f]{10}")
_RUN = re.compile(r"[A-Za-z0-9_.-]{1,128}")

# $1 dir-assignment is spliced as constant text or a quoted path; every other value is an argument
_SCRIPT = r"""
command -v flock >/dev/null 2>&1 || exit 98
k={key} op={op} run={run} fence={fence} seen={seen} ms={ms}
mkdir -p "$d" && chmod 700 "$d" || exit 96
exec 9>>"$d/$k.lock" || exit 96
flock -w 10 9 || exit 95
now=$(date +%s%3N); case $now in *[!0-9]*) exit 94;; esac
f=0 r=- e=0
[ -s "$d/$k.lease" ] && read -r f r e < "$d/$k.lease"
put() {{ t="$d/.$k.$$"; {{ printf '%s %s %s\n' "$1" "$2" "$3"; cat; }} > "$t" && mv -f "$t" "$d/$k.lease" || exit 96; }}
st=0
case $op in
acquire) if [ "$r" = - ] || [ "$seen" = "$f:$e" ]; then put $((f+1)) "$run" $((now+ms)); else st=3; fi;;
renew) if [ "$r" = "$run" ] && [ "$f" = "$fence" ]; then put "$f" "$run" $((now+ms)); else st=5; fi;;
release) if [ "$r" = "$run" ] && [ "$f" = "$fence" ]; then put "$f" - 0; fi;;
esac
echo "$now"; cat "$d/$k.lease" 2>/dev/null
exit $st
"""

HELD, REJECTED = 3, 5


class Answer:
    """What one lease operation saw: the lease host's clock (epoch seconds) and the lease after the operation."""

    def __init__(self, status: int, now: float, lease: Lease | None, header: str) -> None:
        self.status, self.now, self.lease, self.header = status, now, lease, header
        self.rtt = 0.0  # seconds from sending the operation to its answer

    def seen(self) -> str:
        """'FENCE:EXPIRES_MS' of the lease as read: an acquire that judged it takeable takes exactly this one."""
        head = self.header.split()
        return f"{head[0]}:{head[2]}" if len(head) == 3 else "-"


def _parse(key: str, status: int, out: bytes) -> Answer:
    lines = out.decode(errors="replace").splitlines()
    try:
        now = int(lines[0]) / 1000.0
    except (IndexError, ValueError):
        raise RemoteError(
            f"the lease script printed no clock (exit {status})",
            "the lease host needs a POSIX login shell and GNU date",
        ) from None
    if len(lines) < 2 or not lines[1].strip():
        return Answer(status, now, None, "")
    head = lines[1].split()
    try:
        body = orjson.loads(lines[2]) if len(lines) > 2 and lines[2].strip() else {"target_key": key}
        fence, run, exp = int(head[0]), head[1], int(head[2]) / 1000.0
    except (IndexError, ValueError, orjson.JSONDecodeError):
        raise RemoteError(
            f"lease file of '{key}' on the lease host is unreadable ({lines[1][:80]!r})",
            "remove it only when no controller holds that target",
        ) from None
    lease = Lease.from_json(
        {**body, "target_key": key, "fence": fence, "expires": exp, "run_id": None if run == "-" else run}
    )
    return Answer(status, now, lease, lines[1])


class LeaseLink:
    """One SSH connection to a lease host, kept open on a background event loop and reused by every lease
    operation of this process (one exec each); a broken connection is dropped and the next call reconnects."""

    def __init__(self, ssh: SSH) -> None:
        self.ssh = ssh
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conn: asyncssh.SSHClientConnection | None = None
        self._stack: contextlib.AsyncExitStack | None = None

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="lease-link", daemon=True).start()
            self._loop = loop
        return self._loop

    async def _exec(self, script: str, stdin: str, fresh: bool) -> tuple[int, bytes]:
        import asyncssh  # lazy: a local-only run never pays for SSH (~0.2 s)

        if fresh or self._conn is None:
            await self._close()
            self._stack = contextlib.AsyncExitStack()
            self._conn = await self._stack.enter_async_context(connect(self.ssh))
        try:
            return await run_script(self._conn, script, stdin)
        except (asyncssh.Error, OSError):
            await self._close()
            raise

    async def _close(self) -> None:
        stack, self._stack, self._conn = self._stack, None, None
        if stack is not None:
            with contextlib.suppress(Exception):  # closing a broken connection must not hide the real error
                await stack.aclose()

    def call(self, script: str, stdin: str, timeout_s: float) -> tuple[int, bytes]:
        """(exit status, output) of one script within timeout_s in all (a connect included); a reused connection
        that broke is retried once on a new one."""
        import asyncssh  # lazy: a local-only run never pays for SSH (~0.2 s)

        deadline = time.monotonic() + timeout_s
        with self._lock:
            loop = self._ensure_loop()
            for attempt in (0, 1):
                reused = self._conn is not None and attempt == 0
                fut = asyncio.run_coroutine_threadsafe(self._exec(script, stdin, fresh=attempt == 1), loop)
                try:
                    return fut.result(timeout=max(0.0, deadline - time.monotonic()))
                except concurrent.futures.TimeoutError:
                    fut.cancel()
                    asyncio.run_coroutine_threadsafe(self._close(), loop)
                    raise RemoteError(
                        f"no answer from lease host {where(self.ssh)} within {timeout_s:g}s",
                        "check that host and its sshd",
                    ) from None
                except (asyncssh.Error, OSError) as e:
                    if not reused:
                        raise RemoteError(
                            f"ssh to lease host {where(self.ssh)} broke: {type(e).__name__}: {e}",
                            "check the host and its sshd",
                        ) from None
            raise AssertionError("unreachable")


_LINKS: dict[str, LeaseLink] = {}
_LINKS_LOCK = threading.Lock()


def link(ssh: SSH) -> LeaseLink:
    """This process's connection to a lease host (one per login)."""
    with _LINKS_LOCK:
        return _LINKS.setdefault(ssh.model_dump_json(), LeaseLink(ssh))


def lease_dir(ssh: SSH) -> str:
    """The lease directory on the host, as shell text: target.lease_host.dir, else $CASELEDGER_LEASE_HOST_DIR
    of the controller (set it the same everywhere, as CASELEDGER_HOST_DIR), else the login user's state dir."""
    d = getattr(ssh, "dir", None) or os.environ.get(ENV_DIR)
    return shlex.quote(d) if d else DEFAULT_DIR


def operate(
    ssh: SSH,
    op: str,
    key: str,
    lease: Lease,
    *,
    seen: str = "-",
    lease_s: float,
    timeout_s: float = CONNECT_TIMEOUT_S + COMMAND_TIMEOUT_S,
) -> Answer:
    """Run one lease operation (acquire / renew / release) on the lease host; RemoteError when it cannot."""
    run = lease.run_id or "-"
    if not _KEY.fullmatch(key) or not _RUN.fullmatch(run) or not re.fullmatch(r"[0-9:-]+|-", seen):
        raise RemoteError(
            f"lease key {key!r} or run id {run!r} is not of the expected form", "report it: caseledger builds both"
        )
    script = f"d={lease_dir(ssh)}\n" + _SCRIPT.format(
        key=key, op=op, run=shlex.quote(run), fence=int(lease.fence), seen=shlex.quote(seen), ms=int(lease_s * 1000)
    )
    body = orjson.dumps({**lease.to_json(), "expires_utc": None}).decode() + "\n"
    t0 = time.monotonic()
    status, out = link(ssh).call(script, body, timeout_s)
    if status in (94, 95, 96, 98):
        why = {
            98: "flock (util-linux) is not installed",
            96: f"cannot write the lease directory {lease_dir(ssh)}",
            95: "its lease lock was held over 10 s",
            94: "its date cannot print milliseconds (GNU date)",
        }
        raise RemoteError(
            f"lease host {where(ssh)}: {why[status]}",
            "fix that on the lease host, or point target.lease_host.dir elsewhere",
        )
    ans = _parse(key, status, out)
    ans.rtt = time.monotonic() - t0
    return ans
