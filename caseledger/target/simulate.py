"""The reference engine on virtual time: a closed-loop load through the same scheduler the reference target
serves with, in one process, as fast as the CPU runs it.

The event loop's clock is virtual: when nothing is ready, the loop jumps to its next timer instead of sleeping, so
a load of minutes takes milliseconds and replays exactly (the engine's random choices are seeded). It answers
"what would the reference target measure here" for a whole space at once: the exhaustive optimum a search is
judged against (tests/test_search.py), and formal-window time a strategy would spend (bench/bench_search.py).
Only the engine is simulated: no HTTP, no load client, no tokenizer round trip (prompts are token ids).
"""

from __future__ import annotations

import asyncio
import selectors
from dataclasses import dataclass

import numpy as np

from caseledger.case.service import ReferenceConfig
from caseledger.target.reference import ReferenceEngine


class _Selector(selectors.DefaultSelector):
    """Polls without blocking; when nothing is ready, moves the clock to the loop's next timer."""

    def __init__(self, clock: list[float]) -> None:
        super().__init__()
        self._clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if not ready and timeout:
            self._clock[0] += timeout
        elif not ready and timeout is None:
            raise RuntimeError("the simulation stalled: nothing is scheduled and nothing can wake it")
        return ready


class _VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._now = [0.0]
        super().__init__(_Selector(self._now))

    def time(self) -> float:
        return self._now[0]


@dataclass(frozen=True)
class Simulated:
    """What a closed-loop load measured on the simulated engine (times in ms, throughput in tokens/s)."""

    requests: int
    output_throughput: float  # completion tokens / (last end - first send)
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    duration_s: float  # the load's virtual wall time: what a formal window of it would take


def simulate(
    config: ReferenceConfig,
    *,
    concurrency: int,
    requests: int,
    prompt_tokens: int = 256,
    max_tokens: int = 64,
) -> Simulated:
    """N requests at concurrency C (each client sends its next request when the last one ended) on a fresh engine
    with `config` (its seed drives the engine's random choices); prompts bypass the prefix cache, exactly max_tokens
    out."""
    if concurrency < 1 or requests < 1 or prompt_tokens < 1 or max_tokens < 1:
        raise ValueError("concurrency, requests, prompt_tokens and max_tokens must be >= 1")
    loop = _VirtualLoop()
    try:
        return loop.run_until_complete(_load(config, concurrency, requests, prompt_tokens, max_tokens))
    finally:
        loop.close()


async def _load(cfg: ReferenceConfig, c: int, n: int, prompt: int, out: int) -> Simulated:
    engine = ReferenceEngine(cfg, "simulated")
    loop = asyncio.get_running_loop()
    todo = list(range(n))
    ids = [1] * prompt
    ttft: list[float] = []
    tpot: list[float] = []
    tokens = 0
    start = loop.time()

    async def client() -> None:
        nonlocal tokens
        while todo:
            todo.pop()
            sent = loop.time()
            seq = engine.submit(ids, out, cache_prompt=False)  # no cache lookup: the ids' values do not matter
            first: float | None = None
            while not seq.done or seq._out:
                await seq.wait()
                if seq.take() and first is None:
                    first = loop.time()
            assert first is not None
            end = loop.time()
            ttft.append((first - sent) * 1000)
            if seq.completion_tokens > 1:
                tpot.append((end - first) * 1000 / (seq.completion_tokens - 1))
            tokens += seq.completion_tokens

    await asyncio.gather(*(client() for _ in range(min(c, n))))
    await engine.aclose()
    took = loop.time() - start
    tt, tp = np.asarray(ttft), np.asarray(tpot or [0.0])
    return Simulated(
        requests=n,
        output_throughput=tokens / took if took > 0 else 0.0,
        ttft_p50_ms=float(np.percentile(tt, 50)),
        ttft_p99_ms=float(np.percentile(tt, 99)),
        tpot_p50_ms=float(np.percentile(tp, 50)),
        tpot_p99_ms=float(np.percentile(tp, 99)),
        duration_s=took,
    )
