"""Accelerator samples on the service host through the vendor's tool: per device utilisation, memory, power, clock
and the processes on it (load/accel.jsonl, one line per sample).

The tool is run through a `Runner` (argv -> stdout, None when it failed), one or two calls a sample, so tests drive
the parsing with recorded outputs. nvidia-smi is read in query mode (CSV), rocm-smi (AMD) in JSON plus its
--showpidgpus lines (which device each KFD process is on), npu-smi (Huawei Ascend) from the table of `npu-smi info`.
A figure the tool does not give is None, never a zero; a tool whose output holds no device caseledger can read is a
line with the reason, naming the tool.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from typing_extensions import TypedDict

TOOLS = ("nvidia-smi", "rocm-smi", "npu-smi")
NVIDIA_GPUS = [
    "nvidia-smi",
    "--query-gpu=index,uuid,utilization.gpu,memory.used,memory.total,power.draw,clocks.sm",
    "--format=csv,noheader,nounits",
]
NVIDIA_APPS = ["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"]
# rocm_smi_lib python_smi_tools/rocm_smi.py: --json prints one object, "card<N>" -> {"<metric>": "<value>"} (formatJson
# via printLog) and "system" -> {"PID<pid>": "<name>, <gpu count>, <vram B>, <sdma>, <cu occupancy>"} (showPids via
# print2DArray/printSysLog); --showpidgpus prints nothing under --json (printListLog), hence its own plain call
# (showGpusByPid: "PID <pid> is using <n> DRM device(s):" then the device indices).
ROCM_DEVICES = [
    "rocm-smi",
    "--showuniqueid",
    "--showuse",
    "--showmeminfo",
    "vram",
    "--showpower",
    "--showclocks",
    "--showpids",
    "--json",
]
ROCM_PID_GPUS = ["rocm-smi", "--showpidgpus"]
# hicann/driver src/custom/dev_prod/user/npucli/src/npu_info_print.c: print_total_info (310P: Memory-Usage) and
# print_total_info_with_HBM (910B, 910_93: HBM-Usage), two rows per chip, then the table of processes per chip.
NPU_INFO = ["npu-smi", "info"]
MIB = 1 << 20
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
    """One device at one sample; None: the tool reported no value ([N/A], [Not Supported], NA, -, a missing key)."""

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
    reason: str  # no devices: why (no tool, the tool failed, an output with no device caseledger reads)
    host: str  # the service host it was read on over SSH (unset: the controller's own host)


def run_command(argv: list[str]) -> str | None:
    """The Runner of a real host: argv list, never a shell string; None on a failure or a timeout."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False)
        if done.returncode == 0:
            return done.stdout
    return None


def _number(text: str | None) -> float | None:
    """A figure as the tool prints it: '87', '312.45'; '[N/A]', '[Not Supported]', 'N/A (Secondary die)', 'NA', '-',
    'unknown' and a missing one are None."""
    try:
        x = float(text.strip()) if text is not None else math.nan
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def _mib(text: str | None) -> float | None:
    """A size in bytes, in MiB; None when the tool gave none."""
    n = _number(text)
    return None if n is None else n / MIB


def _first(cell: str) -> float | None:
    """The first figure of a table cell ('92.0   38   0 / 0': 92.0)."""
    return _number(next(iter(cell.split()), None))


def _own_ids(devices: list[Device], prefix: str) -> None:
    """Keeps each device's uuid where the tool gave one no other device shares (a unique id, a PCI address), else
    names it `prefix` + its index: load/accel.jsonl keys devices by it."""
    ids = [d["uuid"] for d in devices]
    for d in devices:
        if d["uuid"] in ("", "N/A", "NA", "-") or ids.count(d["uuid"]) > 1:
            d["uuid"] = f"{prefix}{d['index']}"


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


def _rocm_card(index: str, values: dict[str, Any]) -> Device:  # JSON: rocm-smi's "<metric>": "<value>" of a card
    """One card of rocm-smi --json: 'GPU use (%)', 'VRAM Total [Used] Memory (B)', '<Average|Current Socket> Graphics
    Package Power (W)' (showPower), 'sclk clock speed:' '(<n>Mhz)' (showCurrentClocks under --json), 'Unique ID'."""
    power = next((v for k, v in values.items() if k.endswith("Graphics Package Power (W)") and k[:3] != "Max"), None)
    sclk = re.search(r"([\d.]+)\s*mhz", str(values.get("sclk clock speed:", "")), re.IGNORECASE)
    return Device(
        index=index,
        uuid=str(values.get("Unique ID", "")),
        util_pct=_number(values.get("GPU use (%)")),
        mem_used_mib=_mib(values.get("VRAM Total Used Memory (B)")),
        mem_total_mib=_mib(values.get("VRAM Total Memory (B)")),
        power_w=_number(power),
        clock_mhz=None if sclk is None else float(sclk[1]),
        processes=[],
    )


def parse_rocm_pid_gpus(text: str) -> dict[int, list[str]]:
    """rocm-smi --showpidgpus: each KFD process's device indices ('PID 4121 is using 2 DRM device(s):' then '0 1 ',
    or one index a line); a process without its indices has none."""
    on: dict[int, list[str]] = {}
    pid, left = 0, 0
    for line in text.splitlines():
        head = re.match(r"PID (\d+) is using (\d+) DRM device", line.strip())
        words = line.split()
        if head:
            pid, left = int(head[1]), int(head[2])
            on[pid] = []
        elif left > 0 and words and all(w.isdigit() for w in words):
            on[pid] += words[:left]
            left -= len(words[:left])
        else:
            left = 0
    return on


def parse_rocm(cards: str, pid_gpus: str, ours: Callable[[int], bool]) -> list[Device]:
    """The devices in rocm-smi's JSON (ROCM_DEVICES) with the KFD processes of ROCM_PID_GPUS on them. A process's
    VRAM is rocm-smi's sum over its devices: given on a device only when it uses that one alone."""
    try:
        data, _ = json.JSONDecoder().raw_decode(cards, max(cards.find("{"), 0))
    except ValueError:
        return []  # not rocm-smi's JSON: no device
    if not isinstance(data, dict):
        return []
    keys = [k for k, v in data.items() if re.fullmatch(r"card\d+", k) and isinstance(v, dict)]
    devices = [_rocm_card(k[4:], data[k]) for k in sorted(keys, key=lambda k: int(k[4:]))]
    _own_ids(devices, "card")
    by_index = {d["index"]: d for d in devices}
    system = data.get("system")
    pids = system.items() if isinstance(system, dict) else []
    held = {k[3:]: str(v).split(", ") for k, v in pids if k.startswith("PID")}
    for pid, indices in parse_rocm_pid_gpus(pid_gpus).items():
        on = [by_index[i] for i in indices if i in by_index]
        fields = held.get(str(pid), [])  # name, gpu count, vram B, sdma, cu occupancy: vram is third from the end
        vram = _mib(fields[-3]) if len(fields) >= 4 and len(on) == 1 else None
        for d in on:
            d["processes"].append(DeviceProcess(pid=pid, mem_mib=vram, ours=ours(pid)))
    return devices


def _cells(line: str) -> list[str]:
    """The cells of a table row '| a | b |'; none for a rule or any other line."""
    row = line.strip()
    return [c.strip() for c in row.strip("|").split("|")] if row.startswith("|") else []


def _npu_chips(lines: list[str]) -> list[tuple[str, str, list[str], list[str]]]:
    """The chips in npu-smi info's device table: (NPU id, chip, its 'NPU Name' row, its 'Chip' row). The 'Chip' row
    is '<chip> [<Phy-ID|Device>]', or empty where the NPU is the chip (npu-smi v2)."""
    chips: list[tuple[str, str, list[str], list[str]]] = []
    first: list[str] = []
    for line in lines:
        cells = _cells(line)
        if len(cells) < 3:
            continue  # a rule, the version line
        words = " ".join(cells[:-2]).split()
        if words and words[0].isdigit() and not all(w.isdigit() for w in words):
            first = cells  # '<NPU id> <name> | <health> | <power> <temp> <hugepages>'
        elif first and all(w.isdigit() for w in words):
            chips.append((first[0].split()[0], words[0] if words else "0", first, cells))
            first = []
    return chips


def parse_npu(info: str, ours: Callable[[int], bool]) -> list[Device]:
    """The chips of `npu-smi info` (NPU_INFO) with the processes on each. Power and AICore(%) are the first figure of
    their cells ('NA' on a 310P, '-' on a 910_93's second die: None); memory is the row's last used/total pair in MB:
    HBM-Usage where the chip has HBM, Memory-Usage where it has not. No clock in this table: None."""
    lines = info.splitlines()
    at = next((i for i, line in enumerate(lines) if "Process id" in line), len(lines))
    chips = _npu_chips(lines[:at])
    per_npu = [npu for npu, *_ in chips]
    devices: list[Device] = []
    by_chip: dict[tuple[str, str], Device] = {}
    for npu, chip, first, second in chips:
        pairs = re.findall(r"([\w.]+)\s*/\s*([\w.]+)", second[-1])
        used, total = pairs[-1] if pairs else (None, None)
        by_chip[npu, chip] = Device(
            index=npu if per_npu.count(npu) == 1 else f"{npu}.{chip}",
            uuid=second[-2],  # Bus-Id
            util_pct=_first(second[-1]),
            mem_used_mib=_number(used),
            mem_total_mib=_number(total),
            power_w=_first(first[-1]),
            clock_mhz=None,
            processes=[],
        )
        devices.append(by_chip[npu, chip])
    _own_ids(devices, "npu")
    for line in lines[at + 1 :]:
        cells = _cells(line)  # '<NPU> [<chip>] | <pid> | <name> | <memory MB>'
        words = cells[0].split() if len(cells) >= 4 and cells[1].isdigit() else []
        on = by_chip.get((words[0], words[1] if len(words) > 1 else "0")) if words else None
        if on is not None:
            pid = int(cells[1])
            on["processes"].append(DeviceProcess(pid=pid, mem_mib=_number(cells[3]), ours=ours(pid)))
    return devices


@dataclass(frozen=True)
class ToolRead:
    """How one vendor tool is read for a sample: its calls in order, each with what a failure of it names, and the
    parser of their outputs (in that order, then ours)."""

    calls: tuple[tuple[str, list[str]], ...]
    parse: Callable[..., list[Device]]

    def read(self, tool: str, run: Runner, ours: Callable[[int], bool]) -> list[Device] | str:
        """Its devices, or why there are none (the first call that failed)."""
        outs: list[str] = []
        for what, argv in self.calls:
            out = run(argv)
            if out is None:
                return f"{tool} {what} failed or timed out"
            outs.append(out)
        return self.parse(*outs, ours)


TOOL_READS: dict[str, ToolRead] = {
    "nvidia-smi": ToolRead((("--query-gpu", NVIDIA_GPUS), ("--query-compute-apps", NVIDIA_APPS)), parse_nvidia),
    "rocm-smi": ToolRead((("--json", ROCM_DEVICES), ("--showpidgpus", ROCM_PID_GPUS)), parse_rocm),
    "npu-smi": ToolRead((("info", NPU_INFO),), parse_npu),
}
CALLS = {tool: tuple(argv for _, argv in r.calls) for tool, r in TOOL_READS.items()}  # a sample's argv per tool


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
        self.reads = self.tool is not None  # each of TOOLS is read

    def sample(self) -> AccelSample:
        """One sample now: the devices, or why there are none."""
        if self.tool is None:
            return AccelSample(
                mono_ns=time.monotonic_ns(), tool=None, reason="no nvidia-smi, rocm-smi or npu-smi on the service host"
            )
        got = TOOL_READS[self.tool].read(self.tool, self.runner, self.ours)
        now = time.monotonic_ns()
        if isinstance(got, str):
            return AccelSample(mono_ns=now, tool=self.tool, reason=got)
        if not got:
            why = f"{self.tool} answered but its output holds no device caseledger can read (an unknown format)"
            return AccelSample(mono_ns=now, tool=self.tool, reason=why)
        return AccelSample(mono_ns=now, tool=self.tool, devices=got)


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
    its reason and the next one tries again, up to MAX_FAILED_IN_A_ROW (an output caseledger cannot read counts as
    one); a host without a vendor tool (or a service it does not sample: `source` is that line) is written once,
    with why, and never asked again."""

    def __init__(self, source: AccelSampler | AccelSample | None, write: Callable[[AccelSample], None]) -> None:
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
