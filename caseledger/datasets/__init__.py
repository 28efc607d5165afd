"""Datasets: a case's requests materialized once under ledger/datasets/<dataset_id>/, with their identity.

    ledger/datasets/<dataset_id>/entries.jsonl   one orjson line per entry (Entry), entry i = request i
    ledger/datasets/<dataset_id>/identity.json   DatasetIdentity: content hash, tokenizer, token counts

The id comes from the dataset spec alone (`dataset_id_for`): the same spec is reused without loading a
tokenizer, and a subset (fewer entries) is its own dataset. Generation happens in a temp directory that
is renamed into place, under a lock, so concurrent callers never see or leave a half-written dataset.

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

from caseledger.datasets.identity import (
    ENTRIES_FILE,
    GENERATOR_VERSION,
    HIT_RATIO_DENOMINATOR,
    IDENTITY_FILE,
    SALT_K,
    SALT_WORDS,
    DatasetIdentity,
    Entry,
    dataset_id_for,
    render_prompt,
    salt_text,
)
from caseledger.datasets.store import load_entries, load_identity, materialize, verify

__all__ = [
    "ENTRIES_FILE",
    "GENERATOR_VERSION",
    "HIT_RATIO_DENOMINATOR",
    "IDENTITY_FILE",
    "SALT_K",
    "SALT_WORDS",
    "DatasetIdentity",
    "Entry",
    "dataset_id_for",
    "load_entries",
    "load_identity",
    "materialize",
    "render_prompt",
    "salt_text",
    "verify",
]
