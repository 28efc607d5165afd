"""What the controller sees while a local load client runs: the host's CPU, sampled to load/host.jsonl (an
external service's process found on this host counted as the service's, with its children), the
service host's accelerators (load/accel.jsonl, run/accel/sampling.py), a client whose process is stopped (recorded as
events, and as the load evidence's client_stopped_s), and a local service stopped long enough that the load is
ended early."""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import orjson

from caseledger import procs
from caseledger.case.phases import Phase
from caseledger.case.service import SSH
from caseledger.ledger import event_types as et
from caseledger.ledger.evidence import ServiceRecord
from caseledger.ledger.runs import Run
from caseledger.procs import LoadRef
from caseledger.run.accel import sampling as accel
from caseledger.run.accel.remote import RemoteAccel
from caseledger.services.identity import units
from caseledger.services.kinds import adapter_of
from caseledger.services.live import read_state, remote_of

STALL_EVENT_S = 1.0  # a load client stopped this long is recorded as an event (status shows it at once)
# A local service stopped (SIGSTOP) this long under a formal load: its requests can only wait out their timeouts
# (N/C of them in turn, for hours at an engine's usual timeout_s), so the controller ends the load; it fails
# [service] and resume replaces the service and sends the load again as a new attempt.
SERVICE_STOPPED_S = 5.0
HOST_SAMPLE_S = 0.5
# Before the formal load, wait up to this many seconds for the host to be quiet (other processes at most
# measurement.evidence.max_other_cpu_share of its CPU over QUIET_SPAN_S); unset or 0: no wait. The wait and what it
# saw are recorded (event host_quiet_wait); a host still busy then is measured, and its window judged, as ever.
QUIET_WAIT_ENV = "CASELEDGER_QUIET_WAIT_S"
QUIET_SPAN_S = 2.0


class LoadWatch:
    """What the controller sees while the local load client runs: the host's CPU every 0.5 s (load/host.jsonl:
    other processes' share, the client's own, steal, load average) and a client whose process is stopped."""

    def __init__(
        self,
        run: Run,
        client: LoadRef | None,
        event: et.Emit,
        more: list[LoadRef] | None = None,  # the other client processes of a shared load
        runner: accel.Runner = accel.run_command,  # runs the accelerator vendor's tool (tests: recorded output)
    ) -> None:
        self.paths, self.client, self.event = run.paths, client, event
        self.more = more or []  # the other client processes of a shared load: their CPU is the measurement's
        self.sampler = procs.CpuSampler(procs.caseledger_pids(run.workspace.root), service_trees(run))
        self.sessions = _our_sessions(run, client, self.more)
        self.next_sample = 0.0
        self.stopped_since: float | None = None  # when the client was first seen stopped (this stop)
        self.recorded = False  # this stop was recorded as an event
        self.stops: list[float] = []  # seconds of each recorded stop (the load evidence's client_stopped_s)
        self.fd = os.open(self.paths.load_host, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.accel_fd = os.open(self.paths.load_accel, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        # the service host's devices, in this thread: the tool runs after the formal load began, never before it
        devices = _accel_sampler(run, self.sessions, self.sampler.own_pids, runner)
        self.accel = accel.AccelWatch(devices, self._write_accel)
        # each SSH host of the service: its devices read there by a thread of its own, over one connection
        self.remote_accel = [RemoteAccel(ssh, pids, self._write_accel) for ssh, pids in _remote_services(run)]
        for r in self.remote_accel:
            r.start()
        self.services = _local_services(run)
        self.service_stopped_since: float | None = None  # when a service process was first seen stopped
        self.ended_early = False  # the clients were told to end because of it

    def tick(self) -> None:
        now = time.monotonic()
        if now >= self.next_sample:
            self.next_sample = now + HOST_SAMPLE_S
            sample = self.sampler.sample(self.sessions, int(self.client["pid"]) if self.client else None)
            if sample is not None:
                with contextlib.suppress(OSError):  # evidence about the host, never a reason to stop the load
                    os.write(self.fd, orjson.dumps(sample) + b"\n")
        self.accel.tick(now)
        self._end_if_service_stopped()
        if procs.stopped(self.client) or any(procs.stopped(c) for c in self.more):
            self.stopped_since = now if self.stopped_since is None else self.stopped_since
            if not self.recorded and now - self.stopped_since >= STALL_EVENT_S:
                self.recorded = True
                pid = self.client["pid"] if self.client else None
                self.event(et.LoadClientStopped(phase=Phase.LOAD, data=et.LoadClientStoppedData(pid=pid)))
        elif self.stopped_since is not None:
            if self.recorded:
                self.stops.append(round(now - self.stopped_since, 3))
                self.event(
                    et.LoadClientContinued(phase=Phase.LOAD, data=et.LoadClientContinuedData(stopped_s=self.stops[-1]))
                )
            self.stopped_since, self.recorded = None, False

    def _write_accel(self, line: accel.AccelSample) -> None:
        with contextlib.suppress(OSError):  # evidence about the devices, never a reason to stop the load
            os.write(self.accel_fd, orjson.dumps(line) + b"\n")

    def _end_if_service_stopped(self) -> None:
        """A local service process stopped for SERVICE_STOPPED_S or longer: the clients are told to end (SIGTERM:
        each records what is in flight and writes its end file, judged as any other), once, with an event."""
        if self.ended_early:
            return
        now = time.monotonic()
        held = [ref for ref in self.services if procs.stopped(ref)]
        if not held:
            self.service_stopped_since = None
            return
        self.service_stopped_since = self.service_stopped_since or now
        if now - self.service_stopped_since < SERVICE_STOPPED_S:
            return
        self.ended_early = True
        pids = ", ".join(str(ref["pid"]) for ref in held)
        why = f"the service (pid {pids}) has been stopped (SIGSTOP) for {now - self.service_stopped_since:.0f} s"
        self.event(et.LoadEndedEarly(phase=Phase.LOAD, data=et.WhyData(why=why)))
        for ref in [self.client, *self.more]:  # (one that ran in the caller's process is gone: nothing to end)
            if ref is not None:
                procs.terminate(ref, grace_s=5.0)

    def close(self) -> None:
        for r in self.remote_accel:
            r.close()
        os.close(self.fd)
        os.close(self.accel_fd)


def _accel_sampler(
    run: Run, sessions: set[int], own: set[int], runner: accel.Runner
) -> accel.AccelSampler | accel.AccelSample | None:
    """The sampler of this host's accelerators, the one line saying why they are not sampled, or None when every
    process of the service runs on another host (each read there: _remote_services)."""
    rec = ServiceRecord.read(run.paths.phase_file(Phase.SERVICE))
    why = accel_not_sampled(adapter_of(run.case).launched, rec)
    if why is not None:
        return accel.AccelSample(mono_ns=time.monotonic_ns(), tool=None, reason=why)
    if rec is not None and rec.processes and all(p.host for p in rec.processes):
        return None
    return accel.AccelSampler(accel.in_sessions(sessions, own), runner)


def accel_not_sampled(launched: bool, rec: ServiceRecord | None) -> str | None:
    """Why the controller does not sample the service's accelerators, or None: the devices of the hosts it
    started the service on are read (this host's directly, another's over SSH); an external service's host is
    not known, so it is NOT_OBSERVED."""
    if not launched:
        return "an external service: its host is not known to caseledger"
    return None


def _remote_services(run: Run) -> list[tuple[SSH, list[int]]]:
    """Each SSH host the service runs on, with the pids caseledger started there (the service's sessions)."""
    if not adapter_of(run.case).launched:
        return []
    hosts: dict[tuple[str, int, str], tuple[SSH, list[int]]] = {}
    for u in units(run.case):
        st = read_state(run.workspace, u.key(run.meta.target_key or ""))
        proc = st.get("proc")
        if u.ssh is not None and proc is not None and remote_of(st) is not None:
            hosts.setdefault((u.ssh.host, u.ssh.port, u.ssh.user), (u.ssh, []))[1].append(int(proc["pid"]))
    return list(hosts.values())


def _local_services(run: Run) -> list[dict[str, Any]]:  # JSON: the services' recorded process refs
    """The process refs of this run's local service units (a remote one is not ours to read in /proc)."""
    if not adapter_of(run.case).launched:
        return []
    out = []
    for u in units(run.case):
        st = read_state(run.workspace, u.key(run.meta.target_key or ""))
        proc = st.get("proc")
        if proc is not None and remote_of(st) is None:
            out.append(dict(proc))
    return out


def _our_sessions(run: Run, client: LoadRef | None, more: list[LoadRef] | None = None) -> set[int]:
    """Sessions whose CPU is the measurement's own: the load clients', the service processes' and this
    controller's (each is started in a session of its own, so an engine's workers count with it)."""
    pids = [os.getpid(), *([int(client["pid"])] if client else []), *(int(c["pid"]) for c in more or [])]
    rec = ServiceRecord.read(run.paths.phase_file(Phase.SERVICE))
    pids += [c.pid for c in rec.processes if c.pid is not None] if rec is not None else []
    out = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            out.add(os.getsid(pid))
    return out


def service_trees(run: Run) -> set[tuple[int, int]]:
    """(pid, start time) of an external service's processes found on this host (the service phase's listeners):
    counted as the service's with all their children, never as other processes."""
    rec = ServiceRecord.read(run.paths.phase_file(Phase.SERVICE))
    return {(x.pid, x.start_time) for x in (rec.listeners or [])} if rec is not None else set()


def wait_quiet(run: Run, event: et.Emit) -> None:
    """Before a local formal load: wait, bounded by QUIET_WAIT_ENV, until other processes used at most
    max_other_cpu_share of the host over QUIET_SPAN_S; recorded with the share and the processes that took it."""
    raw = os.environ.get(QUIET_WAIT_ENV)
    bound = float(raw) if raw else 0.0  # checked at start_run (run/admission/envcheck.py)
    if bound <= 0 or run.case.load.host is not None or run.case.load.hosts:
        return  # no wait asked, or the load runs on another host (its CPU is sampled there)
    limit = run.case.measurement.evidence.max_other_cpu_share
    sampler = procs.CpuSampler(procs.caseledger_pids(run.workspace.root), service_trees(run))
    sessions = _our_sessions(run, None)
    sampler.sample(sessions, None)
    start = time.monotonic()
    recent: list[procs.CpuSample] = []
    need = int(QUIET_SPAN_S / HOST_SAMPLE_S)
    share, quiet = 0.0, False
    while True:
        time.sleep(HOST_SAMPLE_S)
        x = sampler.sample(sessions, None)
        if x is not None:
            recent = [*recent, x][-need:]
        if len(recent) >= need:
            share = procs.others_of(recent)[0]
            quiet = share <= limit
        if quiet or time.monotonic() - start >= bound:
            break
    top = procs.others_of(recent)[1]
    waited = et.HostQuietWaitData(
        waited_s=round(time.monotonic() - start, 2), quiet=quiet, other_share=round(share, 3), top=top
    )
    event(et.HostQuietWait(phase=Phase.LOAD, data=waited))
