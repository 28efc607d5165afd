"""Text of exact token lengths: a tokenizer's word table, seeded draws of words, fixing a draw's length."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from caseledger.datasets import tokenizers as _tokenizer
from caseledger.datasets.counting import Tok
from caseledger.datasets.identity import SALT_WORDS
from caseledger.errors import CaseInvalid

_MIN_SALT_WORDS = 16
_FIX_ROUNDS = 16
_VOCAB_WORD = re.compile(r"^[\u0120\u2581]([a-z]{2,12})$")  # ByteLevel 'Ġ' / SentencePiece '▁' + letters


@dataclass(frozen=True)
class Words:
    """Word lists measured on one tokenizer."""

    text: list[str]  # words for body text (letters only)
    text_cost: npt.NDArray[np.int64]  # tokens of " w" for each text word
    cost: dict[str, int]  # tokens of " w", every known word
    ones: list[str]  # words whose " w" is one token: fill and salt
    bare_ones: list[str]  # words that are one token without the space: a prefix's first word
    maxcost: int
    mean: float


_WORDS: dict[int, tuple[Any, Words]] = {}  # id(raw tokenizer) -> (it, its word table); a few entries


def words_for(tok: Tok, name: str) -> Words:
    """The word table of a tokenizer, measured once per process (~0.2 s for the builtin)."""
    hit = _WORDS.get(id(tok.raw))
    if hit is None or hit[0] is not tok.raw:
        hit = _WORDS[id(tok.raw)] = (tok.raw, _measure_words(tok, name))
    return hit[1]


def _measure_words(tok: Tok, name: str) -> Words:
    words = _tokenizer.corpus_words()
    spaced = tok.count_batch([" " + w for w in words])
    bare = tok.count_batch(words)
    cost = dict(zip(words, spaced, strict=True))
    ones = [w for w, c in cost.items() if c == 1]
    if len(ones) < SALT_WORDS:
        # A large real vocabulary holds many more single-token words than the pseudo-English corpus.
        extra = sorted({m.group(1) for t in tok.vocab() if (m := _VOCAB_WORD.match(t))} - set(cost))[:8192]
        counts = tok.count_batch([" " + w for w in extra]) if extra else []
        ones = sorted(set(ones) | {w for w, c in zip(extra, counts, strict=True) if c == 1})
        cost.update({w: 1 for w in ones})
    if len(ones) < _MIN_SALT_WORDS:
        raise CaseInvalid(
            f"dataset.tokenizer '{name}' has only {len(ones)} single-token words; the salt slot and exact "
            f"lengths need at least {_MIN_SALT_WORDS}",
            "use a tokenizer with a word-level vocabulary (BPE or SentencePiece) or the 'builtin' tokenizer",
        )
    text = [w for w in words if cost[w] <= 8] or sorted(ones)
    text_cost = np.array([cost[w] for w in text], dtype=np.int64)
    return Words(
        text=text,
        text_cost=text_cost,
        cost=cost,
        ones=sorted(ones),
        bare_ones=sorted(w for w, c in zip(words, bare, strict=True) if c == 1),
        maxcost=int(text_cost.max()),
        mean=float(text_cost.mean()),
    )


def indices(key: str, count: int, modulo: int) -> npt.NDArray[np.int64]:
    """`count` indices below `modulo` from SHAKE-256 of the key: stable across Python/numpy versions."""
    raw = hashlib.shake_256(key.encode()).digest(4 * count)
    return np.frombuffer(raw, dtype=">u4").astype(np.int64) % modulo


def join_words(words: list[str], lead_space: bool) -> str:
    body = " ".join(words)
    return " " + body if lead_space and words else body


def draw(key: str, n: int, table: Words, first: str | None) -> list[str]:
    """Words whose " w" token costs add up to exactly n (`first`, if given, is one token)."""
    out: list[str] = []
    r = n
    if first is not None and r > 0:
        out.append(first)
        r -= 1
    rounds = 0
    while r > table.maxcost:
        idx = indices(f"{key}/{rounds}", int((r - table.maxcost) / table.mean) + 16, len(table.text))
        rounds += 1
        cum = np.cumsum(table.text_cost[idx])
        # Take words while at least maxcost tokens remain, so the loop never overshoots n.
        j = max(1, int(np.searchsorted(cum, r - table.maxcost, side="right")))
        out.extend(table.text[x] for x in idx[:j].tolist())
        r -= int(cum[j - 1])
    out.extend(table.ones[x] for x in indices(f"{key}/fill", r, len(table.ones)).tolist())
    return out


def length_of(tok: Tok, before: str, lead: bool) -> Callable[[list[str]], int]:
    """Token count of `before` + the joined words, by a full encode."""
    return lambda words: tok.count_batch([before + join_words(words, lead)])[0]


def fix_length(
    words: list[str], want: int, measure: Callable[[list[str]], int], key: str, table: Words, what: str
) -> list[str]:
    """Trim or extend a word list until `measure` says it is exactly `want` tokens."""
    for rounds in range(_FIX_ROUNDS):
        got = measure(words)
        if got == want:
            return words
        if got > want:
            excess = got - want
            while excess > 0 and len(words) > 1:
                excess -= table.cost.get(words.pop(), 1)
        else:
            fill = indices(f"{key}/{rounds}", want - got, len(table.ones)).tolist()
            words.extend(table.ones[x] for x in fill)
    raise CaseInvalid(
        f"could not build {what} of exactly {want} tokens with this tokenizer",
        "use the 'builtin' tokenizer or one with a ByteLevel/SentencePiece word split",
    )
