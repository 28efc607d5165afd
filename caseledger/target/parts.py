"""The reference engine's parts: the prompt's chat text, the prefix cache, the counters, one sequence and its
emissions, and a request's ticket. The scheduler that drives them is caseledger.target.reference."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

Fault = Literal["error", "stall"]


def chat_prompt(messages: Seq[tuple[str, str]]) -> str:
    """ChatML text of a conversation, ending with the assistant generation prompt.

    For one user message this equals `caseledger.tokenizer.chatml(content)`.
    """
    body = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in messages)
    return body + "<|im_start|>assistant\n"


class PrefixCache:
    """Block-based LRU prefix cache keyed by a hash chain of token blocks."""

    def __init__(self, capacity_blocks: int, block_size: int) -> None:
        self.capacity = capacity_blocks
        self.block_size = block_size
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def hashes(self, ids: Seq[int]) -> list[int]:
        """Chain hashes of every full block of `ids` (a block's hash covers all tokens before it)."""
        bs = self.block_size
        out: list[int] = []
        parent = 0
        for i in range(0, len(ids) - bs + 1, bs):
            # tuple hashing of ints is not randomized per process, so it is stable across restarts
            parent = hash((parent, tuple(ids[i : i + bs])))
            out.append(parent)
        return out

    def lookup(self, prompt_len: int, hashes: Seq[int]) -> int:
        """Cached tokens for a prompt: leading blocks present, over at most prompt_len - 1 tokens."""
        if self.capacity == 0:
            return 0
        limit = (prompt_len - 1) // self.block_size
        hit = 0
        for h in hashes[:limit]:
            if h not in self._blocks:
                break
            self._blocks.move_to_end(h)
            hit += 1
        return hit * self.block_size

    def insert(self, hashes: Seq[int]) -> None:
        """Insert (or refresh) blocks, evicting the least recently used beyond capacity."""
        if self.capacity == 0:
            return
        blocks = self._blocks
        for h in hashes:
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = None
        while len(blocks) > self.capacity:
            blocks.popitem(last=False)

    def clear(self) -> int:
        """Drop every block; returns how many there were."""
        n = len(self._blocks)
        self._blocks.clear()
        return n


@dataclass
class Counters:
    """Monotonic engine counters (vLLM names in /metrics)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0  # tokens looked up
    prefix_hits: int = 0  # tokens found
    spec_drafts: int = 0  # decode steps that drafted (one per sequence per step)
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_accepted_per_pos: list[int] = field(default_factory=list)  # steps whose draft position k was accepted
    success: dict[str, int] = field(default_factory=lambda: {"length": 0, "stop": 0})


class Emission(NamedTuple):
    """One engine emission of a sequence (a prefill's first token, or a decode step's tokens)."""

    text: str
    completion_tokens: int  # cumulative, after this emission
    drafted: int  # cumulative draft tokens proposed for this sequence (llama.cpp's timings.draft_n)
    accepted: int  # cumulative draft tokens accepted (timings.draft_n_accepted)


class Sequence:
    """One request inside the engine: its prompt, progress and the output not yet drained.

    The scheduler appends an `Emission` per engine emission; the HTTP side drains them with `take()` after
    `await wait()`. `finish_reason` is set once the last token was appended. `drafted` / `accepted` count
    this request's draft tokens as llama.cpp's timings.draft_n / draft_n_accepted do.
    """

    __slots__ = (
        "_hashes",
        "_out",
        "_pos",
        "_remaining",
        "_waiter",
        "aborted",
        "accepted",
        "cache_prompt",
        "cached_tokens",
        "completion_tokens",
        "drafted",
        "finish_reason",
        "max_tokens",
        "prompt_ids",
        "prompt_tokens",
        "target",
    )

    def __init__(self, prompt_ids: list[int], max_tokens: int, target: int, cache_prompt: bool) -> None:
        self.prompt_ids = prompt_ids
        self.prompt_tokens = len(prompt_ids)
        self.max_tokens = max_tokens
        self.target = target  # tokens this sequence will emit (<= max_tokens)
        self.cache_prompt = cache_prompt
        self.cached_tokens = 0
        self.completion_tokens = 0
        self.drafted = 0
        self.accepted = 0
        self.finish_reason: str | None = None
        self.aborted = False
        self._remaining = 0.0  # prefill tokens left
        self._hashes: list[int] = []
        self._pos = 0  # cursor in the engine's output token cycle
        self._out: list[Emission] = []
        self._waiter: asyncio.Future[None] | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None or self.aborted

    def take(self) -> list[Emission]:
        """Emissions since the last call."""
        out = self._out
        if out:
            self._out = []
        return out

    async def wait(self) -> None:
        """Return when there is output to take or the sequence is done."""
        if self._out or self.done:
            return
        self._waiter = asyncio.get_running_loop().create_future()
        await self._waiter

    def _emit(self, text: str, n: int) -> None:
        self.completion_tokens += n
        self._out.append(Emission(text, self.completion_tokens, self.drafted, self.accepted))
        self._notify()

    def _notify(self) -> None:
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)


@dataclass(frozen=True)
class Ticket:
    """A completion request as counted on arrival: its ordinal and the fault it was dealt."""

    ordinal: int  # 1-based count of completion requests received
    phase: str
    fault: Fault | None
