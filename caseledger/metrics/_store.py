"""Where results live: RUN_DIR/results/<processor_version>/<params_key>/<inputs_key>/result.json.

Nothing earlier is ever overwritten: the same inputs with the same parameters land in the same
directory (an identical rewrite is skipped), different parameters or inputs get their own directory,
and different content under an existing key is refused (the processor changed without a version bump).
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from caseledger.case.model import Case
from caseledger.errors import ResultConflict
from caseledger.metrics._models import PROCESSOR_VERSION
from caseledger.metrics._params import params_key, resolve_params
from caseledger.metrics._result import Result
from caseledger.workspace import RESULT_FILE, RunPaths, atomic_write, read_json_or_none, write_json

ENV_FILE = "env.json"


def result_dir(run_dir: Path, result: Result) -> Path:
    return RunPaths(run_dir).results / result.processor_version / result.params_key / result.inputs_key


def result_bytes(result: Result) -> bytes:
    return orjson.dumps(result.model_dump(mode="json"), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


def write_result(run_dir: Path, result: Result) -> Path:
    """Write result.json atomically; an identical existing file is kept as is. Returns its path."""
    path = result_dir(run_dir, result) / RESULT_FILE
    data = result_bytes(result)
    if path.exists():
        if path.read_bytes() == data:
            return path
        raise ResultConflict(
            f"{path} already holds a different result for processor {result.processor_version}, "
            f"params {result.params_key}, inputs {result.inputs_key}",
            "the processor's output changed without a version bump: raise "
            "caseledger.metrics.PROCESSOR_VERSION; earlier results are never overwritten",
        )
    atomic_write(path, data)
    return path


def env_info(argv: list[str]) -> dict[str, Any]:  # JSON: the result's env section
    """The interpreter and environment that produced a result (the seeds' collector failed on sys.path)."""
    try:
        version = metadata.version("caseledger")
    except metadata.PackageNotFoundError:
        version = None
    return {
        "argv": argv,
        "caseledger_version": version,
        "created_utc": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "cwd": os.getcwd(),
        "executable": sys.executable,
        "pid": os.getpid(),
        "processor_version": PROCESSOR_VERSION,
        "python": sys.version,
        "sys_path": list(sys.path),
    }


def write_env(directory: Path, argv: list[str]) -> Path:
    """env.json of the process that first wrote this result directory (kept on identical re-runs)."""
    path = directory / ENV_FILE
    if not path.exists():
        write_json(path, env_info(argv))
    return path


def _created(result_file: Path) -> float:
    env = read_json_or_none(result_file.parent / ENV_FILE)
    if isinstance(env, dict) and isinstance(env.get("created_utc"), str):
        try:
            return datetime.fromisoformat(env["created_utc"]).timestamp()
        except ValueError:
            pass
    return result_file.stat().st_mtime


def _newest(files: list[Path]) -> Result | None:
    for f in sorted(files, key=_created, reverse=True):
        try:
            return Result.model_validate_json(f.read_bytes())
        except (OSError, ValidationError, ValueError):
            continue  # an older schema or a damaged file: try the next newest
    return None


def default_params_key(run_dir: Path) -> str | None:
    """Params key the case's own measurement.native settings give (None: no readable case.json)."""
    try:
        case = Case.model_validate(orjson.loads(RunPaths(run_dir).case.read_bytes()))
    except (OSError, ValidationError, ValueError):
        return None
    p = resolve_params(case, None, None)
    return params_key(p.native_rule, p.native_ratio)


def latest_result(run_dir: Path) -> Result | None:
    """Newest result for the case's default parameters under this PROCESSOR_VERSION, else the newest any."""
    results = RunPaths(run_dir).results
    if not results.is_dir():
        return None
    key = default_params_key(run_dir)
    if key is not None:
        found = _newest(list((results / PROCESSOR_VERSION / key).glob(f"*/{RESULT_FILE}")))
        if found is not None:
            return found
    return _newest(list(results.glob(f"*/*/*/{RESULT_FILE}")))
