"""Writing entries.jsonl line by line, the per-entry figures kept in memory, and what every source shares."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import orjson

from caseledger.case.dataset import Dataset
from caseledger.datasets.identity import Counting, Entry, SaltSlot
from caseledger.datasets.words import indices
from caseledger.errors import CaseInvalid

CHUNK = 16  # suffixes encoded per batch: tokenizers Encodings are ~100 B per token


@dataclass
class Acc:
    """Per-entry figures accumulated while entries are written."""

    body: list[int]
    chat: list[int]
    cached: list[int]
    out: list[int] = field(default_factory=list)

    @classmethod
    def empty(cls) -> Acc:
        return cls([], [], [], [])


@dataclass(frozen=True)
class Result:
    acc: Acc
    counting: Counting
    salt: SaltSlot
    source_sha256: str | None


class Writer:
    """entries.jsonl written line by line; only the counts stay in memory."""

    def __init__(self, path: Path) -> None:
        self._f = path.open("wb")
        self.acc = Acc.empty()

    def add(self, entry: Entry) -> None:
        self._f.write(orjson.dumps(entry) + b"\n")
        self.acc.body.append(entry["body_tokens"])
        self.acc.chat.append(entry["chat_tokens"])
        self.acc.cached.append(entry["expected_cached_tokens"])
        self.acc.out.append(entry["output_tokens"])

    def close(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()


def make_entry(
    i: int, group: int, prefix: str, slot: str, suffix: str, body: int, chat: int, cached: int, out: int
) -> Entry:
    return Entry(
        i=i,
        group=group,
        prefix=prefix,
        salt_slot=slot,
        suffix=suffix,
        body_tokens=body,
        chat_tokens=chat,
        expected_cached_tokens=cached,
        expected_hit_ratio=cached / chat if chat else 0.0,
        output_tokens=out,
    )


def lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for j in range(n):
        if a[j] != b[j]:
            return j
    return n


def sample_entries(n: int, groups: int, seed: int) -> list[int]:
    """Entries re-encoded whole: both ends, each group's first (up to 8) and two picked by the seed."""
    picks = {0, n - 1, *range(min(groups, 8, n))}
    picks.update(int(x) for x in indices(f"caseledger/sample/{seed}", 2, n).tolist())
    return sorted(picks)


_T = TypeVar("_T")


def required(value: _T | None, field: str) -> _T:
    """A field the case validators guarantee for this source; a clear error if a caller skipped them."""
    if value is None:
        raise CaseInvalid(f"{field} is not set", f"give {field} in the case, then freeze_case it again")
    return value


def entry_count(ds: Dataset) -> int:
    """dataset.entries of a frozen case (freezing fills a null one from load.requests)."""
    return required(ds.entries, "dataset.entries")
