"""What caseledger knows about one serving engine, as data: its /metrics names by role, how its argv names the
weights and the commands that start it, where it reports its version, and whether its responses carry per-request
draft counts."""

from __future__ import annotations

from dataclasses import dataclass, field

# The roles a /metrics sample name can play (sample names as scraped: a counter's with its _total suffix).
ROLES = (
    "running",  # gauge: requests in model execution now
    "waiting",  # gauge: requests queued
    "prompt_tokens",  # counter: prompt tokens processed
    "generation_tokens",  # counter: tokens generated
    "cache_queries",  # counter: prefix-cache lookups, in tokens
    "cache_hits",  # counter: prefix-cache hits, in tokens
    "success",  # counter: requests finished, by finished_reason
    "spec_drafts",  # counter: speculative verify steps
    "spec_draft_tokens",  # counter: draft tokens proposed
    "spec_accepted",  # counter: draft tokens accepted
    "spec_per_pos",  # counter: accepted tokens per draft position (label position="k")
)
IN_FLIGHT = ("running", "waiting")  # the gauges that say an engine still works on requests


@dataclass(frozen=True)
class EngineProfile:
    name: str  # the engine's name: its module's name in caseledger/engines, its template's in data/templates
    rank: int  # where it stands in every list of engines (lowest first): help, errors, the schema's spec_decode
    what: str  # one line: the engine and its server command
    metrics: dict[str, str] = field(default_factory=dict)  # role -> sample name
    older: dict[str, tuple[str, ...]] = field(default_factory=dict)  # role -> names of older builds (fallbacks)
    spec_missing: str = ""  # why draft/accepted token counters cannot be read from this engine, when they cannot
    weight_options: tuple[str, ...] = ()  # argv options whose value is model weights (`--opt v` or `--opt=v`)
    serve_words: tuple[str, ...] = ()  # argv words after which the first positional is the weights' path
    version: tuple[tuple[str, str], ...] = ()  # (HTTP path, JSON field) that report the engine's version
    per_request_drafts: bool = False  # its responses carry each request's draft and accepted counts
    commands: tuple[str, ...] = ()  # argv words that start it: an executable's name or a `python -m` module

    def __post_init__(self) -> None:
        unknown = (set(self.metrics) | set(self.older)) - set(ROLES)
        if unknown:
            raise ValueError(f"engine profile {self.name}: unknown metric roles {sorted(unknown)}; known: {ROLES}")

    def names(self, role: str) -> tuple[str, ...]:
        """The sample names that play `role` on this engine, the current one first."""
        current = (self.metrics[role],) if role in self.metrics else ()
        return current + self.older.get(role, ())
