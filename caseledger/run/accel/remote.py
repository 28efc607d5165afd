"""Accelerator samples on a service host reached over SSH: a thread holds one connection for the whole load and
runs one script a sample (every call of the host's vendor tool and the host's pid -> session table), parsed by
the local host's readers (run/accel/sampling.py). The controller's watch never waits on the network.

A process on a device is the service's when it runs in the session of a service process caseledger started there
(each is started in a session of its own: setsid). Every device and reason names the host ('gpu-7:0').
"""

from __future__ import annotations

import contextlib
import shlex
import threading
import time
from collections.abc import Callable

import anyio

from caseledger.case.service import SSH
from caseledger.errors import RemoteError
from caseledger.run.accel import sampling as accel
from caseledger.services import remote

FIND = "for t in " + " ".join(accel.TOOLS) + ' ; do command -v "$t" >/dev/null 2>&1 && { echo "$t"; exit 0; }; done'
OUT, RC, PS = "@@caseledger-out", "@@caseledger-rc", "@@caseledger-ps"
STOP_POLL_S = 0.1  # how soon the thread sees close() between samples


def sample_script(calls: tuple[list[str], ...]) -> str:
    """One sample's script: each call (under `timeout` where the host has it) between marks with its exit status,
    then `ps -eo pid=,sid=`. Built from constant text and shlex-quoted argv only."""
    lines = [f'T=""; command -v timeout >/dev/null 2>&1 && T="timeout {accel.TOOL_TIMEOUT_S:g}"']
    for i, argv in enumerate(calls):
        lines.append(f"echo {OUT} {i}; $T {shlex.join(argv)} 2>/dev/null; r=$?; echo; echo {RC} {i} $r")
    lines.append(f"echo {PS}; ps -eo pid=,sid= 2>/dev/null; exit 0")
    return "\n".join(lines)


def parse_sample(text: str, calls: tuple[list[str], ...]) -> tuple[dict[tuple[str, ...], str], dict[int, int]]:
    """(each call's stdout by argv, for the calls that exited 0; pid -> session id of the host's processes)."""
    outs: dict[tuple[str, ...], str] = {}
    sids: dict[int, int] = {}
    body: list[str] = []
    in_ps = False
    for line in text.splitlines():
        words = line.split()
        if words[:1] == [OUT]:
            body, in_ps = [], False
        elif words[:1] == [RC] and len(words) == 3 and words[1].isdigit() and int(words[1]) < len(calls):
            if words[2] == "0":
                outs[tuple(calls[int(words[1])])] = "\n".join(body[:-1] if body[-1:] == [""] else body)
        elif words[:1] == [PS]:
            in_ps = True
        elif in_ps and len(words) == 2 and words[0].isdigit() and words[1].isdigit():
            sids[int(words[0])] = int(words[1])
        else:
            body.append(line)
    return outs, sids


def _answers(outs: dict[tuple[str, ...], str]) -> accel.Runner:
    """A runner that answers each call with what the sample's script printed for it (None: it failed)."""
    return lambda argv: outs.get(tuple(argv))


def _in_sessions(sids: dict[int, int], service_pids: list[int]) -> Callable[[int], bool]:
    """ours(pid) on that host: the pid runs in the session of one of the service's processes."""
    theirs = {sids.get(p, p) for p in service_pids}
    return lambda pid: sids.get(pid) in theirs


def on_host(line: accel.AccelSample, host: str) -> accel.AccelSample:
    """The line with its host: in each device's index and uuid (two hosts' 'card0' stay apart) and its reason."""
    out = accel.AccelSample(**line, host=host)
    if "reason" in out:
        out["reason"] = f"{host}: {out['reason']}"
    for d in out.get("devices", []):
        d["index"], d["uuid"] = f"{host}:{d['index']}", f"{host}:{d['uuid']}"
    return out


class RemoteAccel:
    """Samples one SSH host's accelerators every accel.SAMPLE_S until close(), each line handed to `write`; the
    service's processes there are `service_pids` (session leaders)."""

    def __init__(self, ssh: SSH, service_pids: list[int], write: Callable[[accel.AccelSample], None]) -> None:
        self.ssh, self.service_pids, self.to_file = ssh, service_pids, write
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"accel {ssh.host}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self, timeout_s: float = accel.TOOL_TIMEOUT_S * 3 + remote.CONNECT_TIMEOUT_S) -> None:
        self.stopping.set()
        self.thread.join(timeout_s)

    def _run(self) -> None:
        try:
            anyio.run(self._main)
        except RemoteError as e:
            self._say(f"not sampled: {e.message}")
        except Exception as e:  # the devices are evidence, never a reason to stop the load
            self._say(f"not sampled: ssh broke: {type(e).__name__}: {e}")

    def write(self, line: accel.AccelSample) -> None:
        self.to_file(on_host(line, self.ssh.host))

    def _say(self, reason: str) -> None:
        with contextlib.suppress(OSError):
            self.write(accel.AccelSample(mono_ns=time.monotonic_ns(), tool=None, reason=reason))

    async def _main(self) -> None:
        async with remote.connect(self.ssh) as conn:
            _, found = await remote.run_script(conn, FIND)
            tool = found.decode(errors="replace").strip() or None
            sampler = accel.AccelSampler(lambda pid: False, lambda argv: None, lambda t: t if t == tool else None)
            watch = accel.AccelWatch(sampler, self.write)
            calls = accel.CALLS.get(tool or "", ())
            while not self.stopping.is_set() and watch.source is not None:
                started = time.monotonic()
                if calls:
                    with anyio.fail_after(accel.TOOL_TIMEOUT_S * len(calls) + remote.CONNECT_TIMEOUT_S):
                        _, out = await remote.run_script(conn, sample_script(calls))
                    outs, sids = parse_sample(out.decode(errors="replace"), calls)
                    sampler.runner, sampler.ours = _answers(outs), _in_sessions(sids, self.service_pids)
                watch.next_at = 0.0  # this loop paces the samples
                watch.tick(time.monotonic())
                while not self.stopping.is_set() and time.monotonic() - started < accel.SAMPLE_S:
                    await anyio.sleep(STOP_POLL_S)
