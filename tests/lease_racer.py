"""A racer process for the lease-host tests: it runs with its own CASELEDGER_HOST_DIR (set by the test), as a
controller host of its own would, and on each line read from stdin calls start_run(wait=True) once and prints
one JSON line: {"ok", "state", "run_id"} or {"ok": false, "error", "message"}.

`python -m tests.lease_racer WORKSPACE CASE_ID`; it prints "ready" once its imports are done, so the test
releases both racers together and a trial costs a run, not an interpreter start.
"""

from __future__ import annotations

import sys
from pathlib import Path

import orjson

from caseledger.errors import CaseledgerError
from caseledger.tools import start_run
from caseledger.workspace import Workspace


def main() -> int:
    ws, case_id = Workspace(Path(sys.argv[1])), sys.argv[2]
    print("ready", flush=True)
    for _ in sys.stdin:
        try:
            r = start_run(ws, case_id, wait=True)
            out = {"ok": True, "state": r.state, "run_id": r.run_id}
        except CaseledgerError as e:
            out = {"ok": False, "error": type(e).__name__, "message": str(e)}
        print(orjson.dumps(out).decode(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
