"""Token counting for generation: one interface over the builtin fast tokenizer and a transformers one."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Protocol

from caseledger.datasets import tokenizers as _tokenizer
from caseledger.datasets.identity import TokenizerInfo
from caseledger.errors import CaseInvalid, quoted
from caseledger.workspace import Workspace, read_json_or_none, sha256_file

_SENTINEL = "\u2063CASELEDGER-CONTENT\u2063"


class Tok(Protocol):
    head: str  # chat-template text before the content ("" when the template is not counted)
    raw: Any  # the underlying tokenizer object (loaded once per process by caseledger.tokenizer)

    def count_batch(self, texts: Sequence[str]) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def chat_batch(self, contents: Sequence[str]) -> list[list[int]]: ...

    def vocab(self) -> dict[str, int]: ...


class _FastTok:
    """tokenizers.Tokenizer on tokenizer.json with ChatML after `prefix`, no transformers import: the builtin, and a
    tokenizer converted from a GGUF without a chat template of its own (tokenizers.chatml_prefix)."""

    def __init__(self, tok: Any, chat: bool, prefix: str = "") -> None:
        self._tok = self.raw = tok
        self._chat = chat
        self._prefix = prefix
        self.head = prefix + _tokenizer.chatml(_SENTINEL).partition(_SENTINEL)[0] if chat else ""
        # encode_batch_fast (tokenizers >= 0.20) skips offsets: same ids, about 25% faster.
        self._batch = getattr(tok, "encode_batch_fast", tok.encode_batch)

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        return [len(e) for e in self._batch(list(texts), add_special_tokens=False)]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._batch(list(texts), add_special_tokens=False)]

    def chat_batch(self, contents: Sequence[str]) -> list[list[int]]:
        if not self._chat:
            return self.encode_batch(contents)
        return self.encode_batch([self._prefix + _tokenizer.chatml(c) for c in contents])

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


def open_tokenizer(name: str, chat: bool) -> Tok:
    if name == "builtin":
        return _FastTok(_tokenizer.load_fast(name), chat)
    try:
        prefix = _tokenizer.chatml_prefix(name)
        if prefix is not None:
            return _FastTok(_tokenizer.load_fast(name), chat, prefix)
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


def tokenizer_path(ws: Workspace, name: str) -> str:
    """dataset.tokenizer as loaded: 'builtin', an absolute or ~ path as written, a relative one in the workspace
    (as a service's relative argv paths: the same case means the same files whoever calls caseledger)."""
    if name == "builtin" or name.startswith(("/", "~")):
        return name
    return str(ws.root / name)


def tokenizer_info(name: str, revision: str | None, local: str) -> TokenizerInfo:
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
