"""A formal load shared by several client processes (load.processes = P > 1): how it is dealt, and the merge.

Dealing (pure): C is split as evenly as it goes (C=5, P=2: 3 + 2) and the C slots are owned in contiguous blocks
(slots 0-2 by process 0, 3-4 by process 1); request i goes to the owner of slot i mod C, a conversation j (its
turns in order) to the owner of slot j mod C. Each process so gets a share of the requests proportional to its
slots, interleaved in schedule order, and a request keeps its index i, its entry, its body and its offset: a rate's
arrival schedule is drawn once for all N (load/schedule.py) and dealt out, so the aggregate arrival process is the
declared one; every process starts its schedule at the one instant load/go names.

Each process writes the one-process files under load/p<k>/ (workspace.PartPaths). When every process has ended
(or is gone), the controller merges them into the files a one-process load leaves at load/: raw.jsonl in send
order on one time base (process 0's monotonic clock; a process on another boot maps through its anchor and, on a
load host, its host's measured clock offset, load/p<k>/clock.json), sent.log,
stalls.jsonl, anchor.json (process 0's) and, when every process wrote its end file, end.json with the summed
counts. Everything downstream (confirm_end, metrics, reprocess_raw, the report) reads those merged files.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import orjson

from caseledger.load.schedule import Schedule
from caseledger.records import RawRecord, read_records
from caseledger.workspace import PartPaths, RunPaths, atomic_write, read_json_or_none, write_json

GO_LEAD_S = 0.05  # load/go names a start this far ahead: every waiting process (polling each 10 ms) sees it first
TIMED = ("send_ns", "end_ns", "sched_ns")


READY_TIMEOUT_S = 120.0  # every client process, here or on a load host, is armed within this, or nothing is sent
# A client armed on a load host cannot watch the controller's pid: the controller touches load/heartbeat there while
# the clients wait (each readiness poll, about every 0.1 s plus a round trip), and an armed client that sees it
# unchanged for the bound this variable names (seconds) exits without sending (load/__main__.py:wait_for_go).
HEARTBEAT_ENV = "CASELEDGER_LOAD_HEARTBEAT_S"
ARMED_ENV = "CASELEDGER_LOAD_ARMED"  # set: the client loads everything, then waits for load/go (or load/abort)


def split_concurrency(concurrency: int, processes: int) -> list[int]:
    """Each process's share of C: C // P, and one more for the first C mod P processes (C=5, P=2: [3, 2])."""
    if processes < 1 or concurrency < processes:
        raise ValueError(
            f"load.processes {processes} needs 1 <= load.processes <= load.concurrency ({concurrency}): each "
            "client process holds at least one slot"
        )
    base, extra = divmod(concurrency, processes)
    return [base + (1 if k < extra else 0) for k in range(processes)]


def slot_owners(concurrency: int, processes: int) -> list[int]:
    """The process that owns each of the C slots: contiguous blocks of split_concurrency's sizes."""
    return [k for k, n in enumerate(split_concurrency(concurrency, processes)) for _ in range(n)]


def part_schedule(schedule: Schedule, part: int) -> Schedule:
    """Process `part`'s share of the schedule (see the module): its requests in schedule order, its share of C."""
    p, c = schedule.processes, schedule.concurrency
    if not 0 <= part < p:
        raise ValueError(f"process index {part} is outside 0..{p - 1} (load.processes is {p})")
    owners = slot_owners(c, p)
    if schedule.sessions is None:
        specs = tuple(s for n, s in enumerate(schedule.specs) if owners[n % c] == part)
        sessions = None
    else:
        mine = [turns for j, turns in enumerate(schedule.sessions) if owners[j % c] == part]
        keep = sorted(k for turns in mine for k in turns)
        at = {k: n for n, k in enumerate(keep)}
        specs = tuple(schedule.specs[k] for k in keep)
        sessions = tuple(tuple(at[k] for k in turns) for turns in mine)
    return replace(schedule, specs=specs, sessions=sessions, concurrency=split_concurrency(c, p)[part])


def boot_id() -> str | None:
    """This boot's id: two processes with the same one read the same CLOCK_MONOTONIC."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def go_record(lead_s: float = GO_LEAD_S) -> dict[str, Any]:  # JSON: load/go, as written
    """The content of load/go for several processes: the one monotonic instant their schedules start at."""
    return {"start_mono_ns": time.monotonic_ns() + int(lead_s * 1e9), "boot_id": boot_id()}


def write_go_at(go: Path, wall_ns: int) -> None:
    """load/go on a load host: the controller's one start instant (given on this host's wall clock) as this boot's
    monotonic instant. Never replaced once written: a resume that writes it again changes no schedule."""
    if go.exists():
        return
    write_json(go, {"start_mono_ns": time.monotonic_ns() + wall_ns - time.time_ns(), "boot_id": boot_id()})


def start_of(go: Path) -> int | None:
    """The common start load/go names, when it is on this boot's clock; None: start at once (a one-process go)."""
    rec = read_json_or_none(go)
    if not isinstance(rec, dict) or rec.get("boot_id") != boot_id() or not isinstance(rec.get("start_mono_ns"), int):
        return None
    start: int = rec["start_mono_ns"]
    return start


class PartRow(TypedDict):
    """One process's row of the merge (end.json's processes, the load evidence's processes)."""

    process: int
    records: int
    shift_ns: int
    offset_ns: int
    pid: NotRequired[int | None]  # from load/p<k>/pid.json, once the end files are read
    exit: NotRequired[str]  # its end file's exit, or "no end file"


@dataclass(frozen=True)
class Merged:
    """What the merge found: the records per process, the shift applied to each, the end files."""

    records: int
    per_part: list[PartRow]
    ends: list[dict[str, Any] | None]  # JSON: each process's end.json (None: none)


def offset_of(clock: dict[str, Any] | None) -> int:  # JSON: load/p<k>/clock.json as read
    """A load host's wall clock ahead of the controller's (load/p<k>/clock.json, remote processes only), in ns:
    measured before the load, else after it; 0 on the controller's host."""
    for when in ("before", "after"):
        got = (clock or {}).get(when)
        if isinstance(got, dict) and isinstance(got.get("offset_ns"), int):
            return int(got["offset_ns"])
    return 0


# JSON: anchor and base as the processes' anchor.json files hold them
def _shift(anchor: dict[str, Any] | None, base: dict[str, Any] | None, offset: int = 0, base_offset: int = 0) -> int:
    """ns to add to a process's monotonic times to put them on process 0's clock: 0 on the same boot (one
    clock), else through both anchors' wall times, each mapped onto the controller's wall clock by its host's
    measured offset (their uncertainties add)."""
    if anchor is None or base is None or anchor.get("boot_id") == base.get("boot_id"):
        return 0
    return int(anchor["wall_ns"] - offset - anchor["mono_ns"]) - int(base["wall_ns"] - base_offset - base["mono_ns"])


def _shifted(rec: RawRecord, ns: int) -> RawRecord:
    if ns == 0:
        return rec
    out: dict[str, Any] = dict(rec)  # JSON: a raw.jsonl line, its time keys shifted by name
    for key in TIMED:
        if isinstance(out.get(key), int):
            out[key] += ns
    out["chunk_ns"] = [t + ns for t in rec["chunk_ns"]]
    return out  # type: ignore[return-value]


def _lines(path: Path) -> list[bytes]:
    """Complete lines of an append-only file (a torn last line is left out)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")
    return [ln + b"\n" for ln in lines[:-1] if ln]


def _stalls(parts: list[PartPaths], shifts: list[int]) -> bytes:
    out: list[tuple[int, int]] = []
    for part, ns in zip(parts, shifts, strict=True):
        for line in _lines(part.load_stalls):
            with contextlib.suppress(orjson.JSONDecodeError, KeyError, TypeError):
                s = orjson.loads(line)
                out.append((int(s["start_ns"]) + ns, int(s["end_ns"]) + ns))
    return b"".join(orjson.dumps({"start_ns": a, "end_ns": b}) + b"\n" for a, b in sorted(out))


def merge(paths: RunPaths, parts: list[PartPaths], plan_sha256: str) -> Merged:
    """Merge the processes' files into load/ (see the module). Deterministic: merging again writes the same
    bytes, so a controller killed mid-merge merges again on resume. end.json only when every process ended."""
    anchors = [read_json_or_none(p.load_anchor) for p in parts]
    offsets = [offset_of(read_json_or_none(p.load_clock)) for p in parts]
    base = anchors[0] if anchors else None
    shifts = [_shift(a, base, off, offsets[0]) for a, off in zip(anchors, offsets, strict=True)]
    recs: list[RawRecord] = []
    per_part: list[PartRow] = []
    for k, (part, ns) in enumerate(zip(parts, shifts, strict=True)):
        mine = read_records(part.raw).records
        recs += [_shifted(r, ns) for r in mine]
        per_part.append({"process": k, "records": len(mine), "shift_ns": ns, "offset_ns": offsets[k]})
    recs.sort(key=lambda r: (r["send_ns"], r["i"]))
    atomic_write(paths.raw, b"".join(orjson.dumps(r) + b"\n" for r in recs))
    atomic_write(paths.load_sent, b"".join(ln for p in parts for ln in _lines(p.load_sent)))
    atomic_write(paths.load_stalls, _stalls(parts, shifts))
    if base is not None:
        write_json(paths.load_anchor, {**base, "processes": len(parts), "time_base": "process 0's clock"})
    ends = [read_json_or_none(p.load_end) for p in parts]
    for info, end, pid in zip(per_part, ends, [read_json_or_none(p.load_pid) for p in parts], strict=True):
        info["pid"], info["exit"] = (pid or {}).get("pid"), (end or {}).get("exit", "no end file")
    if all(e is not None for e in ends):
        write_json(paths.load_end, merged_end([e for e in ends if e is not None], shifts, plan_sha256, per_part))
    return Merged(len(recs), per_part, ends)


SUMMED = ("planned", "sent", "done", "ok", "failed", "chunks", "cpu_user_s", "cpu_sys_s")
SUMMED_CPU = ("cpu_load_user_s", "cpu_load_sys_s")


# JSON: the processes' end.json files in, the merged end.json out
def merged_end(ends: list[dict[str, Any]], shifts: list[int], plan_sha256: str, per_part: list[PartRow]) -> Any:
    """One end file for the whole load: counts and CPU summed, the span on process 0's clock, the worst exit."""
    out: dict[str, Any] = {k: sum(e.get(k) or 0 for e in ends) for k in (*SUMMED, *SUMMED_CPU)}  # JSON: end.json
    firsts = [e["first_send_ns"] + ns for e, ns in zip(ends, shifts, strict=True) if e.get("first_send_ns") is not None]
    lasts = [e["last_end_ns"] + ns for e, ns in zip(ends, shifts, strict=True) if e.get("last_end_ns") is not None]
    exits = [e.get("exit", "complete") for e in ends]
    worst = next((x for x in ("disk_full", "cancelled") if x in exits), "complete")
    out.update(
        first_send_ns=min(firsts) if firsts else None,
        last_end_ns=max(lasts) if lasts else None,
        wall_start_utc=min(e["wall_start_utc"] for e in ends),
        wall_end_utc=max(e["wall_end_utc"] for e in ends),
        plan_sha256=plan_sha256,
        transport="+".join(sorted({str(e.get("transport")) for e in ends})),
        nice=max(int(e.get("nice", 0)) for e in ends),
        exit=worst,
        processes=[{**info, "plan_sha256": e.get("plan_sha256")} for info, e in zip(per_part, ends, strict=True)],
    )
    for key in ("reason", "signal"):
        found = next((e[key] for e in ends if key in e), None)
        if found is not None and worst != "complete":
            out[key] = found
    return out
