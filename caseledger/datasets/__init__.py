"""Datasets: a case's requests materialized once under ledger/datasets/<dataset_id>/, with their identity.

    ledger/datasets/<dataset_id>/entries.jsonl   one orjson line per entry (Entry), entry i = request i
    ledger/datasets/<dataset_id>/identity.json   DatasetIdentity: content hash, tokenizer, token counts

The id comes from the dataset spec alone (`dataset_id_for`): the same spec is reused without loading a
tokenizer, and a subset (fewer entries) is its own dataset. Generation happens in a temp directory that
is renamed into place, under a lock, so concurrent callers never see or leave a half-written dataset.

How the bodies of the synthetic and prefix_cache sources are built: datasets/constructed.py (generation starts
in datasets/generate.py).
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
from caseledger.datasets.store import check_generation, load_entries, load_identity, materialize, verify
from caseledger.datasets.trace import pin

__all__ = [
    "ENTRIES_FILE",
    "GENERATOR_VERSION",
    "HIT_RATIO_DENOMINATOR",
    "IDENTITY_FILE",
    "SALT_K",
    "SALT_WORDS",
    "DatasetIdentity",
    "Entry",
    "check_generation",
    "dataset_id_for",
    "load_entries",
    "load_identity",
    "materialize",
    "pin",
    "render_prompt",
    "salt_text",
    "verify",
]
