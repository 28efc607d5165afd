"""Accelerator evidence: the vendor tool's output read per device (nvidia-smi, rocm-smi, npu-smi), a window's
devices, and a device the service shares with another process distorting the window.

The tool outputs in tests/data/accel/ are recorded formats (nvidia-smi's query mode, rocm-smi's --json and
--showpidgpus, the table of npu-smi info), laid out as the tools print them from their sources and published
outputs (tests/data/accel/README.md names each), not live: this host has no accelerator. The sampler runs the tool
through an injected runner that returns them.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from caseledger.case.model import Case
from caseledger.ledger.evidence import ServiceRecord
from caseledger.metrics import Accelerators, NotObserved, compute_result
from caseledger.metrics._accel import NOT_SAMPLED, accel_distortion, accel_window
from caseledger.outcome.figures import window_figures
from caseledger.outcome.flags import evidence_flags
from caseledger.records import RawRecord, read_jsonl
from caseledger.run.accel import sampling as accel
from caseledger.run.load.watch import accel_not_sampled
from caseledger.tools import freeze_case, start_run
from caseledger.workspace import Workspace, read_json
from tests.conftest import free_port, ref_draft
from tests.helpers import ACCEL_DATA

GPUS = (ACCEL_DATA / "nvidia-smi-query-gpu.csv").read_text()
APPS = (ACCEL_DATA / "nvidia-smi-query-compute-apps.csv").read_text()
SERVICE = {4121, 4187}  # the engine's workers in the recorded output; 4242 is another process
DEV1 = "GPU-b71e04d2-8c3a-4f5e-a6d9-7e8f9a0b1c2d"
ROCM = (ACCEL_DATA / "rocm-smi-json-mi300x.json").read_text()
ROCM_PIDS = (ACCEL_DATA / "rocm-smi-showpidgpus-mi300x.txt").read_text()
NPU_910B = (ACCEL_DATA / "npu-smi-info-910b.txt").read_text()
NPU_310P = (ACCEL_DATA / "npu-smi-info-310p.txt").read_text()
RECORDED = {  # each tool's calls for one sample, with what the tool printed
    "nvidia-smi": {tuple(accel.NVIDIA_GPUS): GPUS, tuple(accel.NVIDIA_APPS): APPS},
    "rocm-smi": {tuple(accel.ROCM_DEVICES): ROCM, tuple(accel.ROCM_PID_GPUS): ROCM_PIDS},
    "npu-smi": {tuple(accel.NPU_INFO): NPU_910B},
}


def _recorded(argv: list[str]) -> str | None:
    """A runner that answers nvidia-smi's two queries with the recorded outputs."""
    if argv == accel.NVIDIA_GPUS:
        return GPUS
    if argv == accel.NVIDIA_APPS:
        return APPS
    return None


def _nvidia_only(name: str) -> str | None:
    return "/usr/bin/nvidia-smi" if name == "nvidia-smi" else None


def _only(tool: str) -> Callable[[str], str | None]:
    """A PATH (the sampler's `which`) that has `tool` and no other vendor tool."""
    return lambda name: f"/usr/bin/{tool}" if name == tool else None


def _answers(outputs: dict[tuple[str, ...], str], calls: list[list[str]] | None = None) -> accel.Runner:
    """A runner that answers the calls in `outputs` (recording each in `calls`) and fails any other."""

    def run(argv: list[str]) -> str | None:
        if calls is not None:
            calls.append(argv)
        return outputs.get(tuple(argv))

    return run


def _samples(n: int, step_ns: int = 10**9) -> list[dict[str, Any]]:  # JSON: load/accel.jsonl lines
    s = accel.AccelSampler(lambda pid: pid in SERVICE, _recorded, _nvidia_only)
    return [{**s.sample(), "mono_ns": (k + 1) * step_ns} for k in range(n)]


def test_nvidia_smi_query_output_is_read_per_device_with_the_processes_on_each() -> None:
    devices = accel.parse_nvidia(GPUS, APPS, lambda pid: pid in SERVICE)
    assert [d["index"] for d in devices] == ["0", "1"]
    d0, d1 = devices
    assert (d0["util_pct"], d0["mem_used_mib"], d0["mem_total_mib"], d0["power_w"], d0["clock_mhz"]) == (
        98.0,
        76543.0,
        81920.0,
        387.12,
        1410.0,
    )
    assert d0["processes"] == [{"pid": 4121, "mem_mib": 75210.0, "ours": True}]
    assert d1["uuid"] == DEV1
    assert d1["processes"] == [
        {"pid": 4187, "mem_mib": 75210.0, "ours": True},
        {"pid": 4242, "mem_mib": 2048.0, "ours": False},
    ]


def test_a_value_the_tool_does_not_report_is_none_never_zero() -> None:
    (d,) = accel.parse_nvidia((ACCEL_DATA / "nvidia-smi-query-gpu-mig.csv").read_text(), "", lambda pid: False)
    assert d["util_pct"] is None and d["power_w"] is None
    assert d["mem_used_mib"] == 10240.0 and d["processes"] == []
    acc = accel_window([{"mono_ns": 5, "tool": "nvidia-smi", "devices": [d]}], 0, 10)
    assert isinstance(acc, Accelerators)
    assert acc.devices[0].util_pct_mean is None and "util ? mean" in acc.devices[0].text


def test_a_host_without_a_vendor_tool_records_not_observed_with_the_reason() -> None:
    line = accel.AccelSampler(lambda pid: True, _recorded, lambda name: None).sample()
    assert "devices" not in line and line["tool"] is None
    assert line["reason"] == "no nvidia-smi, rocm-smi or npu-smi on the service host"
    acc = accel_window([{**line, "mono_ns": 0}], 5, 10)  # said once, before the window: it holds for all of it
    assert isinstance(acc, NotObserved) and acc.reason == line["reason"]


def test_rocm_smi_json_is_read_per_card_with_the_kfd_processes_its_pid_list_puts_on_each() -> None:
    devices = accel.parse_rocm(ROCM, ROCM_PIDS, lambda pid: pid in SERVICE)
    assert [(d["index"], d["uuid"]) for d in devices] == [("0", "0x18a2c9f4d7e03b61"), ("1", "0x4c1f7e2a9b8d6053")]
    d0, d1 = devices
    assert (d0["util_pct"], d0["mem_used_mib"], d0["mem_total_mib"], d0["power_w"], d0["clock_mhz"]) == (
        97.0,
        181500.0,
        196592.0,
        698.0,
        2100.0,
    )
    assert d1["power_w"] == 642.0  # 'Current Socket Graphics Package Power (W)'
    assert d0["processes"] == [{"pid": 4121, "mem_mib": 175210.0, "ours": True}]
    assert d1["processes"] == [
        {"pid": 4187, "mem_mib": 175210.0, "ours": True},
        {"pid": 4242, "mem_mib": 2048.0, "ours": False},
    ]


def test_what_rocm_smi_does_not_report_is_none_and_a_process_on_two_cards_holds_no_known_memory_on_either() -> None:
    cards = (ACCEL_DATA / "rocm-smi-json-mi250x-na.json").read_text()
    pids = (ACCEL_DATA / "rocm-smi-showpidgpus-mi250x-na.txt").read_text()
    d0, d1 = accel.parse_rocm(cards, pids, lambda pid: True)
    assert (d0["uuid"], d1["uuid"]) == ("card0", "card1")  # 'Unique ID': 'N/A' on both
    assert d0["power_w"] == 212.0 and d0["util_pct"] == 64.0  # 'Average Graphics Package Power (W)'
    assert d1["power_w"] is None  # 'N/A (Secondary die)'
    assert d1["util_pct"] is None and d1["clock_mhz"] is None  # no 'GPU use (%)', no 'sclk clock speed:'
    assert d1["mem_used_mib"] == 40098.0
    # rocm-smi gives a process's VRAM summed over its cards ('unknown' here): on no one card is it known
    assert d0["processes"] == d1["processes"] == [{"pid": 5001, "mem_mib": None, "ours": True}]


def test_npu_smi_info_of_a_910b_is_read_per_npu_with_its_hbm_and_the_processes_on_each() -> None:
    d0, d1 = accel.parse_npu(NPU_910B, lambda pid: pid in SERVICE)
    assert [(d["index"], d["uuid"]) for d in (d0, d1)] == [("0", "0000:C1:00.0"), ("1", "0000:01:00.0")]
    assert (d1["util_pct"], d1["mem_used_mib"], d1["mem_total_mib"], d1["power_w"], d1["clock_mhz"]) == (
        91.0,
        64052.0,
        65536.0,
        371.5,
        None,  # npu-smi info has no clock
    )
    assert d0["processes"] == [{"pid": 4121, "mem_mib": 58600.0, "ours": True}]
    assert d1["processes"] == [
        {"pid": 4187, "mem_mib": 58600.0, "ours": True},
        {"pid": 4242, "mem_mib": 2048.0, "ours": False},
    ]


def test_npu_smi_info_of_a_310p_is_read_per_chip_with_its_memory_and_power_na_is_none() -> None:
    devices = accel.parse_npu(NPU_310P, lambda pid: pid in SERVICE)
    assert [d["index"] for d in devices] == ["8.0", "8.1", "9.0", "9.1"]  # two chips a card
    assert [d["uuid"] for d in devices] == ["npu8.0", "npu8.1", "npu9.0", "npu9.1"]  # the chips share a Bus-Id
    d = devices[1]
    assert (d["util_pct"], d["mem_used_mib"], d["mem_total_mib"], d["power_w"], d["clock_mhz"]) == (
        38.0,
        18774.0,
        43757.0,
        None,  # 'NA'
        None,
    )
    assert d["processes"] == [
        {"pid": 4187, "mem_mib": 15210.0, "ours": True},
        {"pid": 4242, "mem_mib": 2048.0, "ours": False},
    ]
    assert devices[2]["util_pct"] == 0.0 and devices[2]["processes"] == []  # a zero the tool printed stays one


def test_npu_smi_info_of_a_910_93_gives_no_power_for_its_second_die() -> None:
    d0, d1 = accel.parse_npu((ACCEL_DATA / "npu-smi-info-a3.txt").read_text(), lambda pid: True)
    assert [(d["index"], d["uuid"]) for d in (d0, d1)] == [("0.0", "0000:9D:00.0"), ("0.1", "0000:9F:00.0")]
    assert (d0["power_w"], d1["power_w"]) == (173.0, None)  # '-' on die 1
    assert (d1["util_pct"], d1["mem_used_mib"]) == (78.0, 61765.0)
    assert d0["processes"] == [] and d1["processes"] == [{"pid": 4121, "mem_mib": 58600.0, "ours": True}]


@pytest.mark.parametrize("tool", ["nvidia-smi", "rocm-smi", "npu-smi"])
def test_the_sampler_reads_the_tool_found_on_path_with_its_own_argv_through_the_runner(tool: str) -> None:
    calls: list[list[str]] = []
    s = accel.AccelSampler(lambda pid: pid in SERVICE, _answers(RECORDED[tool], calls), _only(tool))
    line = s.sample()
    assert s.reads and line["tool"] == tool and len(line["devices"]) == 2 and "reason" not in line
    assert [tuple(c) for c in calls] == list(RECORDED[tool])  # one or two calls, each an argv list
    assert all(isinstance(c, list) and c[0] == tool for c in calls)


@pytest.mark.parametrize(
    ("tool", "failing", "reason"),
    [
        ("rocm-smi", accel.ROCM_DEVICES, "rocm-smi --json failed or timed out"),
        ("rocm-smi", accel.ROCM_PID_GPUS, "rocm-smi --showpidgpus failed or timed out"),
        ("npu-smi", accel.NPU_INFO, "npu-smi info failed or timed out"),
    ],
)
def test_a_failed_rocm_smi_or_npu_smi_call_is_a_line_naming_the_call(
    tool: str, failing: list[str], reason: str
) -> None:
    outputs = {argv: out for argv, out in RECORDED[tool].items() if list(argv) != failing}
    line = accel.AccelSampler(lambda pid: True, _answers(outputs), _only(tool)).sample()
    assert "devices" not in line and line["tool"] == tool and line["reason"] == reason


@pytest.mark.parametrize("tool", ["rocm-smi", "npu-smi"])
def test_a_tool_found_whose_output_caseledger_cannot_read_is_named_not_zeroed(tool: str) -> None:
    unreadable = "Usage: an older build of this tool\n"
    s = accel.AccelSampler(lambda pid: True, lambda argv: unreadable, _only(tool))
    line = s.sample()
    assert s.reads and line["tool"] == tool and "devices" not in line
    assert line["reason"] == f"{tool} answered but its output holds no device caseledger can read (an unknown format)"
    acc = accel_window([{**line, "mono_ns": 0}], 5, 10)
    assert isinstance(acc, NotObserved) and acc.reason == line["reason"]
    lines: list[accel.AccelSample] = []
    w = accel.AccelWatch(s, lines.append)
    for now in range(10):
        w.tick(float(now))
    assert len(lines) == accel.MAX_FAILED_IN_A_ROW  # counted as failed calls: not asked again


@pytest.mark.parametrize(
    ("tool", "outputs", "shared", "uuid"),
    [
        ("rocm-smi", RECORDED["rocm-smi"], "1", "0x4c1f7e2a9b8d6053"),
        ("npu-smi", RECORDED["npu-smi"], "1", "0000:01:00.0"),
        ("npu-smi", {tuple(accel.NPU_INFO): NPU_310P}, "8.1", "npu8.1"),
    ],
)
def test_a_device_shared_with_another_process_distorts_the_window_whichever_tool_read_it(
    tool: str, outputs: dict[tuple[str, ...], str], shared: str, uuid: str
) -> None:
    s = accel.AccelSampler(lambda pid: pid in SERVICE, _answers(outputs), _only(tool))
    acc = accel_window([{**s.sample(), "mono_ns": k * 10**9} for k in (1, 2)], 0, 3 * 10**9)
    assert isinstance(acc, Accelerators) and acc.samples == 2 and acc.tool == tool
    (d,) = [d for d in acc.devices if d.others]
    assert (d.index, d.uuid, d.others) == (shared, uuid, ["pid 4242 2048 MiB"]) and d.used_by_service
    (why,) = accel_distortion(acc)
    assert why.startswith(f"device {shared} ({uuid}) was shared with another process during the window: pid 4242")


def test_a_failed_tool_call_is_a_line_with_its_reason_and_no_devices() -> None:
    s = accel.AccelSampler(lambda pid: True, lambda argv: None, _nvidia_only)
    line = s.sample()
    assert s.reads and "devices" not in line and line["reason"] == "nvidia-smi --query-gpu failed or timed out"


def test_a_window_has_each_devices_figures_and_a_device_shared_with_another_process_distorts_it() -> None:
    samples = _samples(4)  # at 1, 2, 3, 4 s
    acc = accel_window(samples, 2 * 10**9, 3 * 10**9)
    assert isinstance(acc, Accelerators) and acc.samples == 2 and acc.tool == "nvidia-smi"
    d1 = acc.devices[1]
    assert (d1.util_pct_mean, d1.mem_used_mib_max, d1.mem_total_mib, d1.power_w_max, d1.clock_mhz_mean) == (
        96.0,
        77890.0,
        81920.0,
        365.48,
        1410.0,
    )
    assert d1.processes == ["pid 4187 75210 MiB (service)", "pid 4242 2048 MiB (other)"]
    assert d1.others == ["pid 4242 2048 MiB"] and acc.devices[0].others == []
    (why,) = accel_distortion(acc)
    assert why.startswith(f"device 1 ({DEV1}) was shared with another process during the window: pid 4242 2048 MiB")
    assert accel_window(samples, 10 * 10**9, 11 * 10**9) == NotObserved(reason=NOT_SAMPLED)


def test_a_devices_figures_over_several_samples_are_means_and_peaks_and_the_most_memory_held() -> None:
    quieter = GPUS.replace(", 96, 77890,", ", 50, 70000,").replace("365.48", "165.48")
    outputs = iter([GPUS, APPS, quieter, APPS.replace("4242, 2048", "4242, 1024")])
    s = accel.AccelSampler(lambda pid: pid in SERVICE, lambda argv: next(outputs), _nvidia_only)
    acc = accel_window([{**s.sample(), "mono_ns": k} for k in (1, 2)], 0, 3)
    assert isinstance(acc, Accelerators)
    d1 = acc.devices[1]
    assert (d1.samples, d1.util_pct_mean, d1.util_pct_max, d1.mem_used_mib_max) == (2, 73.0, 96.0, 77890.0)
    assert d1.power_w_mean == pytest.approx(265.48) and d1.power_w_max == 365.48
    assert "pid 4242 2048 MiB (other)" in d1.processes  # the most it held, not the last


def test_a_device_the_service_does_not_use_is_not_judged() -> None:
    theirs = accel.AccelSampler(lambda pid: pid == 4121, _recorded, _nvidia_only).sample()  # device 1: not ours
    acc = accel_window([{**theirs, "mono_ns": 1}], 0, 2)
    assert isinstance(acc, Accelerators) and not acc.devices[1].used_by_service
    assert accel_distortion(acc) == []
    nobody = accel.AccelSampler(lambda pid: False, _recorded, _nvidia_only).sample()
    acc = accel_window([{**nobody, "mono_ns": 1}], 0, 2)
    assert isinstance(acc, Accelerators) and accel_distortion(acc) == []
    assert acc.note is not None and "no device is judged" in acc.note


def test_a_process_in_the_services_session_is_the_services() -> None:
    ours = accel.in_sessions({os.getsid(0)}, set())
    assert ours(os.getpid())
    assert not accel.in_sessions({-1}, set())(os.getpid())
    assert accel.in_sessions({-1}, {os.getpid()})(os.getpid())
    assert not ours(2**22 + 1)  # no such pid on this host


def _rec(i: int) -> RawRecord:
    t = i * 10**9
    return RawRecord(
        i=i,
        entry=i,
        route=0,
        send_ns=t,
        chunk_ns=[t + k * 10**8 for k in range(1, 5)],
        chunk_tokens=[None] * 4,
        end_ns=t + 5 * 10**8,
        status=200,
        ok=True,
        error=None,
        error_class=None,
        prompt_tokens=10,
        completion_tokens=4,
        cached_tokens=0,
        finish_reason="length",
        input_tokens_body=8,
        input_tokens_chat=10,
    )


def test_the_result_and_the_report_show_each_windows_devices_and_name_the_shared_device() -> None:
    case = Case.model_validate(
        {
            "scenario": "s",
            "target": {"endpoints": [{"base_url": "http://127.0.0.1:9/v1", "model": "m"}]},
            "dataset": {"source": "synthetic", "input_tokens": 8, "output_tokens": 4},
            "load": {"requests": 4, "concurrency": 1},
        }
    )
    r = compute_result(case, [_rec(i) for i in range(4)], accel=_samples(3))
    w = r.windows.whole
    assert isinstance(w.accelerators, Accelerators) and w.accelerators.samples == 3
    assert any("device 1" in d and "pid 4242 2048 MiB" in d for d in w.distorted), w.distorted
    flag = next(f for f in evidence_flags(r) if f.text.startswith("accelerators, whole window: nvidia-smi, 3 samples"))
    assert flag.warn  # a device shared with another process weakens the figures
    details = flag.details
    assert details[1].startswith("device 1: util 96% mean (96% max), memory 77890/81920 MiB, power 365 W")
    assert "pid 4242 2048 MiB (other)" in details[1]
    figs = window_figures(w)
    assert figs.accelerators == w.accelerators
    bare = compute_result(case, [_rec(i) for i in range(4)])
    assert isinstance(bare.windows.whole.accelerators, NotObserved)
    assert window_figures(bare.windows.whole).accelerators is None
    assert any(m.figures == ["accelerators"] for m in window_figures(bare.windows.whole).not_observed)
    said = [f.text for f in evidence_flags(bare) if f.text.startswith("accelerators")]
    assert said == [f"accelerators: NOT_OBSERVED ({NOT_SAMPLED})"]  # once for both windows


@pytest.fixture
def fake_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An `nvidia-smi` on PATH that prints the recorded outputs; the engine workers' pids become its caller's
    (the controller, the measurement's own), so pid 4242 is the one other process."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f'  --query-gpu=*) cat "{ACCEL_DATA}/nvidia-smi-query-gpu.csv" ;;\n'
        f'  --query-compute-apps=*) sed -e "s/, 4121,/, $PPID,/" -e "s/, 4187,/, $PPID,/" '
        f'"{ACCEL_DATA}/nvidia-smi-query-compute-apps.csv" ;;\n'
        "  *) exit 2 ;;\n"
        "esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return script


@pytest.mark.integration
@pytest.mark.processes  # sampled by a detached controller while its client loads (an inline client returns first)
def test_a_run_with_nvidia_smi_on_path_records_the_devices_and_is_distorted_by_the_shared_one(
    ws: Workspace, stop_services: None, fake_nvidia_smi: Path
) -> None:
    port = free_port()
    draft = ref_draft(
        port,
        service={
            "adapter": "reference",
            "reference": {"prefill_tokens_per_s": 200000, "decode_step_s": 0.05, "decode_step_per_seq_s": 0.0},
        },
        dataset={"source": "synthetic", "input_tokens": 64, "output_tokens": 16},
        load={"requests": 16, "concurrency": 4},
    )
    r = start_run(ws, freeze_case(ws, draft=draft).case_id, wait=True, timeout_s=120)
    assert r.run_id is not None
    lines = read_jsonl(ws.run(r.run_id).load_accel).items
    assert len(lines) >= 2 and all(x["tool"] == "nvidia-smi" and len(x["devices"]) == 2 for x in lines), lines
    report = ws.run(r.run_id).report_md.read_text()
    assert "accelerators, whole window: nvidia-smi" in report, report
    assert f"device 1 ({DEV1}) was shared with another process during the window: pid 4242 2048 MiB" in report
    d = read_json(ws.run(r.run_id).decision)
    assert d["outcome"] == "insufficient" and any("pid 4242" in m for m in d["missing"]), d


def test_an_external_service_is_not_sampled_and_says_why_and_a_started_one_is_on_its_hosts() -> None:
    assert accel_not_sampled(False, None) == "an external service: its host is not known to caseledger"
    # a service started over SSH is read on its host (run/accel/remote.py, tests/test_ssh.py), a local one here
    assert accel_not_sampled(True, ServiceRecord(outcome="done", pid=77, host="gpu-7")) is None
    assert accel_not_sampled(True, ServiceRecord(outcome="done", pid=77)) is None
    assert accel_not_sampled(True, None) is None


@pytest.mark.integration  # the sample script run by a real sh, as a service host's login shell runs it
def test_one_script_a_sample_gives_each_calls_output_and_the_hosts_sessions(
    tmp_path: Path, fake_nvidia_smi: Path
) -> None:
    """The remote sample's script run by sh with the recorded nvidia-smi on PATH: each call's output by its argv,
    a call that fails is left out (its reader says so), and every process's session for ours(pid)."""
    import subprocess

    from caseledger.run.accel import remote as accel_remote

    calls = accel.CALLS["nvidia-smi"]
    out = subprocess.run(["sh", "-c", accel_remote.sample_script(calls)], capture_output=True, text=True, check=True)
    outs, sids = accel_remote.parse_sample(out.stdout, calls)
    assert outs[tuple(accel.NVIDIA_GPUS)] == GPUS.rstrip("\n") and sids[os.getpid()] == os.getsid(0), out.stdout
    devices = accel.parse_nvidia(outs[tuple(accel.NVIDIA_GPUS)], outs[tuple(accel.NVIDIA_APPS)], lambda pid: False)
    assert [d["uuid"] for d in devices][1] == DEV1 and len(devices[1]["processes"]) == 2, devices
    failing = ([*accel.NVIDIA_GPUS[:1], "--no-such-query"],)
    out = subprocess.run(["sh", "-c", accel_remote.sample_script(failing)], capture_output=True, text=True, check=True)
    assert accel_remote.parse_sample(out.stdout, failing)[0] == {}, out.stdout


def test_a_line_read_over_ssh_names_its_host_in_each_device_and_reason() -> None:
    from caseledger.run.accel.remote import on_host

    line = accel.AccelSampler(lambda pid: pid in SERVICE, _recorded, _nvidia_only).sample()
    got = on_host(line, "gpu-7")
    assert got["host"] == "gpu-7" and [d["index"] for d in got["devices"]] == ["gpu-7:0", "gpu-7:1"]
    assert got["devices"][1]["uuid"] == f"gpu-7:{DEV1}"
    said = on_host(accel.AccelSample(mono_ns=1, tool=None, reason="no nvidia-smi"), "gpu-7")
    assert said["reason"] == "gpu-7: no nvidia-smi"


def test_the_watch_samples_each_second_retries_a_failed_call_and_says_a_missing_tool_once() -> None:
    calls: list[list[str]] = []

    def flaky(argv: list[str]) -> str | None:
        calls.append(argv)
        return None if len(calls) == 1 else _recorded(argv)  # the first call fails

    lines: list[accel.AccelSample] = []
    w = accel.AccelWatch(accel.AccelSampler(lambda pid: True, flaky, _nvidia_only), lines.append)
    for now in (0.0, 0.5, 1.0, 1.5, 2.0):
        w.tick(now)
    assert [("devices" in x, "reason" in x) for x in lines] == [(False, True), (True, False), (True, False)]
    lines.clear()
    w = accel.AccelWatch(accel.AccelSampler(lambda pid: True, flaky, lambda name: None), lines.append)
    for now in (0.0, 1.0, 2.0):
        w.tick(now)
    assert [x["reason"] for x in lines] == ["no nvidia-smi, rocm-smi or npu-smi on the service host"]
    lines.clear()
    w = accel.AccelWatch(accel.AccelSample(mono_ns=0, tool=None, reason="an external service"), lines.append)
    for now in (0.0, 1.0):
        w.tick(now)
    assert lines == [{"mono_ns": 0, "tool": None, "reason": "an external service"}]


def test_a_tool_that_keeps_failing_is_not_asked_again_during_the_load() -> None:
    calls: list[list[str]] = []

    def hung(argv: list[str]) -> str | None:
        calls.append(argv)
        return None

    lines: list[accel.AccelSample] = []
    w = accel.AccelWatch(accel.AccelSampler(lambda pid: True, hung, _nvidia_only), lines.append)
    for now in range(10):
        w.tick(float(now))
    assert len(calls) == len(lines) == accel.MAX_FAILED_IN_A_ROW
    assert lines[-1]["reason"].endswith("(3 times in a row: not asked again during this load)")
