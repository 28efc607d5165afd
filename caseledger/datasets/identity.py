"""Dataset identity: the entry record, the identity model, the dataset id, and the prompt a run sends."""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any, Literal, NotRequired, TypedDict

from pydantic import BaseModel, ConfigDict

from caseledger.case.model import Case
from caseledger.workspace import canonical_json, sha256_bytes

GENERATOR_VERSION = "1"  # bump when the same spec would generate different entries
HIT_RATIO_DENOMINATOR = "chat-template prompt tokens"
ENTRIES_FILE = "entries.jsonl"
IDENTITY_FILE = "identity.json"
SALT_K = 8  # salt slot words: 1024**8 = 2**80 slots per entry, so two runs never share one
SALT_WORDS = 1024  # single-token words the salt picks from, recorded in the identity
DEFAULT_SALT = "caseledger-default-slot"


class Entry(TypedDict):
    """One request's data. The body sent is prefix + salt slot (or a run's salt words) + suffix."""

    i: int  # entry index = formal request index
    group: int  # prefix group (i % prefix_groups)
    prefix: str  # the group's shared text ("" for synthetic and file)
    salt_slot: str  # default salt slot: K words " w", one token each ("" when K is 0)
    suffix: str  # unique text (the prompt as is for a file source)
    body_tokens: int  # tokens of prefix + salt_slot + suffix, no special tokens
    chat_tokens: int  # tokens the server counts (chat template applied); body_tokens without one
    expected_cached_tokens: int  # whole cache blocks of the shared chat-template prefix
    expected_hit_ratio: float  # expected_cached_tokens / chat_tokens
    output_tokens: int  # max_tokens for this request
    # source 'trace' only: the request's row in the trace file (0-based), its send offset in seconds as written
    # (before load.time_scale), and how many of its leading hash_ids blocks an earlier row already sent; its
    # expected_cached_tokens is then the planned shared prefix in chat tokens (not aligned to a block)
    trace_row: NotRequired[int]
    arrival_s: NotRequired[float]
    shared_blocks: NotRequired[int]
    # dataset.sessions only: the entry is turn `turn` (0-based) of conversation `session`, which has `turns` turns;
    # think_s is the wait after the previous turn's response ended (0 for turn 0). The entry's prefix/salt/suffix is
    # the turn's new user message; its chat_tokens count that message alone (the history is the server's replies)
    session: NotRequired[int]
    turn: NotRequired[int]
    turns: NotRequired[int]
    think_s: NotRequired[float]


class _Frozen(BaseModel):
    # built on first use: most processes that import datasets never validate an identity
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class TokenizerInfo(_Frozen):
    name: str  # dataset.tokenizer as written: 'builtin' or a local directory
    revision: str  # dataset.tokenizer_revision, else 'sha256:<hex>' of tokenizer.json
    path: str  # the directory it was loaded from


class IntStats(_Frozen):
    min: int
    max: int
    mean: float


class RatioStats(_Frozen):
    min: float
    max: float
    mean: float


class BelowTarget(_Frozen):
    count: int  # entries whose expected hit ratio is below prefix_ratio_target (exact, never rounded)
    first: list[int]  # the first few such entry indices
    message: str | None  # what happened and the fix; None when count is 0


class SaltSlot(_Frozen):
    words: list[str]  # single-token words (used as " w") a run's salt picks from
    k: int  # words per slot; 0: this dataset cannot be salted (file source)
    # one slot for every entry of a run (source 'trace': it leads the prompt, so what the trace shares stays
    # shared inside the run and nothing is shared with another run); False: a slot per entry
    per_run: bool = False


class LengthHistogram(_Frozen):
    edges: list[float]  # bin edges, len(counts) + 1
    counts: list[int]


class Lengths(_Frozen):
    """One side's lengths (input body tokens or output tokens): as declared and as realized in the entries."""

    declared: dict[str, Any]  # JSON: the distribution as written ({'distribution': 'fixed', 'value': n} for an integer)
    count: int
    min: int
    max: int
    mean: float
    stdev: float
    p50: float
    p90: float
    p99: float
    histogram: LengthHistogram
    sha256: str  # sha256 of the lengths joined by ',' in entry order


class TraceInfo(_Frozen):
    """What a trace dataset replays."""

    rows: int  # rows used (dataset.entries; the first of the file)
    rows_in_file: int
    first_row: int
    block_size: int  # tokens per hash id block
    distinct_blocks: int  # distinct hash ids among the rows used
    shared_blocks: int  # blocks planned as already sent by an earlier row, summed over the requests
    planned_shared_tokens: int  # the requests' planned shared-prefix chat tokens, summed
    span_s: float  # last timestamp - first, seconds as written (before load.time_scale)


class SessionsInfo(_Frozen):
    """What a multi-turn dataset holds (dataset.sessions)."""

    count: int  # conversations
    turns: int  # turns in all (= entries = N)
    turns_min: int  # turns of the shortest conversation
    turns_max: int
    think_s_total: float  # the planned waits between turns, summed


class Counting(_Frozen):
    method: Literal["composed", "full"]  # composed: prefix once + each suffix; full: every entry encoded
    checked: list[int]  # entries re-encoded whole (with the chat template) to check the counts


class DatasetIdentity(_Frozen):
    """What a materialized dataset is: stored as identity.json next to entries.jsonl."""

    dataset_id: str
    content_sha256: str  # sha256 of entries.jsonl
    source: Literal["synthetic", "prefix_cache", "file", "trace"]
    source_sha256: str | None  # file and trace sources: sha256 of the JSONL file as read
    spec: dict[str, Any]  # JSON: the filled dataset spec the id was computed from
    api: Literal["chat", "completions"]
    generator: str
    tokenizer: TokenizerInfo
    chat_template_counted: bool  # False: api completions or dataset.chat_template false (chat = body)
    entries: int
    output_tokens: int  # dataset.output_tokens; the longest when drawn or per row (a file line may set its own)
    body_tokens: IntStats
    chat_tokens: IntStats
    expected_cached_tokens: IntStats
    expected_hit_ratio: RatioStats
    hit_ratio_denominator: str
    block_size: int
    prefix_ratio_target: float
    below_target: BelowTarget
    salt: SaltSlot
    counting: Counting
    generated_at: datetime
    generation_seconds: float
    # realized lengths (input body tokens, output tokens) of every entry; null in identities written before them
    input_lengths: Lengths | None = None
    output_lengths: Lengths | None = None
    trace: TraceInfo | None = None  # source 'trace' only
    sessions: SessionsInfo | None = None  # dataset.sessions only


# ---------------------------------------------------------------------------------------------- ids


def dataset_id_for(case: Case) -> str:
    """'d-' + 12 hex of sha256 over the filled dataset spec, target.api and the generator version."""
    filled = case.filled()
    spec = {
        "api": filled.target.api,
        "dataset": filled.dataset.model_dump(mode="json"),
        "generator": GENERATOR_VERSION,
    }
    return "d-" + sha256_bytes(canonical_json(spec))[:12]


# ------------------------------------------------------------------------------------------- salt


def salt_text(salt: str, entry_i: int, words: list[str], k: int) -> str:
    """K words " w" picked deterministically from (salt, entry_i).

    The first word walks the list from an offset given by the salt, so within one run the first slot
    token differs between entries (up to len(words) entries) and nothing past the shared prefix is
    shared by two requests of the run.
    """
    if k <= 0:
        return ""
    if not words:
        raise ValueError("salt_text needs a non-empty word list")
    n = len(words)
    start = int.from_bytes(hashlib.sha256(f"salt\0{salt}".encode()).digest()[:8], "big")
    stream = hashlib.shake_256(f"slot\0{salt}\0{entry_i}".encode()).digest(4 * k)
    picks = [words[(start + entry_i) % n]]
    picks += [words[int.from_bytes(stream[4 * j : 4 * j + 4], "big") % n] for j in range(1, k)]
    return "".join(" " + w for w in picks)


def render_prompt(entry: Entry, salt: str | None, identity: DatasetIdentity) -> str:
    """The body to send: prefix + (the run's salt slot, or the entry's default) + suffix.

    Its token count is entry['body_tokens'] whatever the salt: every slot word is one token and the
    slot is bounded by word boundaries on both sides.
    """
    if salt is None or identity.salt.k == 0:
        slot = entry["salt_slot"]
    else:
        slot = salt_text(salt, 0 if identity.salt.per_run else entry["i"], identity.salt.words, identity.salt.k)
    return entry["prefix"] + slot + entry["suffix"]
