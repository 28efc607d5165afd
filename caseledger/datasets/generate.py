"""Generating a dataset's entries (one per request) with exact token counts.

For the synthetic and prefix_cache sources the body sent for entry i is

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
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import numpy as np
import numpy.typing as npt
import orjson

from caseledger.case.dataset import Dataset, LengthDistribution
from caseledger.case.model import Case
from caseledger.datasets import lengths as _lengths
from caseledger.datasets import tokenizers as _tokenizer
from caseledger.datasets import trace as _trace
from caseledger.datasets.identity import (
    DEFAULT_SALT,
    ENTRIES_FILE,
    GENERATOR_VERSION,
    HIT_RATIO_DENOMINATOR,
    IDENTITY_FILE,
    SALT_K,
    SALT_WORDS,
    BelowTarget,
    Counting,
    DatasetIdentity,
    Entry,
    IntStats,
    Lengths,
    RatioStats,
    SaltSlot,
    SessionsInfo,
    TokenizerInfo,
    TraceInfo,
    salt_text,
)
from caseledger.errors import CaseInvalid, quoted
from caseledger.workspace import (
    Workspace,
    read_json_or_none,
    sha256_bytes,
    sha256_file,
    write_json,
)

_MIN_SALT_WORDS = 16
_CHUNK = 16  # suffixes encoded per batch: tokenizers Encodings are ~100 B per token
_FIX_ROUNDS = 16
_BELOW_FIRST = 8
_SENTINEL = "\u2063CASELEDGER-CONTENT\u2063"
_VOCAB_WORD = re.compile(r"^[\u0120\u2581]([a-z]{2,12})$")  # ByteLevel 'Ġ' / SentencePiece '▁' + letters


# ------------------------------------------------------------------------------------ ratio rules


def _target(prefix_ratio: float) -> Fraction:
    # The decimal the user wrote (0.9 is 9/10, not the binary float just above it).
    return Fraction(repr(prefix_ratio))


def _meets(cached: int, chat: int, target: Fraction) -> bool:
    return chat > 0 and Fraction(cached, chat) >= target


def _pct_floor(cached: int, chat: int) -> str:
    """cached/chat as a percentage truncated to 2 decimals: 117968/131076 is '89.99%', never '90.00%'."""
    q = cached * 10000 // chat if chat else 0
    return f"{q // 100}.{q % 100:02d}%"


@dataclass(frozen=True)
class _Plan:
    prefix_tokens: int  # P: body tokens of each group's shared prefix
    salt_k: int  # K: salt slot words
    suffix_tokens: int  # unique body tokens after the slot; P + K + suffix = input_tokens


def _plan(input_tokens: int, head: int, overhead: int, block: int, target: Fraction, shared: bool) -> _Plan:
    """Size the shared prefix: the fewest whole blocks of head + prefix reaching the target ratio.

    head: chat-template tokens before the content (shared by every request); overhead: template tokens
    in total. When the blocks the target needs do not fit (leaving the salt slot and one unique token),
    the most that fit are used and the entries are reported below the target by the caller.
    """
    k = min(SALT_K, input_tokens - 1)
    if not shared:
        return _Plan(0, k, input_tokens - k)
    chat = input_tokens + overhead
    need = math.ceil(target * chat / block)
    fit = (input_tokens - k - 1 + head) // block
    p = max(0, min(need, fit) * block - head)
    return _Plan(p, k, input_tokens - p - k)


# ------------------------------------------------------------------------------------- tokenizers


class _Tok(Protocol):
    head: str  # chat-template text before the content ("" when the template is not counted)
    raw: Any  # the underlying tokenizer object (loaded once per process by caseledger.tokenizer)

    def count_batch(self, texts: Sequence[str]) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def chat_batch(self, contents: Sequence[str]) -> list[list[int]]: ...

    def vocab(self) -> dict[str, int]: ...


class _FastTok:
    """The builtin: tokenizers.Tokenizer on tokenizer.json with ChatML, no transformers import."""

    def __init__(self, tok: Any, chat: bool) -> None:
        self._tok = self.raw = tok
        self._chat = chat
        self.head = _tokenizer.chatml(_SENTINEL).partition(_SENTINEL)[0] if chat else ""
        # encode_batch_fast (tokenizers >= 0.20) skips offsets: same ids, about 25% faster.
        self._batch = getattr(tok, "encode_batch_fast", tok.encode_batch)

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        return [len(e) for e in self._batch(list(texts), add_special_tokens=False)]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._batch(list(texts), add_special_tokens=False)]

    def chat_batch(self, contents: Sequence[str]) -> list[list[int]]:
        if not self._chat:
            return self.encode_batch(contents)
        return self.encode_batch([_tokenizer.chatml(c) for c in contents])

    def vocab(self) -> dict[str, int]:
        return dict(self._tok.get_vocab())


class _HFTok:
    """A local transformers tokenizer; the chat count comes from its own apply_chat_template."""

    def __init__(self, tok: Any, chat: bool, name: str) -> None:
        self._tok = self.raw = tok
        self._chat = chat
        self.head = ""
        if chat:
            try:
                rendered = tok.apply_chat_template(
                    [{"role": "user", "content": _SENTINEL}], tokenize=False, add_generation_prompt=True
                )
            except ValueError as exc:  # transformers: no chat template set
                raise CaseInvalid(
                    f"dataset.tokenizer '{name}' has no chat template ({exc})",
                    "set dataset.chat_template false, use target.api 'completions', "
                    "or add chat_template.jinja to the tokenizer directory",
                ) from exc
            head, sep, _ = str(rendered).partition(_SENTINEL)
            if not sep:
                raise CaseInvalid(
                    f"the chat template of '{name}' does not place the user content verbatim",
                    "set dataset.chat_template false, or use a tokenizer whose template keeps the content",
                )
            self.head = head

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        return [len(ids) for ids in self.encode_batch(texts)]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(ids) for ids in self._tok(list(texts), add_special_tokens=False)["input_ids"]]

    def chat_batch(self, contents: Sequence[str]) -> list[list[int]]:
        if not self._chat:
            return self.encode_batch(contents)
        template = self._tok.apply_chat_template
        return [
            list(
                template([{"role": "user", "content": c}], tokenize=True, add_generation_prompt=True, return_dict=False)
            )
            for c in contents
        ]

    def vocab(self) -> dict[str, int]:
        return dict(self._tok.get_vocab())


def _open_tokenizer(name: str, chat: bool) -> _Tok:
    if name == "builtin":
        return _FastTok(_tokenizer.load_fast(name), chat)
    try:
        tok = _tokenizer.load(name)
    except CaseInvalid:
        raise
    except Exception as e:  # transformers raises ValueError, OSError, KeyError… for a directory it cannot read
        raise CaseInvalid(
            f"dataset.tokenizer '{quoted(name)}' cannot be loaded: {quoted(e, 160)}",
            "give 'builtin' or a local directory holding a Hugging Face tokenizer (tokenizer.json, "
            "tokenizer_config.json)",
        ) from None
    return _HFTok(tok, chat, name)


@dataclass(frozen=True)
class Inputs:
    """What a dataset is generated from, read and checked before anything is written."""

    tok: _Tok
    rows: list[tuple[str, int]] | None = None  # source 'file': (prompt, output_tokens)
    source_sha256: str | None = None
    trace: _trace.Trace | None = None  # source 'trace'


def read_inputs(ws: Workspace, case: Case) -> Inputs:
    """The prompts file and the tokenizer, checked without writing anything (a refused freeze writes nothing)."""
    ds = case.dataset
    chat = ds.chat_template and case.target.api == "chat"
    if ds.source == "file":
        rows, source_sha256 = _read_prompts(ws, ds)  # a short or broken file fails before any tokenizer
        return Inputs(_open_tokenizer(tokenizer_path(ws, ds.tokenizer), chat), rows, source_sha256)
    if ds.source == "trace":
        tr = _trace.read(ws, case)  # a broken trace fails before any tokenizer
        return Inputs(_open_tokenizer(tokenizer_path(ws, ds.tokenizer), chat), None, tr.sha256, tr)
    for side in ("input_tokens", "output_tokens"):
        if isinstance(d := getattr(ds, side), LengthDistribution):
            _lengths.check(d, f"dataset.{side}")
    if ds.sessions is not None:
        session_turns(case)  # a total of turns other than N fails before any tokenizer
    return Inputs(_open_tokenizer(tokenizer_path(ws, ds.tokenizer), chat))


def session_turns(case: Case) -> list[int]:
    """Turns of each conversation (dataset.sessions), drawn once and seeded; their total must be load.requests."""
    ss = case.dataset.sessions
    assert ss is not None
    if isinstance(ss.turns, int):
        turns = [ss.turns] * ss.count
    else:
        _lengths.check(ss.turns, "dataset.sessions.turns")
        turns = _lengths.sample(ss.turns, ss.count, int(case.dataset.seed), "turns")
    if sum(turns) != case.load.requests:
        raise CaseInvalid(
            f"dataset.sessions draws {sum(turns)} turns in all ({ss.count} conversations, turns "
            f"{min(turns)}..{max(turns)}) but load.requests is {case.load.requests}; N is the total of turns",
            f"set load.requests to {sum(turns)} (the draw is fixed by dataset.seed), or give dataset.sessions.turns "
            "as an integer",
        )
    return turns


def _think_times(ds: Dataset, n: int) -> list[float]:
    """The wait before each entry's turn, seconds (the first turn of a conversation waits none)."""
    think = _required(ds.sessions, "dataset.sessions").think_time_ms
    if isinstance(think, int):
        return [think / 1000.0] * n
    _lengths.check(think, "dataset.sessions.think_time_ms")
    return [t / 1000.0 for t in _lengths.sample(think, n, ds.seed, "think")]


def _annotate_sessions(case: Case, path: Path) -> SessionsInfo:
    """Number the entries as turns of their conversations, in order (conversation 0's turns, then 1's...)."""
    ds = case.dataset
    turns = session_turns(case)
    think = _think_times(ds, sum(turns))
    where = [(s, k, n) for s, n in enumerate(turns) for k in range(n)]
    lines = path.read_bytes().splitlines()
    out = []
    for i, line in enumerate(lines):
        e = orjson.loads(line)
        s, k, n = where[i]
        e.update(session=s, turn=k, turns=n, think_s=0.0 if k == 0 else think[i])
        out.append(orjson.dumps(e) + b"\n")
    with path.open("wb") as f:
        f.write(b"".join(out))
        f.flush()
        os.fsync(f.fileno())
    waits = sum(think[i] for i, (_, k, _) in enumerate(where) if k)
    return SessionsInfo(
        count=len(turns), turns=sum(turns), turns_min=min(turns), turns_max=max(turns), think_s_total=round(waits, 6)
    )


def tokenizer_path(ws: Workspace, name: str) -> str:
    """dataset.tokenizer as loaded: 'builtin', an absolute or ~ path as written, a relative one in the workspace
    (as a service's relative argv paths: the same case means the same files whoever calls caseledger)."""
    if name == "builtin" or name.startswith(("/", "~")):
        return name
    return str(ws.root / name)


def _tokenizer_info(name: str, revision: str | None, local: str) -> TokenizerInfo:
    path = _tokenizer.resolve(local)
    source = read_json_or_none(path / _tokenizer.GGUF_SOURCE)
    if revision is None and source:  # converted from a GGUF: the file's hash and the chat template counted with
        tpl = path / "chat_template.jinja"
        tpl_sha = sha256_file(tpl)[:16] if tpl.is_file() else "-"
        revision = f"gguf-sha256:{source['sha256']};chat_template-sha256:{tpl_sha}"
    if revision is None:
        tj = path / "tokenizer.json"
        if tj.is_file():
            revision = "sha256:" + sha256_file(tj)
        else:  # e.g. a GGUF-only directory: hash every regular file, by name
            h = hashlib.sha256()
            for f in sorted(p for p in path.iterdir() if p.is_file()):
                h.update(f.name.encode() + b"\0" + sha256_file(f).encode())
            revision = "sha256-dir:" + h.hexdigest()
    return TokenizerInfo(name=name, revision=revision, path=str(path))


# ------------------------------------------------------------------------------------------ words


@dataclass(frozen=True)
class _Words:
    """Word lists measured on one tokenizer."""

    text: list[str]  # words for body text (letters only)
    text_cost: npt.NDArray[np.int64]  # tokens of " w" for each text word
    cost: dict[str, int]  # tokens of " w", every known word
    ones: list[str]  # words whose " w" is one token: fill and salt
    bare_ones: list[str]  # words that are one token without the space: a prefix's first word
    maxcost: int
    mean: float


_WORDS: dict[int, tuple[Any, _Words]] = {}  # id(raw tokenizer) -> (it, its word table); a few entries


def _words_for(tok: _Tok, name: str) -> _Words:
    """The word table of a tokenizer, measured once per process (~0.2 s for the builtin)."""
    hit = _WORDS.get(id(tok.raw))
    if hit is None or hit[0] is not tok.raw:
        hit = _WORDS[id(tok.raw)] = (tok.raw, _measure_words(tok, name))
    return hit[1]


def _measure_words(tok: _Tok, name: str) -> _Words:
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
    return _Words(
        text=text,
        text_cost=text_cost,
        cost=cost,
        ones=sorted(ones),
        bare_ones=sorted(w for w, c in zip(words, bare, strict=True) if c == 1),
        maxcost=int(text_cost.max()),
        mean=float(text_cost.mean()),
    )


def _indices(key: str, count: int, modulo: int) -> npt.NDArray[np.int64]:
    """`count` indices below `modulo` from SHAKE-256 of the key: stable across Python/numpy versions."""
    raw = hashlib.shake_256(key.encode()).digest(4 * count)
    return np.frombuffer(raw, dtype=">u4").astype(np.int64) % modulo


def _join(words: list[str], lead_space: bool) -> str:
    body = " ".join(words)
    return " " + body if lead_space and words else body


def _draw(key: str, n: int, table: _Words, first: str | None) -> list[str]:
    """Words whose " w" token costs add up to exactly n (`first`, if given, is one token)."""
    out: list[str] = []
    r = n
    if first is not None and r > 0:
        out.append(first)
        r -= 1
    rounds = 0
    while r > table.maxcost:
        idx = _indices(f"{key}/{rounds}", int((r - table.maxcost) / table.mean) + 16, len(table.text))
        rounds += 1
        cum = np.cumsum(table.text_cost[idx])
        # Take words while at least maxcost tokens remain, so the loop never overshoots n.
        j = max(1, int(np.searchsorted(cum, r - table.maxcost, side="right")))
        out.extend(table.text[x] for x in idx[:j].tolist())
        r -= int(cum[j - 1])
    out.extend(table.ones[x] for x in _indices(f"{key}/fill", r, len(table.ones)).tolist())
    return out


def _length_of(tok: _Tok, before: str, lead: bool) -> Callable[[list[str]], int]:
    """Token count of `before` + the joined words, by a full encode."""
    return lambda words: tok.count_batch([before + _join(words, lead)])[0]


def _fix(
    words: list[str], want: int, measure: Callable[[list[str]], int], key: str, table: _Words, what: str
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
            fill = _indices(f"{key}/{rounds}", want - got, len(table.ones)).tolist()
            words.extend(table.ones[x] for x in fill)
    raise CaseInvalid(
        f"could not build {what} of exactly {want} tokens with this tokenizer",
        "use the 'builtin' tokenizer or one with a ByteLevel/SentencePiece word split",
    )


# ------------------------------------------------------------------------------------- generation


@dataclass
class _Acc:
    """Per-entry figures accumulated while entries are written."""

    body: list[int]
    chat: list[int]
    cached: list[int]
    out: list[int] = field(default_factory=list)

    @classmethod
    def empty(cls) -> _Acc:
        return cls([], [], [], [])


@dataclass(frozen=True)
class _Result:
    acc: _Acc
    counting: Counting
    salt: SaltSlot
    source_sha256: str | None


class _Writer:
    """entries.jsonl written line by line; only the counts stay in memory."""

    def __init__(self, path: Path) -> None:
        self._f = path.open("wb")
        self.acc = _Acc.empty()

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


def _entry(
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


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for j in range(n):
        if a[j] != b[j]:
            return j
    return n


def _sample(n: int, groups: int, seed: int) -> list[int]:
    """Entries re-encoded whole: both ends, each group's first (up to 8) and two picked by the seed."""
    picks = {0, n - 1, *range(min(groups, 8, n))}
    picks.update(int(x) for x in _indices(f"caseledger/sample/{seed}", 2, n).tolist())
    return sorted(picks)


@dataclass(frozen=True)
class _Layout:
    """What the constructed generator decided once, before any entry."""

    plan: _Plan
    overhead: int  # chat tokens - body tokens (template), measured on a probe
    prefixes: list[str]  # per group, exactly plan.prefix_tokens tokens
    shared_ids: list[list[int]]  # per group: ids of the chat-template head + prefix (what can be cached)
    slots: list[str]  # default salt slot per entry
    salt: SaltSlot


_T = TypeVar("_T")


def _required(value: _T | None, field: str) -> _T:
    """A field the case validators guarantee for this source; a clear error if a caller skipped them."""
    if value is None:
        raise CaseInvalid(f"{field} is not set", f"give {field} in the case, then freeze_case it again")
    return value


def _entries(ds: Dataset) -> int:
    """dataset.entries of a frozen case (freezing fills a null one from load.requests)."""
    return _required(ds.entries, "dataset.entries")


def _layout(ds: Dataset, tok: _Tok, table: _Words, key: str, shortest: int) -> _Layout:
    """shortest: the shortest entry's input tokens (the prefix must fit every entry: with drawn lengths the
    prefix is sized on the shortest, and longer entries expect a lower hit ratio, reported as below target)."""
    n, groups = _entries(ds), int(ds.prefix_groups) if ds.source == "prefix_cache" else 1
    head = tok.count_batch([tok.head])[0] if tok.head else 0
    probe = _join(_draw(f"{key}/probe", 64, table, None), False)
    overhead = len(tok.chat_batch([probe])[0]) - tok.count_batch([probe])[0]
    plan = _plan(shortest, head, overhead, int(ds.block_size), _target(ds.prefix_ratio), ds.source == "prefix_cache")
    # Distinct first words keep the groups' prefixes apart from their first token on.
    bare = table.bare_ones
    start = int(_indices(f"{key}/firsts", 1, len(bare))[0]) if bare else 0
    prefixes: list[str] = []
    shared_ids: list[list[int]] = []
    for g in range(min(groups, n)):
        if not plan.prefix_tokens:
            prefixes.append("")
            shared_ids.append(tok.encode_batch([tok.head])[0] if tok.head else [])
            continue
        first = bare[(start + g) % len(bare)] if bare else None
        lead = first is None
        words = _draw(f"{key}/prefix/{g}", plan.prefix_tokens, table, first)
        # The one tokenization of this prefix (with and without the template head, on two threads).
        alone, shared = tok.encode_batch([_join(words, lead), tok.head + _join(words, lead)])
        if len(alone) != plan.prefix_tokens:
            words = _fix(
                words, plan.prefix_tokens, _length_of(tok, "", lead), f"{key}/prefix-fix/{g}", table, f"prefix {g}"
            )
            shared = tok.encode_batch([tok.head + _join(words, lead)])[0]
        prefixes.append(_join(words, lead))
        shared_ids.append(shared)
    salt = SaltSlot(words=table.ones[:SALT_WORDS], k=plan.salt_k)
    slots = [salt_text(DEFAULT_SALT, i, salt.words, salt.k) for i in range(n)]
    return _Layout(plan, overhead, prefixes, shared_ids, slots, salt)


def _suffixes(key: str, lo: int, hi: int, tokens: Sequence[int], table: _Words, seen: set[bytes], n: int) -> list[str]:
    """Unique suffixes " w w ..." of tokens[i] tokens (by word costs) for entries lo..hi-1."""
    out = []
    for i in range(lo, hi):
        for attempt in range(100):
            text = _join(_draw(f"{key}/suffix/{i}/{attempt}", tokens[i], table, None), True)
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
    n = _entries(ds)
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


def _generate_constructed(ds: Dataset, tok: _Tok, name: str, path: Path) -> _Result:
    """synthetic and prefix_cache: shared prefix per group + salt slot + unique suffix, exact lengths."""
    n, block = _entries(ds), int(ds.block_size)
    ins, outs = drawn_lengths(ds)
    key = f"caseledger/{GENERATOR_VERSION}/{ds.seed}"
    table = _words_for(tok, name)
    lay = _layout(ds, tok, table, key, min(ins))
    plan, groups = lay.plan, len(lay.prefixes)
    sufn = [L - plan.prefix_tokens - plan.salt_k for L in ins]  # unique tokens per entry (plan.suffix_tokens: shortest)
    sample = _sample(n, groups, ds.seed)
    kept: dict[int, str] = {}  # suffixes of the sampled entries, for the boundary check

    # Composed pass: the prefix was tokenized once; each suffix is tokenized alone (and fixed if needed).
    w = _Writer(path)
    seen: set[bytes] = set()
    for lo in range(0, n, _CHUNK):
        hi = min(n, lo + _CHUNK)
        sufs = _suffixes(key, lo, hi, sufn, table, seen, n)
        for i, suf, got in zip(range(lo, hi), sufs, tok.count_batch(sufs), strict=True):
            if got != sufn[i]:
                suf = _join(
                    _fix(
                        suf.split(" ")[1:], sufn[i], _length_of(tok, "", True), f"{key}/fix/{i}", table, f"suffix {i}"
                    ),
                    True,
                )
            if i in sample:
                kept[i] = suf
            g = i % groups
            cached = len(lay.shared_ids[g]) // block * block
            w.add(_entry(i, g, lay.prefixes[g], lay.slots[i], suf, ins[i], ins[i] + lay.overhead, cached, outs[i]))
    w.close()
    if _sample_agrees(tok, lay, [(i, kept[i]) for i in sample], w.acc, name):
        return _Result(w.acc, Counting(method="composed", checked=sample), lay.salt, None)

    # Full pass (a tokenizer whose merges cross the boundaries): every entry encoded whole, its length
    # fixed against the whole body, its cached tokens taken from the ids it really shares with its group.
    w = _Writer(path)
    seen = set()
    for lo in range(0, n, _CHUNK):
        hi = min(n, lo + _CHUNK)
        sufs = _suffixes(key, lo, hi, sufn, table, seen, n)
        for i, suf in zip(range(lo, hi), sufs, strict=True):
            g = i % groups
            before = lay.prefixes[g] + lay.slots[i]
            suf = _join(
                _fix(suf.split(" ")[1:], ins[i], _length_of(tok, before, True), f"{key}/fix/{i}", table, f"entry {i}"),
                True,
            )
            chat_ids = tok.chat_batch([before + suf])[0]
            cached = _lcp(chat_ids, lay.shared_ids[g]) // block * block
            w.add(_entry(i, g, lay.prefixes[g], lay.slots[i], suf, ins[i], len(chat_ids), cached, outs[i]))
            if i == 0:
                _check_salt(tok.count_batch([_salted(lay, 0, suf)])[0], ins[i], name)
    w.close()
    return _Result(w.acc, Counting(method="full", checked=list(range(n))), lay.salt, None)


def _sample_agrees(tok: _Tok, lay: _Layout, sample: list[tuple[int, str]], acc: _Acc, name: str) -> bool:
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


def _read_prompts(ws: Workspace, ds: Dataset) -> tuple[list[tuple[str, int]], str]:
    """file: the first dataset.entries (prompt, output_tokens) of the JSONL, and the file's sha256."""
    raw = _trace.read_source(
        ws,
        _required(ds.path, "dataset.path"),
        'put a JSONL file of {"prompt": ...} lines inside the workspace and give its relative path',
    )
    rows: list[tuple[str, int]] = []
    for no, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise CaseInvalid(
                f"dataset.path '{ds.path}' line {no} is not JSON ({exc})", "write one JSON object per line"
            ) from exc
        obj = obj if isinstance(obj, dict) else {}
        prompt, out = obj.get("prompt"), obj.get("output_tokens", ds.output_tokens)
        if not (isinstance(prompt, str) and prompt and type(out) is int and out >= 1):
            raise CaseInvalid(
                f"dataset.path '{ds.path}' line {no}: expected {{\"prompt\": non-empty string, "
                '"output_tokens": optional int >= 1}',
                "fix that line of the file",
            )
        rows.append((prompt, out))
        if len(rows) == _entries(ds):
            break
    if len(rows) < _entries(ds):
        raise CaseInvalid(
            f"dataset.path '{ds.path}' has {len(rows)} prompts but dataset.entries is {ds.entries} "
            "(one entry per formal request)",
            f"add prompts to the file, or lower dataset.entries (and load.requests) to at most {len(rows)}",
        )
    return rows, sha256_bytes(raw)


def _generate_file(rows: list[tuple[str, int]], source_sha256: str, ds: Dataset, tok: _Tok, path: Path) -> _Result:
    """file: the prompts as is, each encoded whole (alone and with the chat template); no salt slot."""
    head = len(tok.encode_batch([tok.head])[0]) if tok.head else 0
    cached = head // ds.block_size * ds.block_size
    w = _Writer(path)
    for lo in range(0, len(rows), _CHUNK):
        chunk = rows[lo : lo + _CHUNK]
        prompts = [p for p, _ in chunk]
        bodies = [len(ids) for ids in tok.encode_batch(prompts)]
        chats = [len(ids) for ids in tok.chat_batch(prompts)]
        for j, ((prompt, out), b, c) in enumerate(zip(chunk, bodies, chats, strict=True)):
            w.add(_entry(lo + j, 0, "", "", prompt, b, c, cached, out))
    w.close()
    return _Result(
        w.acc, Counting(method="full", checked=list(range(len(rows)))), SaltSlot(words=[], k=0), source_sha256
    )


def _trace_blocks(key: str, ids: set[int], block: int, tok: _Tok, table: _Words) -> dict[int, str]:
    """One text of exactly `block` tokens per hash id (" w w ...", drawn from the id: the same id, the same
    tokens, in every row and every dataset of this seed)."""
    out: dict[int, str] = {}
    todo = sorted(ids)
    for lo in range(0, len(todo), _CHUNK):
        part = todo[lo : lo + _CHUNK]
        words = [_draw(f"{key}/block/{h}", block, table, None) for h in part]
        texts = [_join(w, True) for w in words]
        for h, w, text, got in zip(part, words, texts, tok.count_batch(texts), strict=True):
            if got != block:
                text = _join(
                    _fix(w, block, _length_of(tok, "", True), f"{key}/block-fix/{h}", table, f"block {h}"), True
                )
            out[h] = text
    return out


@dataclass(frozen=True)
class _TraceEntry:
    row: _trace.TraceRow
    blocks: int  # leading hash ids built as shared blocks (whole blocks that fit the input length)
    seen: int  # of them, how many an earlier row already sent (the longest prefix of blocks seen before)
    tail: int  # unique tokens after the blocks


def _trace_layout(rows: list[_trace.TraceRow], block: int, fixed: int, path: str) -> list[_TraceEntry]:
    """Per row: blocks that fit, the shared prefix an earlier row planned (a trie of block-id prefixes), the
    tail. `fixed`: tokens ahead of the blocks in every prompt (first word + salt slot)."""
    trie: dict[tuple[int, int], int] = {}  # (parent node, hash id) -> node; node 0 is the root
    out = []
    for r in rows:
        room = r.input_length - fixed
        if room < 1:
            raise CaseInvalid(
                f"dataset.path '{quoted(path)}' row {r.row}: input_length {r.input_length} is shorter than the "
                f"{fixed + 1} tokens every trace prompt needs (a first word, the {fixed - 1}-word salt slot, one more)",
                f"raise that row's input_length to at least {fixed + 1}, or drop the row",
            )
        nb = min(len(r.hash_ids), room // block)
        node, seen, prefix = 0, 0, True
        for h in r.hash_ids[:nb]:
            nxt = trie.get((node, h))
            if nxt is None:
                prefix = False
                nxt = trie[(node, h)] = len(trie) + 1
            elif prefix:
                seen += 1
            node = nxt
        out.append(_TraceEntry(r, nb, seen, room - nb * block))
    return out


def _generate_trace(tr: _trace.Trace, ds: Dataset, tok: _Tok, name: str, path: Path) -> _Result:
    """trace: first word + salt slot (one per run) + the row's hash-id blocks + a unique tail, exact lengths.

    The first word and the slot lead every prompt, so the run's salt keeps one run's prompts apart from the
    next run's while the blocks stay shared exactly as the trace shares them inside a run. A request's
    planned shared prefix (expected_cached_tokens) is the chat-template head, the first word, the slot and
    the blocks an earlier row already sent; the first request plans none.
    """
    block = int(ds.block_size)
    key = f"caseledger/{GENERATOR_VERSION}/trace/{ds.seed}"
    table = _words_for(tok, name)
    k = SALT_K
    lay = _trace_layout(tr.rows, block, 1 + k, str(ds.path))
    bare = table.bare_ones
    first = bare[int(_indices(f"{key}/first", 1, len(bare))[0])] if bare else table.ones[0]
    salt = SaltSlot(words=table.ones[:SALT_WORDS], k=k, per_run=True)
    slot = salt_text(DEFAULT_SALT, 0, salt.words, k)
    texts = _trace_blocks(key, {h for e in lay for h in e.row.hash_ids[: e.blocks]}, block, tok, table)
    head = tok.count_batch([tok.head])[0] if tok.head else 0
    probe = _join(_draw(f"{key}/probe", 64, table, None), False)
    overhead = len(tok.chat_batch([probe])[0]) - tok.count_batch([probe])[0]
    lead = first + slot
    seen_tails: set[bytes] = set()
    bodies: list[tuple[str, str]] = []  # (suffix, shared-prefix text inside the suffix)
    tails = [e.tail for e in lay]
    for i, e in enumerate(lay):
        blocks = [texts[h] for h in e.row.hash_ids[: e.blocks]]
        tail = ""
        if e.tail:
            tail = _suffixes(f"{key}/tail", i, i + 1, tails, table, seen_tails, len(lay))[0]
            if tok.count_batch([tail])[0] != e.tail:
                tail = _join(
                    _fix(
                        tail.split(" ")[1:],
                        e.tail,
                        _length_of(tok, "", True),
                        f"{key}/tail-fix/{i}",
                        table,
                        f"tail of row {e.row.row}",
                    ),
                    True,
                )
        bodies.append(("".join(blocks) + tail, "".join(blocks[: e.seen])))
    # composed counts, checked on a sample by whole encodes; a tokenizer whose merges cross the pieces gets
    # every entry encoded whole and its shared prefix from the ids it really shares
    sample = _sample(len(lay), 1, ds.seed)
    whole = [(lead + bodies[i][0]) for i in sample]
    composed = all(
        len(c) == lay[i].row.input_length + overhead and b == lay[i].row.input_length
        for i, c, b in zip(sample, tok.chat_batch(whole), tok.count_batch(whole), strict=True)
    )
    w = _Writer(path)
    for i, (e, (suffix, shared_text)) in enumerate(zip(lay, bodies, strict=True)):
        if composed:
            body, chat = e.row.input_length, e.row.input_length + overhead
            planned = 0 if i == 0 else head + 1 + k + e.seen * block
        else:
            ids = tok.chat_batch([lead + suffix])[0]
            body, chat = tok.count_batch([lead + suffix])[0], len(ids)
            pre = tok.encode_batch([tok.head + lead + shared_text])[0]
            planned = 0 if i == 0 else _lcp(ids, pre)
        entry = _entry(i, 0, first, slot, suffix, body, chat, planned, e.row.output_length)
        entry["trace_row"] = e.row.row
        entry["arrival_s"] = (e.row.timestamp_ms - tr.rows[0].timestamp_ms) / 1000.0
        entry["shared_blocks"] = e.seen
        w.add(entry)
    w.close()
    method: Literal["composed", "full"] = "composed" if composed else "full"
    return _Result(
        w.acc, Counting(method=method, checked=sample if composed else list(range(len(lay)))), salt, tr.sha256
    )


def _trace_info(tr: _trace.Trace, ds: Dataset, acc: _Acc, path: Path) -> TraceInfo:
    shared = 0
    ids: set[int] = set()
    with path.open("rb") as f:
        for line in f:
            shared += int(orjson.loads(line).get("shared_blocks", 0))
    for r in tr.rows:
        ids.update(r.hash_ids)
    return TraceInfo(
        rows=len(tr.rows),
        rows_in_file=tr.rows_in_file,
        first_row=tr.rows[0].row,
        block_size=int(ds.block_size),
        distinct_blocks=len(ids),
        shared_blocks=shared,
        planned_shared_tokens=sum(acc.cached),
        span_s=(tr.rows[-1].timestamp_ms - tr.rows[0].timestamp_ms) / 1000.0,
    )


def _realized(source: str, declared: int | LengthDistribution, lengths: list[int], trace_field: str) -> Lengths:
    """Realized lengths of one side, beside what declared them (a distribution, a value, or the file's rows)."""
    summary = _lengths.summary(
        declared if isinstance(declared, LengthDistribution) else None,
        lengths,
        declared if isinstance(declared, int) else None,
    )
    if source == "trace":
        summary["declared"] = {"trace": trace_field}
    elif source == "file":
        summary["declared"] = {"file": "prompts as written" if trace_field == "input_length" else "output_tokens"}
    return Lengths.model_validate(summary)


def _int_stats(xs: list[int]) -> IntStats:
    return IntStats(min=min(xs), max=max(xs), mean=sum(xs) / len(xs))


def _below(acc: _Acc, target: Fraction, ds: Dataset) -> BelowTarget:
    idx = [i for i, (c, t) in enumerate(zip(acc.cached, acc.chat, strict=True)) if not _meets(c, t, target)]
    if not idx or target == 0:
        return BelowTarget(count=0, first=[], message=None)
    best = max(idx, key=lambda i: Fraction(acc.cached[i], acc.chat[i]) if acc.chat[i] else Fraction(0))
    if ds.source == "prefix_cache":
        why = (
            "whole cache blocks of the shared prefix cannot reach it; raise dataset.input_tokens, or lower "
            "dataset.block_size or dataset.prefix_ratio"
        )
    else:
        why = (
            f"a {ds.source} dataset shares only the chat-template head by construction; use source "
            "'prefix_cache' for a cache target, or set dataset.prefix_ratio 0"
        )
    return BelowTarget(
        count=len(idx),
        first=idx[:_BELOW_FIRST],
        message=(
            f"{len(idx)} of {len(acc.chat)} entries expect a hit ratio below the target {float(target)}; "
            f"best of them {_pct_floor(acc.cached[best], acc.chat[best])} ({acc.cached[best]} cached of "
            f"{acc.chat[best]} {HIT_RATIO_DENOMINATOR}, block {ds.block_size}, source {ds.source}): {why}"
        ),
    )


def generate_dataset(
    ws: Workspace, case: Case, dataset_id: str, tmp: Path, inputs: Inputs | None = None
) -> DatasetIdentity:
    t0 = time.perf_counter()
    ds = case.dataset
    api = case.target.api
    chat = ds.chat_template and api == "chat"
    entries_path = tmp / ENTRIES_FILE
    inputs = inputs or read_inputs(ws, case)
    if inputs.rows is not None and inputs.source_sha256 is not None:
        res = _generate_file(inputs.rows, inputs.source_sha256, ds, inputs.tok, entries_path)
    elif inputs.trace is not None:
        res = _generate_trace(inputs.trace, ds, inputs.tok, tokenizer_path(ws, ds.tokenizer), entries_path)
    else:
        res = _generate_constructed(ds, inputs.tok, tokenizer_path(ws, ds.tokenizer), entries_path)
    sessions = _annotate_sessions(case, entries_path) if ds.sessions is not None else None
    acc = res.acc
    ratios = [c / t if t else 0.0 for c, t in zip(acc.cached, acc.chat, strict=True)]
    target = _target(ds.prefix_ratio)
    identity = DatasetIdentity(
        dataset_id=dataset_id,
        content_sha256=sha256_file(entries_path),
        source=ds.source,
        source_sha256=res.source_sha256,
        spec=ds.model_dump(mode="json"),
        api=api,
        generator=GENERATOR_VERSION,
        tokenizer=_tokenizer_info(ds.tokenizer, ds.tokenizer_revision, tokenizer_path(ws, ds.tokenizer)),
        chat_template_counted=chat,
        entries=len(acc.body),
        output_tokens=max(acc.out),
        body_tokens=_int_stats(acc.body),
        chat_tokens=_int_stats(acc.chat),
        expected_cached_tokens=_int_stats(acc.cached),
        expected_hit_ratio=RatioStats(min=min(ratios), max=max(ratios), mean=sum(ratios) / len(ratios)),
        hit_ratio_denominator=HIT_RATIO_DENOMINATOR,
        block_size=ds.block_size,
        prefix_ratio_target=ds.prefix_ratio,
        below_target=_below(acc, target, ds),
        salt=res.salt,
        counting=res.counting,
        generated_at=datetime.now(UTC),
        generation_seconds=round(time.perf_counter() - t0, 3),
        input_lengths=_realized(ds.source, ds.input_tokens, acc.body, "input_length"),
        output_lengths=_realized(ds.source, ds.output_tokens, acc.out, "output_length"),
        trace=_trace_info(inputs.trace, ds, acc, entries_path) if inputs.trace is not None else None,
        sessions=sessions,
    )
    write_json(tmp / IDENTITY_FILE, identity.model_dump(mode="json"))
    return identity
