"""Host CPU seconds per detached run: K runs of one small case on the reference target (32 requests at C=4, the
knee campaign's size), each with its real controller, preflight, load client and collector, measured from
/proc/stat (every process on the host counts, so hold the lock and keep the host quiet). With `--tree=NAME=DIR`
the same runs are made by another checkout's code (e.g. a `git archive` of main), alternated round by round with
this one's, after one untimed warm-up run each (it writes the bytecode caches).
By hand: `flock /tmp/caseledger-cpu.lock .venv/bin/python bench/bench_run_cpu.py [K] [ROUNDS] [--tree=NAME=DIR]`.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))

from caseledger.procs import CpuSampler  # noqa: E402  # this checkout's, on the path just above

# run in a fresh interpreter of the tree under test: K runs in a fresh workspace, the service started by the first
RUNS = """
import sys, tempfile, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from caseledger import services
from caseledger.ledger import authorization
from caseledger.tools import freeze_any, start_any
from caseledger.workspace import Workspace
from tests.conftest import free_port, knee_base
ws = Workspace(Path(tempfile.mkdtemp(prefix="bench-run-cpu-")) / "ws")
(ws.root / "cases").mkdir(parents=True)
authorization.set_mode(ws, "auto")
port = free_port()
try:
    for i in range(int(sys.argv[2])):
        d = knee_base(port, "cpu", 32)
        d["load"]["concurrency"] = 4
        d["dataset"]["seed"] = i + 1  # a new case each time, on the one warm service
        v = start_any(ws, freeze_any(ws, draft=d).case_id, wait=True)
        assert v.state == "succeeded", v.text()
finally:
    services.stop_all(ws)
"""


def one(tree: Path, k: int) -> tuple[float, float]:
    """(host CPU-s, wall s) of K runs made by `tree`'s code: the busy ticks of every core (all but idle and
    iowait), as the load's host samples count them."""
    env = {**os.environ, "CASELEDGER_CHART_AFTER_RUN": "0"}  # the runs, not the chart
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    sampler = CpuSampler()
    sampler.sample(set(), None)
    t = time.monotonic()
    subprocess.run([sys.executable, "-c", RUNS, str(tree), str(k)], check=True, env=env, cwd=tree)
    got = sampler.sample(set(), None)
    assert got is not None, "/proc/stat unreadable"
    return got["busy"] / os.sysconf("SC_CLK_TCK"), time.monotonic() - t


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--tree")]
    k = int(args[0]) if args else 6
    rounds = int(args[1]) if len(args) > 1 else 3
    trees = {"this": HERE}
    for a in sys.argv[1:]:
        if a.startswith("--tree="):
            name, _, d = a.removeprefix("--tree=").partition("=")
            trees[name] = Path(d).resolve()
    for tree in trees.values():
        one(tree, 1)  # warm-up: bytecode, page cache
    got: dict[str, list[tuple[float, float]]] = {n: [] for n in trees}
    for r in range(rounds):
        for name in list(trees)[r % len(trees) :] + list(trees)[: r % len(trees)]:  # the order rotates
            got[name].append(one(trees[name], k))
    print(f"{k} runs per round, {rounds} rounds, {os.cpu_count()} cores; host CPU-s and wall s per run")
    for name, xs in got.items():
        cpu = [c / k for c, _ in xs]
        wall = [w / k for _, w in xs]
        print(
            f"{name:8s} CPU-s/run median {statistics.median(cpu):.3f} ({', '.join(f'{c:.3f}' for c in cpu)})  "
            f"wall s/run median {statistics.median(wall):.2f}"
        )


if __name__ == "__main__":
    main()
