"""Several load client processes on one or more load hosts (run/remote/load.py): per host one link, the inputs
copied once, every process started armed, one go for all, each followed and sealed (run_parts, called by
run/load/parts.py).
"""

from __future__ import annotations

import contextlib
import math
import os
import shlex
import time
from functools import partial
from typing import Any

import anyio
import orjson

from caseledger import procs
from caseledger.case.model import Case, LoadHost
from caseledger.case.phases import Phase
from caseledger.errors import FailureClass, FailureEvidence, PhaseFailed, RemoteError
from caseledger.faults import checkpoint
from caseledger.ledger import calls
from caseledger.ledger import event_types as et
from caseledger.ledger.evidence import LoadEnd, LoadEvidence
from caseledger.ledger.runs import Run
from caseledger.load.parts import ARMED_ENV, HEARTBEAT_ENV, READY_TIMEOUT_S, offset_of, split_concurrency
from caseledger.load.schedule import raw_bytes_needed
from caseledger.procs import LoadRef
from caseledger.run.remote.follow import POLL_S, Follower, clock_record
from caseledger.run.remote.link import (
    POLL_TIMEOUT_S,
    Clock,
    Link,
    LinkLost,
    anyio_run,
    launched,
    record_path,
    remote_run_dir,
    run_script,
    where,
)
from caseledger.run.remote.preflight import reserve_raw
from caseledger.services import remote
from caseledger.workspace import PartPaths, read_json_or_none, read_ref, utc_now, write_json

REMOTE_GO_LEAD_S = 1.5  # the go names a start this far ahead: it reaches every load host before it comes
# An armed process gives up (nothing sent) once load/heartbeat there is this much older than the link's own budget:
# a live controller touches it at each readiness poll (measured in tests/test_remote_load.py: a process's ready ->
# the go 0.7-2.6 s, polls every ~0.15 s), and one whose link fails retries for load.host.reconnect_s before it gives
# up; the slack covers a stalled controller (a CPU-starved host, a slow fsync) and the go's own call.
# A host whose controller is never starved may set a shorter slack (CASELEDGER_ARMED_SLACK_S, checked at start).
ARMED_SLACK_S = 30.0
ARMED_SLACK_ENV = "CASELEDGER_ARMED_SLACK_S"


def armed_bound_s(host: LoadHost) -> float:
    """How long an armed process on this load host waits for the go without a heartbeat (HEARTBEAT_ENV)."""
    return host.reconnect_s + float(os.environ.get(ARMED_SLACK_ENV) or ARMED_SLACK_S)


_GO_PY = (
    "import sys\nfrom pathlib import Path\nfrom caseledger.load.parts import write_go_at\n"
    "write_go_at(Path(sys.argv[1]), int(sys.argv[2]))\n"
)


def _alive_sh(ref: LoadRef | None) -> str:
    """A shell test: the referenced process runs (same pid and start time, not a zombie), as procs.alive."""
    p, want = (ref["pid"], ref["start_time"]) if ref else (0, 0)
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
        self.ends: dict[int, LoadEnd | None] = {}  # each process's end.json as copied
        self.lost: str | None = None
        self.clock: Clock | None = None  # measured by prepare, recorded by each process's start
        # JSON: an earlier start's armed processes, their not_started.json as stop_armed found them
        self.armed_ended: list[dict[str, Any]] = []

    def evidence(self) -> dict[str, Any]:  # JSON: a row of the load evidence's hosts (LoadEvidence.hosts)
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

    async def _ref(self, fol: Follower) -> LoadRef | None:
        """The process's ref from its launch record, or its remote pid file (a launch whose answer was lost)."""
        rec = launched(fol.paths) or {}
        ref = procs.ref_of(rec)
        if ref and ref["pid"]:
            return ref
        found = await fol.find_pid()
        if found:
            write_json(record_path(fol.paths), {**rec, **found, "state": "launched"})
            write_json(fol.paths.load_pid, found)
        return found

    async def stop_armed(self) -> None:
        """Processes a start that never gave its go left waiting (armed: nothing sent): aborted, then stopped, so
        the remote load directory can be set aside and the processes started afresh; how each had ended (its
        not_started.json, or "stopped" here) kept in armed_ended."""
        known = [f for f in self.fols if launched(f.paths) is not None]
        if not known:
            return
        for fol in known:  # what each said as it gave up waiting (load/__main__.py), else it is stopped here
            said = await fol._copy_whole("not_started.json")
            with contextlib.suppress(orjson.JSONDecodeError, TypeError):
                rec = orjson.loads(said) if said else None
                self.armed_ended.append(
                    {
                        "process": fol.k,
                        "host": where(self.host),
                        **(rec if isinstance(rec, dict) else {"exit": "stopped"}),
                    }
                )
        q = shlex.quote(self.rload)
        await self.link.call(lambda c: run_script(c, f"[ -d {q} ] && touch {q}/abort; true"))
        for fol in known:
            ref = await self._ref(fol)
            if ref and ref["pid"]:
                await self.link.call(
                    partial(remote.terminate_async, ref=ref, grace_s=2.0), timeout_s=POLL_TIMEOUT_S + 5
                )

    async def prepare(self, need: list[int]) -> None:
        """Inputs copied and verified, the clock measured, the heartbeat begun, each process's raw disk reserved
        there (need: bytes per process of the whole load, by index)."""
        await self.stop_armed()
        self.clock = await self.fols[0].prepare()
        dirs = " ".join(shlex.quote(f.rload) for f in self.fols)
        beat = shlex.quote(f"{self.rload}/heartbeat")
        await self.link.call(lambda c: run_script(c, f"umask 077; mkdir -p {dirs} && touch {beat}"))  # logs go there
        await reserve_raw(self.link, self.host, {f"{f.rload}/raw.jsonl": need[f.k] for f in self.fols})

    async def start(self, env: dict[str, str]) -> None:
        """Every process of this host started armed: it waits for the go while the heartbeat is fresh."""
        assert self.clock is not None
        armed = {**env, ARMED_ENV: "1", HEARTBEAT_ENV: f"{armed_bound_s(self.host):g}"}
        for fol in self.fols:
            await fol.start(armed, self.clock)

    async def ready(self) -> list[tuple[int, str]]:
        """(process, 'ready' | 'wait' | 'dead') for each process of this host; the armed ones' heartbeat touched."""
        refs = [read_ref(f.paths.load_pid) for f in self.fols]
        lines = [f"touch {shlex.quote(self.rload + '/heartbeat')}"]  # each poll: the armed clients' heartbeat
        lines += [
            f"if [ -f {shlex.quote(f.rload + '/ready')} ]; then echo ready; elif {_alive_sh(r)}; then echo wait; "
            "else echo dead; fi"
            for f, r in zip(self.fols, refs, strict=True)
        ]
        _, out = await self.link.call(lambda c: run_script(c, "\n".join(lines)))
        words = out.decode(errors="replace").split()
        return [(f.k, w) for f, w in zip(self.fols, words, strict=False)]

    async def abort(self) -> None:
        """Every armed process of this host exits without sending (best effort: the link may be gone)."""
        q = shlex.quote(self.rload)
        with contextlib.suppress(LinkLost, RemoteError):
            await self.link.call(lambda c: run_script(c, f"[ -d {q} ] && touch {q}/abort; true"))

    async def follow(self, at_ns: int) -> None:
        """Give this host its go (once; at_ns on the controller's wall clock, mapped by the host's offset), then
        follow each process to its end, sealing its copies. A lost link is recorded, not raised: the other
        hosts are followed on."""
        try:
            offset = offset_of(read_json_or_none(self.fols[0].paths.load_clock))
            go = shlex.quote(f"{self.rload}/go")
            py = f"cd / && {shlex.quote(self.host.python)} -c {shlex.quote(_GO_PY)} {go} {at_ns + offset}"
            await self.link.call(lambda c: run_script(c, py), timeout_s=30)
            live: list[tuple[Follower, LoadRef | None]] = []  # each with its ref, as pid.json holds it
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

    async def _poll(self, live: list[tuple[Follower, LoadRef | None]]) -> None:
        wait = POLL_S
        for fol, ref in list(live):
            got, w = await fol.step(ref)
            if got is None:
                wait = min(wait, w)
                continue
            end = got[0]
            fin = await fol.finish(end)
            clock_record(fol.paths, self.host, None, fin["clock_after"])
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


async def _start_all(run: Run, hosts: list[HostLoad], env: dict[str, str], event: et.Emit, attempt: int) -> None:
    """Every host prepared and its processes started armed, all ready; then load/go here (from here on nothing is
    started again, ever), naming the one start instant on the controller's wall clock."""
    need = raw_bytes_needed(run)
    shares = split_concurrency(run.case.load.concurrency, run.case.load.total_processes)
    try:
        for h in hosts:  # every host's disk reserved before any process anywhere is started
            await h.prepare([math.ceil(need * c / run.case.load.concurrency) for c in shares])
        ended = [e for h in hosts for e in h.armed_ended]
        if ended:  # an earlier start that never gave its go: what its processes did (nothing was sent)
            event(et.LoadArmedEnded(phase=Phase.LOAD, attempt=attempt, data=et.LoadArmedEndedData(processes=ended)))
        for h in hosts:
            await h.start(env)
        await _wait_ready(hosts)
        checkpoint("controller", "during", "remote_armed")  # dies with every process armed, before the go
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
    refs = [read_ref(f.paths.load_pid) for h in hosts for f in h.fols]
    started = et.LoadClientStartedData(
        pids=[r["pid"] if r else None for r in refs],
        processes=len(refs),
        armed=True,
        hosts=[et.ClientHost(host=where(h.host), processes=[f.k for f in h.fols]) for h in hosts],
    )
    event(et.LoadClientStarted(phase=Phase.LOAD, attempt=attempt, data=started))


def run_parts(
    run: Run, parts: list[PartPaths], env: dict[str, str], event: et.Emit, attempt: int
) -> tuple[list[LoadEnd | None], LoadEvidence]:
    """The processes of a shared load on load hosts: started once (one go for all hosts), or re-attached; each
    followed, copied and sealed into load/p<k>/ here: each process's end file (None: gone without one) and
    the load evidence (hosts, reattached). PhaseFailed before_model when the start failed (nothing was sent),
    end_unknown when a host's link stayed lost (its clients keep running; the other hosts were followed to their
    end; resume re-attaches)."""
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
        anyio_run(main)
    except (LinkLost, RemoteError) as e:  # before the go: every started process was aborted
        msg = e.message if isinstance(e, RemoteError) else f"a load host is unreachable: {e}"
        raise PhaseFailed(
            f"starting the load clients on the load hosts: {msg}"[:400],
            FailureClass.BEFORE_MODEL,
            (e.fix if isinstance(e, RemoteError) else "check the links to the load hosts, then resume")
            + "; nothing was sent",
        ) from None
    info: FailureEvidence = {"reattached": reattached, "hosts": [h.evidence() for h in hosts]}
    lost = [h for h in hosts if h.lost is not None]
    if lost:
        done = sum(p.raw.read_bytes().count(b"\n") for p in parts if p.raw.exists())
        names = ", ".join(f"{where(h.host)} ({h.lost})" for h in lost)
        raise PhaseFailed(
            f"lost the link to load host{'s' if len(lost) > 1 else ''} {names} after {done} of {run.meta.planned} "
            "records were copied; the remote clients keep running",
            FailureClass.END_UNKNOWN,
            f"{calls.resume_when_link_back(run.run_id)}: it re-attaches over SSH (pid and start time), "
            "copies what is missing and merges; nothing is re-sent and no second client is started",
            evidence=info,
        )
    ends = {k: e for h in hosts for k, e in h.ends.items()}
    return [ends.get(p.part) for p in parts], LoadEvidence(reattached=reattached, hosts=info["hosts"])


def parts_alive(run: Run, parts: list[PartPaths]) -> list[int]:
    """The processes (of a shared load on load hosts) still running there, asked over SSH; PhaseFailed end_unknown
    when a host cannot be asked."""
    hosts = host_loads(run, parts)

    async def main() -> list[int]:
        out: list[int] = []
        for h in hosts:
            try:
                for fol in h.fols:
                    ref = read_ref(fol.paths.load_pid)
                    if ref and ref["pid"] and "gone_utc" not in ref and not await fol.gone(ref):
                        out.append(fol.k)
            finally:
                await h.link.drop()
        return out

    try:
        return anyio_run(main)
    except (LinkLost, RemoteError) as e:
        raise PhaseFailed(
            f"cannot reach a load host to confirm its clients ended: {e}",
            FailureClass.END_UNKNOWN,
            calls.resume_when_link_back(run.run_id),
        ) from None


def terminate_elsewhere(case: Case, refs: list[LoadRef], grace_s: float = 1.0) -> None:
    """Stop the load clients these refs name on the case's load hosts (the lease was lost); best effort."""
    logins = {h.host: h for h, _ in case.load.host_shares()}
    for ref in refs:
        login = logins.get(str(procs.elsewhere(ref)))
        if login is not None:
            with contextlib.suppress(RemoteError):
                remote.Remote(login).terminate(ref, grace_s=grace_s)
