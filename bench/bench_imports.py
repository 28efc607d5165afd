"""CPU seconds each fresh interpreter of a run spends importing its entry module: the controller, preflight, the
load client, the collector, and the campaign driver (once per campaign). A campaign point on a warm service pays
the first four in series around its formal window, so their import CPU is most of its fixed overhead on 2 cores.
By hand: `.venv/bin/python bench/bench_imports.py [N]` (min and median of N fresh interpreters each; caseledger's
.pyc files should exist, as they do after the first run). `-X importtime` names the modules behind a figure:
`.venv/bin/python -X importtime -c 'import caseledger.run.controller' 2>&1 | sort -t'|' -k1 -n | tail`.
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys

ENTRIES = {
    "controller": "caseledger.run.controller",
    "preflight": "caseledger.run.preflight",
    "load client": "caseledger.load.__main__",
    "collector": "caseledger.metrics.__main__",
    "campaign driver": "caseledger.run.campaign_driver",
}
HEAVY = ("numpy", "httpx2", "matplotlib", "transformers", "tokenizers", "mcp")


def cpu_of(code: str) -> float:
    """User + system CPU seconds of one fresh interpreter running `code`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def heavy_loaded(module: str) -> list[str]:
    """Which heavy third-party modules importing `module` loads."""
    code = f"import sys, {module}; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return out.split()


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    bare = [cpu_of("pass") for _ in range(n)]
    print(f"{'bare interpreter':16s} min {min(bare):.3f}  median {statistics.median(bare):.3f} CPU-s")
    for name, module in ENTRIES.items():
        xs = [cpu_of(f"import {module}") for _ in range(n)]
        print(
            f"{name:16s} min {min(xs):.3f}  median {statistics.median(xs):.3f} CPU-s  "
            f"heavy: {' '.join(heavy_loaded(module)) or '-'}"
        )


if __name__ == "__main__":
    main()
