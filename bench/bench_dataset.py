"""Benchmark: materialize a 640 x 131072-token prefix-cache dataset (target 0.9) with the builtin tokenizer.

Measures wall time and peak RSS (resource.getrusage, the process high-water mark after each step) for a
cold materialize, a warm reuse, verify, load_entries and rendering every prompt with a run salt, in a
temporary workspace that is removed afterwards (unless --keep). Prints one small table.

    python3 bench/bench_dataset.py                      # 640 x 131072, block 128, 1 group
    python3 bench/bench_dataset.py --entries 64 --tokens 16384
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from caseledger import datasets
from caseledger.case.model import Case
from caseledger.workspace import Workspace


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _cpu_s() -> float:
    """User + system CPU of this process, all threads (tokenizers encodes batches on every core)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _case(entries: int, tokens: int, block: int, groups: int, ratio: float) -> Case:
    return Case.model_validate(
        {
            "scenario": "bench-dataset",
            "target": {"endpoints": [{"base_url": "http://127.0.0.1:9/v1", "model": "bench"}]},
            "load": {"requests": entries, "concurrency": 64},
            "dataset": {
                "source": "prefix_cache",
                "input_tokens": tokens,
                "output_tokens": 1024,
                "prefix_ratio": ratio,
                "block_size": block,
                "prefix_groups": groups,
            },
        }
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=640)
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--groups", type=int, default=1)
    ap.add_argument("--ratio", type=float, default=0.9)
    ap.add_argument("--keep", action="store_true", help="keep the temporary workspace and print its path")
    args = ap.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="caseledger-bench-"))
    ws = Workspace(root)
    case = _case(args.entries, args.tokens, args.block, args.groups, args.ratio)
    rows: list[tuple[str, float, float, float, str]] = []

    def step(name: str, fn: Callable[[], Any], note: Callable[[Any], str]) -> Any:
        t0, c0 = time.perf_counter(), _cpu_s()
        out = fn()
        rows.append((name, time.perf_counter() - t0, _cpu_s() - c0, _peak_mb(), note(out)))
        return out

    try:
        rows.append(("start (imports)", 0.0, _cpu_s(), _peak_mb(), ""))
        ident = step(
            "materialize (cold)",
            lambda: datasets.materialize(ws, case),
            lambda i: f"{i.dataset_id}, counting {i.counting.method}",
        )
        step("materialize (reuse)", lambda: datasets.materialize(ws, case), lambda i: "no tokenizer loaded")
        step("verify", lambda: datasets.verify(ws, ident.dataset_id), lambda h: f"sha256 {h[:12]}…")
        entries = step(
            "load_entries", lambda: datasets.load_entries(ws, ident.dataset_id), lambda e: f"{len(e)} entries"
        )
        step(
            "render_prompt x N (salted)",
            lambda: sum(len(datasets.render_prompt(e, "run-salt", ident)) for e in entries),
            lambda n: f"{n / 1e6:.0f} M chars",
        )
        size = (ws.dataset_dir(ident.dataset_id) / datasets.ENTRIES_FILE).stat().st_size
        print(
            f"dataset {ident.dataset_id}: {ident.entries} entries x {ident.body_tokens.max} body tokens, "
            f"{ident.chat_tokens.max} chat tokens, {ident.expected_cached_tokens.min} cached "
            f"(ratio {ident.expected_hit_ratio.min:.6f}), below target {ident.below_target.count}, "
            f"entries.jsonl {size / 2**20:.0f} MiB, transformers imported: {'transformers' in sys.modules}"
        )
        print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cpus")
        print(f"{'step':<28} {'wall s':>8} {'cpu s':>8} {'peak RSS MiB':>13}  note")
        for name, wall, cpu, peak, note in rows:
            print(f"{name:<28} {wall:>8.2f} {cpu:>8.2f} {peak:>13.0f}  {note}")
    finally:
        if args.keep:
            print(f"workspace kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
