"""The file and trace sources: prompts as written, or a trace's rows rebuilt with its shared blocks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import orjson

from caseledger.case.dataset import Dataset
from caseledger.datasets import trace as _trace
from caseledger.datasets.constructed import unique_suffixes
from caseledger.datasets.counting import Tok
from caseledger.datasets.entries import (
    CHUNK,
    Acc,
    Result,
    Writer,
    entry_count,
    lcp,
    make_entry,
    required,
    sample_entries,
)
from caseledger.datasets.identity import (
    DEFAULT_SALT,
    GENERATOR_VERSION,
    SALT_K,
    SALT_WORDS,
    Counting,
    SaltSlot,
    TraceInfo,
    salt_text,
)
from caseledger.datasets.words import Words, draw, fix_length, indices, join_words, length_of, words_for
from caseledger.errors import CaseInvalid, quoted
from caseledger.workspace import Workspace, sha256_bytes


def read_prompts(ws: Workspace, ds: Dataset) -> tuple[list[tuple[str, int]], str]:
    """file: the first dataset.entries (prompt, output_tokens) of the JSONL, and the file's sha256."""
    raw = _trace.read_source(
        ws,
        required(ds.path, "dataset.path"),
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
        if len(rows) == entry_count(ds):
            break
    if len(rows) < entry_count(ds):
        raise CaseInvalid(
            f"dataset.path '{ds.path}' has {len(rows)} prompts but dataset.entries is {ds.entries} "
            "(one entry per formal request)",
            f"add prompts to the file, or lower dataset.entries (and load.requests) to at most {len(rows)}",
        )
    return rows, sha256_bytes(raw)


def generate_file(rows: list[tuple[str, int]], source_sha256: str, ds: Dataset, tok: Tok, path: Path) -> Result:
    """file: the prompts as is, each encoded whole (alone and with the chat template); no salt slot."""
    head = len(tok.encode_batch([tok.head])[0]) if tok.head else 0
    cached = head // ds.block_size * ds.block_size
    w = Writer(path)
    for lo in range(0, len(rows), CHUNK):
        chunk = rows[lo : lo + CHUNK]
        prompts = [p for p, _ in chunk]
        bodies = [len(ids) for ids in tok.encode_batch(prompts)]
        chats = [len(ids) for ids in tok.chat_batch(prompts)]
        for j, ((prompt, out), b, c) in enumerate(zip(chunk, bodies, chats, strict=True)):
            w.add(make_entry(lo + j, 0, "", "", prompt, b, c, cached, out))
    w.close()
    return Result(
        w.acc, Counting(method="full", checked=list(range(len(rows)))), SaltSlot(words=[], k=0), source_sha256
    )


def _trace_blocks(key: str, ids: set[int], block: int, tok: Tok, table: Words) -> dict[int, str]:
    """One text of exactly `block` tokens per hash id (" w w ...", drawn from the id: the same id, the same
    tokens, in every row and every dataset of this seed)."""
    out: dict[int, str] = {}
    todo = sorted(ids)
    for lo in range(0, len(todo), CHUNK):
        part = todo[lo : lo + CHUNK]
        words = [draw(f"{key}/block/{h}", block, table, None) for h in part]
        texts = [join_words(w, True) for w in words]
        for h, w, text, got in zip(part, words, texts, tok.count_batch(texts), strict=True):
            if got != block:
                text = join_words(
                    fix_length(w, block, length_of(tok, "", True), f"{key}/block-fix/{h}", table, f"block {h}"), True
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


def generate_trace(tr: _trace.Trace, ds: Dataset, tok: Tok, name: str, path: Path) -> Result:
    """trace: first word + salt slot (one per run) + the row's hash-id blocks + a unique tail, exact lengths.

    The first word and the slot lead every prompt, so the run's salt keeps one run's prompts apart from the
    next run's while the blocks stay shared exactly as the trace shares them inside a run. A request's
    planned shared prefix (expected_cached_tokens) is the chat-template head, the first word, the slot and
    the blocks an earlier row already sent; the first request plans none.
    """
    block = int(ds.block_size)
    key = f"caseledger/{GENERATOR_VERSION}/trace/{ds.seed}"
    table = words_for(tok, name)
    k = SALT_K
    lay = _trace_layout(tr.rows, block, 1 + k, str(ds.path))
    bare = table.bare_ones
    first = bare[int(indices(f"{key}/first", 1, len(bare))[0])] if bare else table.ones[0]
    salt = SaltSlot(words=table.ones[:SALT_WORDS], k=k, per_run=True)
    slot = salt_text(DEFAULT_SALT, 0, salt.words, k)
    texts = _trace_blocks(key, {h for e in lay for h in e.row.hash_ids[: e.blocks]}, block, tok, table)
    head = tok.count_batch([tok.head])[0] if tok.head else 0
    probe = join_words(draw(f"{key}/probe", 64, table, None), False)
    overhead = len(tok.chat_batch([probe])[0]) - tok.count_batch([probe])[0]
    lead = first + slot
    seen_tails: set[bytes] = set()
    bodies: list[tuple[str, str]] = []  # (suffix, shared-prefix text inside the suffix)
    tails = [e.tail for e in lay]
    for i, e in enumerate(lay):
        blocks = [texts[h] for h in e.row.hash_ids[: e.blocks]]
        tail = ""
        if e.tail:
            tail = unique_suffixes(f"{key}/tail", i, i + 1, tails, table, seen_tails, len(lay))[0]
            if tok.count_batch([tail])[0] != e.tail:
                tail = join_words(
                    fix_length(
                        tail.split(" ")[1:],
                        e.tail,
                        length_of(tok, "", True),
                        f"{key}/tail-fix/{i}",
                        table,
                        f"tail of row {e.row.row}",
                    ),
                    True,
                )
        bodies.append(("".join(blocks) + tail, "".join(blocks[: e.seen])))
    # composed counts, checked on a sample by whole encodes; a tokenizer whose merges cross the pieces gets
    # every entry encoded whole and its shared prefix from the ids it really shares
    sample = sample_entries(len(lay), 1, ds.seed)
    whole = [(lead + bodies[i][0]) for i in sample]
    composed = all(
        len(c) == lay[i].row.input_length + overhead and b == lay[i].row.input_length
        for i, c, b in zip(sample, tok.chat_batch(whole), tok.count_batch(whole), strict=True)
    )
    w = Writer(path)
    for i, (e, (suffix, shared_text)) in enumerate(zip(lay, bodies, strict=True)):
        if composed:
            body, chat = e.row.input_length, e.row.input_length + overhead
            planned = 0 if i == 0 else head + 1 + k + e.seen * block
        else:
            ids = tok.chat_batch([lead + suffix])[0]
            body, chat = tok.count_batch([lead + suffix])[0], len(ids)
            pre = tok.encode_batch([tok.head + lead + shared_text])[0]
            planned = 0 if i == 0 else lcp(ids, pre)
        entry = make_entry(i, 0, first, slot, suffix, body, chat, planned, e.row.output_length)
        entry["trace_row"] = e.row.row
        entry["arrival_s"] = (e.row.timestamp_ms - tr.rows[0].timestamp_ms) / 1000.0
        entry["shared_blocks"] = e.seen
        w.add(entry)
    w.close()
    method: Literal["composed", "full"] = "composed" if composed else "full"
    return Result(
        w.acc, Counting(method=method, checked=sample if composed else list(range(len(lay)))), salt, tr.sha256
    )


def trace_info(tr: _trace.Trace, ds: Dataset, acc: Acc, path: Path) -> TraceInfo:
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
