"""The synthetic and prefix_cache sources: entries built to exact token counts.

The body sent for entry i is

    prefix[group]  +  salt slot  +  suffix[i]

* prefix: a group's shared text of exactly P tokens ("" for synthetic), sized so that the chat-template
  head plus the prefix is a whole number of cache blocks reaching the target hit ratio;
* salt slot: K single-token words " w". Each entry has a default slot; a run replaces it with words
  picked from the run's salt, so a warm cache cannot hit past the shared prefix (DESIGN, "cache truth");
* suffix: unique text " w w ..." of exactly the remaining tokens.

Text is words of letters joined by single spaces, never ending in a space, so a ByteLevel pre-tokenizer
splits at every word and the token counts of the pieces add up. The prefix is tokenized once, each suffix
separately, and a sample of entries is re-checked by a full encode with the chat template; if a check
fails (a tokenizer whose merges cross word boundaries), every entry is counted by a full encode instead.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from caseledger.case.dataset import Dataset
from caseledger.datasets import lengths as _lengths
from caseledger.datasets.counting import Tok
from caseledger.datasets.entries import CHUNK, Acc, Result, Writer, entry_count, lcp, make_entry, sample_entries
from caseledger.datasets.identity import (
    DEFAULT_SALT,
    GENERATOR_VERSION,
    SALT_K,
    SALT_WORDS,
    Counting,
    SaltSlot,
    salt_text,
)
from caseledger.datasets.words import Words, draw, fix_length, indices, join_words, length_of, words_for
from caseledger.errors import CaseInvalid

# ------------------------------------------------------------------------------------ ratio rules


def target_ratio(prefix_ratio: float) -> Fraction:
    # The decimal the user wrote (0.9 is 9/10, not the binary float just above it).
    return Fraction(repr(prefix_ratio))


def meets(cached: int, chat: int, target: Fraction) -> bool:
    return chat > 0 and Fraction(cached, chat) >= target


def pct_floor(cached: int, chat: int) -> str:
    """cached/chat as a percentage truncated to 2 decimals: 117968/131076 is '89.99%', never '90.00%'."""
    q = cached * 10000 // chat if chat else 0
    return f"{q // 100}.{q % 100:02d}%"


@dataclass(frozen=True)
class Split:
    prefix_tokens: int  # P: body tokens of each group's shared prefix
    salt_k: int  # K: salt slot words
    suffix_tokens: int  # unique body tokens after the slot; P + K + suffix = input_tokens


def split_prefix(input_tokens: int, head: int, overhead: int, block: int, target: Fraction, shared: bool) -> Split:
    """Size the shared prefix: the fewest whole blocks of head + prefix reaching the target ratio.

    head: chat-template tokens before the content (shared by every request); overhead: template tokens
    in total. When the blocks the target needs do not fit (leaving the salt slot and one unique token),
    the most that fit are used and the entries are reported below the target by the caller.
    """
    k = min(SALT_K, input_tokens - 1)
    if not shared:
        return Split(0, k, input_tokens - k)
    chat = input_tokens + overhead
    need = math.ceil(target * chat / block)
    fit = (input_tokens - k - 1 + head) // block
    p = max(0, min(need, fit) * block - head)
    return Split(p, k, input_tokens - p - k)


@dataclass(frozen=True)
class _Layout:
    """What the constructed generator decided once, before any entry."""

    split: Split
    overhead: int  # chat tokens - body tokens (template), measured on a probe
    prefixes: list[str]  # per group, exactly split.prefix_tokens tokens
    shared_ids: list[list[int]]  # per group: ids of the chat-template head + prefix (what can be cached)
    slots: list[str]  # default salt slot per entry
    salt: SaltSlot


def _layout(ds: Dataset, tok: Tok, table: Words, key: str, shortest: int) -> _Layout:
    """shortest: the shortest entry's input tokens (the prefix must fit every entry: with drawn lengths the
    prefix is sized on the shortest, and longer entries expect a lower hit ratio, reported as below target)."""
    n, groups = entry_count(ds), int(ds.prefix_groups) if ds.source == "prefix_cache" else 1
    head = tok.count_batch([tok.head])[0] if tok.head else 0
    probe = join_words(draw(f"{key}/probe", 64, table, None), False)
    overhead = len(tok.chat_batch([probe])[0]) - tok.count_batch([probe])[0]
    split = split_prefix(
        shortest, head, overhead, int(ds.block_size), target_ratio(ds.prefix_ratio), ds.source == "prefix_cache"
    )
    # Distinct first words keep the groups' prefixes apart from their first token on.
    bare = table.bare_ones
    start = int(indices(f"{key}/firsts", 1, len(bare))[0]) if bare else 0
    prefixes: list[str] = []
    shared_ids: list[list[int]] = []
    for g in range(min(groups, n)):
        if not split.prefix_tokens:
            prefixes.append("")
            shared_ids.append(tok.encode_batch([tok.head])[0] if tok.head else [])
            continue
        first = bare[(start + g) % len(bare)] if bare else None
        lead = first is None
        words = draw(f"{key}/prefix/{g}", split.prefix_tokens, table, first)
        # The one tokenization of this prefix (with and without the template head, on two threads).
        alone, shared = tok.encode_batch([join_words(words, lead), tok.head + join_words(words, lead)])
        if len(alone) != split.prefix_tokens:
            words = fix_length(
                words, split.prefix_tokens, length_of(tok, "", lead), f"{key}/prefix-fix/{g}", table, f"prefix {g}"
            )
            shared = tok.encode_batch([tok.head + join_words(words, lead)])[0]
        prefixes.append(join_words(words, lead))
        shared_ids.append(shared)
    salt = SaltSlot(words=table.ones[:SALT_WORDS], k=split.salt_k)
    slots = [salt_text(DEFAULT_SALT, i, salt.words, salt.k) for i in range(n)]
    return _Layout(split, overhead, prefixes, shared_ids, slots, salt)


def unique_suffixes(
    key: str, lo: int, hi: int, tokens: Sequence[int], table: Words, seen: set[bytes], n: int
) -> list[str]:
    """Unique suffixes " w w ..." of tokens[i] tokens (by word costs) for entries lo..hi-1."""
    out = []
    for i in range(lo, hi):
        for attempt in range(100):
            text = join_words(draw(f"{key}/suffix/{i}/{attempt}", tokens[i], table, None), True)
            digest = hashlib.blake2b(text.encode(), digest_size=16).digest()
            if digest not in seen:
                seen.add(digest)
                out.append(text)
                break
        else:
            raise CaseInvalid(
                f"cannot make {n} unique suffixes of {tokens[i]} tokens",
                "raise dataset.input_tokens, or lower dataset.prefix_ratio or dataset.entries",
            )
    return out


def drawn_lengths(ds: Dataset) -> tuple[list[int], list[int]]:
    """Each entry's input (body) and output tokens: the fixed values, or drawn from their distributions."""
    n = entry_count(ds)
    ins = (
        [ds.input_tokens] * n
        if isinstance(ds.input_tokens, int)
        else _lengths.sample(ds.input_tokens, n, ds.seed, "input")
    )
    outs = (
        [ds.output_tokens] * n
        if isinstance(ds.output_tokens, int)
        else _lengths.sample(ds.output_tokens, n, ds.seed, "output")
    )
    return ins, outs


def generate_constructed(ds: Dataset, tok: Tok, name: str, path: Path) -> Result:
    """synthetic and prefix_cache: shared prefix per group + salt slot + unique suffix, exact lengths."""
    n, block = entry_count(ds), int(ds.block_size)
    ins, outs = drawn_lengths(ds)
    key = f"caseledger/{GENERATOR_VERSION}/{ds.seed}"
    table = words_for(tok, name)
    lay = _layout(ds, tok, table, key, min(ins))
    split, groups = lay.split, len(lay.prefixes)
    sufn = [L - split.prefix_tokens - split.salt_k for L in ins]  # unique tokens per entry (suffix_tokens: shortest)
    sample = sample_entries(n, groups, ds.seed)
    kept: dict[int, str] = {}  # suffixes of the sampled entries, for the boundary check

    # Composed pass: the prefix was tokenized once; each suffix is tokenized alone (and fixed if needed).
    w = Writer(path)
    seen: set[bytes] = set()
    for lo in range(0, n, CHUNK):
        hi = min(n, lo + CHUNK)
        sufs = unique_suffixes(key, lo, hi, sufn, table, seen, n)
        for i, suf, got in zip(range(lo, hi), sufs, tok.count_batch(sufs), strict=True):
            if got != sufn[i]:
                suf = join_words(
                    fix_length(
                        suf.split(" ")[1:], sufn[i], length_of(tok, "", True), f"{key}/fix/{i}", table, f"suffix {i}"
                    ),
                    True,
                )
            if i in sample:
                kept[i] = suf
            g = i % groups
            cached = len(lay.shared_ids[g]) // block * block
            w.add(make_entry(i, g, lay.prefixes[g], lay.slots[i], suf, ins[i], ins[i] + lay.overhead, cached, outs[i]))
    w.close()
    if _sample_agrees(tok, lay, [(i, kept[i]) for i in sample], w.acc, name):
        return Result(w.acc, Counting(method="composed", checked=sample), lay.salt, None)

    # Full pass (a tokenizer whose merges cross the boundaries): every entry encoded whole, its length
    # fixed against the whole body, its cached tokens taken from the ids it really shares with its group.
    w = Writer(path)
    seen = set()
    for lo in range(0, n, CHUNK):
        hi = min(n, lo + CHUNK)
        sufs = unique_suffixes(key, lo, hi, sufn, table, seen, n)
        for i, suf in zip(range(lo, hi), sufs, strict=True):
            g = i % groups
            before = lay.prefixes[g] + lay.slots[i]
            suf = join_words(
                fix_length(
                    suf.split(" ")[1:], ins[i], length_of(tok, before, True), f"{key}/fix/{i}", table, f"entry {i}"
                ),
                True,
            )
            chat_ids = tok.chat_batch([before + suf])[0]
            cached = lcp(chat_ids, lay.shared_ids[g]) // block * block
            w.add(make_entry(i, g, lay.prefixes[g], lay.slots[i], suf, ins[i], len(chat_ids), cached, outs[i]))
            if i == 0:
                _check_salt(tok.count_batch([_salted(lay, 0, suf)])[0], ins[i], name)
    w.close()
    return Result(w.acc, Counting(method="full", checked=list(range(n))), lay.salt, None)


def _sample_agrees(tok: Tok, lay: _Layout, sample: list[tuple[int, str]], acc: Acc, name: str) -> bool:
    """Do whole-entry encodes give the composed counts, each starting with its group's shared ids?

    Every sampled entry is encoded with the chat template; the first one also alone and with a run's
    salt. Two at a time: a tokenizers Encoding of 128K tokens holds ~100 bytes per token.
    """
    groups = len(lay.prefixes)
    for lo in range(0, len(sample), 2):
        part = sample[lo : lo + 2]
        bodies = [lay.prefixes[i % groups] + lay.slots[i] + suf for i, suf in part]
        for (i, _), c in zip(part, tok.chat_batch(bodies), strict=True):
            sid = lay.shared_ids[i % groups]
            if len(c) != acc.chat[i] or c[: len(sid)] != sid:
                return False
    i0, suf0 = sample[0]
    body0 = lay.prefixes[i0 % groups] + lay.slots[i0] + suf0
    plain, salted = tok.count_batch([body0, _salted(lay, i0, suf0)])
    if plain != acc.body[i0]:
        return False
    _check_salt(salted, plain, name)
    return True


def _salted(lay: _Layout, i: int, suffix: str) -> str:
    return lay.prefixes[i % len(lay.prefixes)] + salt_text("check", i, lay.salt.words, lay.salt.k) + suffix


def _check_salt(salted: int, body: int, name: str) -> None:
    """A run's salt must leave the body's token count unchanged (the slot words are one token each)."""
    if salted != body:
        raise CaseInvalid(
            f"dataset.tokenizer '{name}': a salted body has {salted} tokens instead of {body}",
            "the salt slot must be count-neutral; use the 'builtin' tokenizer, or set load.salt false "
            "and flush the engine's prefix cache before each run",
        )
