"""Tokenizers: the small builtin BPE the project generates and ships, and lazy loading of any local one.

`transformers` is imported only inside functions here (about a second of import time), so the CLI, the
controller and the load client never pay for it. The reference target uses the `tokenizers` library
directly on tokenizer.json, which is fast to import.
"""

from __future__ import annotations

import functools
import os
import random
from pathlib import Path
from typing import Any

from caseledger.errors import CaseInvalid, quoted

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
    syll = ["ka", "lo", "mi", "ne", "ru", "sa", "te", "vo", "pi", "da", "ge", "hu", "zo", "ba", "qi", "ly",
            "or", "an", "el", "is", "um", "ex", "at", "on", "re", "st", "th", "ch"]
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
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer=trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, eos_token="<|im_end|>", bos_token=None, unk_token=None, pad_token="<|endoftext|>"
    )
    fast.chat_template = CHATML_TEMPLATE
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    return out_dir


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def resolve(name: str) -> Path:
    """'builtin' or a local directory; never a hub name (nothing is downloaded at run time)."""
    if name == "builtin":
        return BUILTIN_DIR
    p = Path(name).expanduser()
    try:
        ok = p.is_dir() and any((p / f).is_file() for f in TOKENIZER_FILES)
    except (OSError, ValueError):  # a NUL, an over-long name
        ok = False
    if not ok:
        raise CaseInvalid(
            f"dataset.tokenizer '{quoted(name)}' is not a local tokenizer directory",
            f"give 'builtin' or a directory holding one of {', '.join(TOKENIZER_FILES)} "
            "(hub names are not fetched at run time)",
        )
    return p


@functools.lru_cache(maxsize=4)
def load(name: str) -> Any:
    """transformers.AutoTokenizer from a local directory (lazy import)."""

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    from transformers import AutoTokenizer  # lazy: ~1 s import, only for HF tokenizers

    return AutoTokenizer.from_pretrained(str(resolve(name)))


@functools.lru_cache(maxsize=4)
def load_fast(name: str) -> Any:
    """A `tokenizers.Tokenizer` straight from tokenizer.json (no transformers import)."""
    from tokenizers import Tokenizer  # lazy: only when a dataset is generated or the target serves

    return Tokenizer.from_file(str(resolve(name) / "tokenizer.json"))


if __name__ == "__main__":
    print(build_builtin())
