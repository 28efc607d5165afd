"""Launching a service process on its host, behind one seam: this host (a detached child in its own session)
or another over SSH (remote.py). A launcher spawns the argv, answers whether the process still runs, reads
the tail of its log, reads its argv and held files back, and kills it; `wait_health` is the one health wait
both use, each launcher probing its process as often as a probe is cheap there (a local poll every pass, a
remote probe, one SSH exec, about once a second).

Every launch is an argv list, never a shell string: case fields must not become shell syntax.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Protocol

from caseledger import procs, redact
from caseledger.case.service import SSH
from caseledger.errors import FailureClass, PhaseFailed
from caseledger.services import remote
from caseledger.services.identity import Unit
from caseledger.services.live import HealthWait, ProcView, local_view, remote_view

__all__ = ["Launcher", "LocalLauncher", "SshLauncher", "wait_health"]

LOG_TAIL_BYTES = 400  # how much of a service log is read to show its last line


class Launcher(Protocol):
    """One process of a service on the host that runs it. `spawn` first; the other calls are about the
    process it started."""

    where: str  # "" on this host, " on HOST" over SSH: follows the process's name in messages
    shown_log: str  # the service log as an agent can read it (a path here, user@host:path over SSH)
    probe_after_s: float  # wait_health's first liveness probe, this long after the wait starts
    probe_every_s: float  # the time between probes after that (0: on every pass)

    @property
    def ref(self) -> procs.ProcRef:
        """The process spawn started."""
        ...

    def spawn(self, argv: list[str], env: dict[str, str]) -> procs.ProcRef:
        """Start the argv detached with exactly `env`, its output appended to the service log."""
        ...

    def exit_status(self) -> str | None:
        """None while the process runs; else how it ended, as an error shows it ("exited with code 1")."""
        ...

    def log_tail(self) -> str:
        """The last bytes of the service log."""
        ...

    def cmdline(self) -> list[str] | None:
        """The argv the live process runs, read back from /proc on its host; None when unreadable."""
        ...

    def view(self, paths: list[str]) -> ProcView:
        """What the process holds and runs with, read on its host, with `paths` (declared files) looked up there."""
        ...

    def kill(self) -> bool:
        """Stop the process (SIGTERM to its group, SIGKILL after a grace period); False when it was gone."""
        ...


def wait_health(launcher: Launcher, u: Unit) -> None:
    """Wait until u's health answers. Each pass asks health first, then, when a probe is due (see
    Launcher.probe_after_s, probe_every_s), whether the process still runs: a process that ended fails the wait
    with its log's last line (the case's secrets masked); when time runs out the process is stopped."""
    start = time.monotonic()
    deadline = start + u.health_timeout_s
    next_probe = start + launcher.probe_after_s
    with HealthWait(u.health_url) as health:
        while time.monotonic() < deadline:
            if health.ok():
                return
            if time.monotonic() >= next_probe:
                ended = launcher.exit_status()
                if ended is not None:
                    tail = launcher.log_tail().strip().splitlines()[-1:] or [""]
                    # the engine's own log line: outside text, the values of the case's secrets masked
                    raise PhaseFailed(
                        f"{u.label}{launcher.where} {ended} before health: {redact.mask(tail[0])}",
                        FailureClass.SERVICE,
                        f"read {launcher.shown_log}; fix the case's service and resume",
                    )
                next_probe = time.monotonic() + launcher.probe_every_s
            health.pause()
    launcher.kill()
    raise PhaseFailed(
        f"{u.label}{launcher.where} not healthy at {u.health_url} after {u.health_timeout_s}s",
        FailureClass.SERVICE,
        f"raise the health timeout or read {launcher.shown_log}",
    )


class _Started:
    """The process a launcher started (its ref), refused before spawn."""

    _ref: procs.ProcRef | None = None

    @property
    def ref(self) -> procs.ProcRef:
        if self._ref is None:
            raise RuntimeError("launcher: spawn() first")  # a programming error, never a case's
        return self._ref


class LocalLauncher(_Started):
    """A process on this host, started in a session of its own (its workers stop with it) in the workspace."""

    where = ""
    probe_after_s = 0.0
    probe_every_s = 0.0  # a local poll costs a syscall: on every pass

    def __init__(self, cwd: Path, label: str, log: Path) -> None:
        self.cwd, self.label, self.log = cwd, label, log
        self.shown_log = str(log)
        self._popen: subprocess.Popen[bytes] | None = None

    def spawn(self, argv: list[str], env: dict[str, str]) -> procs.ProcRef:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as lf:
            try:
                p = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=lf,
                    stderr=lf,
                    env=env,
                    cwd=self.cwd,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as e:
                raise PhaseFailed(
                    f"cannot start {self.label}: argv[0] {argv[0]!r}: {e}",
                    FailureClass.SERVICE,
                    "fix service.argv in a new case",
                ) from None
        self._popen = p
        self._ref = procs.ref(p.pid)
        return self._ref

    def exit_status(self) -> str | None:
        code = self._popen.poll() if self._popen is not None else None  # poll also reaps our exited child
        return None if code is None else f"exited with code {code}"

    def log_tail(self) -> str:
        try:
            return self.log.read_bytes()[-LOG_TAIL_BYTES:].decode(errors="replace")
        except OSError:
            return ""

    def cmdline(self) -> list[str] | None:
        return procs.cmdline(self.ref["pid"])

    def view(self, paths: list[str]) -> ProcView:
        return local_view(self.ref["pid"])  # declared files are looked up here by their own paths

    def kill(self) -> bool:
        return procs.terminate(self.ref)


class SshLauncher(_Started):
    """A process on ssh.host, started detached over SSH; its ref names that host (procs.alive says False for it)."""

    probe_after_s = 0.5
    probe_every_s = 1.0  # each probe is a remote exec (an SSH round trip and the login shell's rc files)

    def __init__(self, ssh: SSH, log: str) -> None:
        self.ssh, self.log = ssh, log
        self.rem = remote.Remote(ssh)
        self.where = f" on {ssh.host}"
        self.shown_log = f"{ssh.user}@{ssh.host}:{log}"

    def spawn(self, argv: list[str], env: dict[str, str]) -> procs.ProcRef:
        try:
            pid, started = self.rem.launch(argv, env, self.log)
        except remote.RemoteError as e:
            raise PhaseFailed(f"cannot start the service: {e.message}", FailureClass.SERVICE, e.fix) from None
        self._ref = {"pid": pid, "start_time": started, "host": self.ssh.host}
        return self._ref

    def exit_status(self) -> str | None:
        return None if self.rem.alive(self.ref) else "exited"  # no exit code over SSH: it was not our child

    def log_tail(self) -> str:
        return self.rem.tail(self.log, LOG_TAIL_BYTES)

    def cmdline(self) -> list[str] | None:
        return self.rem.cmdline(self.ref["pid"])

    def view(self, paths: list[str]) -> ProcView:
        return remote_view(self.rem, self.ref["pid"], paths)

    def kill(self) -> bool:
        return self.rem.terminate(self.ref)
