"""The SSH link to a load host (run/remote/load.py): one connection reopened with backoff, the remote scripts'
runner and copier, the clock reader, and where a run lives there.

Remote command lines are constant script text, integers and `shlex.quote`d paths (services/remote.py is the SSH
layer: host-key policy, key by path only).
"""

from __future__ import annotations

import os
import shlex
import statistics
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

import anyio

from caseledger.case.model import LoadHost
from caseledger.errors import RemoteError
from caseledger.ledger.runs import Run
from caseledger.services import remote
from caseledger.workspace import RunPaths, read_json_or_none, utc_now

if TYPE_CHECKING:
    import asyncssh  # imported where used (services/remote.py): a local-only run never pays for it

T = TypeVar("T")

POLL_TIMEOUT_S = 5.0  # one remote command; a cut link shows as this timeout
BACKOFF_S = (0.25, 0.5, 1.0, 2.0, 4.0)  # reconnect waits, the last repeated
CLOCK_ROUNDS = 9

_CLOCK_PY = (
    "import sys, time\nout = sys.stdout\nout.write('clock-ready\\n'); out.flush()\n"
    "for _ in iter(sys.stdin.buffer.readline, b''):\n    out.write('%d\\n' % time.time_ns()); out.flush()\n"
)


class Clock(TypedDict):
    """One clock measurement against a load host (read_clock); load/clock.json keeps one from before the load and
    one from after it."""

    offset_ns: int
    uncertainty_ns: int
    rtt_min_ns: int
    rtt_median_ns: int
    rounds: int
    measured_utc: str
    method: str
    maps: str


class LinkLost(Exception):
    """The load host could not be reached again within load.host.reconnect_s."""


class _Retry(Exception):
    """The link failed under a call (connect, transport, timeout): reconnect and try again."""


def where(host: LoadHost) -> str:
    return remote.where(host)


def remote_run_dir(run: Run, host: LoadHost) -> str:
    return f"{host.workdir.rstrip('/')}/ledger/runs/{run.run_id}"


def remote_dataset_dir(run: Run, host: LoadHost) -> str:
    return f"{host.workdir.rstrip('/')}/ledger/datasets/{run.meta.dataset()}"


def record_path(paths: RunPaths) -> Path:
    return paths.load_remote


def launched(paths: RunPaths) -> dict[str, Any] | None:  # JSON: load/remote.json as read
    """load/remote.json: a launch was attempted (its pid once known). Its presence forbids a second launch."""
    rec = read_json_or_none(record_path(paths))
    return rec if isinstance(rec, dict) else None


def load_host_error(e: RemoteError) -> RemoteError:
    """connect()'s fixes name service.ssh; here the login is load.host."""
    return RemoteError(e.message.replace("service.ssh", "load.host"), e.fix.replace("service.ssh", "load.host"))


class Link:
    """One SSH connection to the load host, reopened with backoff after a failure; LinkLost once the host has
    not answered for `budget_s`."""

    def __init__(self, host: LoadHost, budget_s: float) -> None:
        self.host = host
        self.budget_s = budget_s
        self.conn: asyncssh.SSHClientConnection | None = None
        self._stack: AsyncExitStack | None = None
        self.reconnects = 0
        self.failures = 0
        self.last_error = ""

    async def _open(self) -> asyncssh.SSHClientConnection:
        stack = AsyncExitStack()
        try:
            with anyio.fail_after(remote.CONNECT_TIMEOUT_S + 2):
                conn = await stack.enter_async_context(remote.connect(self.host))
        except BaseException:
            with anyio.move_on_after(1, shield=True):
                await stack.aclose()
            raise
        self._stack, self.conn = stack, conn
        return conn

    async def drop(self) -> None:
        conn, stack = self.conn, self._stack
        self.conn = self._stack = None
        if conn is not None:
            conn.abort()  # a cut link never flushes: do not wait for it
        if stack is not None:
            with anyio.move_on_after(1, shield=True):
                await stack.aclose()

    async def call(
        self, fn: Callable[[asyncssh.SSHClientConnection], Awaitable[T]], timeout_s: float = POLL_TIMEOUT_S
    ) -> T:
        import asyncssh  # lazy: a local-only run never pays for SSH (~0.2 s)

        n, lost_since = 0, None
        while True:
            try:
                try:
                    conn = self.conn or await self._open()
                except RemoteError as e:  # connect() names what failed: unreachable, refused, timed out
                    raise _Retry(load_host_error(e).message) from None
                try:
                    with anyio.fail_after(timeout_s):
                        out = await fn(conn)
                except (TimeoutError, asyncssh.Error, OSError) as e:  # the link, not the command's answer
                    raise _Retry(f"{type(e).__name__}: {e}" if str(e) else f"no answer within {timeout_s:g}s") from None
                return out
            except _Retry as e:
                self.last_error = str(e)
            self.failures += 1
            await self.drop()
            lost_since = lost_since or time.monotonic()  # the budget counts from the first failure of this call
            if time.monotonic() - lost_since > self.budget_s:
                raise LinkLost(self.last_error)
            await anyio.sleep(BACKOFF_S[min(n, len(BACKOFF_S) - 1)])
            n += 1
            self.reconnects += 1


# ---------------------------------------------------------------------------------------------- remote scripts
async def run_script(conn: asyncssh.SSHClientConnection, script: str) -> tuple[int, bytes]:
    return await remote.run_script(conn, script)  # the one runner: output after its mark (rc-file noise cut off)


async def put_file(conn: asyncssh.SSHClientConnection, src: Path, dest: str) -> None:
    """Copy a local file to dest on the host atomically (temp file + rename), private to the login user; streamed
    in blocks (a dataset can be large)."""
    tmp = f"{dest}.tmp{os.getpid()}"
    script = (
        f"umask 077 && mkdir -p {shlex.quote(str(Path(dest).parent))} && cat > {shlex.quote(tmp)} && "
        f"mv -f {shlex.quote(tmp)} {shlex.quote(dest)}"
    )
    async with conn.create_process(script, encoding=None) as proc:
        with src.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                proc.stdin.write(block)
                await proc.stdin.drain()
        proc.stdin.write_eof()
        res = await proc.wait(check=False)
    if res.exit_status != 0:
        raise RemoteError(
            f"cannot write {dest} on the load host (exit {res.exit_status})",
            "check load.host.workdir: it must be writable by load.host.user",
        )


async def sha256s(conn: asyncssh.SSHClientConnection, files: list[str]) -> dict[str, str | None]:
    """sha256 of each remote file (None when missing)."""
    got: dict[str, str | None] = dict.fromkeys(files)
    got.update(await remote.sha256_async(conn, files))
    return got


async def read_clock(conn: asyncssh.SSHClientConnection, host: LoadHost) -> Clock:
    """Offset of the load host's wall clock from the controller's: CLOCK_ROUNDS round trips to a reader there;
    the shortest one bounds the error (the remote read happened between send and receive)."""
    cmd = f"{shlex.quote(host.python)} -c {shlex.quote(_CLOCK_PY)}"
    samples: list[tuple[int, int, int]] = []
    async with conn.create_process(cmd, encoding=None) as proc:
        while True:
            line = await proc.stdout.readline()
            if not line:
                raise RemoteError(f"the clock reader on the load host ({host.python}) exited", "check load.host.python")
            if line.strip() == b"clock-ready":
                break
        for _ in range(CLOCK_ROUNDS):
            t0 = time.time_ns()
            proc.stdin.write(b"t\n")
            line = await proc.stdout.readline()
            t1 = time.time_ns()
            samples.append((t0, int(line), t1))
        proc.stdin.write_eof()
    t0, r, t1 = min(samples, key=lambda s: s[2] - s[0])
    rtts = [s[2] - s[0] for s in samples]
    return {
        "offset_ns": r - (t0 + t1) // 2,
        "uncertainty_ns": (t1 - t0 + 1) // 2,
        "rtt_min_ns": t1 - t0,
        "rtt_median_ns": int(statistics.median(rtts)),
        "rounds": len(samples),
        "measured_utc": utc_now(),
        "method": "SSH round trips to a reader on the load host; offset = remote wall - midpoint of the "
        "shortest round trip, uncertainty = half of it",
        "maps": "controller wall ns = load-host wall ns - offset_ns (± uncertainty_ns)",
    }


def anyio_run(fn: Callable[[], Awaitable[T]]) -> T:
    return anyio.run(fn)
