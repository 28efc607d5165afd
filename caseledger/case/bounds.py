"""The input boundary of a case: every number and string has a documented bound, far above what a real campaign
needs (a large one: N 640, C 64, 131072 input tokens) and low enough that a typo (1e12) is refused at freeze instead
of hanging it, exhausting memory or flooding HANDOFF.md. Integers and booleans are strict (`true` is no 1, 5.0 is
no 5) and floats must be finite (NaN/Infinity would be stored as null): the base model of every case section says
so once."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

from caseledger.records import SCENARIO_PATTERN

MAX_REQUESTS = 1_000_000  # N: 1500x the seeds' 640
MAX_CONCURRENCY = 100_000  # C
MAX_LOAD_PROCESSES = 64  # load.processes: client processes of one formal load
MAX_TOKENS = 2_097_152  # tokens per prompt or per output (2 Mi: 16x the seeds' 131072-token inputs)
# input tokens one freeze may generate (datasets.check_generation), over every dataset it materializes: a case's, or a
# campaign's base and points on every pool target (a dataset they share counted once, one already materialized not
# at all). Synthetic and prefix_cache: entries x the longest input (entries: load.requests, which counts every turn
# of dataset.sessions); a trace: its rows' input_length summed. 2**29: 6.4x the seeds' largest case (N 640 x 131072
# input tokens), and 5-7.5 minutes at the 1.2-1.7 M tokens/s the builtin tokenizer generates on one core, so a freeze
# at the bound ends inside one MCP tool call (README: a tool timeout above 600 s); the 2**30 per case before took ~15
MAX_FREEZE_TOKENS = 2**29
MAX_TIMEOUT_S = 86_400.0  # one day: per-request timeout, health wait
MAX_SEED = 2**63 - 1  # seeds fit a signed 64-bit integer (the canonical JSON encoder's limit)
MAX_URL = 2048
MAX_PATH = 4096  # PATH_MAX
MAX_ARG = 32_768  # one argv element or env value
MAX_ARGS = 1024  # argv elements, env entries
MAX_SESSIONS = 100_000  # conversations per dataset
MAX_TURNS = 1024  # turns per conversation
MAX_THINK_MS = 3_600_000  # one hour between two turns
# one SSE event the load client holds while it arrives: streamed chunks are a few KB (usage, timings,
# logprobs), so 8 MiB is a thousand times that, and 64 streams at once still hold at most 512 MiB
DEFAULT_MAX_EVENT_BYTES = 8 * 2**20
MIN_EVENT_BYTES, MAX_EVENT_BYTES = 2**16, 2**30  # under 64 KiB a chunk with logprobs may not fit; over 1 GiB: a typo

# what a pattern means, in words, for the answer to a draft that breaks it (case/store.py explain)
PATTERN_RULES = {
    SCENARIO_PATTERN: "must start with a letter or digit, followed by letters, digits, '.', '_' or '-' "
    "(at most 200 characters), e.g. 'copy-128k-1k-prefix90'"
}


class SectionModel(BaseModel):
    """The base of every case section: frozen, no unknown fields, finite floats; built on first use."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, defer_build=True)


class OmitAtDefault(SectionModel):
    """A case section with fields added after cases were frozen: each named in `omit_at_default` is left out of
    the canonical JSON while it holds its default, so the cases frozen before it existed keep their ids."""

    omit_at_default: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _omit_defaults(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:  # JSON: a pydantic dump
        data: dict[str, Any] = handler(self)  # JSON: the section as pydantic dumps it
        fields = type(self).model_fields
        for name in self.omit_at_default:
            if getattr(self, name) == fields[name].get_default(call_default_factory=True):
                data.pop(name, None)
        return data
