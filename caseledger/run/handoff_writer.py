"""HANDOFF.md refreshed off a run's critical path.

A phase start asks for a refresh and goes on: a daemon thread renders and writes it DELAY_S later, the asks of
that while coalescing into one write. A hot run reaches its formal load in about half a second; the render (~0.1
CPU-s with the imports of the outcome stage, done by that thread) would otherwise compete with the phases before
it for the interpreter. The last refresh, when the controller exits, is written in the caller's thread after any
write in flight, so HANDOFF.md ends with the run's outcome.
"""

from __future__ import annotations

import sys
import threading

from caseledger.workspace import Workspace, is_disk_full

DELAY_S = 1.0


class HandoffWriter:
    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self._asked = threading.Event()
        self._lock = threading.Lock()  # one write at a time; the final one last
        self._closed = False
        self._closing = threading.Event()  # set by final(): a pending delayed write gives way at once
        self._thread: threading.Thread | None = None

    def ask(self) -> None:
        """Refresh soon, in the background (coalesced with asks not yet served)."""
        if self._closed:
            return
        self._asked.set()
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="handoff", daemon=True)
            self._thread.start()

    def _serve(self) -> None:
        while True:
            self._asked.wait()
            self._closing.wait(DELAY_S)
            self._asked.clear()
            with self._lock:
                if self._closed:
                    return
                try:
                    self._write(None)
                except Exception as e:  # a derived file: the run's facts stand; the final write tries again
                    print(f"controller: HANDOFF.md not refreshed: {type(e).__name__}: {e}", file=sys.stderr)

    def final(self, exiting: str) -> None:
        """The last refresh, naming the run that is exiting; no background write after it. A full disk leaves
        HANDOFF.md as it was (a derived file must not hide the recorded outcome)."""
        self._closing.set()
        with self._lock:
            self._closed = True
            try:
                self._write(exiting)
            except OSError as e:
                if not is_disk_full(e):
                    raise

    def _write(self, exiting: str | None) -> None:
        from caseledger.views import handoff  # lazy: the views it renders are not on the run's critical path

        handoff.refresh(self.ws, exiting=exiting)
