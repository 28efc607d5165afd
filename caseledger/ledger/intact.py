"""Whether a run's recorded data is whole: its raw data as sealed when the load ended (`raw_change`, `tampered`) and
its append-only evidence files without a line cut mid-write (`torn_lines`).

Readers (phase_status, summarize, reprocess_raw) call these; they never change a file. Each file is read once per
(path, size, mtime) in a process, so a status polled in a loop reads a settled file once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from caseledger.case.phases import Phase
from caseledger.errors import CaseledgerError
from caseledger.ledger.runs import load_run
from caseledger.ledger.state import fold, sealed_raw_sha256
from caseledger.ledger.view import PhaseState, RunView
from caseledger.workspace import RunPaths, Workspace, sha256_file

_SHA_SEEN: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha256: a status poll hashes once
SEEN_KEPT = 4096  # entries per cache before it starts again (a long MCP session reads many runs)


def _key(path: Path) -> tuple[str, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (str(path), st.st_size, st.st_mtime_ns)


def _bounded(cache: dict[tuple[str, int, int], Any]) -> dict[tuple[str, int, int], Any]:
    if len(cache) >= SEEN_KEPT:
        cache.clear()
    return cache


def raw_change(paths: RunPaths, sealed: str | None) -> str | None:
    """How the raw data differs from what was sealed when the load's end was confirmed ('changed after the load
    ended (sha256 ... now, ... sealed)'), or None when it is as sealed (or nothing was sealed, or it is gone:
    missing_evidence says so)."""
    if sealed is None:
        return None
    k = _key(paths.raw)
    if k is None:
        return None
    now = _SHA_SEEN.get(k)
    if now is None:
        now = _bounded(_SHA_SEEN)[k] = sha256_file(paths.raw)
    if now == sealed:
        return None
    return (
        f"load/raw.jsonl changed after the load ended (sha256 {now[:12]}… now, {sealed[:12]}… sealed at confirm_end): "
        "its figures rest on the sealed data, reprocess_raw refuses it; restore it from a backup"
    )


def settled_change(paths: RunPaths, v: RunView) -> str | None:
    """raw_change of a folded run whose controller is gone (a live one may still be writing or re-sealing it)."""
    return None if v.controller_alive else raw_change(paths, sealed_raw_sha256(v))


def tampered(ws: Workspace, run_ids: list[str]) -> list[str]:
    """Of these runs, the ones whose raw data no longer hashes as sealed, as damaged-entry lines
    ('ledger/runs/r-…/load/raw.jsonl changed after the load ended …'), in the order given, each once."""
    out: list[str] = []
    for rid in dict.fromkeys(run_ids):
        try:
            run = load_run(ws, rid)
            change = settled_change(run.paths, fold(ws, run))
        except CaseledgerError:  # an unreadable run is named by the index's own damaged list
            continue
        if change is not None:
            out.append(damaged_entry(rid, change))
    return out


def damaged_entry(run_id: str, change: str) -> str:
    """A raw_change as a damaged ledger entry: the path from the workspace, then what changed."""
    return f"ledger/runs/{run_id}/{change}"


# What a line cut from each append-only file means for the run's figures ({whole}: the lines that parse)
_MEANS = {
    "raw.jsonl": "the request it recorded is not in the figures, which rest on the {whole} whole records",
    "host.jsonl": "the window's host CPU evidence (other processes' share, steal) rests on the {whole} whole samples",
    "accel.jsonl": "the accelerator evidence rests on the {whole} whole samples",
    "stalls.jsonl": "a client stall it recorded may be missing from the distortion check ({whole} whole lines)",
}


@dataclass(frozen=True)
class _Cut:
    bad: tuple[int, ...]  # 1-based numbers of the lines that do not parse
    last_cut: bool  # the last of them is the file's last line, without its newline (cut mid-write)
    lines: int  # lines in the file
    whole: int  # lines that parse


_CUT_SEEN: dict[tuple[str, int, int], _Cut] = {}


def _cut(path: Path) -> _Cut | None:
    k = _key(path)
    if k is None:
        return None
    hit = _CUT_SEEN.get(k)
    if hit is not None:
        return hit
    data = path.read_bytes()
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()  # the empty string after the last newline
    bad, whole = [], 0
    for i, line in enumerate(lines, start=1):
        if not line:
            continue
        try:
            orjson.loads(line)
            whole += 1
        except orjson.JSONDecodeError:
            bad.append(i)
    last_cut = bool(bad) and bad[-1] == len(lines) and not data.endswith(b"\n")
    hit = _bounded(_CUT_SEEN)[k] = _Cut(tuple(bad), last_cut, len(lines), whole)
    return hit


def torn_lines(paths: RunPaths) -> list[str]:
    """Lines of the run's append-only load evidence (raw records, host and accelerator samples, stalls; each
    client process's of a shared load) that do not parse: which file, which line, whether it is the last one cut
    mid-write (a full disk, a kill), and what it means for the figures. [] when every line is whole."""
    files = [paths.raw, paths.load_host, paths.load_accel, paths.load_stalls]
    for part in paths.load_parts():
        files += [part.raw, part.load_stalls]
    out = []
    for f in files:
        cut = _cut(f)
        if cut is None or not cut.bad:
            continue
        name = str(f.relative_to(paths.root))
        means = _MEANS.get(f.name, "it was skipped ({whole} whole lines)").format(whole=cut.whole)
        for i in cut.bad:
            how = (
                "is torn: cut mid-write (a full disk, a kill), without its newline"
                if cut.last_cut and i == cut.bad[-1]
                else "does not parse (cut mid-write, more lines follow)"
            )
            out.append(f"{name} line {i} of {cut.lines} {how}; skipped: {means}")
    return out


def load_settled(v: RunView) -> bool:
    """The load's files are no longer written: no load client alive, the load phase not running."""
    return not v.client_alive and v.phases[Phase.LOAD].state != PhaseState.RUNNING
