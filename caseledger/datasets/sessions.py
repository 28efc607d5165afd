"""Multi-turn datasets (dataset.sessions): each conversation's turns and think times, the entries numbered."""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from caseledger.case.dataset import Dataset
from caseledger.case.model import Case
from caseledger.datasets import lengths as _lengths
from caseledger.datasets.entries import required
from caseledger.datasets.identity import SessionsInfo
from caseledger.errors import CaseInvalid


def session_turns(case: Case) -> list[int]:
    """Turns of each conversation (dataset.sessions), drawn once and seeded; their total must be load.requests."""
    ss = case.dataset.sessions
    assert ss is not None
    if isinstance(ss.turns, int):
        turns = [ss.turns] * ss.count
    else:
        _lengths.check(ss.turns, "dataset.sessions.turns")
        turns = _lengths.sample(ss.turns, ss.count, int(case.dataset.seed), "turns")
    if sum(turns) != case.load.requests:
        raise CaseInvalid(
            f"dataset.sessions draws {sum(turns)} turns in all ({ss.count} conversations, turns "
            f"{min(turns)}..{max(turns)}) but load.requests is {case.load.requests}; N is the total of turns",
            f"set load.requests to {sum(turns)} (the draw is fixed by dataset.seed), or give dataset.sessions.turns "
            "as an integer",
        )
    return turns


def _think_times(ds: Dataset, n: int) -> list[float]:
    """The wait before each entry's turn, seconds (the first turn of a conversation waits none)."""
    think = required(ds.sessions, "dataset.sessions").think_time_ms
    if isinstance(think, int):
        return [think / 1000.0] * n
    _lengths.check(think, "dataset.sessions.think_time_ms")
    return [t / 1000.0 for t in _lengths.sample(think, n, ds.seed, "think")]


def annotate_sessions(case: Case, path: Path) -> SessionsInfo:
    """Number the entries as turns of their conversations, in order (conversation 0's turns, then 1's...)."""
    ds = case.dataset
    turns = session_turns(case)
    think = _think_times(ds, sum(turns))
    where = [(s, k, n) for s, n in enumerate(turns) for k in range(n)]
    lines = path.read_bytes().splitlines()
    out = []
    for i, line in enumerate(lines):
        e = orjson.loads(line)
        s, k, n = where[i]
        e.update(session=s, turn=k, turns=n, think_s=0.0 if k == 0 else think[i])
        out.append(orjson.dumps(e) + b"\n")
    with path.open("wb") as f:
        f.write(b"".join(out))
        f.flush()
        os.fsync(f.fileno())
    waits = sum(think[i] for i, (_, k, _) in enumerate(where) if k)
    return SessionsInfo(
        count=len(turns), turns=sum(turns), turns_min=min(turns), turns_max=max(turns), think_s_total=round(waits, 6)
    )
