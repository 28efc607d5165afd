"""The case's dataset (what is sent): its source, lengths (fixed or drawn from a distribution), prefix groups,
tokenizer and multi-turn sessions."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, model_validator

from caseledger.case.bounds import (
    MAX_PATH,
    MAX_REQUESTS,
    MAX_SEED,
    MAX_SESSIONS,
    MAX_THINK_MS,
    MAX_TOKENS,
    MAX_TURNS,
    OmitAtDefault,
    SectionModel,
)


class LengthDistribution(SectionModel):
    """A length drawn per entry (dataset.input_tokens or dataset.output_tokens as an object), seeded by
    dataset.seed: fixed, uniform on [min, max], or normal / lognormal truncated to [min, max] and rounded."""

    distribution: Literal["fixed", "uniform", "normal", "lognormal"] = Field(
        description="fixed: always value; uniform: integers min..max equally likely; normal, lognormal: mean and "
        "stdev of the length itself, truncated to [min, max] (resampled, never clipped) and rounded",
        examples=["lognormal"],
    )
    value: int | None = Field(None, ge=1, le=MAX_TOKENS, strict=True, description="fixed: the length (1..2097152)")
    mean: float | None = Field(
        None,
        gt=0,
        le=MAX_TOKENS,
        strict=True,
        description="normal, lognormal: mean of the length in tokens",
        examples=[512.0],
    )
    stdev: float | None = Field(
        None,
        gt=0,
        le=MAX_TOKENS,
        strict=True,
        description="normal, lognormal: standard deviation of the length in tokens",
        examples=[128.0],
    )
    min: int = Field(1, ge=1, le=MAX_TOKENS, strict=True, description="Shortest length (1..2097152)")
    max: int = Field(
        MAX_TOKENS,
        ge=1,
        le=MAX_TOKENS,
        strict=True,
        description="Longest length (1..2097152); the bound of what is materialized and of the context check",
    )

    @model_validator(mode="after")
    def _complete(self) -> LengthDistribution:
        d = self.distribution
        if self.min > self.max:
            raise ValueError(f"length distribution: min {self.min} > max {self.max}; give min <= max")
        if d == "fixed":
            if self.value is None or self.mean is not None or self.stdev is not None:
                raise ValueError(
                    "length distribution 'fixed' takes value (and nothing else): e.g. "
                    "{'distribution': 'fixed', 'value': 256}"
                )
        elif self.value is not None:
            raise ValueError(
                f"length distribution '{d}' takes no value (only 'fixed' does); use min/max"
                + ("" if d == "uniform" else ", mean and stdev")
            )
        if d == "uniform" and (self.mean is not None or self.stdev is not None or "max" not in self.model_fields_set):
            raise ValueError(
                "length distribution 'uniform' takes min and max only: e.g. {'distribution': "
                "'uniform', 'min': 64, 'max': 512}"
            )
        if d in ("normal", "lognormal") and (self.mean is None or self.stdev is None):
            raise ValueError(
                f"length distribution '{d}' needs mean and stdev (of the length, in tokens), and "
                "optionally min/max: e.g. {'distribution': '" + d + "', 'mean': 512, 'stdev': 128, "
                "'min': 16, 'max': 2048}"
            )
        return self

    @property
    def longest(self) -> int:
        return self.value if self.distribution == "fixed" and self.value is not None else self.max


Length = int | LengthDistribution
LENGTH_TAGS = ("tokens", "distribution")  # the branches of a length field, as they appear in validation error paths


def _length_kind(v: Any) -> str:
    return "distribution" if isinstance(v, dict | LengthDistribution) else "tokens"


# an integer, or a distribution (an object): the branch is chosen by the value's kind, so an out-of-range integer
# is reported as that, not as "not a distribution" too
_LengthField = Annotated[
    Annotated[Annotated[int, Field(ge=1, le=MAX_TOKENS, strict=True)], Tag("tokens")]
    | Annotated[LengthDistribution, Tag("distribution")],
    Discriminator(_length_kind),
]


class Sessions(SectionModel):
    """Multi-turn conversations (dataset.sessions, source 'synthetic'): `count` conversations of `turns` turns
    each. Every turn sends the conversation so far (the earlier user messages and the replies the server gave)
    plus a new user message of dataset.input_tokens body tokens, and asks dataset.output_tokens; turn k leaves
    only after turn k-1's response ended and think_time_ms passed. N (load.requests) is the total of turns."""

    count: int = Field(
        description="Conversations (sessions), 1..100000", ge=1, le=MAX_SESSIONS, strict=True, examples=[8]
    )
    turns: Annotated[
        Annotated[Annotated[int, Field(ge=1, le=MAX_TURNS, strict=True)], Tag("tokens")]
        | Annotated[LengthDistribution, Tag("distribution")],
        Discriminator(_length_kind),
    ] = Field(
        description="Turns per conversation (1..1024), or a distribution drawn per conversation (seeded by "
        "dataset.seed, as lengths are)",
        examples=[4, {"distribution": "uniform", "min": 2, "max": 6}],
    )
    think_time_ms: Annotated[
        Annotated[Annotated[int, Field(ge=0, le=MAX_THINK_MS, strict=True)], Tag("tokens")]
        | Annotated[LengthDistribution, Tag("distribution")],
        Discriminator(_length_kind),
    ] = Field(
        0,
        description="Wait between a turn's response end and the next turn's send, ms (0..3600000), or a "
        "distribution drawn per turn",
        examples=[0, {"distribution": "uniform", "min": 200, "max": 800}],
    )

    @model_validator(mode="after")
    def _bounds(self) -> Sessions:
        if isinstance(self.turns, LengthDistribution) and self.turns.longest > MAX_TURNS:
            raise ValueError(
                f"dataset.sessions.turns: max {self.turns.longest} is above {MAX_TURNS} turns; set "
                f"its max to at most {MAX_TURNS}"
            )
        if isinstance(self.think_time_ms, LengthDistribution) and self.think_time_ms.longest > MAX_THINK_MS:
            raise ValueError(
                f"dataset.sessions.think_time_ms: max {self.think_time_ms.longest} is above "
                f"{MAX_THINK_MS} ms; set its max to at most {MAX_THINK_MS}"
            )
        return self

    def fixed_total(self) -> int | None:
        """Total turns (N) when turns is an integer; None when each conversation draws its own."""
        return self.count * self.turns if isinstance(self.turns, int) else None


def longest(x: Length) -> int:
    """The largest length a dataset.input_tokens / output_tokens value can give."""
    return x if isinstance(x, int) else x.longest


class Dataset(OmitAtDefault):
    omit_at_default = ("sha256", "sessions")  # added after cases were frozen: out of the canonical JSON at default
    source: Literal["synthetic", "prefix_cache", "file", "trace"] = Field(
        "synthetic",
        description="synthetic: exact token lengths; prefix_cache: shared prefix per group + unique suffix; "
        "file: JSONL of prompts inside the workspace, hashed as is; trace: a Mooncake-style JSONL (timestamp ms, "
        "input_length, output_length, hash_ids) inside the workspace, each hash id one shared block of "
        "block_size tokens",
    )
    entries: int | None = Field(
        None,
        ge=1,
        le=MAX_REQUESTS,
        strict=True,
        description="Entries materialized, one per formal request (1..1000000); null: filled with load.requests",
    )
    input_tokens: _LengthField = Field(
        256,
        description="Body tokens per entry (before the chat template), 1..2097152, or a length distribution "
        "drawn per entry (synthetic, prefix_cache); entries x the longest input, over all the datasets one freeze "
        "generates, at most 2**29",
        examples=[256, {"distribution": "lognormal", "mean": 512, "stdev": 256, "min": 32, "max": 4096}],
    )
    output_tokens: _LengthField = Field(
        64,
        description="Output tokens per request (max_tokens; ignore_eos fixes it), 1..2097152, or a length "
        "distribution drawn per entry (then load.max_tokens must stay null)",
        examples=[64, {"distribution": "uniform", "min": 16, "max": 256}],
    )
    prefix_ratio: float = Field(
        0.0, ge=0, lt=1, strict=True, description="prefix_cache: minimum expected hit ratio per entry"
    )
    block_size: int = Field(
        16, ge=1, le=65_536, strict=True, description="Cache block size the hit ratio is aligned to (1..65536)"
    )
    prefix_groups: int = Field(
        1,
        ge=1,
        le=MAX_REQUESTS,
        strict=True,
        description="prefix_cache: number of distinct shared prefixes (1..1000000)",
    )
    tokenizer: str = Field(
        "builtin",
        min_length=1,
        max_length=MAX_PATH,
        description="Tokenizer: 'builtin' (a small BPE the project generates) or a local path for "
        "transformers.AutoTokenizer (no hub access at run time); at most 4096 characters",
    )
    tokenizer_revision: str | None = Field(
        None, max_length=200, description="Tokenizer revision recorded in the identity (at most 200 characters)"
    )
    chat_template: bool = Field(
        True, strict=True, description="Count tokens with the chat template applied (what the server sees)"
    )
    path: str | None = Field(
        None,
        max_length=MAX_PATH,
        description="file, trace: JSONL path relative to the workspace (file: one {'prompt': ...} "
        "per line; trace: one request per line), at most 4096 characters",
    )
    sha256: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{64}$",
        description="trace: sha256 of the file at dataset.path; null: filled at freeze (the "
        "case id and the dataset id then cover the trace's content)",
    )
    seed: int = Field(
        0, ge=-MAX_SEED - 1, le=MAX_SEED, strict=True, description="Generator seed (a signed 64-bit integer)"
    )
    sessions: Sessions | None = Field(
        None,
        description="Multi-turn conversations (source 'synthetic', target.api 'chat'): input_tokens is each "
        "turn's new user message, output_tokens each turn's reply; later turns carry the earlier turns. null: every "
        "entry is a single-turn request",
    )

    @model_validator(mode="after")
    def _source_fields(self) -> Dataset:
        if self.sha256 is not None and self.source != "trace":
            raise ValueError(f"dataset.sha256 is only used by source 'trace', not '{self.source}'; remove it")
        if self.source in ("file", "trace") and isinstance(self.input_tokens, LengthDistribution):
            raise ValueError(
                f"dataset.input_tokens is a distribution but source '{self.source}' takes its lengths "
                "from the file; give an integer or use source 'synthetic' or 'prefix_cache'"
            )
        if self.sessions is not None and self.source != "synthetic":
            raise ValueError(
                f"dataset.sessions needs source 'synthetic' (it is '{self.source}'): each turn's user "
                "message is generated; set source 'synthetic' or remove dataset.sessions"
            )
        if self.source == "trace" and isinstance(self.output_tokens, LengthDistribution):
            raise ValueError(
                "dataset.output_tokens is a distribution but source 'trace' takes output_length from "
                "each row; give an integer (unused) or leave it out"
            )
        return self
