"""CPU seconds each fresh interpreter of a run spends importing its entry module: the controller, preflight, the
load client, the collector, and the campaign driver (once per campaign). A campaign point on a warm service pays
the first four in series around its formal window, so their import CPU is most of its fixed overhead on 2 cores.
By hand: `.venv/bin/python bench/bench_imports.py [N]` (min and median of N fresh interpreters each; caseledger's
.pyc files should exist, as they do after the first run). `--no-bytecode` measures the same with no cached
bytecode at all, the standard library's included (an empty PYTHONPYCACHEPREFIX and PYTHONDONTWRITEBYTECODE=1): an
upper bound of what each process pays where a shell sets that variable and nothing wrote __pycache__ before.
`-X importtime` names the modules behind a figure:
`.venv/bin/python -X importtime -c 'import caseledger.run.controller' 2>&1 | sort -t'|' -k1 -n | tail`.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile

ENTRIES = {
    "controller": "caseledger.run.controller",
    "preflight": "caseledger.run.preflight",
    "load client": "caseledger.load.__main__",
    "collector": "caseledger.metrics.__main__",
    "campaign driver": "caseledger.run.campaign_driver",
    "reference target": "caseledger.target.__main__",
}
HEAVY = ("numpy", "httpx2", "matplotlib", "transformers", "tokenizers", "mcp")


def cpu_of(code: str, env: dict[str, str] | None = None) -> float:
    """User + system CPU seconds of one fresh interpreter running `code`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def heavy_loaded(module: str) -> list[str]:
    """Which heavy third-party modules importing `module` loads."""
    code = f"import sys, {module}; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return out.split()


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--no-bytecode"]
    n = int(args[0]) if args else 7
    env = None
    if "--no-bytecode" in sys.argv:
        empty = tempfile.mkdtemp(prefix="no-pycache-")  # never written to: nothing is cached between runs
        env = {**os.environ, "PYTHONPYCACHEPREFIX": empty, "PYTHONDONTWRITEBYTECODE": "1"}
    bare = [cpu_of("pass", env) for _ in range(n)]
    print(f"{'bare interpreter':16s} min {min(bare):.3f}  median {statistics.median(bare):.3f} CPU-s")
    for name, module in ENTRIES.items():
        xs = [cpu_of(f"import {module}", env) for _ in range(n)]
        print(
            f"{name:16s} min {min(xs):.3f}  median {statistics.median(xs):.3f} CPU-s  "
            f"heavy: {' '.join(heavy_loaded(module)) or '-'}"
        )


if __name__ == "__main__":
    main()
