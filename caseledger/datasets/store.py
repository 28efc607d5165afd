"""Materialized datasets under ledger/datasets/<dataset_id>/: generated once under a lock, reused by id."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import orjson

from caseledger.case.model import Case
from caseledger.datasets import trace as _trace
from caseledger.datasets.identity import ENTRIES_FILE, IDENTITY_FILE, DatasetIdentity, Entry, dataset_id_for
from caseledger.errors import CaseInvalid, NotFound
from caseledger.workspace import Workspace, flocked, read_json, sha256_file
from caseledger.workspace.steps import step

# ------------------------------------------------------------------------------------ materialize


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _reuse(ws: Workspace, case: Case, dataset_id: str) -> DatasetIdentity:
    identity = load_identity(ws, dataset_id)
    ds = case.dataset
    if ds.source == "file" and ds.path and identity.source_sha256:
        src = ws.inside(ds.path, "dataset.path")
        if src.is_file() and (now := sha256_file(src)) != identity.source_sha256:
            raise CaseInvalid(
                f"dataset.path '{ds.path}' changed since dataset {dataset_id} was materialized "
                f"(sha256 {now[:12]}… now, {identity.source_sha256[:12]}… then)",
                "restore the file, or save the new prompts under a new path so they get their own dataset id",
            )
    return identity


GENERATION_WAIT_S = 3600.0  # case.bounds.MAX_DATASET_TOKENS take about 15 minutes to generate


def materialize(ws: Workspace, case: Case) -> DatasetIdentity:
    """The case's dataset: reused when identity.json exists (no tokenizer loaded), else generated once."""
    case = _trace.pin(ws, case.filled())  # a trace frozen before its hash was pinned: hashed now
    dataset_id = dataset_id_for(case)
    final = ws.dataset_dir(dataset_id)
    if (final / IDENTITY_FILE).is_file():
        return _reuse(ws, case, dataset_id)
    # lazy: generation needs numpy (and maybe a tokenizer); a reused dataset, the usual case, needs neither
    from caseledger.datasets.generate import generate_dataset, read_inputs

    inputs = read_inputs(ws, case)  # the prompts file and the tokenizer are checked before anything is written
    ws.datasets_dir.mkdir(parents=True, exist_ok=True)
    # a second caller waits on the lock, then finds the dataset the first one wrote (the holder may be generating
    # for minutes: the wait is bounded by the longest generation, not by the ledger's short locks)
    with flocked(ws.datasets_dir / f".{dataset_id}.lock", timeout_s=GENERATION_WAIT_S):
        if (final / IDENTITY_FILE).is_file():
            return _reuse(ws, case, dataset_id)
        if final.exists():
            raise CaseInvalid(
                f"{final} exists without {IDENTITY_FILE}; caseledger writes datasets by an atomic rename",
                f"move {final} out of the ledger and materialize again",
            )
        tmp = Path(tempfile.mkdtemp(prefix=f".{dataset_id}.", suffix=".tmp", dir=ws.datasets_dir))
        try:
            ds = case.dataset
            with step(f"generating dataset {dataset_id}: {ds.entries} entries, tokenizer {ds.tokenizer}"):
                identity = generate_dataset(ws, case, dataset_id, tmp, inputs)
            try:
                os.rename(tmp, final)
            except OSError:
                # Another writer that did not take the lock (e.g. a filesystem without flock) got there first.
                if (final / IDENTITY_FILE).is_file():
                    return _reuse(ws, case, dataset_id)
                raise
            _fsync_dir(ws.datasets_dir)
            return identity
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------------------------------ reads


def _existing(ws: Workspace, dataset_id: str, name: str) -> Path:
    path = ws.dataset_dir(dataset_id) / name
    if not path.is_file():
        raise NotFound(
            f"dataset {dataset_id} has no {name} in {ws.datasets_dir}",
            "freeze the case again (freeze_case) to materialize its dataset; dataset ids come from "
            "freeze_case or datasets.materialize",
        )
    return path


def load_identity(ws: Workspace, dataset_id: str) -> DatasetIdentity:
    """identity.json of a materialized dataset."""
    return DatasetIdentity.model_validate(read_json(_existing(ws, dataset_id, IDENTITY_FILE)))


def load_entries(ws: Workspace, dataset_id: str) -> list[Entry]:
    """All entries in order. A group's prefix is held once in memory, however many entries share it."""
    path = _existing(ws, dataset_id, ENTRIES_FILE)
    prefixes: dict[str, str] = {}
    out: list[Entry] = []
    with path.open("rb") as f:
        for line in f:
            e: Entry = orjson.loads(line)
            e["prefix"] = prefixes.setdefault(e["prefix"], e["prefix"])
            out.append(e)
    return out


def verify(ws: Workspace, dataset_id: str) -> str:
    """Recompute the sha256 of entries.jsonl and compare it (and the line count) with the identity."""
    identity = load_identity(ws, dataset_id)
    path = _existing(ws, dataset_id, ENTRIES_FILE)
    h = hashlib.sha256()
    lines = 0
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            lines += block.count(b"\n")
    got = h.hexdigest()
    fix = f"the file changed after it was materialized; move {path.parent} out of the ledger and freeze the case again"
    if got != identity.content_sha256:
        raise CaseInvalid(
            f"dataset {dataset_id}: {ENTRIES_FILE} sha256 is {got[:12]}…, identity.content_sha256 is "
            f"{identity.content_sha256[:12]}…",
            fix,
        )
    if lines != identity.entries:
        raise CaseInvalid(
            f"dataset {dataset_id}: {ENTRIES_FILE} has {lines} lines, identity.entries is {identity.entries}", fix
        )
    return got
