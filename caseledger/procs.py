"""Process identity and liveness: a pid is only 'the same process' with the same start time; and how a run's
parts are started (the launcher: detached processes, or in the caller's process for tests)."""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, Protocol, TypeVar

from typing_extensions import TypedDict  # pydantic validates it (services' state model) on Python 3.11


class ProcRef(TypedDict):
    """A process as caseledger records it: a pid is only the same process with the same start time, on its host."""

    pid: int
    start_time: int
    host: str


class LoadRef(ProcRef, total=False):
    """A load client's process reference (load/pid.json, load/p<k>/pid.json): on a load host, `gone_utc` once it
    was seen gone there (`elsewhere` then asks no more)."""

    gone_utc: str


def ref_of(obj: object) -> LoadRef | None:
    """The process reference in a JSON object as read (pid.json, remote.json), or None when it has no pid. A pid
    of 0 is a process on its host whose pid is not known yet (the lease keeps it); a missing start time is 0 (any
    start time), a missing host this host, as alive() reads them."""
    if not isinstance(obj, Mapping) or "pid" not in obj:
        return None
    ref: LoadRef = {
        "pid": int(obj["pid"] or 0),
        "start_time": int(obj.get("start_time") or 0),
        "host": str(obj.get("host") or socket.gethostname()),
    }
    if "gone_utc" in obj:
        ref["gone_utc"] = str(obj["gone_utc"])
    return ref


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (clock ticks since boot), or None when the process is gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # the command name may contain spaces and parens: split after the last ')'
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def _stat_fields(pid: int) -> list[bytes] | None:
    """/proc/PID/stat after the command name (field 3, the state, first), or None when the process is gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return data[data.rfind(b")") + 2 :].split()  # the command name may hold spaces and parens


def is_zombie(pid: int) -> bool:
    f = _stat_fields(pid)
    return f is not None and f[0] == b"Z"


STOPPED_STATES = (b"T", b"t")  # stopped by a signal (SIGSTOP, SIGTSTP) or by a tracer


def stopped(ref: Mapping[str, Any] | None) -> bool:
    """True when the referenced local process exists but is stopped: it holds its pid, ports and lease, and does
    no work at all. Alive is not the same as working."""
    if not alive(ref) or ref is None:
        return False
    f = _stat_fields(int(ref["pid"]))
    return f is not None and f[0] in STOPPED_STATES


def run_module(module: str, argv: list[str]) -> int:
    """`python -m MODULE ARGV` in this process, for a part run in the caller's process (InProcess): the
    module's main(argv), named as the detached spawn names it (by module, so a part may start the part that
    started it, as processes do)."""
    return int(importlib.import_module(module).main(argv))


def gone(ref: ProcRef) -> LoadRef:
    """The ref of a process part that ran inline and returned: recorded as gone, so no reader waits for it."""
    return {**ref, "gone_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def me() -> ProcRef:
    return ref(os.getpid())


def ref(pid: int) -> ProcRef:
    """The reference of the process `pid` on this host (a child just started, or this process)."""
    return {"pid": pid, "start_time": start_time(pid) or 0, "host": socket.gethostname()}


def alive(ref: Mapping[str, Any] | None) -> bool:
    """True when the referenced process still runs (same pid AND same start time, not a zombie); never for a ref
    recorded as gone ('gone_utc': seen gone on its host, or a part of an inline run that has returned)."""
    if not ref or "pid" not in ref or "gone_utc" in ref:
        return False
    if ref.get("host") not in (None, socket.gethostname()):
        return False  # another host: the caller must check remotely
    st = start_time(int(ref["pid"]))
    if st is None or is_zombie(int(ref["pid"])):
        return False
    return ref.get("start_time") in (None, 0, st)


def elsewhere(ref: Mapping[str, Any] | None) -> str | None:
    """The other host a process ref names (only a question over SSH there can tell whether it runs), or None;
    None too once it was seen gone there ('gone_utc')."""
    if not ref or "pid" not in ref or ref.get("host") in (None, socket.gethostname()) or "gone_utc" in ref:
        return None
    return str(ref["host"])


def cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def flock_holders(fd: int) -> list[int]:
    """Pids holding an flock on the file open at `fd` (/proc/locks; waiters, shown with '->', are left out)."""
    st = os.fstat(fd)
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    found: list[tuple[bool, int]] = []  # (same device, pid)
    for line in lines:
        f = line.split()  # "1: FLOCK  ADVISORY  WRITE 4121 fe:00:2165536 0 EOF" (device major:minor in hex)
        if len(f) < 6 or f[1] != "FLOCK" or not f[4].isdigit() or f[5].count(":") != 2:
            continue
        major, minor, ino = f[5].split(":")
        if ino == str(st.st_ino):
            found.append(((int(major, 16), int(minor, 16)) == (os.major(st.st_dev), os.minor(st.st_dev)), int(f[4])))
    # an overlay filesystem may show another device than stat does: the inode alone then
    same = [pid for dev_ok, pid in found if dev_ok]
    return same or [pid for _, pid in found]


_TCP_LISTEN = "0A"  # /proc/net/tcp state code of a listening socket


class HeldFile(TypedDict):
    path: str  # as the kernel names it (" (deleted)" stripped)
    dev: int
    inode: int
    replaced: bool  # the path no longer names this file (unlinked or replaced since it was opened)
    via: str  # a /proc path that opens this very file (map_files or fd), for hashing what the process holds


def held_files(pid: int) -> list[HeldFile]:
    """Regular files the process has mapped (/proc/PID/maps) or open (/proc/PID/fd), one entry per file."""
    try:
        out = mapped_files(Path(f"/proc/{pid}/maps").read_text(errors="replace").splitlines(), pid)
    except OSError:
        out = {}
    with contextlib.suppress(OSError):
        for fd in os.scandir(f"/proc/{pid}/fd"):
            try:
                st = os.stat(fd.path)
                target = os.readlink(fd.path)
            except OSError:
                continue
            if not target.startswith("/") or not stat.S_ISREG(st.st_mode):
                continue
            path = target.removesuffix(" (deleted)")
            out.setdefault(
                (st.st_dev, st.st_ino),
                {
                    "path": path,
                    "dev": st.st_dev,
                    "inode": st.st_ino,
                    "replaced": target.endswith(" (deleted)"),
                    "via": fd.path,
                },
            )
    for f in out.values():  # a path replaced by rename is not "(deleted)" when another name still links it
        with contextlib.suppress(OSError):
            st = os.stat(f["path"])
            f["replaced"] = f["replaced"] or (st.st_dev, st.st_ino) != (f["dev"], f["inode"])
    return list(out.values())


def mapped_files(maps: list[str], pid: int) -> dict[tuple[int, int], HeldFile]:
    """(dev, inode) -> HeldFile of the file-backed lines of a /proc/PID/maps text (this host's or another's)."""
    out: dict[tuple[int, int], HeldFile] = {}
    for line in maps:  # start-end perms offset dev inode path
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/") or parts[4] == "0":
            continue
        path, replaced = parts[5].removesuffix(" (deleted)"), parts[5].endswith(" (deleted)")
        major, minor = (int(x, 16) for x in parts[3].split(":"))
        key = (os.makedev(major, minor), int(parts[4]))
        out.setdefault(
            key,
            {
                "path": path,
                "dev": key[0],
                "inode": key[1],
                "replaced": replaced,
                "via": f"/proc/{pid}/map_files/{parts[0]}",
            },
        )
    return out


def environ(pid: int) -> dict[str, str] | None:
    """The process's environment as it started (/proc/PID/environ); None when unreadable."""
    try:
        data = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    pairs = (item.split(b"=", 1) for item in data.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _listening_inodes(port: int) -> set[str]:
    """'socket:[inode]' of every listening TCP socket on `port` (v4 and v6), from /proc/net/tcp{,6}."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                f = line.split()
                if len(f) > 9 and f[3] == _TCP_LISTEN and int(f[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{f[9]}]")
    return inodes


def _holds(pid: int, inodes: set[str]) -> bool:
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd) in inodes:
                    return True
    return False


def _pids() -> list[int]:
    return [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit()]


def listening_pids(port: int) -> tuple[set[int], bool]:
    """The processes of this host that hold a listening TCP socket on `port` (v4 or v6), the topmost of them
    only (a forked worker sharing its parent's socket is counted with the parent); with whether any listening
    socket was found at all (found, but no pid: another user's process, whose fds are not ours to read)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return set(), False
    holders = {p for p in _pids() if _holds(p, inodes)}
    return {p for p in holders if _ppid(p) not in holders}, True


def _ppid(pid: int) -> int | None:
    f = _stat_fields(pid)
    return int(f[1]) if f is not None and len(f) > 1 else None


def program(argv: list[str]) -> str:
    """What a command line runs, without its arguments (they may carry a key): the program's name, and an
    interpreter's module or script ('python3 -m vllm.entrypoints.openai.api_server', 'llama-server')."""
    if not argv:
        return "?"
    name = os.path.basename(argv[0])[:64]
    if len(argv) > 2 and argv[1] == "-m":
        return f"{name} -m {argv[2][:64]}"
    if name.startswith("python") and len(argv) > 1 and not argv[1].startswith("-"):
        return f"{name} {os.path.basename(argv[1])[:64]}"
    return name


def owns_port(pid: int, port: int) -> tuple[bool, set[int]]:
    """Whether the listener on `port` is `pid` or runs in the session `pid` leads (services are started in a
    session of their own, so a worker process that holds the socket still counts); with the listeners found.
    The pid itself is looked at first, so the usual answer costs one fd directory, not every process's."""
    inodes = _listening_inodes(port)
    if not inodes:
        return False, set()
    if _holds(pid, inodes):
        return True, {pid}
    for p in _pids():
        with contextlib.suppress(OSError):
            if p != pid and os.getsid(p) == pid and _holds(p, inodes):
                return True, {p}
    return False, listeners(port)


def listeners(port: int) -> set[int]:
    """The pids that hold a listening TCP socket on `port`, as far as this host shows them."""
    inodes = _listening_inodes(port)
    return {p for p in _pids() if _holds(p, inodes)} if inodes else set()


def terminate(ref: Mapping[str, Any], grace_s: float = 5.0) -> bool:
    """SIGTERM the process group (or the process), then SIGKILL after the grace period. A child of this process
    (a service an inline run started) is reaped, so no zombie of it stays in the process table."""
    if not alive(ref):
        if ref.get("pid") and ref.get("host") in (None, socket.gethostname()):
            _reap(int(ref["pid"]))  # it ended by itself: a child of ours is reaped still
        return False
    pid = int(ref["pid"])
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
            if sig == signal.SIGTERM:
                os.killpg(pid, signal.SIGCONT)  # a stopped process acts on SIGTERM only once continued
        except OSError:
            try:
                os.kill(pid, sig)
                if sig == signal.SIGTERM:
                    os.kill(pid, signal.SIGCONT)
            except OSError:
                return True
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not alive(ref):  # gone, or a zombie: reaped here when it is our child
                _reap(pid)
                return True
            time.sleep(0.05)
    _reap(pid)
    return not alive(ref)


REAP_WAIT_S = 2.0


def _reap(pid: int) -> None:
    """Collect the exit status of `pid` if it is an exited child of this process (no zombie left behind);
    nothing for another process's child. A multi-threaded child (an engine) reads as a zombie once its main
    thread exits, but can be reaped only when its last thread has: waited for, at most REAP_WAIT_S."""
    deadline = time.monotonic() + REAP_WAIT_S
    while True:
        try:
            got, _ = os.waitpid(pid, os.WNOHANG)
        except (ChildProcessError, OSError):
            return  # not our child, or reaped already
        if got == pid or time.monotonic() >= deadline:
            return
        time.sleep(0.01)


PKG_PARENT = str(Path(__file__).resolve().parent.parent)


def child_env(extra: dict[str, str] | None = None, keep: Iterable[str] = ()) -> dict[str, str]:
    """An explicit, minimal environment for caseledger's own fresh subprocesses (controller, load client,
    preflight, postprocess): the basics any command needs (INHERITED_ENV), what runs this interpreter and
    caseledger (OWN_ENV), this package on the path, and the variables the case names (`keep`: its API key
    variable, the ${VAR} its service env references). Never the rest of the caller's environment: secrets
    in the agent's shell stay out of /proc/PID/environ of every process caseledger starts."""
    names = set(keep) | set(INHERITED_ENV) | set(OWN_ENV)
    prefixes = INHERITED_ENV_PREFIXES + OWN_ENV_PREFIXES
    env = {k: v for k, v in os.environ.items() if k in names or k.startswith(prefixes)}
    env["PYTHONPATH"] = PKG_PARENT + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    env.update(OWN_PROCESS_ENV)
    env.update(extra or {})
    return env


# Set for caseledger's own processes, which run on the host whose contention the run's evidence measures:
# - one BLAS thread: they compute on arrays of a few thousand numbers, and numpy's import otherwise starts a
#   thread per core;
# - no pydantic plugins: a plugin installed beside caseledger would instrument the load client and the
#   collector, and looking for one reads every installed distribution's entry points in each process.
# What each costs: bench/RESULTS.md (host CPU per detached run).
# A service never gets these: an engine's threads and libraries are its own to set, in service.env.
OWN_PROCESS_ENV = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYDANTIC_DISABLE_PLUGINS": "__all__",
}


# What a local service (and identity_command) inherits from the caller: only what any command needs to run at
# all -- find programs, a home, who it runs as, a shell, a temp dir, time zone and locale. Never the rest: the
# agent's shell holds API keys and tokens, and a service's environment is readable in /proc/PID/environ.
# LD_LIBRARY_PATH, PYTHONPATH, CUDA_VISIBLE_DEVICES and the like are deliberately NOT inherited: they decide
# which code and which devices the engine runs, so they belong to the case -- declare them in service.env
# (e.g. "LD_LIBRARY_PATH": "${LD_LIBRARY_PATH}"), where they are part of the service identity and recorded.
# A remote service (service.ssh) gets case_env() only, on top of the remote login's own environment.
INHERITED_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "TMPDIR", "TZ", "LANG", "LANGUAGE")
INHERITED_ENV_PREFIXES = ("LC_",)
# caseledger's own processes also get what runs Python and caseledger: its settings (CASELEDGER_*), the
# library paths of this interpreter, the offline tokenizer settings.
OWN_ENV = ("LD_LIBRARY_PATH", "VIRTUAL_ENV", "PYTHONHOME", "SSL_CERT_FILE", "SSL_CERT_DIR")
OWN_ENV_PREFIXES = ("CASELEDGER_", "HF_", "TOKENIZERS_", "TRANSFORMERS_")


class CpuSample(TypedDict):
    """CPU of this host over one interval, in clock ticks (load/host.jsonl, one line per sample)."""

    mono_ns: int  # end of the interval, time.monotonic_ns() (the load client's clock on the same host)
    dt_ns: int  # interval length
    total: int  # all CPU time of all cores
    busy: int  # total minus idle and iowait
    steal: int  # stolen by the hypervisor
    ours: int  # processes in the watched sessions (load client, service, controller) and the own pids
    client: int  # the load client's own process
    cores: int
    load1: float  # 1-minute load average at the end
    top: list[tuple[int, str, int]]  # the other processes that used the most: (pid, command name, ticks), at most 3


TOP_OTHERS = 3  # other processes named per sample (the ones that took the most CPU)


def others_of(samples: Iterable[Mapping[str, Any]]) -> tuple[float, list[str]]:
    """Over some CpuSamples (or their load/host.jsonl lines): the other processes' share of all CPU time, and
    the TOP_OTHERS of them that took the most ('pid 4242 cc1 38%', share of all CPU time)."""
    rows = list(samples)
    total = sum(x["total"] for x in rows) or 1
    share = max(0.0, sum(x["busy"] - x["ours"] for x in rows) / total)
    took: dict[tuple[int, str], int] = {}
    for x in rows:
        for pid, name, ticks in x.get("top") or []:
            took[(pid, name)] = took.get((pid, name), 0) + ticks
    most = sorted(took.items(), key=lambda kv: -kv[1])[:TOP_OTHERS]
    return share, [f"pid {pid} {name} {t / total:.0%}" for (pid, name), t in most]


def caseledger_pids(root: Path) -> set[int]:
    """caseledger's own processes for a workspace: those running caseledger (its CLI, its MCP server) with the
    workspace on their command line or as their working directory. Their CPU (an agent's status calls answered)
    is the measurement's own, never "other processes"."""
    out: set[int] = set()
    where = str(root).encode()
    for pid in _pids():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"caseledger" not in cmd:
            continue
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd").encode()
        except OSError:
            cwd = b""
        if where in cmd or cwd == where or cwd.startswith(where + b"/"):
            out.add(pid)
    return out


class CpuSampler:
    """Successive /proc readings of host CPU and of the processes in some sessions; `sample` returns the interval
    since the last call (None on the first). Processes are keyed by (pid, start time): a pid reused in the
    interval starts from zero. own_pids: processes counted as ours besides the sessions (caseledger's own, e.g.
    the MCP server of this workspace answering status calls). trees: (pid, start time) of processes counted as
    ours with all their descendants (an external service found listening on its port: not in our sessions)."""

    def __init__(self, own_pids: set[int] | None = None, trees: set[tuple[int, int]] | None = None) -> None:
        self._prev: tuple[int, list[int], dict[tuple[int, int], int]] | None = None
        self.own_pids = own_pids or set()
        self.trees = trees or set()

    def sample(self, sessions: set[int], client_pid: int | None) -> CpuSample | None:
        now = time.monotonic_ns()
        try:
            cpu = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
            load1 = float(Path("/proc/loadavg").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        jiffies: dict[tuple[int, int], int] = {}
        mine: set[tuple[int, int]] = set()
        names: dict[tuple[int, int], str] = {}
        parent: dict[int, int] = {}
        for pid in _pids():
            try:
                data = Path(f"/proc/{pid}/stat").read_bytes()
            except OSError:
                continue
            cut = data.rfind(b")")
            f = data[cut + 2 :].split()
            # fields after the name: state ppid pgrp session ... utime(11) stime(12) ... starttime(19)
            if len(f) < 20:
                continue
            k = (pid, int(f[19]))
            jiffies[k] = int(f[11]) + int(f[12])
            names[k] = data[data.find(b"(") + 1 : cut].decode(errors="replace")[:32]
            parent[pid] = int(f[1])
            if int(f[3]) in sessions or pid in self.own_pids:
                mine.add(k)
        mine |= _trees(self.trees, jiffies, parent)
        prev, self._prev = self._prev, (now, cpu, jiffies)
        if prev is None:
            return None
        t0, cpu0, j0 = prev
        d = [a - b for a, b in zip(cpu, cpu0, strict=True)]
        total = sum(d)
        used = {k: max(0, j - j0.get(k, 0)) for k, j in jiffies.items()}
        ours = sum(used[k] for k in mine)
        client = sum(u for k, u in used.items() if k[0] == client_pid)
        others = sorted(((u, k) for k, u in used.items() if k not in mine and u > 0), reverse=True)[:TOP_OTHERS]
        return CpuSample(
            mono_ns=now,
            dt_ns=now - t0,
            total=total,
            busy=total - d[3] - d[4],
            steal=d[7],
            ours=ours,
            client=client,
            cores=os.cpu_count() or 1,
            load1=load1,
            top=[(k[0], names[k], u) for u, k in others],
        )


def _trees(
    roots: set[tuple[int, int]], keys: Iterable[tuple[int, int]], parent: Mapping[int, int]
) -> set[tuple[int, int]]:
    """The processes among `keys` that are one of `roots` (same pid and start time) or descend from one."""
    if not roots:
        return set()
    live = {pid for pid, start in keys if (pid, start) in roots}
    out: set[int] = set()
    for pid in parent:
        chain: list[int] = []
        p = pid
        while p not in live and p not in out and p in parent and p > 1 and len(chain) < 4096:
            chain.append(p)
            p = parent[p]
        if p in live or p in out:
            out.update(chain)
            out.add(p)
    return {k for k in keys if k[0] in out}


# ------------------------------------------------------------------ launchers: how a run's parts are started
# The one place that knows whether a run's parts get processes of their own.
#
# A run's parts (the controller and its phase table, preflight, the load client, the collector, a campaign's
# driver) are started through the current launcher, never by asking which mode is on:
#
# - `Detached` (the default, production): each part is a fresh process -- detached in a session of its own, or a
#   child whose answer is read -- and owns its signals, its environment, its priority and its exit;
# - `InProcess`: each part's entry runs in the calling process with the same functions and files, for tests whose
#   subject is what a run computes (folds, decisions, reports, handoff), where ~3 s of interpreter starts per run is
#   the whole cost. The caller's process is not the part's: its signals, environment, priority and exit are left
#   alone, no process is started ahead, and what needs a process of its own (a kill, a lease lost, several load
#   clients waiting for one go) is refused with a RuntimeError naming it. Services are still their own processes.
#
# `in_process()` selects the second for a block (tests/conftest.py, for every test not marked `processes`); like
# httpx's transport, the code that starts a part never branches on it.

T = TypeVar("T")
Handler = Callable[[int, Any], None]  # a signal handler: (signum, frame)


@dataclass(frozen=True)
class Part:
    """A part of a run as both launchers start it: `python -m MODULE ARGV` detached (its output appended to
    `log`, its environment `env`, its reference handed to `record` at once), or `here`, its entry in this
    process, which does its own bookkeeping (its reference written as gone once it returns)."""

    module: str
    argv: list[str]
    log: Path
    here: Callable[[], object]
    env: dict[str, str] = field(default_factory=dict)
    record: Callable[[LoadRef], None] = lambda ref: None


class Launcher(Protocol):
    """What the code that runs a part asks, and the two answers (Detached, InProcess)."""

    def start(self, part: Part) -> LoadRef:
        """Start a part that runs on its own; its process reference (live, or gone once it ran here)."""
        ...

    def answer(self, fresh: Callable[[], T], here: Callable[[], T]) -> T:
        """A part whose answer the caller waits for (preflight, the collector): `fresh` in a fresh process, or
        `here`, its entry in this process."""
        ...

    def ahead(self, spawn: Callable[[], T]) -> T | None:
        """A process started before its run exists (it imports while the run is written), or None: no part
        runs ahead of its start."""
        ...

    def adopt(self, sigterm: Handler | None = None, env: Mapping[str, str] | None = None) -> None:
        """The settings a part makes in a process of its own: its SIGTERM handler, variables its children
        inherit."""
        ...

    def niced(self, work: Callable[[], None]) -> None:
        """Derived work the part does last at the lowest CPU priority (charts), or none in the caller's
        process (summarize then draws in memory)."""
        ...

    def own_process(self, why: str) -> None:
        """Nothing when the part has a process of its own; a RuntimeError saying `why` when it would act on the
        caller's (end it, wait in it for ever, run several clients one after another in it)."""
        ...


class Detached:
    """Each part a fresh process (production)."""

    def start(self, part: Part) -> LoadRef:
        with part.log.open("ab") as log:
            p = subprocess.Popen(
                [sys.executable, "-m", part.module, *part.argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=part.env,
                start_new_session=True,
                close_fds=True,
            )
        ref: LoadRef = {"pid": p.pid, "start_time": start_time(p.pid) or 0, "host": me()["host"]}
        part.record(ref)  # at once: readers must see the part even before it has started up
        return ref

    def answer(self, fresh: Callable[[], T], here: Callable[[], T]) -> T:
        return fresh()

    def ahead(self, spawn: Callable[[], T]) -> T | None:
        return spawn()

    def adopt(self, sigterm: Handler | None = None, env: Mapping[str, str] | None = None) -> None:
        if sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)
        os.environ.update(env or {})

    def niced(self, work: Callable[[], None]) -> None:
        os.nice(19)
        work()

    def own_process(self, why: str) -> None:
        return None


class InProcess:
    """Each part's entry in the calling process (tests of what a run computes)."""

    def start(self, part: Part) -> LoadRef:
        part.here()
        return gone(me())

    def answer(self, fresh: Callable[[], T], here: Callable[[], T]) -> T:
        return here()

    def ahead(self, spawn: Callable[[], T]) -> T | None:
        return None  # the part runs in this process when it starts

    def adopt(self, sigterm: Handler | None = None, env: Mapping[str, str] | None = None) -> None:
        return None  # the caller's signals and environment are not the part's

    def niced(self, work: Callable[[], None]) -> None:
        return None  # the caller's process is no place for nice 19

    def own_process(self, why: str) -> NoReturn:
        raise RuntimeError(why)


DETACHED = Detached()
IN_PROCESS = InProcess()


class _Current:
    now: Launcher = DETACHED


def launcher() -> Launcher:
    """The launcher the code that starts a part uses: Detached unless inside in_process()."""
    return _Current.now


@contextlib.contextmanager
def using(chosen: Launcher) -> Iterator[None]:
    """Within this block the run's parts start through `chosen`."""
    before, _Current.now = _Current.now, chosen
    try:
        yield
    finally:
        _Current.now = before


def in_process() -> contextlib.AbstractContextManager[None]:
    """Within this block a run's parts run in the calling process (InProcess); kills, stops, leases, resume
    across deaths and detachment need real processes, outside it."""
    return using(IN_PROCESS)
