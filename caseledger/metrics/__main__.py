"""`python -m caseledger.metrics RUN_DIR [--rule aisbench|sglang] [--ratio R]`: the postprocessor.

Runs in a fresh process: reads RUN_DIR/case.json, load/raw.jsonl, load/anchor.json, the two /metrics
snapshots, load/stalls.jsonl, load/host.jsonl and load/accel.jsonl, writes
RUN_DIR/results/<PROCESSOR_VERSION>/<params>/<inputs>/{result.json, env.json} and prints one JSON line:
{"result", "raw_sha256", "requests", "ok", "failed", "reused"}. On failure it exits non-zero with the error
on stderr. It imports no network or model library (mcp, httpx, transformers).
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

import orjson

from caseledger.case.model import Case
from caseledger.errors import CaseledgerError
from caseledger.faults import fault
from caseledger.metrics._columns import read_raw
from caseledger.metrics._compute import compute_result
from caseledger.metrics._models import NATIVE_RULES, RATIO_MAX, RATIO_MIN_EXCLUSIVE
from caseledger.metrics._store import result_dir, write_env, write_result
from caseledger.records import read_jsonl
from caseledger.workspace import RESULT_FILE, RunPaths

EXIT_INPUT = 2  # the run directory lacks what postprocessing needs
EXIT_BUG = 1  # anything else: a traceback follows on stderr


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m caseledger.metrics", description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path, help="run directory (holds case.json and load/)")
    p.add_argument(
        "--rule",
        choices=NATIVE_RULES,
        default=None,
        help="native window rule (default: the case's measurement.native.rule)",
    )
    p.add_argument(
        "--ratio",
        type=float,
        default=None,
        help=f"sglang rule: share of peak concurrency, {RATIO_MIN_EXCLUSIVE:g} < R <= {RATIO_MAX:g} "
        "(default: the case's)",
    )
    return p


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None


def _read_anchor(path: Path) -> dict[str, Any] | None:  # JSON: load/anchor.json
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    return data if isinstance(data, dict) else None


def run(
    run_dir: Path,
    rule: str | None,
    ratio: float | None,
    argv: list[str],
) -> dict[str, Any]:  # JSON: the summary line
    """Postprocess one run directory; returns the one-line summary."""
    paths = RunPaths(run_dir)
    if not paths.case.is_file():
        raise CaseledgerError(f"no case.json in {run_dir}", "pass a run directory (ledger/runs/<run_id>)")
    case = Case.model_validate(orjson.loads(paths.case.read_bytes()))
    if not paths.raw.is_file():
        raise CaseledgerError(
            f"no raw file at {paths.raw}: the load phase wrote no records",
            "nothing to postprocess; check the load phase (zero requests is not a negative result)",
        )
    columns, source = read_raw(paths.raw, rel=str(paths.raw.relative_to(paths.root)))
    meta = orjson.loads(paths.run_json.read_bytes()) if paths.run_json.is_file() else {}
    result = compute_result(
        case,
        columns,
        anchor=_read_anchor(paths.load_anchor),
        metrics_before=_read_text(paths.metrics_before),
        metrics_after=_read_text(paths.metrics_after),
        rule=rule,
        ratio=ratio,
        source=source,
        stalls=read_jsonl(paths.load_stalls).items,
        host=read_jsonl(paths.load_host).items,
        accel=read_jsonl(paths.load_accel).items,
        chunks_are_content=not (isinstance(meta, dict) and meta.get("imported")),
    )
    reused = (result_dir(run_dir, result) / RESULT_FILE).exists()
    path = write_result(run_dir, result)
    write_env(path.parent, argv)
    return {
        "result": str(path.resolve()),
        "raw_sha256": source.sha256,
        "requests": result.requests,
        "ok": result.ok,
        "failed": result.failed,
        "reused": reused,
    }


def main(argv: list[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(args_list)
    try:
        summary = run(args.run_dir, args.rule, args.ratio, ["-m", "caseledger.metrics", *args_list])
    except CaseledgerError as e:
        print(f"caseledger.metrics: {e}", file=sys.stderr)
        return EXIT_INPUT
    except ValueError as e:  # invalid case.json or parameters
        print(f"caseledger.metrics: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_INPUT
    except Exception:
        print(
            "caseledger.metrics: postprocessing failed; the raw data is untouched, fix and run again",
            file=sys.stderr,
        )
        traceback.print_exc()
        return EXIT_BUG
    sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    return 0


if __name__ == "__main__":
    if fault("postprocess", "stop") is not None:  # test hook: a collector stopped (SIGSTOP) as it starts
        os.kill(os.getpid(), signal.SIGSTOP)
    code = main()
    gc.freeze()  # no final collection over every imported model at exit: ~0.15 s of teardown
    sys.exit(code)
