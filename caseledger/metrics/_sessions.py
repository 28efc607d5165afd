"""Multi-turn figures (dataset.sessions) from raw columns: by turn index and by conversation. Pure."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from caseledger.metrics._columns import F64, RawColumns
from caseledger.metrics._models import Distribution, NotObserved
from caseledger.metrics._result import Conversations, SessionFigures, TurnFigures

SESSIONS_LISTED = 10_000
_S = 1e9


def _mean(x: F64) -> float | None:
    x = x[~np.isnan(x)]
    return float(x.mean()) if x.size else None


def _by_turn(c: RawColumns, ttft_ms: F64, turn: F64) -> list[TurnFigures]:
    out = []
    for t in sorted({int(x) for x in turn[~np.isnan(turn)].tolist()}):
        at = turn == t
        ok = at & c.ok
        both = ok & ~np.isnan(c.cached_tokens) & ~np.isnan(c.planned_shared_tokens)
        planned = float(c.planned_shared_tokens[both].sum())
        tt = ttft_ms[ok]
        tt = tt[~np.isnan(tt)]
        out.append(
            TurnFigures(
                turn=t,
                requests=int(at.sum()),
                ok=int(ok.sum()),
                ttft_ms_p50=float(np.percentile(tt, 50)) if tt.size else None,
                ttft_ms_mean=float(tt.mean()) if tt.size else None,
                prompt_tokens_mean=_mean(c.prompt_tokens[ok]),
                planned_shared_tokens_mean=_mean(c.planned_shared_tokens[ok]),
                cached_tokens_mean=_mean(c.cached_tokens[ok]),
                cached_over_planned=float(c.cached_tokens[both].sum()) / planned if planned > 0 else None,
            )
        )
    return out


def _per_session(c: RawColumns, session: F64, turns: F64) -> list[SessionFigures]:
    out = []
    for s in sorted({int(x) for x in session[~np.isnan(session)].tolist()}):
        at = session == s
        planned = int(np.nanmax(turns[at])) if not np.isnan(turns[at]).all() else int(at.sum())
        ok = int((at & c.ok).sum())
        out.append(
            SessionFigures(
                session=s,
                turns_planned=planned,
                turns_recorded=int(at.sum()),
                turns_ok=ok,
                complete=ok == planned,
                duration_s=float(c.end_ns[at].max() - c.send_ns[at].min()) / _S,
            )
        )
    return out


def conversations(
    c: RawColumns, ttft_ms: F64, summarize: Callable[[F64, str, str], Distribution | NotObserved]
) -> Conversations | None:
    """The sessions section of a result; None when no record belongs to a conversation. summarize: the result's
    distribution summary (sample, unit, reason when empty)."""
    if c.session is None or c.turn is None or c.turns is None or np.isnan(c.session).all():
        return None
    per = _per_session(c, c.session, c.turns)
    done = sum(p.complete for p in per)
    durations = np.array([p.duration_s for p in per])
    dist = summarize(durations, "s", "no conversation recorded")
    by_turn = _by_turn(c, ttft_ms, c.turn)
    later = [t for t in by_turn if t.turn > 0 and t.cached_over_planned is not None]
    cover = (
        f"; later turns cached {min(t.cached_over_planned or 0 for t in later):.0%}.."
        f"{max(t.cached_over_planned or 0 for t in later):.0%} of their planned history"
        if later
        else ""
    )
    text = (
        f"{len(per)} conversations, {done} complete, {len(per) - done} incomplete; "
        f"{int(sum(p.turns_recorded for p in per))} of {sum(p.turns_planned for p in per)} turns recorded; "
        f"duration p50 {np.percentile(durations, 50):.3f} s, max {durations.max():.3f} s{cover}"
    )
    return Conversations(
        sessions=len(per),
        complete=done,
        incomplete=len(per) - done,
        turns_recorded=sum(p.turns_recorded for p in per),
        turns_planned=sum(p.turns_planned for p in per),
        duration_s=dist,
        by_turn=by_turn,
        per_session=per[:SESSIONS_LISTED],
        text=text,
    )
