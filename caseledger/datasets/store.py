"""Materialized datasets under ledger/datasets/<dataset_id>/: generated once under a lock, reused by id."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

import orjson

from caseledger.case.bounds import MAX_FREEZE_TOKENS
from caseledger.case.dataset import longest
from caseledger.case.model import Case
from caseledger.datasets import trace as _trace
from caseledger.datasets.identity import ENTRIES_FILE, IDENTITY_FILE, DatasetIdentity, Entry, dataset_id_for
from caseledger.errors import CaseInvalid, NotFound, quoted
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


GENERATION_WAIT_S = 3600.0  # case.bounds.MAX_FREEZE_TOKENS take 5-7.5 minutes to generate: ample for a waiter


def generation_tokens(ws: Workspace, case: Case) -> tuple[int, str]:
    """(input tokens materializing the case's dataset generates, the fields that make them), read without writing.
    Source 'file' counts 0: its prompts are written out in the file, not multiplied from numbers in the draft."""
    ds = case.dataset
    n = int(ds.entries or case.load.requests)
    if ds.source == "file":
        return 0, ""
    if ds.source == "trace":
        rows = _trace.read(ws, case).rows  # a bad trace is refused here as at generation: nothing is written
        return sum(r.input_length for r in rows), f"input_length of dataset.path '{quoted(ds.path)}' over {n} rows"
    count = "dataset.entries" if ds.entries not in (None, case.load.requests) else "load.requests"
    turns = " (every turn of dataset.sessions)" if ds.sessions is not None else ""
    most = longest(ds.input_tokens)
    each = f"dataset.input_tokens {most}" if isinstance(ds.input_tokens, int) else f"dataset.input_tokens max {most}"
    return n * most, f"{count} {n}{turns} x {each}"


def check_generation(ws: Workspace, cases: Iterable[tuple[str, Case]], source: str) -> None:
    """Refuse, before any dataset is generated, a freeze that would generate more than MAX_FREEZE_TOKENS input
    tokens over all its datasets (cases: what to call each in the answer, '' for a lone case; a dataset two cases
    share counts once, one already materialized not at all): CaseInvalid naming the fields and the fix."""
    seen: set[str] = set()
    parts: list[tuple[int, str, str]] = []
    sources: set[str] = set()
    for where, case in cases:
        dataset_id = dataset_id_for(case)
        if dataset_id in seen or (ws.dataset_dir(dataset_id) / IDENTITY_FILE).is_file():
            continue
        seen.add(dataset_id)
        sources.add(case.dataset.source)
        parts.append((*generation_tokens(ws, case), where))
    total = sum(n for n, _, _ in parts)
    if total <= MAX_FREEZE_TOKENS:
        return
    parts.sort(key=lambda p: -p[0])
    named = "; ".join(f"{where + ': ' if where else ''}{how} = {n:,}" for n, how, where in parts[:3])
    named += f"; and {len(parts) - 3} more dataset(s)" if len(parts) > 3 else ""
    fixes = [] if sources == {"trace"} else ["lower load.requests (or dataset.entries) or dataset.input_tokens"]
    if "trace" in sources:
        fixes.append("a trace: fewer of its rows (load.requests) or rows with a shorter input_length")
    fix = "; ".join(fixes)
    if len(parts) > 1:
        fix += (
            "; a campaign: fewer values on the axes that change the dataset, or freeze it in parts (a dataset an "
            "earlier freeze generated is reused, not counted)"
        )
    raise CaseInvalid(
        f"{source} would generate {total:,} input tokens at freeze over {len(parts)} dataset(s), above the "
        f"{MAX_FREEZE_TOKENS:,} one freeze may generate (case/bounds.py MAX_FREEZE_TOKENS): {named}",
        fix + "; nothing was written",
    )


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
