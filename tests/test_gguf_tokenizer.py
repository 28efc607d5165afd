"""A GGUF's tokenizer read without transformers' converter counts exactly as the converter's: the same
tokenizer.json, the same token ids for text and for the chat template, the same dataset. The reference is
transformers' converter fed by the `gguf` package's own reader. Small GGUFs are written here with the `gguf`
package; the real Gemma 3 270M GGUF (CASELEDGER_LLAMA_MODEL) is compared under the engine mark."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from caseledger.datasets import counting, gguf_vocab
from caseledger.datasets import tokenizers as tk
from caseledger.errors import CaseInvalid
from caseledger.tools import freeze_case
from caseledger.workspace import Workspace
from caseledger.workspace.steps import Steps
from tests.conftest import ref_draft
from tests.engine import MODEL_ENV, REQUIRE_ENV

TEXTS = [
    "hello world",
    "  two leading spaces and   a run of three",
    "tabs\tand\nnew\n\nlines\n\n\n",
    "unicode: é ü ß ñ, 日本語のテキスト, emoji 🙂🚀, Ελληνικά, русский",
    "<bos>special<eos> tokens <start_of_turn>user\nin text<end_of_turn>",
    "<|im_start|>user\nchatml markers<|im_end|>",
    "     ",
    "",
    "abc ab a b c abcabc",
]

GEMMA_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "[multimodal]", "<start_of_turn>", "<end_of_turn>"]
GEMMA_TOKENS += ["\n", "\n\n", "  ", "   ", "▁", "a", "b", "c", "é", "ab", "bc", "abc", "▁a", "▁ab", "▁abc", "<0x41>"]
GEMMA_TYPES = [3, 3, 3, 3, 3, 4, 3, 3, 4, 4, 4, 4] + [1] * 11 + [6]


def write_gguf(path: Path, arch: str, tokens: list[str], types: list[int], template: str | None = None) -> Path:
    import gguf  # the writer llama.cpp's converters use

    w = gguf.GGUFWriter(str(path), arch)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(len(tokens))])
    w.add_token_types(types)
    w.add_bos_token_id(tokens.index("<bos>"))
    w.add_eos_token_id(tokens.index("<eos>"))
    w.add_unk_token_id(tokens.index("<unk>"))
    w.add_pad_token_id(tokens.index("<pad>"))
    w.add_add_bos_token(True)
    if template is not None:
        w.add_chat_template(template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def reference_meta(path: Path) -> dict[str, Any]:
    import gguf

    return {k: f.contents() for k, f in gguf.GGUFReader(str(path)).fields.items() if not k.startswith("GGUF.")}


def both_ways(gguf_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(the directory caseledger converts, the one transformers' converter writes from the gguf package's read)."""
    monkeypatch.setenv("CASELEDGER_CACHE", str(cache))
    mine = tk.gguf_dir(gguf_path)
    ref = cache / "reference"
    tk.write_gguf_tokenizer(reference_meta(gguf_path), gguf_path, "0" * 64, ref, fast=False)
    return mine, ref


def assert_same_tokenizer(mine: Path, ref: Path) -> None:
    for f in ("tokenizer.json", "tokenizer_config.json"):
        assert json.loads((mine / f).read_text()) == json.loads((ref / f).read_text()), f
    assert (mine / "chat_template.jinja").read_text() == (ref / "chat_template.jinja").read_text()


def assert_same_counts(mine: Path, ref: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """caseledger's counting on `mine` (tokenizers alone where the template is ChatML) against transformers'
    AutoTokenizer and apply_chat_template on the reference directory."""
    fast = counting.open_tokenizer(str(mine), chat=True)
    monkeypatch.setattr(tk, "chatml_prefix", lambda name: None)  # the reference: transformers only
    slow = counting.open_tokenizer(str(ref), chat=True)
    monkeypatch.undo()
    assert type(slow).__name__ == "_HFTok"
    assert fast.head == slow.head
    assert fast.encode_batch(TEXTS) == slow.encode_batch(TEXTS)
    assert fast.chat_batch(TEXTS) == slow.chat_batch(TEXTS)
    assert fast.vocab() == slow.vocab()


def test_a_small_gemma_gguf_converts_and_counts_as_transformers_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_gguf(tmp_path / "g.gguf", "gemma3", GEMMA_TOKENS, GEMMA_TYPES)
    meta = gguf_vocab.read_metadata(path)
    assert meta == reference_meta(path)  # the same metadata as the gguf package reads
    assert gguf_vocab.gemma_tokenizer_json(meta) is not None  # the fast path, not the converter
    mine, ref = both_ways(path, tmp_path / "cache", monkeypatch)
    assert_same_tokenizer(mine, ref)
    assert tk.chatml_prefix(str(mine)) == "<bos>"  # no template in the GGUF: ChatML after the BOS token
    assert_same_counts(mine, ref, monkeypatch)
    assert type(counting.open_tokenizer(str(mine), chat=True)).__name__ == "_FastTok"


def test_a_gguf_outside_the_fast_path_still_converts_through_transformers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] | trim }}\n{% endfor %}"
    path = write_gguf(tmp_path / "l.gguf", "llama", GEMMA_TOKENS, GEMMA_TYPES, template=own)
    assert gguf_vocab.gemma_tokenizer_json(gguf_vocab.read_metadata(path)) is None  # not Gemma
    mine, ref = both_ways(path, tmp_path / "cache", monkeypatch)
    assert_same_tokenizer(mine, ref)
    assert tk.chatml_prefix(str(mine)) is None  # the GGUF's own template: rendered by transformers
    assert json.loads((mine / tk.GGUF_SOURCE).read_text())["chat_template"] == "gguf"
    assert_same_counts(mine, ref, monkeypatch)


def test_a_cut_short_gguf_is_refused_and_nothing_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = write_gguf(tmp_path / "g.gguf", "gemma3", GEMMA_TOKENS, GEMMA_TYPES).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: len(whole) // 2])
    monkeypatch.setenv("CASELEDGER_CACHE", str(tmp_path / "cache"))
    with pytest.raises(CaseInvalid) as e:
        tk.gguf_dir(cut)
    assert "dataset.tokenizer" in str(e.value) and "cut short" in str(e.value)
    assert "tokenizer directory instead" in e.value.fix
    kept = [p.name for p in (tmp_path / "cache" / "tokenizers").iterdir() if p.is_dir()]
    assert kept == []  # no converted directory, no temporary one left behind


def real_gguf() -> Path:
    model = os.environ.get(MODEL_ENV, "")
    if model and Path(model).is_file():
        return Path(model)
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {MODEL_ENV} is not a GGUF file", pytrace=False)
    pytest.skip(f"{MODEL_ENV} is not set to a GGUF (run `bash .ci/install-llama`, then load llama.env)")


@pytest.mark.engine
def test_the_real_gemma_gguf_counts_and_generates_as_transformers_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = real_gguf()
    mine, ref = both_ways(model, tmp_path / "cache", monkeypatch)
    assert_same_tokenizer(mine, ref)
    assert tk.chatml_prefix(str(mine)) == "<bos>"  # Gemma 3 270M's GGUF has no template: ChatML after BOS
    assert_same_counts(mine, ref, monkeypatch)
    # the same dataset, generated through tokenizers alone and through transformers
    draft = ref_draft(9, dataset={"input_tokens": 96, "tokenizer": str(model)}, load={"requests": 6})
    entries = []
    for name, prefix in (("fast", tk.chatml_prefix), ("transformers", lambda name: None)):
        monkeypatch.setattr(tk, "chatml_prefix", prefix)
        ws = Workspace(tmp_path / name)
        frozen = freeze_case(ws, draft=draft)
        entries.append((ws.root / "ledger" / "datasets" / frozen.dataset_id / "entries.jsonl").read_bytes())
    assert entries[0] == entries[1]


def test_each_step_of_a_first_gguf_freeze_is_named_for_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_gguf(tmp_path / "g.gguf", "gemma3", GEMMA_TOKENS, GEMMA_TYPES)
    monkeypatch.setenv("CASELEDGER_CACHE", str(tmp_path / "cache"))
    heard: list[str] = []
    with Steps(say=heard.append, after_s=0).active():  # every step is slow: each one is said
        counting.open_tokenizer(str(path), chat=True)
    firsts = [h.split(" ")[0] for h in heard]
    assert firsts.index("hashing") < firsts.index("converting") < firsts.index("loading"), heard
    assert heard[-1].startswith("loading the tokenizer ") and "gguf-" in heard[-1]
