"""Tokenizers: the small builtin BPE the project generates and ships, and lazy loading of any local one.

`transformers` is imported only inside functions here (about a second of import time), so the CLI, the
controller and the load client never pay for it. The reference target uses the `tokenizers` library
directly on tokenizer.json, which is fast to import.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import orjson

from caseledger.datasets import gguf_vocab
from caseledger.errors import CaseInvalid, quoted
from caseledger.workspace import atomic_write, read_json_or_none, sha256_file
from caseledger.workspace.steps import step

BUILTIN_DIR = Path(__file__).resolve().parent.parent / "data" / "tokenizer"
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def chatml(content: str) -> str:
    """The text the server tokenizes for one user message under ChatML (what llama.cpp falls back to)."""
    return f"<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"


def corpus_words(seed: int = 7, n: int = 4000) -> list[str]:
    """A deterministic pseudo-English vocabulary of words (no downloads)."""
    rng = random.Random(seed)
    syll = [
        "ka",
        "lo",
        "mi",
        "ne",
        "ru",
        "sa",
        "te",
        "vo",
        "pi",
        "da",
        "ge",
        "hu",
        "zo",
        "ba",
        "qi",
        "ly",
        "or",
        "an",
        "el",
        "is",
        "um",
        "ex",
        "at",
        "on",
        "re",
        "st",
        "th",
        "ch",
    ]
    words: set[str] = set()
    while len(words) < n:
        words.add("".join(rng.choice(syll) for _ in range(rng.randint(1, 4))))
    return sorted(words)


def build_builtin(out_dir: Path = BUILTIN_DIR, vocab_size: int = 4096) -> Path:
    """Train the builtin byte-level BPE on generated text and save it with a ChatML template."""
    # lazy: tokenizers and transformers load only when the builtin tokenizer is built
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast  # lazy: ~1 s import, only to build the builtin tokenizer

    words = corpus_words()
    rng = random.Random(11)
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(8, 40))) for _ in range(20000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(lines, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", bos_token=None, unk_token=None, pad_token="<|endoftext|>"
    )
    fast.chat_template = CHATML_TEMPLATE
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    return out_dir


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def resolve(name: str) -> Path:
    """'builtin', a local tokenizer directory or a GGUF file (converted once, see gguf_dir); never a hub name
    (nothing is downloaded at run time)."""
    if name == "builtin":
        return BUILTIN_DIR
    p = Path(name).expanduser()
    try:
        if p.is_file() and p.suffix.lower() == ".gguf":
            return gguf_dir(p)
        ok = p.is_dir() and any((p / f).is_file() for f in TOKENIZER_FILES)
    except (OSError, ValueError):  # a NUL, an over-long name
        ok = False
    if not ok:
        raise CaseInvalid(
            f"dataset.tokenizer '{quoted(name)}' is not a local tokenizer directory or GGUF file",
            f"give 'builtin', a directory holding one of {', '.join(TOKENIZER_FILES)}, or the model's .gguf "
            "file (hub names are not fetched at run time)",
        )
    return p


def cache_root() -> Path:
    """Where converted tokenizers are kept: $CASELEDGER_CACHE, else ~/.cache/caseledger."""
    return Path(os.environ.get("CASELEDGER_CACHE") or Path.home() / ".cache" / "caseledger")


GGUF_SOURCE = "gguf-source.json"  # in a converted directory: the GGUF's path, size and sha256


def gguf_dir(path: Path) -> Path:
    """The tokenizer a GGUF file carries, as a tokenizer directory converted once and kept under
    cache_root()/tokenizers/gguf-<sha256 of the file>: the same tokens llama.cpp counts for that model.

    Gemma's vocabulary is read from the GGUF's metadata and written as transformers' GGUF converter would
    write it, in about a second (gguf_vocab); any other goes through that converter (no torch; about 10 s for a
    256k vocabulary, once per file). Its chat template is the
    GGUF's own; a GGUF without one gets ChatML, which llama.cpp falls back to, with the BOS token in front
    when the GGUF says llama.cpp adds one (tokenizer.ggml.add_bos_token)."""
    st = path.stat()
    with step(f"hashing {path.name} ({st.st_size / 1e9:.1f} GB; once per file version)"):
        sha = _gguf_sha256(str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
    out = cache_root() / "tokenizers" / f"gguf-{sha[:16]}"
    if (out / "tokenizer.json").is_file():
        return out
    try:
        with step(f"converting the tokenizer of {path.name} to {out} (once per file)"):
            _convert_gguf(path, sha, out)
    except CaseInvalid:
        raise
    except Exception as e:  # the reader or the converter refused the file
        raise CaseInvalid(
            f"dataset.tokenizer '{quoted(str(path))}': its tokenizer cannot be read: {quoted(e, 160)}",
            "give the model's Hugging Face tokenizer directory instead of the GGUF file",
        ) from None
    return out


GGUF_HASHES = "gguf-hashes.json"  # in cache_root()/tokenizers: "path size mtime_ns inode" -> sha256


@functools.lru_cache(maxsize=8)
def _gguf_sha256(real: str, size: int, mtime_ns: int, inode: int) -> str:
    """A GGUF's sha256, once per file version: kept in this process and in cache_root()/tokenizers/GGUF_HASHES
    by path, size, mtime and inode (a model file is hundreds of MB to GBs: hashed once, not per freeze)."""
    index = cache_root() / "tokenizers" / GGUF_HASHES
    k = f"{real} {size} {mtime_ns} {inode}"
    known = read_json_or_none(index)
    known = known if isinstance(known, dict) else {}
    sha = known.get(k)
    if isinstance(sha, str) and len(sha) == 64:
        return sha
    sha = sha256_file(Path(real))
    with contextlib.suppress(OSError):  # a read-only cache: hashed again next time, nothing lost
        index.parent.mkdir(parents=True, exist_ok=True)
        kept = {p: v for p, v in known.items() if not p.startswith(real + " ")}  # the file's older versions go
        atomic_write(index, orjson.dumps({**kept, k: sha}))
    return sha


GGUF_SPECIALS = {  # the special tokens a converted tokenizer names, by the GGUF key of their id
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}


def _convert_gguf(path: Path, sha: str, out: Path) -> None:
    write_gguf_tokenizer(gguf_vocab.read_metadata(path), path, sha, out)


def write_gguf_tokenizer(meta: gguf_vocab.Metadata, path: Path, sha: str, out: Path, *, fast: bool = True) -> None:
    """Write the tokenizer of the GGUF at `path`, whose metadata is `meta`, as a tokenizer directory at `out`:
    Gemma's vocabulary straight from the metadata (gguf_vocab, about a second), any other (or every one, with
    fast=False) through transformers' converters."""
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or "general.architecture" not in meta:
        raise CaseInvalid(
            f"dataset.tokenizer '{quoted(str(path))}': the GGUF holds no tokenizer vocabulary",
            "give the model's Hugging Face tokenizer directory instead of the GGUF file",
        )
    special = {name: tokens[meta[key]] for name, key in GGUF_SPECIALS.items() if meta.get(key) is not None}
    own = meta.get("tokenizer.chat_template")
    add_bos = meta.get("tokenizer.ggml.add_bos_token", meta.get("tokenizer.ggml.model") == "llama")
    template = own or ("{{ bos_token }}" if add_bos and "bos_token" in special else "") + CHATML_TEMPLATE
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=out.parent))
    try:
        doc = gguf_vocab.gemma_tokenizer_json(meta) if fast else None
        if doc is None:
            _save_with_transformers(meta, special, template, tmp)
        else:
            (tmp / "tokenizer.json").write_bytes(orjson.dumps(doc))
            config = {"backend": "tokenizers", **special, "model_max_length": int(1e30)}  # as transformers saves
            config["tokenizer_class"] = "TokenizersBackend"
            (tmp / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
            (tmp / "chat_template.jinja").write_text(template)
        source = {"gguf": str(path.resolve()), "bytes": path.stat().st_size, "sha256": sha}
        chat = "gguf" if own else "chatml (llama.cpp's fallback)"
        (tmp / GGUF_SOURCE).write_text(json.dumps({**source, "chat_template": chat}))
        os.replace(tmp, out)  # another process may have converted it first: keep theirs
    except OSError:
        if not (out / "tokenizer.json").is_file():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _save_with_transformers(meta: gguf_vocab.Metadata, special: dict[str, str], template: str, tmp: Path) -> None:
    """Any GGUF vocabulary gguf_vocab does not build: transformers' GGUF converters (about 10 s for 256k tokens)."""
    try:
        from transformers import PreTrainedTokenizerFast  # lazy: ~1 s import, only to convert a GGUF tokenizer
        from transformers.integrations.gguf import gguf_tokenizer_mapping as conv  # lazy: same
    except ImportError as e:
        raise CaseInvalid(
            f"dataset.tokenizer is a GGUF file but {e.name or e} is not installed",
            "pip install 'transformers>=5.24' (a caseledger dependency), or give a tokenizer directory",
        ) from None
    tok_dict = {
        name: meta[f"tokenizer.{key}"]
        for key, name in conv.GGUF_TOKENIZER_MAPPING["tokenizer"].items()
        if f"tokenizer.{key}" in meta
    }
    built = conv.select_tokenizer_builder(meta["general.architecture"], tok_dict.get("tokenizer_type"))(tok_dict)
    built = conv.set_split_regex(conv.add_gguf_special_tokens(built, tok_dict), tok_dict)
    fast = PreTrainedTokenizerFast(tokenizer_object=built.backend_tokenizer, **special)
    fast.chat_template = template
    fast.save_pretrained(str(tmp))


@functools.lru_cache(maxsize=4)
def load(name: str) -> Any:
    """transformers.AutoTokenizer from a local directory (lazy import)."""

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    from transformers import AutoTokenizer  # lazy: ~1 s import, only for HF tokenizers

    where = resolve(name)
    with step(f"loading the tokenizer {where}"):
        return AutoTokenizer.from_pretrained(str(where))


@functools.lru_cache(maxsize=4)
def load_fast(name: str) -> Any:
    """A `tokenizers.Tokenizer` straight from tokenizer.json (no transformers import)."""
    from tokenizers import Tokenizer  # lazy: only when a dataset is generated or the target serves

    where = resolve(name)
    with step(f"loading the tokenizer {where}"):
        return Tokenizer.from_file(str(where / "tokenizer.json"))


def chatml_prefix(name: str) -> str | None:
    """For a tokenizer converted from a GGUF that carries no chat template (its template is the ChatML fallback
    written above): the text the template puts before ChatML, '' or the BOS token. The chat is then counted
    with `tokenizers` alone, without transformers' import and load (seconds for a 256k vocabulary); the same
    text, so the same tokens. None for any other tokenizer."""
    if name == "builtin":
        return None
    where = resolve(name)
    config = read_json_or_none(where / "tokenizer_config.json")
    try:
        template = (where / "chat_template.jinja").read_text() if (where / GGUF_SOURCE).is_file() else None
    except (OSError, UnicodeDecodeError):
        return None
    if template == CHATML_TEMPLATE:
        return ""
    bos = config.get("bos_token") if isinstance(config, dict) else None
    if template == "{{ bos_token }}" + CHATML_TEMPLATE and isinstance(bos, str):
        return bos
    return None


if __name__ == "__main__":
    print(build_builtin())
