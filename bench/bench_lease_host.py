"""Latency of the target lease on a lease host over SSH (target.lease_host), against a real sshd on loopback
(tests/sshd.py): the first acquire of a process (SSH handshake + one exec), then acquire, renew and release on
the process's reused connection (one exec each), next to the host-local lease. A renewal is a heartbeat every
few seconds and an acquire happens once per start_run, so both should stay far below the heartbeat.
By hand: `.venv/bin/python bench/bench_lease_host.py [K]`.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from caseledger.case.model import Case
from caseledger.ledger.leases import target_key
from caseledger.run import lease as run_lease
from caseledger.workspace import Workspace
from tests.conftest import free_port, ref_draft
from tests.sshd import running_sshd


def ms(xs: list[float]) -> str:
    xs = sorted(xs)
    return f"median {statistics.median(xs) * 1e3:6.1f} ms  p90 {xs[int(0.9 * (len(xs) - 1))] * 1e3:6.1f} ms"


def timed(fn: object, *a: object, **kw: object) -> float:
    t0 = time.perf_counter()
    fn(*a, **kw)  # type: ignore[operator]
    return time.perf_counter() - t0


def main(k: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["CASELEDGER_HOST_DIR"] = str(root / "host")
        ws = Workspace(root / "ws")
        (ws.root / "cases").mkdir(parents=True)
        with running_sshd(root / "sshd") as sshd:
            d = ref_draft(free_port(), service={"adapter": "external"})
            local = Case.model_validate(d)
            d["target"]["lease_host"] = sshd.ssh(dir=str(root / "leases"))
            leased = Case.model_validate(d)
            key = target_key(leased.canonical())
            for name, case in (("host-local", local), ("lease host", leased)):
                acq, ren, rel = [], [], []
                first = 0.0
                for i in range(k):
                    rid = f"r-{i:08x}"
                    t0 = time.perf_counter()
                    lease = run_lease.acquire(ws, case, key, rid, owner=None)
                    if i == 0:
                        first = time.perf_counter() - t0
                    else:
                        acq.append(time.perf_counter() - t0)
                    ren.append(timed(run_lease.renew, ws, case, key, rid, lease.fence))
                    rel.append(timed(run_lease.release, ws, case, key, rid, lease.fence))
                print(f"{name:10s} first acquire {first * 1e3:6.1f} ms (a new SSH connection on the lease host)")
                print(f"{name:10s} acquire  {ms(acq)}")
                print(f"{name:10s} renew    {ms(ren)}")
                print(f"{name:10s} release  {ms(rel)}   ({k} each)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 50)
