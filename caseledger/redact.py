"""Secrets a case references, masked as `***` in every text that came from outside.

A case references its secrets by variable name (target.api_key_env, service.env values written "${NAME}"); their
values live only in the environment of the processes that need them and are never copied into the ledger, in any
form (not even as a hash). Text from outside (a server's error body, an engine log line, an SSH error, an
exception) may still echo a value, so it is masked where it is first recorded (the load client's record, the
controller's phase evidence and events, a service's quoted log line) and again where text leaves (quoted(),
answers, HANDOFF.md, reports), which also masks text an older version recorded unmasked.

    MASK                what every occurrence of a secret becomes
    Secrets(values)     a masker over some values: .mask(text), .cut(text, n), .mask_obj(obj), .mask_bytes(data)
    remember(names)     this process masks the values of these variables from now on (only names are kept)
    current()           the Secrets of the remembered variables' values in this process's environment, now
    mask(text), cut(text, n), mask_obj(obj), mask_bytes(data)   the same with current()
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable
from typing import Any, TypeVar, cast
from urllib.parse import quote, quote_plus

T = TypeVar("T")

MASK = "***"
# Values shorter than this are not masked: a log level, a port, a device list ('0,1,2,3'), 'EMPTY' are common
# substrings of any text (and a few hex digits of a recorded sha256), so masking them would garble answers and
# evidence while hiding next to nothing; a real key is longer.
MIN_SECRET_CHARS = 8


def forms(value: str) -> set[str]:
    """The spellings a value takes in text from outside: as is, JSON-escaped (a server's JSON body quoting it,
    with or without ASCII escapes and escaped slashes), Python repr (an exception quoting it), URL-encoded."""
    out: set[str] = set()
    for v in {value, value.strip()}:
        if len(v) < MIN_SECRET_CHARS:  # the value's own length counts, not its (longer) escaped spellings
            continue
        js = json.dumps(v)[1:-1]
        out |= {
            v,
            js,
            js.replace("/", "\\/"),
            json.dumps(v, ensure_ascii=False)[1:-1],
            repr(v)[1:-1],
            repr(v.encode("utf-8", "backslashreplace"))[2:-1],
            quote(v, safe=""),
            quote_plus(v),
        }
    return out


class Secrets:
    """A masker over some secret values: each occurrence of any of their spellings (forms()) becomes MASK.
    Occurrences that overlap or touch are masked as one (no piece of a value is left between two masks)."""

    __slots__ = ("_forms", "_longest")

    def __init__(self, values: Iterable[str]) -> None:
        found = {f for v in values if v for f in forms(v)}
        self._forms = tuple(sorted(found, key=len, reverse=True))
        self._longest = len(self._forms[0]) if self._forms else 0

    def __bool__(self) -> bool:
        return bool(self._forms)

    def __repr__(self) -> str:  # never the values
        return f"Secrets({len(self._forms)} spellings)"

    def _spans(self, text: str) -> list[tuple[int, int]]:
        """Merged [start, end) ranges covered by some occurrence of some spelling, overlapping ones included."""
        spans = []
        for f in self._forms:
            i = text.find(f)
            while i >= 0:
                spans.append((i, i + len(f)))
                i = text.find(f, i + 1)
        spans.sort()
        merged: list[tuple[int, int]] = []
        for a, b in spans:
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        return merged

    @staticmethod
    def _replace(text: str, spans: list[tuple[int, int]]) -> str:
        out, at = [], 0
        for a, b in spans:
            out += [text[at:a], MASK]
            at = b
        out.append(text[at:])
        return "".join(out)

    def mask(self, text: str) -> str:
        if not self._forms or not any(f in text for f in self._forms):
            return text
        return self._replace(text, self._spans(text))

    def cut(self, text: str, n: int) -> str:
        """The first n characters of text, masked, with no piece of a secret left at the cut: an occurrence that
        crosses it is masked whole (cutting first could keep the first characters of a key)."""
        if len(text) <= n:
            return self.mask(text)
        if not self._forms:
            return text[:n]
        head = text[: n + self._longest]  # holds every occurrence that starts before the cut
        spans = [s for s in self._spans(head) if s[0] < n]
        return self._replace(head[: max(n, spans[-1][1]) if spans else n], spans)

    def mask_obj(self, obj: T) -> T:
        """A JSON-like value (dicts, lists, strings) with every string masked, keys included; the structure
        stays valid (the serialized form is never edited, so a value like 'true' cannot break it)."""
        return cast(T, self._mask_any(obj)) if self._forms else obj

    def _mask_any(self, obj: Any) -> Any:
        if isinstance(obj, str):
            return self.mask(obj)
        if isinstance(obj, dict):
            return {self._mask_any(k): self._mask_any(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return type(obj)(self._mask_any(v) for v in obj)
        return obj

    def mask_bytes(self, data: bytes) -> bytes:
        """Bytes (a copied log) masked as UTF-8 text; bytes that are not UTF-8 pass through unchanged."""
        if not self._forms:
            return data
        return self.mask(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")


_lock = threading.Lock()
_names: set[str] = set()
_cache: tuple[tuple[str, ...], Secrets] = ((), Secrets(()))


def remember(names: Iterable[str | None]) -> None:
    """Mask the values of these variables in this process from now on. Called wherever a case is read, so a
    process masks the secrets of every case it has seen; the names are kept, the values read when masking."""
    with _lock:
        _names.update(n for n in names if n)


def current() -> Secrets:
    """The masker of the remembered variables' values as this process's environment holds them now (a variable
    the process does not have masks nothing: it cannot have echoed it either)."""
    global _cache
    with _lock:
        values = tuple(sorted({v for n in _names if (v := os.environ.get(n))}))
        if values != _cache[0]:
            _cache = (values, Secrets(values))
        return _cache[1]


def mask(text: str) -> str:
    return current().mask(text)


def cut(text: str, n: int) -> str:
    return current().cut(text, n)


def mask_obj(obj: T) -> T:
    return current().mask_obj(obj)


def mask_bytes(data: bytes) -> bytes:
    return current().mask_bytes(data)
