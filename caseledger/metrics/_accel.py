"""A window's accelerators from load/accel.jsonl, and the devices a foreign process shared with the service. Pure."""

from __future__ import annotations

from statistics import fmean
from typing import Any

from caseledger.metrics._models import Accelerators, DeviceFigures, NotObserved

NOT_SAMPLED = "no accelerator sample inside the window (sampled every 1 s by a controller following a local load)"


def _mean(xs: list[float | None]) -> float | None:
    known = [x for x in xs if x is not None]
    return fmean(known) if known else None


def _max(xs: list[float | None]) -> float | None:
    known = [x for x in xs if x is not None]
    return max(known) if known else None


def _figures(rows: list[dict[str, Any]]) -> DeviceFigures:  # JSON: one device's entries of load/accel.jsonl
    """One device over its samples: means and peaks, and each process with the most memory it held."""
    held: dict[int, tuple[float | None, bool]] = {}
    for r in rows:
        for p in r["processes"]:
            mem, _ = held.get(p["pid"], (None, p["ours"]))
            held[p["pid"]] = (_max([mem, p["mem_mib"]]), p["ours"])
    named = {pid: f"pid {pid} {'?' if mem is None else f'{mem:.0f}'} MiB" for pid, (mem, _) in held.items()}
    procs = [f"{named[pid]} ({'service' if ours else 'other'})" for pid, (_, ours) in sorted(held.items())]
    return _with_text(
        index=rows[-1]["index"],
        uuid=rows[-1]["uuid"],
        samples=len(rows),
        util_pct_mean=_mean([r["util_pct"] for r in rows]),
        util_pct_max=_max([r["util_pct"] for r in rows]),
        mem_used_mib_max=_max([r["mem_used_mib"] for r in rows]),
        mem_total_mib=_max([r["mem_total_mib"] for r in rows]),
        power_w_mean=_mean([r["power_w"] for r in rows]),
        power_w_max=_max([r["power_w"] for r in rows]),
        clock_mhz_mean=_mean([r["clock_mhz"] for r in rows]),
        processes=procs,
        used_by_service=any(ours for _, ours in held.values()),
        others=[named[pid] for pid, (_, ours) in sorted(held.items()) if not ours],
    )


def _with_text(**fields: Any) -> DeviceFigures:  # JSON: DeviceFigures' fields but text
    """The device's figures with their line: '?' where the tool gave no value."""
    d = DeviceFigures.model_validate({**fields, "text": ""})

    def f(x: float | None, unit: str) -> str:
        return "?" if x is None else f"{x:.0f}{unit}"

    text = (
        f"device {d.index}: util {f(d.util_pct_mean, '%')} mean ({f(d.util_pct_max, '%')} max), memory "
        f"{f(d.mem_used_mib_max, '')}/{f(d.mem_total_mib, ' MiB')}, power {f(d.power_w_mean, ' W')}, "
        f"clock {f(d.clock_mhz_mean, ' MHz')}; processes: {', '.join(d.processes) or 'none'}"
    )
    return d.model_copy(update={"text": text})


def accel_window(samples: list[dict[str, Any]], start: int, end: int) -> Accelerators | NotObserved:  # JSON: lines
    """The devices sampled in [start, end] (mono_ns), or NOT_OBSERVED with why (no tool, a failed tool, none
    inside the window)."""
    inside = [x for x in samples if "devices" in x and start <= x["mono_ns"] <= end]
    if not inside:
        why = sorted({str(x["reason"]) for x in samples if "reason" in x})
        return NotObserved(reason="; ".join(why) if why else NOT_SAMPLED)
    rows: dict[str, list[dict[str, Any]]] = {}  # JSON: the device entries, by uuid
    for x in inside:
        for d in x["devices"]:
            rows.setdefault(str(d["uuid"]), []).append(d)
    devices = sorted((_figures(r) for r in rows.values()), key=lambda d: d.index)
    used = [d for d in devices if d.used_by_service]
    note = (
        None
        if used
        else "no process of the service was seen on any device (a service without accelerators, or one in "
        "another PID namespace): no device is judged"
    )
    tool = str(inside[-1]["tool"])
    text = f"{tool}, {len(inside)} samples: " + "; ".join(d.text for d in devices) + (f"; {note}" if note else "")
    return Accelerators(tool=tool, samples=len(inside), devices=devices, note=note, text=text)


def accel_distortion(acc: Accelerators | NotObserved) -> list[str]:
    """A device the service uses that also held another process during the window: named with the pid and its
    memory. A device the service does not use is not judged."""
    if isinstance(acc, NotObserved):
        return []
    out: list[str] = []
    for d in acc.devices:
        if d.used_by_service and d.others:
            out.append(
                f"device {d.index} ({d.uuid}) was shared with another process during the window: "
                f"{', '.join(d.others)}: the service did not have it to itself; repeat on free devices"
            )
    return out
