"""A GGUF's tokenizer read straight from its metadata: the key-value header, and for Gemma's SentencePiece
vocabulary the tokenizer.json that transformers' GGUF converter writes for it, in about a second.

The `gguf` package's reader builds a numpy view per string (a 256k vocabulary: minutes of CPU on a busy host)
and the converter derives Gemma's merges the slow way; both are replaced here for the vocabularies this module
knows, and `gemma_tokenizer_json` answers None for any other, which the caller converts the slow way. A test
compares both paths on the real GGUF: the same tokenizer.json, the same token counts.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

# JSON: a GGUF's key-value header as decoded (its value types are JSON's: strings, numbers, booleans, lists)
Metadata = dict[str, Any]
GGUF_VERSIONS = (2, 3)
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def read_metadata(path: Path) -> Metadata:
    """The GGUF's key-value metadata (arrays as lists, strings decoded as UTF-8); the tensors are not read.
    ValueError for a file that is not GGUF v2/v3 or ends inside its header."""
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        try:
            return _read(m)
        except struct.error as e:  # a length or count past the end of the file
            raise ValueError(f"its GGUF header is cut short ({e})") from None


def _read(m: mmap.mmap) -> Metadata:
    magic, version, _tensors, count = struct.unpack_from("<4sIQQ", m, 0)
    if magic != b"GGUF" or version not in GGUF_VERSIONS:
        raise ValueError(f"not a GGUF v2 or v3 file (magic {magic!r}, version {version})")
    meta: Metadata = {}
    pos = 24
    for _ in range(count):
        key, pos = _string(m, pos)
        (kind,) = struct.unpack_from("<I", m, pos)
        meta[key], pos = _value(m, pos + 4, kind)
    return meta


def _string(m: mmap.mmap, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", m, pos)
    end = pos + 8 + n
    if end > len(m):
        raise struct.error(f"a string of {n} bytes at offset {pos}")
    return m[pos + 8 : end].decode("utf-8"), end


def _value(m: mmap.mmap, pos: int, kind: int) -> tuple[Any, int]:
    if kind in _SCALAR:
        fmt = _SCALAR[kind]
        return struct.unpack_from(fmt, m, pos)[0], pos + struct.calcsize(fmt)
    if kind == _STRING:
        return _string(m, pos)
    if kind != _ARRAY:
        raise ValueError(f"unknown GGUF value type {kind} at offset {pos}")
    item, n = struct.unpack_from("<IQ", m, pos)
    pos += 12
    if item in _SCALAR:  # one unpack for the whole array
        fmt = _SCALAR[item]
        return list(struct.unpack_from(f"<{n}{fmt[1]}", m, pos)), pos + n * struct.calcsize(fmt)
    out = []
    for _ in range(n):
        v, pos = _value(m, pos, item)
        out.append(v)
    return out, pos


GEMMA_ARCHITECTURES = ("gemma", "gemma2", "gemma3")  # SentencePiece BPE ('llama' vocabulary) without merges
GEMMA_SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>")  # transformers' GemmaTokenizer adds these
_CONTROL, _USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values


def gemma_tokenizer_json(meta: Metadata) -> dict[str, Any] | None:  # JSON: tokenizer.json
    """The tokenizer.json document transformers' GGUF converter builds for a Gemma 1-3 vocabulary, or None where
    this GGUF is outside what this function reproduces (another model, merges or a pre-tokenizer in the file, a
    vocabulary whose spellings collide): convert that one with transformers."""
    tokens = meta.get("tokenizer.ggml.tokens")
    types = meta.get("tokenizer.ggml.token_type")
    if (
        meta.get("tokenizer.ggml.model") != "llama"
        or meta.get("general.architecture") not in GEMMA_ARCHITECTURES
        or meta.get("tokenizer.ggml.pre") not in (None, "default")
        or "tokenizer.ggml.merges" in meta
        or not isinstance(tokens, list)
        or not isinstance(types, list)
        or len(types) != len(tokens)
    ):
        return None
    # a token of two or more spaces is stored as spaces; the tokenizer spells it with U+2581, as the converter does
    spelled = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {t: i for i, t in enumerate(spelled)}
    control = {i for i, k in enumerate(types) if k == _CONTROL}
    if len(vocab) != len(spelled) or any(spelled[i] != tokens[i] for i in control):
        return None
    if any(s not in vocab for s in GEMMA_SPECIALS):
        return None
    special = control | {vocab[s] for s in GEMMA_SPECIALS}
    user = {vocab[t] for t, k in zip(tokens, types, strict=True) if k == _USER_DEFINED and t in vocab} - special
    added = [_added(i, spelled[i], i in special) for i in sorted(special | user)]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        "pre_tokenizer": {
            "type": "Split",
            "pattern": {"String": " "},
            "behavior": "MergedWithPrevious",
            "invert": False,
        },
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {},
        },
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
            ],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": "<unk>",
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": gemma_merges(spelled, vocab),
        },
    }


def _added(i: int, content: str, special: bool) -> dict[str, Any]:  # JSON: one of tokenizer.json's added_tokens
    flags = dict.fromkeys(("single_word", "lstrip", "rstrip", "normalized"), False)
    return {"id": i, "content": content, **flags, "special": special}


def gemma_merges(spelled: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Every split of a token into two tokens, best first: Gemma's merge order is the order of its tokens in the
    file (not their scores), and of one token's splits the longer left piece first. It is the order
    transformers' generate_merges sorts into for this vocabulary, without its sort of half a million merges."""
    merges: list[tuple[str, str]] = []
    add = merges.append
    for tok in spelled:
        for k in range(len(tok) - 1, 0, -1):
            left = tok[:k]
            if left in vocab:
                right = tok[k:]
                if right in vocab:
                    add((left, right))
    return merges
