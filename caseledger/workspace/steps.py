"""Slow steps say what they are doing: a call that takes longer than a few seconds names its step.

A freeze may hash a model file or convert a GGUF tokenizer for a minute on first use, deep inside the datasets
stage and far from the tool that was called. The caller installs a `Steps` for its call (`with steps.active():`);
the code below marks its possibly slow parts with `step("converting ...")`. A context variable carries the
Steps down, so no stage between the tool and the slow code takes a parameter for it, and a call without one
(a run's controller, a test) marks steps at no cost.

A step that lasts `after_s` is said once through `say` (the CLI: a line on stderr): by a timer while it runs, or
at its end when it ended before the timer got to it, so a step longer than the threshold is always said, exactly
once. `current()` names the innermost step running now for a heartbeat (the MCP server's progress notifications).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

SLOW_S = 2.0  # a step that lasts this long is said (the CLI's threshold; the MCP heartbeat's cadence is alike)

_ACTIVE: ContextVar[Steps | None] = ContextVar("caseledger_steps", default=None)


class Steps:
    """The steps of one call: which one runs now, and saying each that lasts `after_s` or longer."""

    def __init__(
        self,
        say: Callable[[str], None] | None = None,
        after_s: float = SLOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.say = say
        self.after_s = after_s
        self.clock = clock  # seconds, for a step's length at its end (the timer's are the OS's)
        self._lock = threading.Lock()
        self._running: list[str] = []
        self._entries = itertools.count()  # a name may run twice: each run of a step is said on its own
        self._said: set[int] = set()

    def current(self) -> str | None:
        """The innermost step running now (None: none)."""
        with self._lock:
            return self._running[-1] if self._running else None

    @contextmanager
    def active(self) -> Iterator[Steps]:
        """Make this the Steps that `step()` reports to, in this thread (and the context copied from it)."""
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    @contextmanager
    def step(self, what: str) -> Iterator[None]:
        """Run a step named `what` ('hashing model.gguf (4.1 GB)'): said once if it lasts after_s or longer."""
        entry = next(self._entries)
        with self._lock:
            self._running.append(what)
        timer = threading.Timer(self.after_s, self._say_once, (entry, what)) if self.say else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        t0 = self.clock()
        try:
            yield
        finally:
            if timer is not None:
                timer.cancel()
            with self._lock:
                self._running.remove(what)
            if self.clock() - t0 >= self.after_s:  # it ended before the timer said it
                self._say_once(entry, what)

    def _say_once(self, entry: int, what: str) -> None:
        with self._lock:
            if entry in self._said or self.say is None:
                return
            self._said.add(entry)
        self.say(what)


@contextmanager
def step(what: str) -> Iterator[None]:
    """Mark a possibly slow step for the Steps of the current call, if any (else: nothing is said)."""
    steps = _ACTIVE.get()
    if steps is None:
        yield
        return
    with steps.step(what):
        yield
