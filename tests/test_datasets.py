"""Datasets: materialized once, exact token counts, honest hit ratios, salts that keep the counts."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from fractions import Fraction
from pathlib import Path
from typing import Any

import orjson
import pytest

from caseledger import datasets as ds
from caseledger.case.model import Case
from caseledger.datasets import constructed as dscon
from caseledger.datasets import generate as dsgen
from caseledger.datasets import tokenizers as tk
from caseledger.datasets.entries import Acc
from caseledger.errors import CaseInvalid, NotFound, PathEscapes
from caseledger.workspace import Workspace, sha256_file

CHATML_OVERHEAD = 16  # builtin: <|im_start|>user\n (6 tokens) + <|im_end|>\n<|im_start|>assistant\n (10)


def make_case(requests: int = 8, api: str = "chat", **dataset: Any) -> Case:
    return Case.model_validate(
        {
            "scenario": "t",
            "target": {"endpoints": [{"base_url": "http://127.0.0.1:9/v1", "model": "m"}], "api": api},
            "load": {"requests": requests, "concurrency": 2},
            "dataset": dataset,
        }
    )


def new_ws(root: Path) -> Workspace:
    root.mkdir(parents=True, exist_ok=True)
    return Workspace(root.resolve())


def counts(texts: list[str]) -> list[int]:
    return [len(e) for e in tk.load_fast("builtin").encode_batch(texts, add_special_tokens=False)]


def chat_ids(text: str) -> list[int]:
    ids: list[int] = tk.load_fast("builtin").encode(tk.chatml(text), add_special_tokens=False).ids
    return ids


def lcp(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


PREFIX_64: dict[str, Any] = {
    "source": "prefix_cache",
    "input_tokens": 8192,
    "prefix_ratio": 0.9,
    "block_size": 128,
    "prefix_groups": 2,
}


@pytest.fixture(scope="module")
def prefix64(tmp_path_factory: pytest.TempPathFactory) -> tuple[Workspace, ds.DatasetIdentity, list[ds.Entry]]:
    ws = new_ws(tmp_path_factory.mktemp("p64"))
    ident = ds.materialize(ws, make_case(64, **PREFIX_64))
    return ws, ident, ds.load_entries(ws, ident.dataset_id)


# ------------------------------------------------------------------------------------ prefix cache


def test_prefix_cache_64x8192_every_entry_reaches_target_and_content_hash_repeats(
    prefix64: tuple[Workspace, ds.DatasetIdentity, list[ds.Entry]], tmp_path: Path
) -> None:
    _, ident, entries = prefix64
    assert ident.entries == len(entries) == 64
    assert ident.hit_ratio_denominator == "chat-template prompt tokens"
    assert ident.below_target.count == 0 and ident.below_target.message is None
    assert ident.counting.method == "composed"
    for e in entries:
        assert e["body_tokens"] == 8192
        assert e["chat_tokens"] == 8192 + CHATML_OVERHEAD
        assert e["expected_cached_tokens"] % 128 == 0
        assert Fraction(e["expected_cached_tokens"], e["chat_tokens"]) >= Fraction(9, 10)
        assert e["expected_hit_ratio"] == e["expected_cached_tokens"] / e["chat_tokens"]
    assert ident.expected_hit_ratio.min >= 0.9
    assert {e["group"] for e in entries} == {0, 1}
    assert len({e["suffix"] for e in entries}) == 64

    again = ds.materialize(new_ws(tmp_path / "other"), make_case(64, **PREFIX_64))
    assert again.dataset_id == ident.dataset_id
    assert again.content_sha256 == ident.content_sha256


def test_shared_chat_prefix_is_exactly_the_expected_cached_blocks_even_across_salted_runs(
    prefix64: tuple[Workspace, ds.DatasetIdentity, list[ds.Entry]],
) -> None:
    _, ident, entries = prefix64
    e0, e2, e1 = entries[0], entries[2], entries[1]  # 0 and 2 share group 0; 1 is group 1
    cached, block = e0["expected_cached_tokens"], ident.block_size
    run1 = [chat_ids(ds.render_prompt(e, "run-1", ident)) for e in (e0, e2, e1)]
    run2_e0 = chat_ids(ds.render_prompt(e0, "run-2", ident))
    # Same group, same run: the shared blocks are cached, and no further whole block is shared.
    assert cached <= lcp(run1[0], run1[1]) < cached + block
    # The same entry in the next run (warm cache): still no block beyond the target.
    assert cached <= lcp(run1[0], run2_e0) < cached + block
    # Another group shares only the template head.
    assert lcp(run1[0], run1[2]) < block


def test_seed_figures_and_a_below_target_construction_is_reported_not_rounded() -> None:
    # Seeds: 131072 body tokens, 131076 chat tokens (4 template tokens), block 128, target 0.9.
    plan = dscon.split_prefix(131072, head=3, overhead=4, block=128, target=Fraction(9, 10), shared=True)
    cached = plan.prefix_tokens + 3
    assert cached == 922 * 128 and Fraction(cached, 131076) >= Fraction(9, 10)
    assert plan.prefix_tokens + plan.salt_k + plan.suffix_tokens == 131072
    assert dscon.pct_floor(118784, 131076) == "90.62%"  # the seeds' 928 blocks
    # 7373 blocks of 16 = 117968 tokens is 89.9997%: below 90%, and never shown as 90.00%.
    assert f"{117968 / 131076:.2%}" == "90.00%"  # what naive formatting would claim
    assert dscon.pct_floor(117968, 131076) == "89.99%"
    assert not dscon.meets(117968, 131076, Fraction(9, 10))
    below = dsgen._below(
        Acc(body=[131072], chat=[131076], cached=[117968]),
        Fraction(9, 10),
        make_case(1, **{**PREFIX_64, "block_size": 16}).dataset,
    )
    assert below.count == 1 and below.first == [0]
    assert below.message is not None and "89.99%" in below.message and "90.00%" not in below.message


def test_unreachable_target_is_counted_in_below_target(tmp_path: Path) -> None:
    ws = new_ws(tmp_path)
    tiny = ds.materialize(ws, make_case(8, source="prefix_cache", input_tokens=64, prefix_ratio=0.9, block_size=256))
    assert tiny.below_target.count == 8 and tiny.below_target.first == list(range(8))
    assert tiny.below_target.message is not None and "block 256" in tiny.below_target.message
    assert tiny.expected_cached_tokens.max == 0 and tiny.body_tokens.min == 64
    # A page-aligned construction that lands just short: 3 blocks of 64 fit, 192/216 = 88.88%.
    near = ds.materialize(ws, make_case(8, source="prefix_cache", input_tokens=200, prefix_ratio=0.9, block_size=64))
    assert near.below_target.count == 8
    assert near.expected_cached_tokens.min == 192 and near.chat_tokens.min == 200 + CHATML_OVERHEAD
    assert near.below_target.message is not None and "88.88%" in near.below_target.message
    assert all(e["expected_hit_ratio"] < 0.9 for e in ds.load_entries(ws, near.dataset_id))


# ------------------------------------------------------------------------------------ ids and reuse


def test_same_spec_is_reused_without_loading_a_tokenizer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = new_ws(tmp_path)
    case = make_case(8, source="prefix_cache", input_tokens=512, prefix_ratio=0.5)
    first = ds.materialize(ws, case)
    entries = ws.dataset_dir(first.dataset_id) / ds.ENTRIES_FILE
    mtime = entries.stat().st_mtime_ns

    def refuse(name: str) -> Any:
        raise AssertionError(f"tokenizer {name} loaded on reuse")

    monkeypatch.setattr(tk, "load", refuse)
    monkeypatch.setattr(tk, "load_fast", refuse)
    assert ds.materialize(ws, case) == first
    assert entries.stat().st_mtime_ns == mtime


def test_subset_is_its_own_dataset_and_entries_default_to_requests(tmp_path: Path) -> None:
    ws = new_ws(tmp_path)
    spec: dict[str, Any] = {"source": "prefix_cache", "input_tokens": 256, "prefix_ratio": 0.5}
    small = ds.materialize(ws, make_case(32, **spec))
    big = ds.materialize(ws, make_case(32, entries=64, **spec))
    assert small.dataset_id != big.dataset_id
    assert (small.entries, big.entries) == (32, 64)
    assert len(ds.load_entries(ws, big.dataset_id)) == 64
    assert ds.dataset_id_for(make_case(32, **spec)) == ds.dataset_id_for(make_case(32, entries=32, **spec))
    assert ds.dataset_id_for(make_case(32, **spec)) != ds.dataset_id_for(make_case(32, api="completions", **spec))


def test_concurrent_materialize_gives_one_dataset_and_leaves_no_temp_dirs(tmp_path: Path) -> None:
    ws = new_ws(tmp_path)
    case = make_case(16, source="prefix_cache", input_tokens=1024, prefix_ratio=0.8)
    got: list[ds.DatasetIdentity] = []
    threads = [threading.Thread(target=lambda: got.append(ds.materialize(ws, case))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 3 and len({g.content_sha256 for g in got}) == 1 and len({g.generated_at for g in got}) == 1
    names = sorted(p.name for p in ws.datasets_dir.iterdir())
    assert names == sorted([got[0].dataset_id, f".{got[0].dataset_id}.lock"])
    assert ds.verify(ws, got[0].dataset_id) == got[0].content_sha256


def test_verify_names_a_modified_entries_file(tmp_path: Path) -> None:
    ws = new_ws(tmp_path)
    ident = ds.materialize(ws, make_case(4, input_tokens=64))
    path = ws.dataset_dir(ident.dataset_id) / ds.ENTRIES_FILE
    path.write_bytes(path.read_bytes().replace(b'"output_tokens":64', b'"output_tokens":65', 1))
    with pytest.raises(CaseInvalid, match=r"entries\.jsonl sha256") as exc:
        ds.verify(ws, ident.dataset_id)
    assert "freeze the case again" in exc.value.fix


def test_unknown_dataset_is_not_found_with_a_fix(tmp_path: Path) -> None:
    ws = new_ws(tmp_path)
    for fn in (ds.load_entries, ds.load_identity, ds.verify):
        with pytest.raises(NotFound) as exc:
            fn(ws, "d-0123456789ab")
        assert "freeze" in exc.value.fix
    with pytest.raises(PathEscapes):
        ds.load_entries(ws, "d-../../etc")


# ------------------------------------------------------------------------------- counts and salts


def test_synthetic_bodies_are_exactly_input_tokens_by_reencoding(tmp_path: Path) -> None:
    ws = new_ws(tmp_path)
    ident = ds.materialize(ws, make_case(16, input_tokens=300, output_tokens=7))
    entries = ds.load_entries(ws, ident.dataset_id)
    bodies = [ds.render_prompt(e, None, ident) for e in entries]
    assert counts(bodies) == [300] * 16
    assert [len(chat_ids(b)) for b in bodies] == [e["chat_tokens"] for e in entries] == [300 + CHATML_OVERHEAD] * 16
    assert len(set(bodies)) == 16
    assert all(e["prefix"] == "" and e["output_tokens"] == 7 for e in entries)
    assert ident.expected_cached_tokens.max == 0  # only the 6-token template head is shared; block 16


def test_salt_keeps_token_counts_over_many_salts(tmp_path: Path) -> None:
    ws = new_ws(tmp_path)
    ident = ds.materialize(ws, make_case(8, source="prefix_cache", input_tokens=1024, prefix_ratio=0.75))
    entries = ds.load_entries(ws, ident.dataset_id)
    assert ident.salt.k == ds.SALT_K and len(ident.salt.words) == ds.SALT_WORDS
    salts = [f"r-{n:04x}" for n in range(40)]
    texts = [ds.render_prompt(e, s, ident) for s in salts for e in entries]
    want = [e["body_tokens"] for _ in salts for e in entries]
    assert counts(texts) == want
    assert counts([tk.chatml(t) for t in texts[:40]]) == [e["chat_tokens"] for e in entries] * 5
    # The salt changes only the slot, right after the shared prefix.
    e = entries[3]
    salted = ds.render_prompt(e, "r-1", ident)
    assert salted.startswith(e["prefix"]) and salted.endswith(e["suffix"])
    assert salted != ds.render_prompt(e, None, ident)
    assert ds.render_prompt(e, None, ident) == e["prefix"] + e["salt_slot"] + e["suffix"]
    # Deterministic, and the first slot word differs between the entries of one run.
    assert ds.salt_text("r-1", 3, ident.salt.words, 8) == ds.salt_text("r-1", 3, ident.salt.words, 8)
    firsts = {ds.salt_text("r-1", i, ident.salt.words, 8).split()[0] for i in range(len(ident.salt.words))}
    assert len(firsts) == len(ident.salt.words)


def test_completions_and_template_off_count_the_body_chat_counts_the_template(tmp_path: Path) -> None:
    ws = new_ws(tmp_path)
    spec: dict[str, Any] = {"source": "prefix_cache", "input_tokens": 2048, "prefix_ratio": 0.9, "block_size": 64}
    chat = ds.materialize(ws, make_case(4, **spec))
    comp = ds.materialize(ws, make_case(4, api="completions", **spec))
    off = ds.materialize(ws, make_case(4, chat_template=False, **spec))
    assert chat.chat_template_counted and not comp.chat_template_counted and not off.chat_template_counted
    assert chat.chat_tokens.min == 2048 + CHATML_OVERHEAD
    for ident in (comp, off):
        entries = ds.load_entries(ws, ident.dataset_id)
        assert all(e["chat_tokens"] == e["body_tokens"] == 2048 for e in entries)
        assert all(Fraction(e["expected_cached_tokens"], 2048) >= Fraction(9, 10) for e in entries)
    body = ds.render_prompt(ds.load_entries(ws, chat.dataset_id)[0], None, chat)
    assert len(chat_ids(body)) == chat.chat_tokens.min


def test_builtin_fast_path_agrees_with_transformers_chat_template(tmp_path: Path) -> None:
    hf = tk.load("builtin")
    for text in ["kalo mine", " kalo mine", "kalo\n\nmine  ", "x"]:
        want = hf.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True, return_dict=False
        )
        assert chat_ids(text) == list(want)
    # A local copy of the builtin goes through transformers and must give the very same entries.
    local = tmp_path / "ws" / "tok"
    shutil.copytree(tk.BUILTIN_DIR, local)
    ws = new_ws(tmp_path / "ws")
    spec: dict[str, Any] = {"source": "prefix_cache", "input_tokens": 1024, "prefix_ratio": 0.9, "block_size": 32}
    fast = ds.materialize(ws, make_case(6, **spec))
    slow = ds.materialize(ws, make_case(6, tokenizer=str(local), **spec))
    assert slow.dataset_id != fast.dataset_id
    assert slow.content_sha256 == fast.content_sha256
    assert slow.tokenizer.revision == fast.tokenizer.revision == "sha256:" + sha256_file(local / "tokenizer.json")
    pinned = ds.materialize(ws, make_case(6, tokenizer=str(local), tokenizer_revision="v1", **spec))
    assert pinned.tokenizer.revision == "v1"


def test_full_counting_fallback_gives_the_same_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    case = make_case(6, source="prefix_cache", input_tokens=1024, prefix_ratio=0.9, block_size=32, prefix_groups=2)
    composed = ds.materialize(new_ws(tmp_path / "a"), case)
    monkeypatch.setattr(dscon, "_sample_agrees", lambda *a: False)  # as if a merge crossed a boundary
    full = ds.materialize(new_ws(tmp_path / "b"), case)
    assert (composed.counting.method, full.counting.method) == ("composed", "full")
    assert full.content_sha256 == composed.content_sha256


@pytest.mark.integration
def test_module_import_and_builtin_generation_do_not_import_transformers(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path\n"
        "from caseledger import datasets\nfrom caseledger.workspace import Workspace\n"
        "from caseledger.case import Case\n"
        "assert 'transformers' not in sys.modules\n"
        "c = Case.model_validate({'scenario': 't', 'target': {'endpoints': [{'base_url': 'http://127.0.0.1:9/v1',"
        " 'model': 'm'}]}, 'load': {'requests': 2, 'concurrency': 1}})\n"
        f"datasets.materialize(Workspace(Path({str(tmp_path)!r})), c)\n"
        "print('transformers' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------------------------------- file


def write_prompts(ws: Workspace, rel: str, rows: list[dict[str, Any]]) -> Path:
    path = ws.root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def test_file_source_inside_the_workspace_is_hashed_as_is(tmp_path: Path) -> None:
    ws = new_ws(tmp_path)
    rows: list[dict[str, Any]] = [{"prompt": f"question {n}: why is the sky blue?"} for n in range(5)]
    rows[1]["output_tokens"] = 9
    path = write_prompts(ws, "data/prompts.jsonl", rows)
    ident = ds.materialize(ws, make_case(4, source="file", path="data/prompts.jsonl", output_tokens=33))
    entries = ds.load_entries(ws, ident.dataset_id)
    assert ident.source_sha256 == sha256_file(path) and ident.entries == 4
    assert [e["suffix"] for e in entries] == [r["prompt"] for r in rows[:4]]
    assert [ds.render_prompt(e, "r-1", ident) for e in entries] == [r["prompt"] for r in rows[:4]]
    assert [e["output_tokens"] for e in entries] == [33, 9, 33, 33]
    assert [e["body_tokens"] for e in entries] == counts([r["prompt"] for r in rows[:4]])
    assert [e["chat_tokens"] for e in entries] == [len(chat_ids(r["prompt"])) for r in rows[:4]]
    assert ident.salt.k == 0
    # The same spec over changed content is refused, not silently reused.
    write_prompts(ws, "data/prompts.jsonl", rows[::-1])
    with pytest.raises(CaseInvalid, match="changed since dataset"):
        ds.materialize(ws, make_case(4, source="file", path="data/prompts.jsonl", output_tokens=33))


def test_file_source_outside_the_workspace_or_too_short_is_refused_before_any_tokenizer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(name: str) -> Any:
        raise AssertionError(f"tokenizer {name} loaded for a file that is refused anyway")

    monkeypatch.setattr(tk, "load", refuse)
    monkeypatch.setattr(tk, "load_fast", refuse)
    ws = new_ws(tmp_path / "ws")
    (tmp_path / "outside.jsonl").write_text('{"prompt": "hi"}\n')
    with pytest.raises(PathEscapes):
        ds.materialize(ws, make_case(1, source="file", path="../outside.jsonl"))
    write_prompts(ws, "p.jsonl", [{"prompt": "a"}, {"prompt": "b"}])
    with pytest.raises(CaseInvalid) as exc:
        ds.materialize(ws, make_case(3, source="file", path="p.jsonl"))
    assert "dataset.entries" in str(exc.value) and "dataset.path" in str(exc.value) and "at most 2" in exc.value.fix
    assert not ws.datasets_dir.exists() or not [p for p in ws.datasets_dir.iterdir() if p.suffix == ".tmp"]


def test_a_gguf_is_hashed_once_across_processes_and_again_when_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GGUF's sha256 (which names its converted tokenizer) is kept in the cache by path, size, mtime and
    inode: a later process (its in-memory cache empty) reads it instead of hashing GBs again; a changed file is
    hashed again."""
    import hashlib

    from caseledger.datasets import tokenizers

    monkeypatch.setenv("CASELEDGER_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"weights" * 1000)
    st = f.stat()
    args = (str(f), st.st_size, st.st_mtime_ns, st.st_ino)
    tokenizers._gguf_sha256.cache_clear()
    assert tokenizers._gguf_sha256(*args) == hashlib.sha256(f.read_bytes()).hexdigest()
    tokenizers._gguf_sha256.cache_clear()  # as a new process
    hashed: list[Path] = []
    real = tokenizers.sha256_file
    monkeypatch.setattr(tokenizers, "sha256_file", lambda p: (hashed.append(p), real(p))[1])
    assert tokenizers._gguf_sha256(*args) == hashlib.sha256(f.read_bytes()).hexdigest() and hashed == []
    f.write_bytes(b"other" * 1000)
    st = f.stat()
    tokenizers._gguf_sha256.cache_clear()
    got = tokenizers._gguf_sha256(str(f), st.st_size, st.st_mtime_ns, st.st_ino)
    assert got == hashlib.sha256(f.read_bytes()).hexdigest() and hashed == [f]
    tokenizers._gguf_sha256.cache_clear()
