"""`python -m caseledger.load RUN_DIR`: the formal load of one run, as its own detached process.

Everything comes from the run directory (case.json, run.json, the dataset they name); the command line
only says where it is. Files written under RUN_DIR/load/ (see RunPaths; the writers: load/recording.py):

    pid.json       {"pid", "start_time", "host"}, at start (start_time: /proc/self/stat field 22)
    anchor.json    {"wall_utc", "wall_ns", "mono_ns", "uncertainty_ns", "boot_id"}, before the first send
    raw.jsonl      one RawRecord per finished request, written as it ends (a kill loses only in-flight ones)
    progress.json  {"planned", "sent", "done", "ok", "failed", "updated_utc"}, every <= 0.5 s and at the end
    sent.log       one line (the request index) per formal request, written before its first byte leaves
    stalls.jsonl   one {"start_ns", "end_ns"} line per span of >= 0.2 s in which this process's event loop did not run
    end.json       counts, first_send_ns/last_end_ns, wall and CPU times, chunks, "exit", when the load ended

`python -m caseledger.load RUN_DIR K` is process K of a load shared by load.processes = P > 1 processes
(load/parts.py): the same files under RUN_DIR/load/pK/, its share of the schedule (its requests and its share of C),
load/pK/ready once it waits for the go, and a schedule that starts at the instant load/go names (one for all P);
it refuses as below when its own files or the merged load/ show an earlier start.
On a load host the controller's pid means nothing there: an armed client (HEARTBEAT_ENV set) also gives up once the
controller's load/heartbeat has not changed for that many seconds, and writes load/pK/not_started.json (exit 2).

Exit codes: 0 load complete (failed requests are data, not a client failure); 1 cancelled by SIGTERM/SIGINT
(end.json says "cancelled", in-flight requests are recorded as error_class 'client'); 2 the load could
not start (nothing was sent); 3 refused: this run's formal load already started once, and formal
requests are never sent twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from caseledger import procs
from caseledger.errors import CaseledgerError
from caseledger.faults import checkpoint
from caseledger.load.client import run_requests, transport_used
from caseledger.load.parts import ARMED_ENV, HEARTBEAT_ENV, part_schedule, start_of
from caseledger.load.recording import RawWriter, Tally, clock_anchor, progress_loop, stall_loop, utc_now
from caseledger.load.schedule import Schedule, schedule_from_run_dir
from caseledger.load.sessions import run_sessions
from caseledger.records import RawRecord
from caseledger.workspace import PartPaths, RunPaths, Spare, is_disk_full, read_json_or_none, reserve, write_json

EXIT_COMPLETE, EXIT_CANCELLED, EXIT_NOT_STARTED, EXIT_REFUSED = 0, 1, 2, 3


def log(msg: str) -> None:
    print(f"{utc_now()} load: {msg}", flush=True)


def refusal(paths: RunPaths) -> str | None:
    """Why this run's formal load must not start (again), or None."""
    if paths.load_end.exists():
        return f"{paths.load_end} exists: this run's load already ended"
    if paths.raw.exists() and paths.raw.stat().st_size > 0:
        return f"{paths.raw} is not empty: this run's load already sent requests"
    if paths.load_anchor.exists():
        # the anchor is written just before the first send: requests may have been in flight at a kill
        return f"{paths.load_anchor} exists: a previous client started sending this run's formal requests"
    return None


async def _watch_signals(scope: anyio.CancelScope, caught: list[str]) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            caught.append(signal.Signals(signum).name)
            scope.cancel()
            return


async def _run(
    paths: RunPaths,
    schedule: Schedule,
    api_key: str | None,
    writer: RawWriter,
    tally: Tally,
    start_ns: int | None = None,
    own_process: bool = True,
) -> list[str]:
    def on_record(rec: RawRecord) -> None:
        if tally.disk_full:
            return  # the load is stopping; nothing more can be written
        try:
            writer.write(rec)
        except OSError as e:
            if not is_disk_full(e):
                raise
            # a record that cannot be written is not counted: the ledger holds exactly what is on disk
            tally.disk_full = f"disk full (ENOSPC) writing load/raw.jsonl after {tally.done} records"
            caught.append("disk_full")
            load_scope.cancel()  # stop sending: more requests could not be recorded
            return
        tally.on_record(rec)
        checkpoint("load", "after", tally.done, run_dir=paths.root)

    caught: list[str] = []
    load_scope = anyio.CancelScope()
    async with anyio.create_task_group() as tg:
        tg.start_soon(progress_loop, paths, tally)
        tg.start_soon(stall_loop, paths)
        if own_process:  # signal handlers belong to the process (and only its main thread may set them)
            tg.start_soon(_watch_signals, load_scope, caught)
        with load_scope:
            if schedule.sessions is not None:  # conversations: each turn after the previous one's response
                await run_sessions(
                    schedule,
                    "load",
                    api_key=api_key,
                    on_record=on_record,
                    on_send=tally.on_send,
                    max_event_bytes=schedule.max_event_bytes,
                    start_ns=start_ns,
                    run_id=paths.run_id,
                )
            else:
                await run_requests(
                    schedule.specs,
                    schedule.concurrency,
                    "load",
                    api_key=api_key,
                    on_record=on_record,
                    on_send=tally.on_send,
                    timeout_s=schedule.timeout_s,
                    max_event_bytes=schedule.max_event_bytes,
                    scheduled=schedule.scheduled,
                    start_ns=start_ns,
                    run_id=paths.run_id,
                )
        tg.cancel_scope.cancel()
    return caught


SWITCH_INTERVAL_S = 0.0005
LOAD_NICE = -5


def quiet_runtime() -> None:
    """Keep pauses out of send times. What exists before the first send (imports, the schedule) is frozen out of
    the cyclic collector, so a full collection during the load walks only what the load made; a thread (the
    progress writer) gives the GIL back to the event loop within 0.5 ms, not 5; and where the host allows it
    (CAP_SYS_NICE) the client runs at nice LOAD_NICE, so a due send or an arriving chunk is not queued behind
    the engine's threads on a shared host (the sample trace on llama-server, 2 cores: arrival error p99
    1.1-3.3 ms at nice 0, 0.09-0.16 ms at -5). load/end.json records the nice it ran at."""
    gc.collect()
    gc.freeze()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    with contextlib.suppress(OSError):  # allowed with CAP_SYS_NICE (root): sends are not queued behind others
        os.setpriority(os.PRIO_PROCESS, 0, LOAD_NICE)


def wait_for_go(paths: RunPaths, poll_s: float = 0.01, heartbeat_s: float | None = None) -> str | None:
    """Armed start: the controller spawns the client while preflight runs, so its start-up (imports, schedule)
    is off the hot path. Nothing is sent until load/go exists (None); load/abort or a dead controller ends it
    (why, returned): dead when the run's controller.pid names no live controller (a resume's new controller
    adopts a client its dead predecessor armed). heartbeat_s (a client on a load host, where the controller's
    pid means nothing): the wait also ends once load/heartbeat has not changed for that long, counted on this
    host's monotonic clock from the first look (a wall clock step cannot trip it)."""
    ctl = read_json_or_none(paths.controller_pid) if heartbeat_s is None else None
    go, abort, beat = paths.load_go, paths.load_abort, paths.load_heartbeat
    seen: int | None = None
    since = time.monotonic()
    while True:
        if go.exists():
            return None
        if abort.exists():
            return "the controller aborted the load"
        if ctl is not None and not procs.alive(ctl):
            now = read_json_or_none(paths.controller_pid)
            if now is None or now == ctl or not procs.alive(now):
                return "the controller died"
            # a resume's controller took the run over while this client was armed (it keeps an armed client that
            # is alive rather than spawn a second): its go is this client's
            ctl = now
        if heartbeat_s is not None:
            try:
                mtime: int | None = beat.stat().st_mtime_ns
            except FileNotFoundError:
                mtime = None
            now = time.monotonic()
            if mtime != seen:
                seen, since = mtime, now
            elif now - since > heartbeat_s:
                return (
                    f"no go and no heartbeat from the controller ({beat} unchanged) for {heartbeat_s:g} s: "
                    "the controller died or lost this host before the go"
                )
        time.sleep(poll_s)


def _heartbeat_s() -> float | None:
    """The heartbeat bound the controller of a load host's clients passed (HEARTBEAT_ENV), or None (local)."""
    raw = os.environ.get(HEARTBEAT_ENV)
    if not raw:
        return None
    try:
        bound = float(raw)
    except ValueError:
        bound = 0.0
    if not bound > 0:
        raise _NotStarted(EXIT_NOT_STARTED, f"load: not started, nothing sent: {HEARTBEAT_ENV}={raw!r} is not > 0 s")
    return bound


def _await_go(paths: RunPaths) -> None:
    """An armed client waits for the go; _NotStarted when it does not come. On a load host the end is recorded
    (load/not_started.json: why, the exit code), as no controller there sees the exit code."""
    bound = _heartbeat_s()
    why = wait_for_go(paths, heartbeat_s=bound)
    if why is None:
        return
    if bound is None:  # here: the controller sees the exit code and the log line
        raise _NotStarted(
            EXIT_NOT_STARTED,
            "not started, nothing sent: the controller aborted (or died) before the load phase",
            logged=True,
        )
    line = (
        f"not started, nothing sent: {why}; exit {EXIT_NOT_STARTED}. A resume of the run stops this attempt "
        "and starts the load afresh"
    )
    with contextlib.suppress(OSError):  # the log line below says it too
        write_json(
            paths.load_not_started,
            {"exit": "not_started", "code": EXIT_NOT_STARTED, "reason": why, "sent": 0, "utc": utc_now()},
        )
    raise _NotStarted(EXIT_NOT_STARTED, line, logged=True)


class _NotStarted(Exception):
    """The load does not start (nothing was sent): the exit code and the line that says why."""

    def __init__(self, code: int, line: str, *, logged: bool = False) -> None:
        super().__init__(line)
        self.code, self.line, self.logged = code, line, logged


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not 1 <= len(args) <= 2 or args[0].startswith("-") or (len(args) == 2 and not args[1].isdigit()):
        print(
            "usage: python -m caseledger.load RUN_DIR [PROCESS]  (everything else is read from the run directory; "
            "PROCESS: this client's index 0..load.processes-1 when load.processes > 1)",
            file=sys.stderr,
        )
        return EXIT_NOT_STARTED
    root = Path(os.path.abspath(args[0]))
    return _main(RunPaths(root) if len(args) == 1 else PartPaths(root, int(args[1])))


def run_inline(paths: RunPaths) -> int:
    """The same load in the calling process (procs.InProcess: tests of what a run computes). Left out: what only
    a process of its own may do (runtime tuning, nice, signal handlers); the exit code is returned."""
    return _main(paths, own_process=False)


def _main(paths: RunPaths, own_process: bool = True) -> int:
    if paths.root.is_symlink() or not paths.root.is_dir():  # a link may point anywhere: never written through
        problem = "is a symbolic link (never followed)" if paths.root.is_symlink() else "does not exist"
        print(f"load: run directory {paths.root} {problem}", file=sys.stderr)
        return EXIT_NOT_STARTED
    paths.load_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(paths.raw, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        schedule, transport, api_key = _admit(paths, fd)
        start_ns = start_of(paths.load_go) if isinstance(paths, PartPaths) else None
    except _NotStarted as e:  # the one exit before the load: the raw file's descriptor closed here
        os.close(fd)
        if e.logged:
            log(e.line)
        else:
            print(e.line, file=sys.stderr, flush=True)
        return e.code
    return _load(paths, fd, schedule, transport, api_key, start_ns, own_process)


def _refusal(paths: RunPaths) -> str | None:
    """refusal() of this client's files and, for one process of several, of the merged load (load/)."""
    if isinstance(paths, PartPaths):
        return refusal(paths) or refusal(RunPaths(paths.root))
    return refusal(paths)


def _schedule(paths: RunPaths) -> Schedule:
    """The schedule this client sends: the run's, or for process k of load.processes its share (load/parts.py)."""
    schedule = schedule_from_run_dir(paths.root)
    if isinstance(paths, PartPaths):
        return part_schedule(schedule, paths.part)
    if schedule.processes > 1:
        raise ValueError(
            f"load.processes is {schedule.processes}: start each client with its index, "
            "python -m caseledger.load RUN_DIR PROCESS (the controller does)"
        )
    return schedule


def _admit(paths: RunPaths, fd: int) -> tuple[Schedule, str, str | None]:
    """Everything that must hold before the first formal request: the raw file's lock (one client per run,
    ever at once), no earlier attempt on record, the schedule and its transport, the API key, the controller's go."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held until exit
    except BlockingIOError:
        raise _NotStarted(EXIT_REFUSED, f"load: refused: another load client holds {paths.raw}") from None
    why = _refusal(paths)
    if why is not None:
        raise _NotStarted(
            EXIT_REFUSED,
            f"load: refused: {why}; formal requests are never sent twice. Read the raw "
            "records (or confirm_end) instead of starting the load again.",
        )
    write_json(paths.load_pid, procs.me())
    try:
        schedule = _schedule(paths)
        transport = transport_used(s.url for s in schedule.specs)  # an unknown transport refuses before any send
    except (CaseledgerError, ValueError, OSError) as e:
        raise _NotStarted(EXIT_NOT_STARTED, f"load: not started, nothing sent: {type(e).__name__}: {e}") from None
    api_key = None
    if schedule.api_key_env:
        api_key = os.environ.get(schedule.api_key_env)
        if not api_key:
            raise _NotStarted(
                EXIT_NOT_STARTED,
                f"load: not started, nothing sent: target.api_key_env names "
                f"{schedule.api_key_env}, which is not set in the load client's environment; export it "
                "for the controller",
            )
    if isinstance(paths, PartPaths):
        paths.load_ready.touch()  # the controller gives one go once every process is here
    if os.environ.get(ARMED_ENV):
        _await_go(paths)
    return schedule, transport, api_key


def _load(
    paths: RunPaths,
    fd: int,
    schedule: Schedule,
    transport: str,
    api_key: str | None,
    start_ns: int | None = None,
    own_process: bool = True,
) -> int:
    """The formal load: send, record every request, then the end file (written even on a full disk).
    start_ns: the monotonic instant the schedule starts at (one go for several processes); None: at once."""
    part = f" (process {paths.part} of {schedule.processes})" if isinstance(paths, PartPaths) else ""
    log(
        f"run {paths.run_id}{part}: {schedule.planned} requests, C={schedule.concurrency}, rate={schedule.rate}, "
        f"arrival={schedule.arrival}, timeout_s={schedule.timeout_s:g}"
    )
    spare = Spare(paths.load_dir / ".spare")  # freed on a full disk so the end file can still be written
    sent_fd = os.open(paths.load_sent, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    reserve(sent_fd, 12 * schedule.planned)
    tally = Tally(planned=schedule.planned, sent_fd=sent_fd)
    write_json(paths.load_progress, tally.progress())
    writer = RawWriter(fd)
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    wall_start = utc_now()
    write_json(paths.load_anchor, clock_anchor())
    if own_process:
        quiet_runtime()
    try:
        caught = anyio.run(_run, paths, schedule, api_key, writer, tally, start_ns, own_process)
    finally:
        writer.close()
        if tally.sent_fd is not None:
            os.fsync(tally.sent_fd)
            os.close(tally.sent_fd)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    if tally.disk_full:
        spare.free()
    with contextlib.suppress(OSError):
        write_json(paths.load_progress, tally.progress())
    end = _end_record(tally, schedule, transport, caught, wall_start, ru0, ru)
    try:
        write_json(paths.load_end, end)
    except OSError as e:
        if not is_disk_full(e):
            raise
        spare.free()
        write_json(paths.load_end, end)
    spare.free()
    log(
        f"{end['exit']}: sent {tally.sent}, done {tally.done}, ok {tally.ok}, failed {tally.failed}, "
        f"chunks {tally.chunks}"
    )
    return EXIT_CANCELLED if caught else EXIT_COMPLETE


def _end_record(
    tally: Tally,
    schedule: Schedule,
    transport: str,
    caught: list[str],
    wall_start: str,
    ru0: resource.struct_rusage,
    ru: resource.struct_rusage,
) -> dict[str, Any]:  # JSON: load/end.json
    """The end file's content (JSON): counts, clock and CPU of the load, how it ended."""
    end: dict[str, Any] = {  # JSON: load/end.json
        **tally.counts(),
        "first_send_ns": tally.first_send_ns,
        "last_end_ns": tally.last_end_ns,
        "wall_start_utc": wall_start,
        "wall_end_utc": utc_now(),
        "cpu_user_s": ru.ru_utime,
        "cpu_sys_s": ru.ru_stime,
        # CPU of the load itself (anchor to end): what per-chunk client cost is computed from
        "cpu_load_user_s": ru.ru_utime - ru0.ru_utime,
        "cpu_load_sys_s": ru.ru_stime - ru0.ru_stime,
        "chunks": tally.chunks,
        "plan_sha256": schedule.digest(),
        "transport": transport,
        "nice": os.getpriority(os.PRIO_PROCESS, 0),  # LOAD_NICE when the host allowed it, else what it inherited
        "exit": "disk_full" if tally.disk_full else "cancelled" if caught else "complete",
    }
    if tally.disk_full:
        end["reason"] = tally.disk_full
    elif caught:
        end["signal"] = caught[0]
    return end


if __name__ == "__main__":
    sys.exit(main())
