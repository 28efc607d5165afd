"""Accelerator samples on the service host through the vendor's tool: per device utilisation, memory, power, clock
and the processes on it (load/accel.jsonl, one line per sample).

The tool is run through a `Runner` (argv -> stdout, None when it failed), so tests drive the parsing with recorded
outputs. nvidia-smi is read in query mode; rocm-smi and npu-smi are recognised but not read yet: a host that has
only them records NOT_OBSERVED naming the tool, never a zero.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable

from typing_extensions import TypedDict

TOOLS = ("nvidia-smi", "rocm-smi", "npu-smi")
NVIDIA_GPUS = [
    "nvidia-smi",
    "--query-gpu=index,uuid,utilization.gpu,memory.used,memory.total,power.draw,clocks.sm",
    "--format=csv,noheader,nounits",
]
NVIDIA_APPS = ["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"]
SAMPLE_S = 1.0  # the tool takes tens of ms to seconds per call: a slower cadence than the CPU's /proc reads
TOOL_TIMEOUT_S = 2.0  # a hung driver call must not hold the controller's watch for long
# failed calls in a row after which the tool is not asked again during this load: a hung driver would otherwise
# hold the watch (the client's stops, a stopped service) for 2 x TOOL_TIMEOUT_S every SAMPLE_S
MAX_FAILED_IN_A_ROW = 3

Runner = Callable[[list[str]], str | None]
"""Runs a command and returns its stdout, or None when it could not run or exited non-zero."""


class DeviceProcess(TypedDict):
    """A process on a device: its pid, the device memory it holds (MiB), whether it is the measurement's own
    (the service's sessions, caseledger's processes) as seen at the sample."""

    pid: int
    mem_mib: float | None
    ours: bool


class Device(TypedDict):
    """One device at one sample; None: the tool reported no value ([N/A], [Not Supported])."""

    index: str
    uuid: str
    util_pct: float | None
    mem_used_mib: float | None
    mem_total_mib: float | None
    power_w: float | None
    clock_mhz: float | None
    processes: list[DeviceProcess]


class AccelSample(TypedDict, total=False):
    """One line of load/accel.jsonl: the devices at mono_ns, or why there are none (`reason`)."""

    mono_ns: int  # time.monotonic_ns() when the tool answered (the load client's clock on the same host)
    tool: str | None  # the vendor tool read; None: none on the host
    devices: list[Device]
    reason: str  # no devices: why (no tool, a tool not read, the tool failed)


def run_command(argv: list[str]) -> str | None:
    """The Runner of a real host: argv list, never a shell string; None on a failure or a timeout."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False)
        if done.returncode == 0:
            return done.stdout
    return None


def _number(text: str) -> float | None:
    """A csv cell with nounits: '87', '312.45'; '[N/A]', '[Not Supported]' and the like are None."""
    try:
        return float(text.strip())
    except ValueError:
        return None


def parse_nvidia(gpus: str, apps: str, ours: Callable[[int], bool]) -> list[Device]:
    """The devices in nvidia-smi's query output (NVIDIA_GPUS) with the processes of NVIDIA_APPS on them."""
    devices: list[Device] = []
    for line in gpus.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 7:
            continue  # a warning or a blank line, not a device row
        devices.append(
            Device(
                index=cells[0],
                uuid=cells[1],
                util_pct=_number(cells[2]),
                mem_used_mib=_number(cells[3]),
                mem_total_mib=_number(cells[4]),
                power_w=_number(cells[5]),
                clock_mhz=_number(cells[6]),
                processes=[],
            )
        )
    by_uuid = {d["uuid"]: d for d in devices}
    for line in apps.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 3 or cells[0] not in by_uuid or not cells[1].isdigit():
            continue  # 'No running processes found', or a process on a device not listed
        pid = int(cells[1])
        by_uuid[cells[0]]["processes"].append(DeviceProcess(pid=pid, mem_mib=_number(cells[2]), ours=ours(pid)))
    return devices


class AccelSampler:
    """The service host's accelerators through the first vendor tool found on PATH (`which`), read by `runner`;
    `ours(pid)` says whether a process on a device is the measurement's own."""

    def __init__(
        self,
        ours: Callable[[int], bool],
        runner: Runner = run_command,
        which: Callable[[str], str | None] = shutil.which,
    ) -> None:
        self.ours, self.runner = ours, runner
        self.tool = next((t for t in TOOLS if which(t) is not None), None)
        self.reads = self.tool == "nvidia-smi"  # the one tool whose output is parsed

    def sample(self) -> AccelSample:
        """One sample now: the devices, or why there are none."""
        if self.tool is None:
            return AccelSample(
                mono_ns=time.monotonic_ns(), tool=None, reason="no nvidia-smi, rocm-smi or npu-smi on the service host"
            )
        if self.tool != "nvidia-smi":
            return AccelSample(
                mono_ns=time.monotonic_ns(),
                tool=self.tool,
                reason=f"{self.tool} is on the service host but caseledger reads only nvidia-smi's output so far",
            )
        gpus = self.runner(NVIDIA_GPUS)
        apps = self.runner(NVIDIA_APPS) if gpus is not None else None
        now = time.monotonic_ns()
        if gpus is None or apps is None:
            what = "--query-gpu" if gpus is None else "--query-compute-apps"
            return AccelSample(mono_ns=now, tool=self.tool, reason=f"nvidia-smi {what} failed or timed out")
        return AccelSample(mono_ns=now, tool=self.tool, devices=parse_nvidia(gpus, apps, self.ours))


def in_sessions(sessions: set[int], own_pids: set[int]) -> Callable[[int], bool]:
    """ours(pid) for a local host: the pid is one of own_pids or runs in one of the sessions (an engine's workers
    are in its session). A pid not seen in this host's /proc (gone, another PID namespace) is not ours."""

    def ours(pid: int) -> bool:
        if pid in own_pids:
            return True
        try:
            return os.getsid(pid) in sessions
        except OSError:
            return False

    return ours


class AccelWatch:
    """Samples at most every SAMPLE_S, each line handed to `write` (load/accel.jsonl): a failed call is a line with
    its reason and the next one tries again, up to MAX_FAILED_IN_A_ROW; a host without a tool caseledger reads (or
    a service it does not sample: `source` is that line) is written once, with why, and never asked again."""

    def __init__(self, source: AccelSampler | AccelSample, write: Callable[[AccelSample], None]) -> None:
        self.source: AccelSampler | AccelSample | None = source
        self.write = write
        self.next_at = 0.0
        self.failed = 0  # failed calls in a row

    def tick(self, now: float) -> None:
        src = self.source
        if src is None or now < self.next_at:
            return
        self.next_at = now + SAMPLE_S
        if not isinstance(src, AccelSampler) or not src.reads:
            self.source = None  # the reason holds for the whole load: said once
            self.write(src.sample() if isinstance(src, AccelSampler) else src)
            return
        line = src.sample()
        self.failed = 0 if "devices" in line else self.failed + 1
        if self.failed >= MAX_FAILED_IN_A_ROW:
            self.source = None
            line["reason"] += f" ({self.failed} times in a row: not asked again during this load)"
        self.write(line)
