"""Live progress for a person waiting on a run: read from the same folded state phase_status answers from
(events checked against evidence; formal requests from the load's sent log and raw records), never estimated
from elapsed time alone.

    progress_line(view, elapsed_s, points)   the facts in one line: phase, formal sent/done/failed of N, elapsed,
                                             an estimate of the load's rest, points done of total (a campaign)
    ProgressLine(stream, tty)                a wait's callback: on a terminal one line redrawn in place (at most
                                             every REDRAW_S, so at least once a second); otherwise one plain line
                                             per phase change
"""

from __future__ import annotations

import time
from typing import TextIO

from caseledger.case.phases import Phase
from caseledger.ledger.state import RunView

REDRAW_S = 0.25  # a terminal line is redrawn at most this often (the wait polls about every 50 ms)


def _s(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m"


def load_rest_s(view: RunView, now_ns: int | None = None) -> float | None:
    """Seconds the formal load still needs at the rate its requests have ended so far (None: not loading, or
    nothing ended yet). The load phase's start is a monotonic time of this host, as the controller runs here."""
    load = view.phases[Phase.LOAD]
    c = view.counts
    if load.state.value != "running" or load.started_mono is None or c.done <= 0:
        return None
    spent = ((now_ns if now_ns is not None else time.monotonic_ns()) - load.started_mono) / 1e9
    return spent / c.done * max(0, c.planned - c.done) if spent > 0 else None


def phase_of(view: RunView) -> str:
    """'load running', 'postprocess done', 'succeeded': where the run is, as phase_status names it."""
    if view.state.value not in ("running", "created") or view.current is None:
        return view.state.value
    return f"{view.current.value} {view.phases[view.current].state.value}"


def progress_line(view: RunView, elapsed_s: float, points: tuple[int, int] | None = None) -> str:
    c = view.counts
    head = f"points {points[0]}/{points[1]} · " if points else ""
    rest = load_rest_s(view)
    est = (
        f"~{_s(rest)} of load left"
        if rest is not None
        else "load ended"
        if view.load_ended == "yes"
        else "rest unknown until requests end"
    )
    return (
        f"{head}{view.run_id} {phase_of(view)} · formal sent {c.sent}/{c.planned} done {c.done} "
        f"failed {c.failed} · {_s(elapsed_s)} elapsed, {est}"
    )


class ProgressLine:
    """The callback a CLI wait hands to wait_for: it writes progress_line() to `stream`."""

    def __init__(self, stream: TextIO, tty: bool) -> None:
        self.stream = stream
        self.tty = tty
        self.t0 = time.monotonic()
        self.points: tuple[int, int] | None = None
        self._last_draw = -1.0
        self._last_phase: tuple[str, str] | None = None
        self._width = 0

    def __call__(self, view: RunView) -> None:
        now = time.monotonic()
        text = progress_line(view, now - self.t0, self.points)
        if self.tty:
            if now - self._last_draw < REDRAW_S:
                return
            self._last_draw = now
            pad = max(0, self._width - len(text))  # blanks over a longer previous line (no terminal codes)
            self._width = len(text)
            self.stream.write("\r" + text + " " * pad)
            self.stream.flush()
            return
        phase = (view.run_id, phase_of(view))
        if phase != self._last_phase:
            self._last_phase = phase
            self.stream.write(text + "\n")
            self.stream.flush()

    def close(self) -> None:
        """End the redrawn line, so the answer that follows starts on a line of its own."""
        if self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0
