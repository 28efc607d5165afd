"""The first freeze of a case whose tokenizer is a GGUF file: how long, and how often the tokenizer is converted.

Each freeze is `caseledger freeze` in a fresh process (as a person or an agent's MCP server would start), timed
from outside: (1) cold: an empty tokenizer cache (CASELEDGER_CACHE in a temporary directory), so the GGUF is
hashed and its tokenizer converted; (2) warm, a new workspace: the same file, a new process, a new dataset to
materialize; (3) warm, the same workspace, a child that changes only C (its dataset reused). The converted
directories are counted and their tokenizer.json mtimes compared: a conversion happens once per file. Each
figure is wall time, with the freeze process's CPU seconds beside it (a shared host stretches the wall time).
Needs a real GGUF: `set -a; . ~/.cache/caseledger/llama.env; set +a` (the llama-server binary is only written
into the case's argv, never started: without CASELEDGER_LLAMA_SERVER the argv names `llama-server`), then
`flock /tmp/caseledger-cpu.lock .venv/bin/python bench/bench_freeze_gguf.py [K]`.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXE = Path(sys.executable).with_name("caseledger")


def draft(model: str, concurrency: int) -> dict[str, Any]:
    d: dict[str, Any] = json.loads((ROOT / "cases" / "llamacpp.json").read_text())
    d.pop("$schema", None)
    argv = d["service"]["argv"]
    argv[0], argv[argv.index("-m") + 1] = os.environ.get("CASELEDGER_LLAMA_SERVER", "llama-server"), model
    d["dataset"]["tokenizer"] = model  # the served GGUF's own tokenizer
    d["load"]["concurrency"] = concurrency
    return d


def freeze(ws: Path, cache: Path, d: dict[str, Any]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the freeze process)."""
    path = ws / "cases" / f"c{d['load']['concurrency']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(d))
    env = {**os.environ, "CASELEDGER_CACHE": str(cache)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run(
        [str(EXE), "--workspace", str(ws), "freeze", str(path)], env=env, capture_output=True, text=True, check=False
    )
    took = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"freeze failed: {p.stdout}{p.stderr}")
    return took, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def converted(cache: Path) -> dict[str, int]:
    return {
        d.name: (d / "tokenizer.json").stat().st_mtime_ns for d in (cache / "tokenizers").glob("gguf-*") if d.is_dir()
    }


def main(k: int = 3) -> None:
    model = os.environ["CASELEDGER_LLAMA_MODEL"]
    size = Path(model).stat().st_size
    print(f"GGUF {Path(model).name}: {size / 1e6:.0f} MB; each figure: `caseledger freeze` in a fresh process")
    cold: list[tuple[float, float]] = []
    warm_new: list[tuple[float, float]] = []
    warm_same: list[tuple[float, float]] = []
    for i in range(k):
        with tempfile.TemporaryDirectory(prefix="bench-gguf-") as tmp:
            cache = Path(tmp) / "cache"
            cold.append(freeze(Path(tmp) / "ws0", cache, draft(model, 1)))
            first = converted(cache)
            warm_new.append(freeze(Path(tmp) / "ws1", cache, draft(model, 1)))
            warm_same.append(freeze(Path(tmp) / "ws1", cache, draft(model, 2)))
            assert converted(cache) == first and len(first) == 1, (first, converted(cache))  # converted once
        print(
            f"round {i + 1}: cold {cold[-1][0]:.2f} s (cpu {cold[-1][1]:.2f}), warm new workspace "
            f"{warm_new[-1][0]:.2f} s (cpu {warm_new[-1][1]:.2f}), warm child {warm_same[-1][0]:.2f} s "
            f"(cpu {warm_same[-1][1]:.2f}); 1 conversion"
        )
    for name, runs in (("cold", cold), ("warm, new workspace", warm_new), ("warm, C-only child", warm_same)):
        xs, cpu = [w for w, _ in runs], [c for _, c in runs]
        print(
            f"{name}: median {statistics.median(xs):.2f} s (min {min(xs):.2f}, max {max(xs):.2f}), "
            f"cpu median {statistics.median(cpu):.2f} s, over {k}"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
