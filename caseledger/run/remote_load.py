"""The formal load on another host (case `load.host`): the same `python -m caseledger.load RUN_DIR`, started over
SSH in a session of its own, followed from the controller, its raw data copied back and hash-checked.

One code path, two hosts: the load host gets a workspace of its own (`load.host.workdir`) holding a copy of the
run (run.json, case.json) and of its dataset, each copied file's sha256 checked there after the copy; the client
reads only that copy and writes raw.jsonl, sent.log, progress.json, anchor.json and end.json in its run directory
exactly as it does locally. The controller polls it over one SSH connection, appends each new complete line of
raw.jsonl and sent.log to the local files (so status counts what is already safe here), copies progress, anchor
and finally the end file, and seals the load only when the local raw data's sha256 equals the remote one.

A lost link never stops the client: the controller reconnects with backoff; past `load.host.reconnect_s` the load
phase fails `end_unknown`, the controller keeps its lease (the remote client's ref is in it, see ledger.leases),
and a resume re-attaches: it checks the remote pid *and* start time, progress and end file, copies what is
missing. Once `load/remote.json` names a launch, no second client is ever started for the run (the remote client
itself also refuses a second start: its flock on raw.jsonl and its anchor, as locally).

The clock relation between the hosts is measured by several round trips to a small remote reader (offset and
its uncertainty, half the shortest round trip) before the load and again after it, and recorded in
load/clock.json and the load evidence: controller wall time = remote wall time - offset_ns (± uncertainty_ns).

Several processes (load.processes > 1 with load.host, or load.hosts: each host with its processes; run_parts, called
by run/load_parts.py): per host one SSH link, the inputs copied once, the clock measured once (recorded in each of
its processes' load/p<k>/clock.json); every process `python -m caseledger.load RUN_DIR k` started armed (its files
under <remote run>/load/p<k>/, remote.json and pid.json under load/p<k>/ here); once every process of every host is
ready the controller writes load/go here (from then on nothing is started again) naming one instant on its wall
clock, and each host gets it as its own monotonic instant (load/parts.write_go_at, through the host's offset). Each
process is then followed, copied and sealed as one client is; a host whose link stays lost is recorded while the
others are followed to their end, then the phase fails end_unknown; load/parts.py merges what came back.

Security: the SSH layer is services/remote.py (host-key policy, key by path only). Remote command lines are
constant script text, integers and `shlex.quote`d paths; the API key travels on the channel's stdin.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import statistics
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import orjson

from caseledger import procs, redact
from caseledger.case.model import Case, LoadHost
from caseledger.errors import FailureClass, PhaseFailed, RemoteError
from caseledger.faults import checkpoint
from caseledger.ledger.runs import Run
from caseledger.load.parts import offset_of
from caseledger.services import remote
from caseledger.workspace import PartPaths, RunPaths, atomic_write, read_json_or_none, sha256_file, utc_now, write_json

if TYPE_CHECKING:
    import asyncssh  # imported where used (services/remote.py): a local-only run never pays for it

T = TypeVar("T")

POLL_S = 0.5  # how often the controller reads the remote progress
POLL_TIMEOUT_S = 5.0  # one remote command; a cut link shows as this timeout
CHUNK_BYTES = 1 << 20  # raw bytes copied per remote command
LINK_FLOOR_BPS = 256 << 10  # the slowest link a chunk's timeout allows for (a cut link shows within seconds)
BACKOFF_S = (0.25, 0.5, 1.0, 2.0, 4.0)  # reconnect waits, the last repeated
CLOCK_ROUNDS = 9
END_EXIT_WAIT_S = 30.0  # the client wrote its end file and is exiting
PREFLIGHT_TIMEOUT_S = 300.0
COPIED = ("raw.jsonl", "sent.log")  # appended line by line as they grow

_CLOCK_PY = (
    "import sys, time\nout = sys.stdout\nout.write('clock-ready\\n'); out.flush()\n"
    "for _ in iter(sys.stdin.buffer.readline, b''):\n    out.write('%d\\n' % time.time_ns()); out.flush()\n"
)
_DIGEST_PY = (
    "import importlib.metadata as m\nfrom caseledger.run.remote_load import package_digest\n"
    "print(m.version('caseledger'), package_digest())\n"
)


_FETCH_PY = (
    "import sys, urllib.request\nwith urllib.request.urlopen(sys.argv[1], timeout=5) as r:\n"
    "    sys.stdout.write(r.read().decode())\n"
)


class LinkLost(Exception):
    """The load host could not be reached again within load.host.reconnect_s."""


class _Retry(Exception):
    """The link failed under a call (connect, transport, timeout): reconnect and try again."""


def package_digest() -> str:
    """sha256 over this caseledger's source files (relative path and content): equal on both hosts means the
    load host runs the same client code."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def where(host: LoadHost) -> str:
    return remote.where(host)


def remote_run_dir(run: Run, host: LoadHost) -> str:
    return f"{host.workdir.rstrip('/')}/ledger/runs/{run.run_id}"


def remote_dataset_dir(run: Run, host: LoadHost) -> str:
    return f"{host.workdir.rstrip('/')}/ledger/datasets/{run.meta.dataset()}"


def record_path(paths: RunPaths) -> Path:
    return paths.load_remote


def launched(paths: RunPaths) -> dict[str, Any] | None:
    """load/remote.json: a launch was attempted (its pid once known). Its presence forbids a second launch."""
    rec = read_json_or_none(record_path(paths))
    return rec if isinstance(rec, dict) else None


def _named(e: RemoteError) -> RemoteError:
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
                    raise _Retry(_named(e).message) from None
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
async def _script(conn: asyncssh.SSHClientConnection, script: str) -> tuple[int, bytes]:
    return await remote._run(conn, script)  # the one runner: output after its mark (rc-file noise cut off)


async def _put(conn: asyncssh.SSHClientConnection, src: Path, dest: str) -> None:
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


async def _sha256s(conn: asyncssh.SSHClientConnection, files: list[str]) -> dict[str, str | None]:
    """sha256 of each remote file (None when missing)."""
    got: dict[str, str | None] = dict.fromkeys(files)
    got.update(await remote.sha256_async(conn, files))
    return got


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


async def _copy_verified(conn: asyncssh.SSHClientConnection, run: Run, host: LoadHost) -> dict[str, Any]:
    """Copy the run and its dataset to the load host where missing or different; every file hash-checked there."""
    files = _local_files(run, host)
    want = {r: sha256_file(p) for r, p in files.items()}
    have = await _sha256s(conn, list(files))
    copied = []
    for r, p in files.items():
        if have.get(r) != want[r]:
            await _put(conn, p, r)
            copied.append(Path(r).name)
    if copied:
        have = await _sha256s(conn, list(files))
    bad = [Path(r).name for r in files if have.get(r) != want[r]]
    if bad:
        raise RemoteError(
            f"copied {', '.join(bad)} to the load host, but its sha256 there differs",
            "check the load host's disk (load.host.workdir), then resume",
        )
    return {"copied": copied, "sha256": {Path(r).name: want[r][:16] for r in files}}


async def _version(conn: asyncssh.SSHClientConnection, host: LoadHost) -> dict[str, str]:
    status, out = await _script(conn, f"cd / && {shlex.quote(host.python)} -c {shlex.quote(_DIGEST_PY)} 2>&1")
    words = out.decode(errors="replace").split()
    if status != 0 or len(words) != 2:
        raise RemoteError(
            f"{host.python} on the load host cannot import caseledger (exit {status}: {' '.join(words)[-160:]})",
            "install this caseledger there, or point load.host.python at an interpreter that has it",
        )
    return {"version": words[0], "digest": words[1]}


async def _preflight(conn: asyncssh.SSHClientConnection, run: Run, host: LoadHost) -> dict[str, Any]:
    """The real preflight entry point, fresh, on the load host (sockets forbidden there as here)."""
    rdir = remote_run_dir(run, host)
    status, out = await _script(
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
    checks: dict[str, Any] = res.get("checks") or {}
    return checks


async def _clock(conn: asyncssh.SSHClientConnection, host: LoadHost) -> dict[str, Any]:
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


# ------------------------------------------------------------------------------------------------ sync faces
def _anyio_run(fn: Callable[[], Awaitable[T]]) -> T:
    return anyio.run(fn)


def preflight(run: Run) -> dict[str, Any]:
    """Preflight on the load host (load.host; with load.hosts on each, {"hosts": [...]}): the same caseledger
    there (source digest), the run and its dataset copied and hash-verified, the real preflight entry point run
    fresh there, and the clock offset. PhaseFailed (before_model) names the host and the fix."""
    if run.case.load.hosts:
        return {"hosts": [_preflight_host(run, host) for host, _ in run.case.load.host_shares()]}
    host = run.case.load.host
    assert host is not None
    return _preflight_host(run, host)


def _preflight_host(run: Run, host: LoadHost) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
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
            files = await link.call(lambda c: _copy_verified(c, run, host), timeout_s=PREFLIGHT_TIMEOUT_S)
            checks = await link.call(lambda c: _preflight(c, run, host), timeout_s=PREFLIGHT_TIMEOUT_S)
            clock = await link.call(lambda c: _clock(c, host), timeout_s=30)
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
        return _anyio_run(main)
    except (RemoteError, LinkLost) as e:
        msg = e.message if isinstance(e, RemoteError) else f"load host {where(host)} unreachable: {e}"
        fix = e.fix if isinstance(e, RemoteError) else "check the link to load.host, then resume"
        raise PhaseFailed(
            f"load host {where(host)}: {msg}"[:400], FailureClass.BEFORE_MODEL, f"{fix}; 0 model requests were sent"
        ) from None


class Follower:
    """The controller's side of one remote load client: start it once, follow it, copy its files, seal them.
    paths: the run's (one client, load/) or one process's of several (load/p<k>/, the same names under
    <remote run>/load/p<k>/ there); link: one SSH connection shared by the processes of one host."""

    def __init__(
        self, run: Run, host: LoadHost | None = None, paths: RunPaths | None = None, link: Link | None = None
    ) -> None:
        host = host or run.case.load.host
        assert host is not None
        self.run, self.host, self.paths = run, host, paths or run.paths
        self.rdir = remote_run_dir(run, host)
        self.part = self.paths.part if isinstance(self.paths, PartPaths) else None  # process k of several
        self.rload = f"{self.rdir}/load" + (f"/p{self.part}" if self.part is not None else "")
        self.link = link or Link(host, budget_s=host.reconnect_s)
        self.k = self.part or 0
        self.copied_bytes = 0
        self._gone_once = False  # its end file may land between the status script's two reads: look once more
        self._end_since: float | None = None

    # ---- launch
    async def launch(self, env: dict[str, str]) -> dict[str, Any]:
        """Copy/verify the inputs, measure the clock, then start the client (remote.json first: from here on
        no second launch). Returns the clock measured before the load."""
        clock = await self.prepare()
        await self.start(env, clock)
        return clock

    async def prepare(self) -> dict[str, Any]:
        """Once per host: the inputs copied and verified, an earlier attempt's remote load directory set aside,
        the clock measured (returned)."""
        host = self.host
        await self.link.call(lambda c: _copy_verified(c, self.run, host), timeout_s=PREFLIGHT_TIMEOUT_S)
        await self.link.call(self._set_aside)
        clock: dict[str, Any] = await self.link.call(lambda c: _clock(c, host), timeout_s=30)
        return clock

    async def start(self, env: dict[str, str], clock: dict[str, Any]) -> dict[str, Any]:
        """Start this client (remote.json first: from here on no second launch); its ref."""
        host, paths = self.host, self.paths
        paths.load_dir.mkdir(parents=True, exist_ok=True)
        _clock_record(paths, host, clock, None)  # kept for a resume, whatever happens to this controller
        write_json(
            record_path(paths),
            {
                "host": host.host,
                "port": host.port,
                "user": host.user,
                "run_dir": self.rdir,
                "state": "launching",
                "utc": utc_now(),
            },
        )
        # a ref on that host before its pid is known: the lease names it from the next heartbeat on (leases.py)
        write_json(paths.load_pid, {"pid": 0, "start_time": 0, "host": host.host})
        argv = [host.python, "-m", "caseledger.load", self.rdir]
        argv += [str(self.part)] if self.part is not None else []
        # one attempt only: a launch whose answer was lost may have started the client (resume finds its pid)
        try:
            conn = self.link.conn or await self.link._open()
            with anyio.fail_after(remote.COMMAND_TIMEOUT_S):
                pid, started = await remote.launch_async(conn, argv, env, f"{self.rload}/client.log")
        except RemoteError as e:  # the launch script refused (no setsid, log not writable): nothing started
            record_path(paths).unlink(missing_ok=True)
            named = _named(e)
            raise PhaseFailed(
                f"load host {where(host)}: {named.message}",
                FailureClass.BEFORE_MODEL,
                f"{named.fix}; then resume (nothing was sent)",
            ) from None
        except Exception as e:  # asyncssh.Error, OSError, TimeoutError: the answer was lost; the client may run
            raise RemoteError(
                f"the launch on the load host got no answer ({type(e).__name__})",
                "resume finds the client by its pid file",
            ) from None
        checkpoint("controller", "during", "remote_launch")  # dies between the launch and recording its pid
        ref = {"pid": pid, "start_time": started, "host": host.host}
        write_json(record_path(paths), {**read_json_or_none(record_path(paths)), **ref, "state": "launched"})
        write_json(paths.load_pid, ref)  # another host: procs.alive says False; the lease keeps it (leases.py)
        return ref

    async def _set_aside(self, conn: asyncssh.SSHClientConnection) -> None:
        """A remote load directory no launch here knows of is a superseded attempt's (its local copy was set
        aside, e.g. after hot_entry): move it aside there too, once it has ended; never under a live client.
        Ended: its end file, or every process's of several, or aborted before any process sent (no anchor)."""
        d = f"{self.rdir}/load"
        q = shlex.quote(d)
        status, out = await _script(
            conn,
            "\n".join(
                [
                    "ended() {",
                    f"  [ -f {q}/end.json ] && return 0",
                    f"  [ -f {q}/abort ] && ! ls {q}/p*/anchor.json >/dev/null 2>&1 && return 0",
                    f'  set -- {q}/p*/; [ -d "$1" ] || return 1',
                    '  for p; do [ -f "$p/end.json" ] || return 1; done',
                    "}",
                    f'if [ -d {q} ] && [ -n "$(ls -A {q})" ]; then',
                    "  ended || { echo unended; exit 0; }",
                    f"  mv {q} {shlex.quote(d + '.superseded-' + str(time.time_ns()))} || exit 1",
                    "fi",
                    f"umask 077; mkdir -p {q}",
                ]
            ),
        )
        if status != 0 or out.strip() == b"unended":
            raise RemoteError(
                f"{d} on the load host holds a load client's files without an end file, and this run "
                "has no record of starting it",
                "check that directory on the load host (a client may "
                "still run there); move it away once no client runs, then resume",
            )

    async def find_pid(self) -> dict[str, Any] | None:
        """The client's pid from the remote pid.json (a launch whose answer was lost), or None."""

        async def read(conn: asyncssh.SSHClientConnection) -> bytes:
            _, out = await _script(conn, f"cat {shlex.quote(self.rload + '/pid.json')} 2>/dev/null")
            return out

        data = await self.link.call(read)
        with contextlib.suppress(orjson.JSONDecodeError):
            got = orjson.loads(data)
            if isinstance(got, dict) and "pid" in got:
                return {"pid": int(got["pid"]), "start_time": int(got.get("start_time") or 0), "host": self.host.host}
        return None

    # ---- follow
    async def _status(self, conn: asyncssh.SSHClientConnection, ref: dict[str, Any]) -> dict[str, Any]:
        d = shlex.quote(self.rload)
        # the end file first: when it is there (or the process is gone) the sizes read after it are final
        script = "\n".join(
            [
                f"d={d}; p={int(ref.get('pid') or 0)}; want={int(ref.get('start_time') or 0)}",
                'printf "end\\n"; cat "$d/end.json" 2>/dev/null; printf "\\n--\\n"',
                'printf "progress\\n"; cat "$d/progress.json" 2>/dev/null; printf "\\n--\\n"',
                's=$(sed "s/.*) //" /proc/$p/stat 2>/dev/null) && set -- $s && [ "$1" != Z ] && '
                '{ [ "$want" = 0 ] || [ "${20}" = "$want" ]; } && echo alive || echo gone',
                *[f'stat -c %s "$d/{f}" 2>/dev/null || echo -1' for f in COPIED],
                'test -f "$d/anchor.json" && echo anchor || echo none',
            ]
        )
        status, out = await _script(conn, script)
        if status != 0:
            raise RemoteError(f"reading {self.rload} on the load host failed (exit {status})", "resume")
        end_s, prog_s, rest = [*out.split(b"\n--\n"), b"", b"", b""][:3]
        words = rest.split()

        def obj(section: bytes) -> dict[str, Any] | None:
            body = section.partition(b"\n")[2].strip()
            try:
                got = orjson.loads(body) if body else None
            except orjson.JSONDecodeError:
                return None  # being replaced (atomic rename makes this rare): read it at the next poll
            return got if isinstance(got, dict) else None

        return {
            "end": obj(end_s),
            "progress": obj(prog_s),
            "alive": words[:1] == [b"alive"],
            "sizes": {f: int(w) for f, w in zip(COPIED, words[1:3], strict=False)},
            "anchor": words[3:4] == [b"anchor"],
        }

    async def _fetch(self, conn: asyncssh.SSHClientConnection, name: str, offset: int, size: int) -> bytes:
        n = min(size - offset, CHUNK_BYTES)
        status, out = await _script(
            conn, f"tail -c +{offset + 1} -- {shlex.quote(self.rload + '/' + name)} | head -c {n}"
        )
        if status != 0:
            raise RemoteError(f"copying {name} from the load host failed (exit {status})", "resume")
        return out

    async def _copy_new(self, sizes: dict[str, int]) -> None:
        """Append each file's new complete lines to its local copy."""
        for name in COPIED:
            local = self.paths.load_dir / name
            have = local.stat().st_size if local.exists() else 0
            while sizes.get(name, -1) > have:
                want = min(sizes[name] - have, CHUNK_BYTES)
                data = await self.link.call(
                    partial(self._fetch, name=name, offset=have, size=sizes[name]),
                    timeout_s=POLL_TIMEOUT_S + want / LINK_FLOOR_BPS,
                )
                cut = data.rfind(b"\n") + 1  # whole lines only: the client may be mid-write on the last one
                if cut == 0:
                    break
                with local.open("ab") as f:
                    f.write(data[:cut])
                    f.flush()
                    os.fsync(f.fileno())
                have += cut
                self.copied_bytes += cut

    async def _copy_whole(self, name: str) -> bytes | None:
        async def read(conn: asyncssh.SSHClientConnection) -> tuple[int, bytes]:
            return await _script(conn, f"cat -- {shlex.quote(self.rload + '/' + name)}")

        status, out = await self.link.call(read)
        return out if status == 0 else None

    async def _check_prefix(self) -> None:
        """Re-attach: each local copy must be a prefix of the remote file, else it is copied again from 0."""
        for name in COPIED:
            local = self.paths.load_dir / name
            n = local.stat().st_size if local.exists() else 0
            if n == 0:
                continue

            async def head_sha(conn: asyncssh.SSHClientConnection, nm: str = name, k: int = n) -> str:
                _, out = await _script(conn, f"head -c {k} -- {shlex.quote(self.rload + '/' + nm)} | sha256sum")
                return out.decode(errors="replace").split(" ")[0]

            if await self.link.call(head_sha) != hashlib.sha256(local.read_bytes()).hexdigest():
                local.write_bytes(b"")

    async def follow(self, ref: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """Until the client has ended (end file) or is gone: copy as it grows. (end or None, last status)."""
        await self._check_prefix()
        while True:
            got, wait_s = await self.step(ref)
            if got is not None:
                return got
            await anyio.sleep(wait_s)

    async def step(self, ref: dict[str, Any]) -> tuple[tuple[dict[str, Any] | None, dict[str, Any]] | None, float]:
        """One poll: copy what is new; ((end or None, status), _) once the client is gone, else (None, seconds
        until the next poll)."""
        st = await self.link.call(lambda c: self._status(c, ref))
        await self._copy_new(st["sizes"])
        if st["progress"] is not None:
            write_json(self.paths.load_progress, st["progress"])
        if st["anchor"] and not self.paths.load_anchor.exists():
            anchor = await self._copy_whole("anchor.json")
            if anchor:
                atomic_write(self.paths.load_anchor, anchor)
        if not st["alive"] and st["end"] is None and not self._gone_once:
            self._gone_once = True  # its end file may have landed between the script's two reads: look once more
            return None, 0.0
        if not st["alive"]:  # gone: the sizes read after that are final, and copied above
            return (st["end"], st), 0.0
        if st["end"] is not None:  # it wrote its end file and is exiting
            self._end_since = self._end_since or time.monotonic()
            if time.monotonic() - self._end_since > END_EXIT_WAIT_S:
                raise RemoteError(
                    f"the load client (pid {ref.get('pid')}) is alive {END_EXIT_WAIT_S:g}s after its end file",
                    "resume waits for it",
                )
        return None, POLL_S if st["end"] is None else 0.05

    async def seal(self) -> dict[str, str]:
        """The local copies' sha256 must equal the remote files' (one full re-copy on a mismatch)."""
        names = [f"{self.rload}/{f}" for f in COPIED]
        for again in (False, True):
            theirs = await self.link.call(lambda c: _sha256s(c, names), timeout_s=60)
            ours = {
                n: sha256_file(self.paths.load_dir / Path(n).name)
                if (self.paths.load_dir / Path(n).name).exists()
                else None
                for n in names
            }
            if all(theirs[n] == ours[n] for n in names if theirs[n] is not None):
                return {Path(n).name: ours[n] or "" for n in names}
            if again:
                break
            for n in names:
                whole = await self._copy_whole(Path(n).name)
                if whole is not None:
                    atomic_write(self.paths.load_dir / Path(n).name, whole)
        raise RemoteError(
            "the raw records copied from the load host differ from the remote file (sha256)",
            "resume copies them again; nothing is re-sent",
        )

    async def finish(self, end: dict[str, Any] | None) -> dict[str, Any]:
        """Seal the copies, then copy client.log, stalls.jsonl and the end file (last: it marks the load done here)."""
        sealed = await self.seal()
        for name in ("client.log", "stalls.jsonl"):
            with contextlib.suppress(RemoteError, LinkLost):
                body = await self._copy_whole(name)
                if body is not None:  # the client's log is outside text, masked; its stalls (on the raw records'
                    # clock, the load host's) are its own numbers
                    atomic_write(self.paths.load_dir / name, redact.mask_bytes(body) if name == "client.log" else body)
        clock = None
        with contextlib.suppress(RemoteError, LinkLost):
            clock = await self.link.call(lambda c: _clock(c, self.host), timeout_s=30)
        if end is not None:
            write_json(self.paths.load_end, end)
        return {"sealed": sealed, "clock_after": clock}

    async def gone(self, ref: dict[str, Any]) -> bool:
        st = await self.link.call(lambda c: self._status(c, ref))
        return not st["alive"]


def _clock_record(
    paths: RunPaths, host: LoadHost, before: dict[str, Any] | None, after: dict[str, Any] | None
) -> dict[str, Any]:
    old = read_json_or_none(paths.load_clock) or {}
    rec: dict[str, Any] = {
        "host": where(host),
        "before": before or old.get("before"),
        "after": after or old.get("after"),
    }
    b, a = rec["before"], rec["after"]
    if b and a:
        rec["drift_ns"] = a["offset_ns"] - b["offset_ns"]
    write_json(paths.load_clock, rec)
    return rec


def run_load(run: Run, env: dict[str, str], event: Callable[..., None], attempt: int) -> dict[str, Any]:
    """Start the remote client (once per run, ever) or re-attach to it, follow it to its end and seal the copies.

    Returns {"end": end or None, "reattached", "host", "clock", "link", "remote": ref}. PhaseFailed end_unknown
    when the link stays lost (the client keeps running; resume re-attaches), before_model when the load host
    could not be reached before anything was started there."""
    paths, host = run.paths, run.case.load.host
    assert host is not None
    fol = Follower(run)
    state: dict[str, Any] = {"reattached": False, "clock_before": None}

    async def main() -> dict[str, Any]:
        rec = launched(paths)
        try:
            if rec is None:
                state["clock_before"] = await fol.launch(env)
                ref = read_json_or_none(paths.load_pid) or {}
                event(
                    "load_client_started",
                    phase="load",
                    attempt=attempt,
                    data={"pid": ref.get("pid"), "host": where(host), "run_dir": fol.rdir},
                )
            else:
                state["reattached"] = True
                ref = {k: rec[k] for k in ("pid", "start_time", "host") if k in rec}
                if "pid" not in ref:  # the launch's answer was lost: the client's own pid file says
                    ref = await fol.find_pid() or {}
                    if ref:
                        write_json(record_path(paths), {**rec, **ref, "state": "launched"})
                        write_json(paths.load_pid, ref)
                    else:  # never started there (and a second client would refuse: flock + anchor, as locally)
                        state["reattached"] = False
                        state["clock_before"] = await fol.launch(env)
                        ref = read_json_or_none(paths.load_pid) or {}
            end, st = await fol.follow(ref)
            fin = await fol.finish(end)
            if end is None and ref:  # asked over SSH: gone without an end file (status says so, the lease lapses)
                write_json(paths.load_pid, {**ref, "gone_utc": utc_now()})
        finally:
            await fol.link.drop()
        return {"end": end, "ref": ref, "fin": fin, "st": st}

    try:
        out = _anyio_run(main)
    except (LinkLost, RemoteError) as e:
        if launched(paths) is None:  # nothing was started on the load host
            raise PhaseFailed(
                f"load host {where(host)} before the load: {e}",
                FailureClass.BEFORE_MODEL,
                "check the link to load.host and the fix above, then resume; nothing was sent",
            ) from None
        done = paths.raw.read_bytes().count(b"\n") if paths.raw.exists() else 0
        what = (
            f"lost the link to load host {where(host)} ({e})"
            if isinstance(e, LinkLost)
            else f"load host {where(host)}: {e.message}"
        )
        raise PhaseFailed(
            f"{what} after {done} of {run.meta.planned} records were copied; the remote client keeps running",
            FailureClass.END_UNKNOWN,
            f"resume(run_id='{run.run_id}') once the link is back: it re-attaches over SSH (pid and start time), "
            "copies what is missing; nothing is re-sent and no second client is started",
        ) from None
    clock = _clock_record(paths, host, state["clock_before"], out["fin"]["clock_after"])
    return {
        "end": out["end"],
        "reattached": state["reattached"],
        "host": where(host),
        "remote": out["ref"],
        "remote_run_dir": fol.rdir,
        "clock": clock,
        "sealed_sha256": out["fin"]["sealed"],
        "link": {"reconnects": fol.link.reconnects, "failures": fol.link.failures, "copied_bytes": fol.copied_bytes},
    }


def confirm_gone(run: Run) -> bool:
    """True when the client on the load host is gone (pid with its start time not running); PhaseFailed
    end_unknown when the host cannot be asked."""
    paths, host = run.paths, run.case.load.host
    assert host is not None
    ref = read_json_or_none(paths.load_pid) or {}
    fol = Follower(run)

    async def main() -> bool:
        try:
            return await fol.gone(ref)
        finally:
            await fol.link.drop()

    try:
        return _anyio_run(main)
    except (LinkLost, RemoteError) as e:
        raise PhaseFailed(
            f"cannot reach load host {where(host)} to confirm the client ended: {e}",
            FailureClass.END_UNKNOWN,
            f"resume(run_id='{run.run_id}') once the link is back",
        ) from None


def snapshot_metrics(run: Run, dest: Path) -> str | None:
    """The /metrics text read on the load host (where the controller cannot reach it); who read it, or None (the
    .missing file beside dest gets the load host's reason too)."""
    case = run.case
    host = case.load.host_shares()[0][0]  # the first load host: it reaches the target as every one does
    url = case.target.metrics_url or ""

    async def main() -> tuple[int, bytes]:
        link = Link(host, budget_s=min(host.reconnect_s, 5.0))
        try:
            return await link.call(
                lambda c: _script(c, f"{shlex.quote(host.python)} -c {shlex.quote(_FETCH_PY)} {shlex.quote(url)} 2>&1"),
                timeout_s=15,
            )
        finally:
            await link.drop()

    try:
        status, out = _anyio_run(main)
    except (RemoteError, LinkLost) as e:
        status, out = 255, str(e).encode()
    missing = dest.with_suffix(".missing")
    if status == 0:
        atomic_write(dest, out)
        missing.unlink(missing_ok=True)
        return f"load host ({where(host)})"
    tail = out.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
    with contextlib.suppress(OSError), missing.open("a") as f:
        f.write(f"load host {where(host)}: {tail[0][:300]}\n")
    return None


# ---------------------------------------------------------------------- several processes, one or more load hosts
READY_TIMEOUT_S = 120.0  # every remote process has imported and built its plan within this, or nothing is sent
REMOTE_GO_LEAD_S = 1.5  # the go names a start this far ahead: it reaches every load host before it comes
ARMED_ENV = "CASELEDGER_LOAD_ARMED"  # the client waits for load/go (or load/abort) before sending

_GO_PY = (
    "import sys\nfrom pathlib import Path\nfrom caseledger.load.parts import write_go_at\n"
    "write_go_at(Path(sys.argv[1]), int(sys.argv[2]))\n"
)


def _alive_sh(ref: dict[str, Any]) -> str:
    """A shell test: the referenced process runs (same pid and start time, not a zombie), as procs.alive."""
    p, want = int(ref.get("pid") or 0), int(ref.get("start_time") or 0)
    return (
        f's=$(sed "s/.*) //" /proc/{p}/stat 2>/dev/null) && set -- $s && [ "$1" != Z ] && '
        f'{{ [ {want} = 0 ] || [ "${{20}}" = {want} ]; }}'
    )


class HostLoad:
    """The client processes of one load host (load.host with load.processes, or one entry of load.hosts): one
    SSH link shared by a Follower per process, what each ended with, and whether the link was lost."""

    def __init__(self, run: Run, host: LoadHost, parts: list[PartPaths]) -> None:
        self.run, self.host = run, host
        self.link = Link(host, budget_s=host.reconnect_s)
        self.fols = [Follower(run, host, p, self.link) for p in parts]
        self.rload = f"{remote_run_dir(run, host)}/load"
        self.ends: dict[int, dict[str, Any] | None] = {}
        self.lost: str | None = None

    def evidence(self) -> dict[str, Any]:
        return {
            "host": where(self.host),
            "processes": [f.k for f in self.fols],
            "remote_run_dir": remote_run_dir(self.run, self.host),
            "clock": read_json_or_none(self.fols[0].paths.load_clock),
            "link": {
                "reconnects": self.link.reconnects,
                "failures": self.link.failures,
                "copied_bytes": sum(f.copied_bytes for f in self.fols),
                "lost": self.lost,
            },
        }

    async def _ref(self, fol: Follower) -> dict[str, Any]:
        """The process's ref from its launch record, or its remote pid file (a launch whose answer was lost)."""
        rec = launched(fol.paths) or {}
        ref: dict[str, Any] = {k: rec[k] for k in ("pid", "start_time", "host") if k in rec}
        if ref.get("pid"):
            return ref
        found = await fol.find_pid()
        if found:
            write_json(record_path(fol.paths), {**rec, **found, "state": "launched"})
            write_json(fol.paths.load_pid, found)
        return found or {}

    async def stop_armed(self) -> None:
        """Processes a start that never gave its go left waiting (armed: nothing sent): aborted, then stopped, so
        the remote load directory can be set aside and the processes started afresh."""
        known = [f for f in self.fols if launched(f.paths) is not None]
        if not known:
            return
        q = shlex.quote(self.rload)
        await self.link.call(lambda c: _script(c, f"[ -d {q} ] && touch {q}/abort; true"))
        for fol in known:
            ref = await self._ref(fol)
            if ref.get("pid"):
                await self.link.call(
                    partial(remote.terminate_async, ref=ref, grace_s=2.0), timeout_s=POLL_TIMEOUT_S + 5
                )

    async def start(self, env: dict[str, str]) -> None:
        """Inputs copied and verified, the clock measured, every process of this host started armed."""
        await self.stop_armed()
        clock = await self.fols[0].prepare()
        dirs = " ".join(shlex.quote(f.rload) for f in self.fols)
        await self.link.call(lambda c: _script(c, f"umask 077; mkdir -p {dirs}"))  # each process's log goes there
        for fol in self.fols:
            await fol.start({**env, ARMED_ENV: "1"}, clock)

    async def ready(self) -> list[tuple[int, str]]:
        """(process, 'ready' | 'wait' | 'dead') for each process of this host."""
        refs = [read_json_or_none(f.paths.load_pid) or {} for f in self.fols]
        lines = [
            f"if [ -f {shlex.quote(f.rload + '/ready')} ]; then echo ready; elif {_alive_sh(r)}; then echo wait; "
            "else echo dead; fi"
            for f, r in zip(self.fols, refs, strict=True)
        ]
        _, out = await self.link.call(lambda c: _script(c, "\n".join(lines)))
        words = out.decode(errors="replace").split()
        return [(f.k, w) for f, w in zip(self.fols, words, strict=False)]

    async def abort(self) -> None:
        """Every armed process of this host exits without sending (best effort: the link may be gone)."""
        q = shlex.quote(self.rload)
        with contextlib.suppress(LinkLost, RemoteError):
            await self.link.call(lambda c: _script(c, f"[ -d {q} ] && touch {q}/abort; true"))

    async def follow(self, at_ns: int) -> None:
        """Give this host its go (once; at_ns on the controller's wall clock, mapped by the host's offset), then
        follow each process to its end, sealing its copies. A lost link is recorded, not raised: the other
        hosts are followed on."""
        try:
            offset = offset_of(read_json_or_none(self.fols[0].paths.load_clock))
            go = shlex.quote(f"{self.rload}/go")
            py = f"cd / && {shlex.quote(self.host.python)} -c {shlex.quote(_GO_PY)} {go} {at_ns + offset}"
            await self.link.call(lambda c: _script(c, py), timeout_s=30)
            live: list[tuple[Follower, dict[str, Any]]] = []
            for fol in self.fols:
                end = read_json_or_none(fol.paths.load_end)
                if end is not None:  # copied and sealed already (the end file is copied last)
                    self.ends[fol.k] = end
                    continue
                ref = await self._ref(fol)
                await fol._check_prefix()
                live.append((fol, ref))
            while live:
                await self._poll(live)
        except (LinkLost, RemoteError) as e:
            self.lost = e.message if isinstance(e, RemoteError) else str(e)

    async def _poll(self, live: list[tuple[Follower, dict[str, Any]]]) -> None:
        wait = POLL_S
        for fol, ref in list(live):
            got, w = await fol.step(ref)
            if got is None:
                wait = min(wait, w)
                continue
            end = got[0]
            fin = await fol.finish(end)
            _clock_record(fol.paths, self.host, None, fin["clock_after"])
            if ref:  # asked over SSH: gone (status, the lease and the other hosts' wait stop counting it)
                write_json(fol.paths.load_pid, {**ref, "gone_utc": utc_now()})
            self.ends[fol.k] = end
            live.remove((fol, ref))
        if live:
            await anyio.sleep(wait)


def host_loads(run: Run, parts: list[PartPaths]) -> list[HostLoad]:
    return [HostLoad(run, host, [parts[k] for k in ks]) for host, ks in run.case.load.host_shares()]


async def _wait_ready(hosts: list[HostLoad]) -> None:
    """Every process of every host has built its plan and waits for the go; RemoteError names one that did not."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        waiting: list[tuple[HostLoad, int]] = []
        for h in hosts:
            for k, state in await h.ready():
                if state == "dead":
                    raise RemoteError(
                        f"load client process {k} on {where(h.host)} exited before it was ready",
                        f"read {h.rload}/p{k}/client.log on that host, fix the cause, then resume",
                    )
                if state != "ready":
                    waiting.append((h, k))
        if not waiting:
            return
        if time.monotonic() > deadline:
            h, k = waiting[0]
            raise RemoteError(
                f"load client process {k} on {where(h.host)} was not ready within {READY_TIMEOUT_S:g} s",
                f"read {h.rload}/p{k}/client.log on that host (a slow start or a stuck import), then resume",
            )
        await anyio.sleep(0.1)


async def _start_all(
    run: Run, hosts: list[HostLoad], env: dict[str, str], event: Callable[..., None], attempt: int
) -> None:
    """Every host prepared and its processes started armed, all ready; then load/go here (from here on nothing is
    started again, ever), naming the one start instant on the controller's wall clock."""
    try:
        for h in hosts:
            await h.start(env)
        await _wait_ready(hosts)
    except BaseException:
        with anyio.move_on_after(15, shield=True):
            for h in hosts:
                await h.abort()
        raise
    write_json(
        run.paths.load_go,
        {
            "wall_ns": time.time_ns() + int(REMOTE_GO_LEAD_S * 1e9),
            "time_base": "controller wall clock; each load host starts at this + its offset_ns",
            "hosts": [where(h.host) for h in hosts],
        },
    )
    refs = [read_json_or_none(f.paths.load_pid) or {} for h in hosts for f in h.fols]
    event(
        "load_client_started",
        phase="load",
        attempt=attempt,
        data={
            "pids": [r.get("pid") for r in refs],
            "processes": len(refs),
            "armed": True,
            "hosts": [{"host": where(h.host), "processes": [f.k for f in h.fols]} for h in hosts],
        },
    )


def run_parts(
    run: Run, parts: list[PartPaths], env: dict[str, str], event: Callable[..., None], attempt: int
) -> dict[str, Any]:
    """The processes of a shared load on load hosts: started once (one go for all hosts), or re-attached; each
    followed, copied and sealed into load/p<k>/ here. {"ends": per process (None: gone without one), "hosts",
    "reattached"}. PhaseFailed before_model when the start failed (nothing was sent), end_unknown when a host's
    link stayed lost (its clients keep running; the other hosts were followed to their end; resume re-attaches)."""
    paths = run.paths
    hosts = host_loads(run, parts)
    reattached = paths.load_go.exists()

    async def main() -> None:
        try:
            if not reattached:
                await _start_all(run, hosts, env, event, attempt)
            at = int((read_json_or_none(paths.load_go) or {}).get("wall_ns") or time.time_ns())
            async with anyio.create_task_group() as tg:
                for h in hosts:
                    tg.start_soon(h.follow, at)
        finally:
            for h in hosts:
                await h.link.drop()

    try:
        _anyio_run(main)
    except (LinkLost, RemoteError) as e:  # before the go: every started process was aborted
        msg = e.message if isinstance(e, RemoteError) else f"a load host is unreachable: {e}"
        raise PhaseFailed(
            f"starting the load clients on the load hosts: {msg}"[:400],
            FailureClass.BEFORE_MODEL,
            (e.fix if isinstance(e, RemoteError) else "check the links to the load hosts, then resume")
            + "; nothing was sent",
        ) from None
    info = {"reattached": reattached, "hosts": [h.evidence() for h in hosts]}
    lost = [h for h in hosts if h.lost is not None]
    if lost:
        done = sum(p.raw.read_bytes().count(b"\n") for p in parts if p.raw.exists())
        names = ", ".join(f"{where(h.host)} ({h.lost})" for h in lost)
        raise PhaseFailed(
            f"lost the link to load host{'s' if len(lost) > 1 else ''} {names} after {done} of {run.meta.planned} "
            "records were copied; the remote clients keep running",
            FailureClass.END_UNKNOWN,
            f"resume(run_id='{run.run_id}') once the link is back: it re-attaches over SSH (pid and start time), "
            "copies what is missing and merges; nothing is re-sent and no second client is started",
            evidence=info,
        )
    ends = {k: e for h in hosts for k, e in h.ends.items()}
    return {"ends": [ends.get(p.part) for p in parts], **info}


def parts_alive(run: Run, parts: list[PartPaths]) -> list[int]:
    """The processes (of a shared load on load hosts) still running there, asked over SSH; PhaseFailed end_unknown
    when a host cannot be asked."""
    hosts = host_loads(run, parts)

    async def main() -> list[int]:
        out: list[int] = []
        for h in hosts:
            try:
                for fol in h.fols:
                    ref = read_json_or_none(fol.paths.load_pid) or {}
                    if ref.get("pid") and "gone_utc" not in ref and not await fol.gone(ref):
                        out.append(fol.k)
            finally:
                await h.link.drop()
        return out

    try:
        return _anyio_run(main)
    except (LinkLost, RemoteError) as e:
        raise PhaseFailed(
            f"cannot reach a load host to confirm its clients ended: {e}",
            FailureClass.END_UNKNOWN,
            f"resume(run_id='{run.run_id}') once the link is back",
        ) from None


def terminate_elsewhere(case: Case, refs: list[dict[str, Any]], grace_s: float = 1.0) -> None:
    """Stop the load clients these refs name on the case's load hosts (the lease was lost); best effort."""
    logins = {h.host: h for h, _ in case.load.host_shares()}
    for ref in refs:
        login = logins.get(str(procs.elsewhere(ref)))
        if login is not None:
            with contextlib.suppress(RemoteError):
                remote.Remote(login).terminate(ref, grace_s=grace_s)
