"""What a window's trust is judged on besides the records: client stalls and the host's CPU. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from caseledger.case.model import Case
from caseledger.metrics._columns import B
from caseledger.metrics._models import NotObserved
from caseledger.metrics._result import HostLoad
from caseledger.procs import others_of

_S = 1e9  # ns per s


@dataclass(frozen=True)
class Evidence:
    """What the window's trust is judged on besides the records: invalid requests, client stalls, host CPU."""

    invalid: B  # per request: a successful response whose counts failed a check
    stalls: list[tuple[int, int]]  # (start_ns, end_ns) of each load client stall, client clock
    host: list[dict[str, Any]]  # JSON: load/host.jsonl samples
    accel: list[dict[str, Any]] = field(default_factory=list)  # JSON: load/accel.jsonl samples


def distortion(case: Case, start: int, end: int, ev: Evidence, t0: int) -> list[str]:
    """Why [start, end] is not a clean measurement: the client stalled, or other processes used the host."""
    th = case.measurement.evidence
    out: list[str] = []
    inside = [(max(a, start), min(b, end)) for a, b in ev.stalls if b > start and a < end]
    stalled = sum(b - a for a, b in inside) / _S
    if inside and stalled >= th.max_stall_s:
        a, b = max(inside, key=lambda x: x[1] - x[0])
        out.append(
            f"load client stalled {stalled:.1f} s in all ({len(inside)} stall(s), longest {(b - a) / _S:.1f} s "
            f"from {(a - t0) / _S:.1f} s): its timestamps are late; repeat the run"
        )
    host = host_load(samples_in(ev.host, start, end))
    if isinstance(host, HostLoad) and host.other_share > th.max_other_cpu_share:
        most = f" (the most: {', '.join(host.top)})" if host.top else ""
        out.append(
            f"other processes used {host.other_share:.0%} of the host's {host.cores} core(s) during the "
            f"window{most} (> measurement.evidence.max_other_cpu_share {th.max_other_cpu_share:g}): a contended "
            "host; repeat on a quiet host"
        )
    return out


# JSON: load/host.jsonl lines
def samples_in(samples: list[dict[str, Any]], start: int, end: int) -> list[dict[str, Any]]:
    """The host CPU samples whose interval overlaps [start, end] (each covers (mono_ns - dt_ns, mono_ns])."""
    return [x for x in samples if x["mono_ns"] > start and x["mono_ns"] - x["dt_ns"] < end]


def host_load(samples: list[dict[str, Any]]) -> HostLoad | NotObserved:  # JSON: load/host.jsonl lines
    """The host's CPU over a set of load/host.jsonl samples (jiffy deltas)."""
    total = sum(x["total"] for x in samples)
    if not samples or total <= 0:
        return NotObserved(reason="no host CPU sample inside the window (samples every 0.5 s by a local controller)")
    ours = sum(x["ours"] for x in samples)
    cores = max(int(x.get("cores", 1)) for x in samples)
    span_s = sum(x["dt_ns"] for x in samples) / _S
    other, top = others_of(samples)
    client = sum(x["client"] for x in samples) / total * cores
    steal = sum(x.get("steal", 0) for x in samples) / total
    load1 = max(float(x.get("load1", 0.0)) for x in samples)
    text = (
        f"other processes {other:.0%} of {cores} core(s), caseledger + service {ours / total:.0%}, load client "
        f"{client:.0%} of one core, steal {steal:.0%}, load average up to {load1:.2f} ({len(samples)} samples "
        f"over {span_s:.1f} s)" + (f"; other processes that took the most: {', '.join(top)}" if top else "")
    )
    return HostLoad(
        samples=len(samples),
        cores=cores,
        span_s=span_s,
        other_share=other,
        ours_share=ours / total,
        client_share=client,
        steal_share=steal,
        load1_max=load1,
        top=top,
        text=text,
    )
