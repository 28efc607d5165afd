"""The controller's side of one load client on a load host (run/remote/load.py): started once, followed over
the link, its raw data appended here line by line as it grows, sealed when the sha256 here equals the remote one.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict, cast

import anyio
import orjson

from caseledger import redact
from caseledger.case.model import LoadHost
from caseledger.errors import FailureClass, PhaseFailed, RemoteError
from caseledger.faults import checkpoint
from caseledger.ledger.evidence import LoadEnd
from caseledger.ledger.runs import Run
from caseledger.load.schedule import raw_bytes_needed
from caseledger.procs import LoadRef, ProcRef
from caseledger.run.remote.link import (
    POLL_TIMEOUT_S,
    Clock,
    Link,
    LinkLost,
    load_host_error,
    read_clock,
    record_path,
    remote_run_dir,
    run_script,
    sha256s,
    where,
)
from caseledger.run.remote.preflight import PREFLIGHT_TIMEOUT_S, copy_verified, reserve_raw
from caseledger.services import remote
from caseledger.workspace import PartPaths, RunPaths, atomic_write, read_json_or_none, sha256_file, utc_now, write_json

if TYPE_CHECKING:
    import asyncssh  # imported where used (services/remote.py): a local-only run never pays for it

POLL_S = 0.5  # how often the controller reads the remote progress
CHUNK_BYTES = 1 << 20  # raw bytes copied per remote command
LINK_FLOOR_BPS = 256 << 10  # the slowest link a chunk's timeout allows for (a cut link shows within seconds)
END_EXIT_WAIT_S = 30.0  # the client wrote its end file and is exiting
COPIED = ("raw.jsonl", "sent.log")  # appended line by line as they grow


class Status(TypedDict):
    """One read of the remote client's directory (Follower._status)."""

    end: LoadEnd | None  # the client's end.json there
    progress: dict[str, Any] | None  # JSON: the client's progress.json there
    alive: bool
    sizes: dict[str, int]  # COPIED file -> its size there (-1: missing)
    anchor: bool


class Finish(TypedDict):
    """Follower.finish: the sealed copies' sha256 and the clock measured after the load (None: not reached)."""

    sealed: dict[str, str]
    clock_after: Clock | None


class ClockRecord(TypedDict):
    """load/clock.json: the clock offset measured before and after the load, and their difference."""

    host: str
    before: Clock | None
    after: Clock | None
    drift_ns: NotRequired[int]


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
    async def launch(self, env: dict[str, str]) -> Clock:
        """Copy/verify the inputs, measure the clock, reserve the raw records' disk there, then start the client
        (remote.json first: from here on no second launch). Returns the clock measured before the load."""
        clock = await self.prepare()
        await reserve_raw(self.link, self.host, {f"{self.rload}/raw.jsonl": raw_bytes_needed(self.run)})
        await self.start(env, clock)
        return clock

    async def prepare(self) -> Clock:
        """Once per host: the inputs copied and verified, an earlier attempt's remote load directory set aside,
        the clock measured (returned)."""
        host = self.host
        await self.link.call(lambda c: copy_verified(c, self.run, host), timeout_s=PREFLIGHT_TIMEOUT_S)
        await self.link.call(self._set_aside)
        clock: Clock = await self.link.call(lambda c: read_clock(c, host), timeout_s=30)
        return clock

    async def start(self, env: dict[str, str], clock: Clock) -> ProcRef:
        """Start this client (remote.json first: from here on no second launch); its ref."""
        host, paths = self.host, self.paths
        paths.load_dir.mkdir(parents=True, exist_ok=True)
        clock_record(paths, host, clock, None)  # kept for a resume, whatever happens to this controller
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
            named = load_host_error(e)
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
        ref: ProcRef = {"pid": pid, "start_time": started, "host": host.host}
        write_json(record_path(paths), {**read_json_or_none(record_path(paths)), **ref, "state": "launched"})
        write_json(paths.load_pid, ref)  # another host: procs.alive says False; the lease keeps it (leases.py)
        return ref

    async def _set_aside(self, conn: asyncssh.SSHClientConnection) -> None:
        """A remote load directory no launch here knows of is a superseded attempt's (its local copy was set
        aside, e.g. after hot_entry): move it aside there too, once it has ended; never under a live client.
        Ended: its end file, or every process's of several, or aborted before any process sent (no anchor), or
        never launched into (no client's log: the launch script creates it before the client runs)."""
        d = f"{self.rdir}/load"
        q = shlex.quote(d)
        status, out = await run_script(
            conn,
            "\n".join(
                [
                    "ended() {",
                    f"  [ -f {q}/end.json ] && return 0",
                    # no client.log: no launch ever reached it (e.g. only a reserved, empty raw file)
                    f'  for f in {q}/client.log {q}/p*/client.log; do [ -e "$f" ] && break; done',
                    '  [ -e "$f" ] || return 0',
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

    async def find_pid(self) -> LoadRef | None:
        """The client's pid from the remote pid.json (a launch whose answer was lost), or None."""

        async def read(conn: asyncssh.SSHClientConnection) -> bytes:
            _, out = await run_script(conn, f"cat {shlex.quote(self.rload + '/pid.json')} 2>/dev/null")
            return out

        data = await self.link.call(read)
        with contextlib.suppress(orjson.JSONDecodeError):
            got = orjson.loads(data)
            if isinstance(got, dict) and "pid" in got:
                return {"pid": int(got["pid"]), "start_time": int(got.get("start_time") or 0), "host": self.host.host}
        return None

    # ---- follow
    async def _status(self, conn: asyncssh.SSHClientConnection, ref: LoadRef | None) -> Status:
        d = shlex.quote(self.rload)
        pid, want = (int(ref.get("pid") or 0), int(ref.get("start_time") or 0)) if ref else (0, 0)
        # the end file first: when it is there (or the process is gone) the sizes read after it are final
        script = "\n".join(
            [
                f"d={d}; p={pid}; want={want}",
                'printf "end\\n"; cat "$d/end.json" 2>/dev/null; printf "\\n--\\n"',
                'printf "progress\\n"; cat "$d/progress.json" 2>/dev/null; printf "\\n--\\n"',
                's=$(sed "s/.*) //" /proc/$p/stat 2>/dev/null) && set -- $s && [ "$1" != Z ] && '
                '{ [ "$want" = 0 ] || [ "${20}" = "$want" ]; } && echo alive || echo gone',
                *[f'stat -c %s "$d/{f}" 2>/dev/null || echo -1' for f in COPIED],
                'test -f "$d/anchor.json" && echo anchor || echo none',
            ]
        )
        status, out = await run_script(conn, script)
        if status != 0:
            raise RemoteError(f"reading {self.rload} on the load host failed (exit {status})", "resume")
        end_s, prog_s, rest = [*out.split(b"\n--\n"), b"", b"", b""][:3]
        words = rest.split()

        def obj(section: bytes) -> dict[str, Any] | None:  # JSON: a file the client wrote there
            body = section.partition(b"\n")[2].strip()
            try:
                got = orjson.loads(body) if body else None
            except orjson.JSONDecodeError:
                return None  # being replaced (atomic rename makes this rare): read it at the next poll
            return got if isinstance(got, dict) else None

        return {
            "end": cast("LoadEnd | None", obj(end_s)),  # as the client wrote it: the load phase checks its counts
            "progress": obj(prog_s),
            "alive": words[:1] == [b"alive"],
            "sizes": {f: int(w) for f, w in zip(COPIED, words[1:3], strict=False)},
            "anchor": words[3:4] == [b"anchor"],
        }

    async def _fetch(self, conn: asyncssh.SSHClientConnection, name: str, offset: int, size: int) -> bytes:
        n = min(size - offset, CHUNK_BYTES)
        status, out = await run_script(
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
            return await run_script(conn, f"cat -- {shlex.quote(self.rload + '/' + name)}")

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
                _, out = await run_script(conn, f"head -c {k} -- {shlex.quote(self.rload + '/' + nm)} | sha256sum")
                return out.decode(errors="replace").split(" ")[0]

            if await self.link.call(head_sha) != hashlib.sha256(local.read_bytes()).hexdigest():
                local.write_bytes(b"")

    async def follow(self, ref: LoadRef | None) -> tuple[LoadEnd | None, Status]:
        """Until the client has ended (end file) or is gone: copy as it grows. (end or None, last status)."""
        await self._check_prefix()
        while True:
            got, wait_s = await self.step(ref)
            if got is not None:
                return got
            await anyio.sleep(wait_s)

    async def step(self, ref: LoadRef | None) -> tuple[tuple[LoadEnd | None, Status] | None, float]:
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
                    f"the load client (pid {ref['pid'] if ref else '?'}) is alive {END_EXIT_WAIT_S:g}s after its end "
                    "file",
                    "resume waits for it",
                )
        return None, POLL_S if st["end"] is None else 0.05

    async def seal(self) -> dict[str, str]:
        """The local copies' sha256 must equal the remote files' (one full re-copy on a mismatch)."""
        names = [f"{self.rload}/{f}" for f in COPIED]
        for again in (False, True):
            theirs = await self.link.call(lambda c: sha256s(c, names), timeout_s=60)
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

    async def finish(self, end: LoadEnd | None) -> Finish:
        """Seal the copies, then copy client.log, stalls.jsonl and the end file (last: it marks the load done here)."""
        sealed = await self.seal()
        # without an end file: what an armed client that gave up before the go wrote (it sent nothing)
        for name in ("client.log", "stalls.jsonl", *(("not_started.json",) if end is None else ())):
            with contextlib.suppress(RemoteError, LinkLost):
                body = await self._copy_whole(name)
                if body is not None:  # the client's log is outside text, masked; its stalls (on the raw records'
                    # clock, the load host's) are its own numbers
                    atomic_write(self.paths.load_dir / name, redact.mask_bytes(body) if name == "client.log" else body)
        clock = None
        with contextlib.suppress(RemoteError, LinkLost):
            clock = await self.link.call(lambda c: read_clock(c, self.host), timeout_s=30)
        if end is not None:
            write_json(self.paths.load_end, end)
        return {"sealed": sealed, "clock_after": clock}

    async def gone(self, ref: LoadRef | None) -> bool:
        st = await self.link.call(lambda c: self._status(c, ref))
        return not st["alive"]


def clock_record(paths: RunPaths, host: LoadHost, before: Clock | None, after: Clock | None) -> ClockRecord:
    old = read_json_or_none(paths.load_clock) or {}
    rec: ClockRecord = {
        "host": where(host),
        "before": before or old.get("before"),
        "after": after or old.get("after"),
    }
    b, a = rec["before"], rec["after"]
    if b and a:
        rec["drift_ns"] = a["offset_ns"] - b["offset_ns"]
    write_json(paths.load_clock, rec)
    return rec
