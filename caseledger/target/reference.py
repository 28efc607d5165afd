"""The reference engine: a simulated LLM server with a documented performance model.

It stands in for a real inference engine so the pipeline (load client, metrics, cache checks, faults)
can be exercised on one laptop core. Everything here is plain code driven by ONE asyncio scheduler
task; the HTTP layer (server.py) only submits sequences and drains their output; the parts it schedules
(prefix cache, sequences, counters) are in parts.py.

Performance model (`ReferenceConfig` fields in backticks; times on the event loop's monotonic clock):

- Admission: a request waits in a FIFO queue until fewer than `slots` sequences are running (in
  prefill or decode). On admission the prefix cache is looked up (see below) and fixes
  `cached_tokens`.
- Prefill: the uncached prompt tokens (`prompt_tokens - cached_tokens`, always >= 1) are processed at
  `prefill_tokens_per_s`, shared equally among the sequences in prefill at each instant (processor
  sharing): with n sequences in prefill each advances at `prefill_tokens_per_s / n` tokens/s. A lone
  request therefore has TTFT = queue wait + uncached / prefill_tokens_per_s. The end of prefill emits
  the first output token (as real engines do) and inserts the prompt's full blocks into the cache.
- Decode: runs concurrently with prefill, in steps. A step starts when the previous one ends (or when
  a sequence is ready) and takes `decode_step_s + decode_step_per_seq_s * (batch_size - 1)`, where
  batch_size = sequences in decode at the step's start. Sequences finishing prefill join the next step.
  At the end of a step every sequence in it emits 1 token, or with `spec_tokens > 0`
  1 + accepted drafts: `spec_tokens` drafts, each accepted with probability `spec_accept`, stopping at
  the first rejection; the accepted count is capped so the sequence never exceeds its length.
  So TPOT ~= step time / (1 + E[accepted]) and completion tokens = 1 + sum over steps of (1 + accepted).
  Verifying drafts costs `spec_verify_s` per draft token per sequence in the step, so E[accepted] (which
  saturates at spec_accept / (1 - spec_accept)) stops paying for more drafts at some `spec_tokens`.
- Chunked prefill (`max_batched_tokens` set, like vLLM's max-num-batched-tokens): prefill no longer runs
  beside decode. Each step processes the decode tokens (1 + spec_tokens per sequence) and, within the
  budget left, prefill chunks of the sequences in prefill in admission order; the step takes
  chunk / `prefill_tokens_per_s` longer (a step with only prefill takes `decode_step_s` plus that). A small
  budget keeps steps short (TPOT) and makes prompts wait (TTFT); a large one the other way round.
- Length: `ignore_eos` gives exactly max_tokens tokens (finish_reason "length"); otherwise the length
  is drawn per request (seeded) with an EOS chance of EOS_PER_TOKEN per token, capped at max_tokens
  (finish_reason "stop" when the EOS came first).

Prefix cache (vLLM-like): prompts are cut into blocks of `block_size` tokens, each identified by the
hash chain (parent hash, block tokens). A lookup counts the leading blocks present, over at most
`prompt_tokens - 1` tokens aligned down to a block (the last token is always computed), so
cached_tokens is a multiple of block_size and < prompt_tokens. An LRU of `cache_blocks` blocks;
0 disables caching. `reset_prefix_cache()` empties it.

Counters follow vLLM's names (`vllm:*` in /metrics); `prefix_cache_queries/hits` count tokens.
Random choices (faults, EOS, drafts, output text) come from RNGs seeded with `seed`, one per purpose,
so a config replays the same decisions for the same request order.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import random
import time
from collections import deque
from collections.abc import Sequence as Seq
from datetime import UTC, datetime
from typing import Any

from caseledger import engines
from caseledger.case.service import ReferenceConfig
from caseledger.datasets.tokenizers import load_fast
from caseledger.target.parts import Counters, Fault, Sequence, Ticket
from caseledger.target.parts import PrefixCache as PrefixCache  # re-exported: the engine's names, one module
from caseledger.target.parts import chat_prompt as chat_prompt
from caseledger.workspace import canonical_json, sha256_bytes

log = logging.getLogger("caseledger.target")

EOS_PER_TOKEN = 1 / 128  # chance an output token is EOS when ignore_eos is off (seeded per request)
UNLABELLED = "unlabelled"  # phase of a request without the x-caseledger-phase header
MAX_RUNS_SEEN = 1000
_CYCLE = 8191  # length of the pre-drawn output token cycle (prime, so offsets do not align)
_EPS = 1e-9


@functools.cache
def _vocab(tokenizer: str) -> tuple[Any, list[str], list[int]]:
    """The tokenizer, the text of every token id, and the ids safe to emit: ' word' pieces that re-encode to
    themselves, so the streamed text re-tokenizes to exactly the tokens counted (once per tokenizer and process:
    a simulation builds an engine per point)."""
    tok = load_fast(tokenizer)
    size = tok.get_vocab_size()
    texts = [tok.decode([i]) for i in range(size)]
    safe = [
        i
        for i, t in enumerate(texts)
        if len(t) > 1 and t[0] == " " and t[1:].isascii() and t[1:].isalpha() and tok.encode(t).ids == [i]
    ]
    if not safe:
        raise ValueError(f"tokenizer '{tokenizer}' has no ' word' tokens to emit")
    return tok, texts, safe


class ReferenceEngine:
    """Scheduler, prefix cache, speculative decoding, faults and counters of the reference target."""

    def __init__(self, config: ReferenceConfig, model: str, tokenizer: str = "builtin") -> None:
        self.config = config
        self.model = model
        self.tokenizer_name = tokenizer
        self.config_sha256 = sha256_bytes(canonical_json(config.model_dump(mode="json")))
        self.pid = os.getpid()
        self.started_at = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        self.cache = PrefixCache(config.cache_blocks, config.block_size)
        self.counters = Counters()
        self.requests_total = 0
        self.by_phase: dict[str, int] = {}
        # per run (x-caseledger-run): its requests and the wall times of its first and last arrival, the newest
        # MAX_RUNS_SEEN runs: who used this target when (two runs whose spans overlap: two owners at once)
        self.by_run: dict[str, dict[str, float]] = {}
        self.slowdown = 1.0  # every prefill and decode step takes this many times longer (SIGUSR1 doubles it)
        self._tok, self._texts, out_ids = _vocab(tokenizer)
        seed = config.seed
        self._rng_fault = random.Random(f"{seed}:fault")
        self._rng_eos = random.Random(f"{seed}:eos")
        self._rng_spec = random.Random(f"{seed}:spec")
        self._rng_text = random.Random(f"{seed}:text")
        self._cycle = [self._rng_text.choice(out_ids) for _ in range(_CYCLE)]
        self._waiting: deque[Sequence] = deque()
        self._prefill: list[Sequence] = []
        self._decoding: list[Sequence] = []
        self._batch: list[Sequence] = []
        self._chunks: list[tuple[Sequence, int]] = []  # chunked prefill: this step's prefill tokens per sequence
        self._step_end: float | None = None
        self._last_step_end: float | None = None
        self._prefill_t = 0.0
        self._dirty = False  # an abort happened: filter the lists
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    # ---- tokenization -------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of a prompt text, exactly as counted in usage.prompt_tokens."""
        ids: list[int] = self._tok.encode(text).ids
        return ids

    def decode(self, ids: Seq[int]) -> str:
        return "".join(self._texts[i] for i in ids)

    # ---- request accounting and faults --------------------------------------------------------

    def count_request(self, phase: str | None, run_id: str | None = None) -> Ticket:
        """Count a completion request on arrival (by phase and by run) and deal its fault (stall beats error)."""
        self.requests_total += 1
        label = phase or UNLABELLED
        self.by_phase[label] = self.by_phase.get(label, 0) + 1
        if run_id:
            now = time.time()
            seen = self.by_run.setdefault(run_id[:64], {"requests": 0, "first": now, "last": now})
            seen["requests"] += 1
            seen["last"] = now
            while len(self.by_run) > MAX_RUNS_SEEN:
                del self.by_run[next(iter(self.by_run))]
        cfg = self.config
        # draw for every request, so the error pattern depends only on the request order
        error = cfg.error_rate > 0 and self._rng_fault.random() < cfg.error_rate
        fault: Fault | None = None
        if cfg.stall_after is not None and self.requests_total > cfg.stall_after:
            fault = "stall"
        elif error:
            fault = "error"
        return Ticket(self.requests_total, label, fault)

    def crash_due(self, ticket: Ticket) -> bool:
        """True when this finished request is the `crash_after`-th one."""
        return self.config.crash_after is not None and ticket.ordinal == self.config.crash_after

    def stats(self) -> dict[str, Any]:  # JSON: the /stats body
        return {
            "pid": self.pid,
            "started_at": self.started_at,
            "requests_total": self.requests_total,
            "by_phase": dict(self.by_phase),
            "by_run": {k: dict(v) for k, v in self.by_run.items()},
            "model": self.model,
            "config": self.config.model_dump(mode="json"),
            "config_sha256": self.config_sha256,
            "slowdown": self.slowdown,
        }

    # ---- submission -------------------------------------------------------------------------

    def submit(
        self, prompt_ids: list[int], max_tokens: int, *, ignore_eos: bool = True, cache_prompt: bool = True
    ) -> Sequence:
        """Queue a sequence; its output appears on the returned object."""
        if not prompt_ids:
            raise ValueError("empty prompt")
        if max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        target = max_tokens
        if not ignore_eos:
            u = self._rng_eos.random()
            target = min(max_tokens, 1 + int(math.log1p(-u) / math.log1p(-EOS_PER_TOKEN)))
        seq = Sequence(prompt_ids, max_tokens, target, cache_prompt)
        seq._pos = self._rng_text.randrange(_CYCLE)
        self._waiting.append(seq)
        self._ensure_running()
        assert self._wake is not None
        self._wake.set()
        return seq

    def abort(self, seq: Sequence) -> None:
        """Drop a sequence (client gone); its slot frees at the scheduler's next pass."""
        if seq.done:
            return
        seq.aborted = True
        seq._notify()
        self._dirty = True
        if self._wake is not None:
            self._wake.set()

    def reset_prefix_cache(self) -> int:
        return self.cache.clear()

    @property
    def running(self) -> int:
        return len(self._prefill) + len(self._decoding)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._prefill_t = asyncio.get_running_loop().time()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="reference-scheduler")

    async def aclose(self) -> None:
        """Stop the scheduler task (sequences in flight are left unfinished)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # ---- the scheduler ----------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._loop()
        except Exception:
            # a scheduler bug must not leave streams hanging: end every sequence, restart on next submit
            log.exception("reference scheduler failed; aborting all sequences in flight")
            for seq in [*self._waiting, *self._prefill, *self._decoding]:
                self.abort(seq)
            self._waiting.clear()
            self._prefill, self._decoding, self._batch, self._chunks = [], [], [], []
            self._step_end = None
            raise

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        wake = self._wake
        assert wake is not None
        while True:
            wake.clear()
            now = loop.time()
            if self._dirty:
                self._drop_aborted(now)
            self._advance_prefill(now)
            chained = False
            if self._step_end is not None and now >= self._step_end - _EPS:
                self._finish_step()
                chained = True
            self._admit()
            chunked = self.config.max_batched_tokens is not None
            if self._step_end is None and (self._decoding or (chunked and self._prefill)):
                self._start_step(now, chained)
            deadline = self._next_deadline()
            if deadline is None:
                await wake.wait()
                continue
            delay = deadline - loop.time()
            if delay <= 0:
                await asyncio.sleep(0)  # let the streams drain this step before the next one
                continue
            handle = loop.call_later(delay, wake.set)
            await wake.wait()
            handle.cancel()

    def _drop_aborted(self, now: float) -> None:
        self._advance_prefill(now)  # account progress under the old sharing first
        self._waiting = deque(s for s in self._waiting if not s.aborted)
        self._prefill = [s for s in self._prefill if not s.aborted]
        self._decoding = [s for s in self._decoding if not s.aborted]
        self._dirty = False

    def _admit(self) -> None:
        slots = self.config.slots
        while self._waiting and len(self._prefill) + len(self._decoding) < slots:
            seq = self._waiting.popleft()
            if seq.aborted:
                continue
            if seq.cache_prompt:
                seq._hashes = self.cache.hashes(seq.prompt_ids)
                seq.cached_tokens = self.cache.lookup(seq.prompt_tokens, seq._hashes)
            self.counters.prefix_queries += seq.prompt_tokens
            self.counters.prefix_hits += seq.cached_tokens
            seq._remaining = float(seq.prompt_tokens - seq.cached_tokens)
            self._prefill.append(seq)

    def _advance_prefill(self, now: float) -> None:
        """Processor-sharing progress from the last accounting time to `now`, completing prefills (chunked
        prefill advances in the decode steps instead)."""
        elapsed = now - self._prefill_t
        self._prefill_t = now
        if self.config.max_batched_tokens is not None:
            return
        rate = self.config.prefill_tokens_per_s / self.slowdown
        while self._prefill and elapsed > 0:
            n = len(self._prefill)
            least = min(s._remaining for s in self._prefill)
            need = least * n / rate
            step = min(need, elapsed)
            done_tokens = step * rate / n
            elapsed -= step
            for s in self._prefill:
                s._remaining -= done_tokens
            self._complete_prefills()
        self._complete_prefills()

    def _complete_prefills(self) -> None:
        finished = [s for s in self._prefill if s._remaining <= 1e-6]
        if not finished:
            return
        self._prefill = [s for s in self._prefill if s._remaining > 1e-6]
        for seq in finished:
            self.counters.prompt_tokens += seq.prompt_tokens
            if seq.cache_prompt:
                self.cache.insert(seq._hashes)
            seq._hashes = []
            self._emit(seq, 1)  # prefill yields the first token
            if not seq.done:
                self._decoding.append(seq)

    def _start_step(self, now: float, chained: bool) -> None:
        self._batch = list(self._decoding)
        cfg = self.config
        b = len(self._batch)
        dur = cfg.decode_step_s + cfg.decode_step_per_seq_s * max(0, b - 1) + cfg.spec_verify_s * cfg.spec_tokens * b
        if cfg.max_batched_tokens is not None:
            budget = cfg.max_batched_tokens - b * (1 + cfg.spec_tokens)
            self._chunks = []
            for seq in self._prefill:
                if budget <= 0:
                    break
                take = min(budget, math.ceil(seq._remaining - 1e-6))
                self._chunks.append((seq, take))
                budget -= take
            dur += sum(t for _, t in self._chunks) / cfg.prefill_tokens_per_s
        dur *= self.slowdown
        last = self._last_step_end
        # a step that follows another starts at its scheduled end, so wake-up latency does not slow
        # decode down; after idle time, or a loop starved for more than a step, it starts now
        start = last if chained and last is not None and now - last <= dur else now
        self._step_end = start + dur

    def _finish_step(self) -> None:
        cfg = self.config
        spec = cfg.spec_tokens
        counters = self.counters
        for seq in self._batch:
            if seq.done:
                continue
            n = 1
            if spec:
                accepted = 0
                rnd = self._rng_spec.random
                while accepted < spec and rnd() < cfg.spec_accept:
                    accepted += 1
                accepted = min(accepted, seq.target - seq.completion_tokens - 1)
                counters.spec_drafts += 1
                counters.spec_draft_tokens += spec
                counters.spec_accepted_tokens += accepted
                per_pos = counters.spec_accepted_per_pos
                if len(per_pos) < spec:
                    per_pos.extend([0] * (spec - len(per_pos)))
                for k in range(accepted):
                    per_pos[k] += 1
                seq.drafted += spec
                seq.accepted += accepted
                n += accepted
            self._emit(seq, n)
        self._decoding = [s for s in self._decoding if not s.done]
        self._batch = []
        if cfg.max_batched_tokens is not None:  # chunked prefill: this step's chunks are done
            for seq, take in self._chunks:
                seq._remaining -= take
            self._chunks = []
            self._prefill = [s for s in self._prefill if not s.aborted]
            self._complete_prefills()
        self._last_step_end = self._step_end
        self._step_end = None

    def _emit(self, seq: Sequence, n: int) -> None:
        cycle = self._cycle
        pos = seq._pos
        if n == 1:  # noqa: SIM108 - the common case, without building a generator per token
            text = self._texts[cycle[pos]]
        else:
            text = "".join(self._texts[cycle[(pos + k) % _CYCLE]] for k in range(n))
        seq._pos = (pos + n) % _CYCLE
        self.counters.generation_tokens += n
        if seq.completion_tokens + n >= seq.target:
            reason = "length" if seq.target >= seq.max_tokens else "stop"
            seq.finish_reason = reason
            self.counters.success[reason] += 1
        seq._emit(text, n)

    def _next_deadline(self) -> float | None:
        deadline = self._step_end
        if self._prefill and self.config.max_batched_tokens is None:
            n = len(self._prefill)
            least = min(s._remaining for s in self._prefill)
            t = self._prefill_t + least * n * self.slowdown / self.config.prefill_tokens_per_s
            deadline = t if deadline is None else min(deadline, t)
        return deadline

    # ---- /metrics ---------------------------------------------------------------------------

    def metrics_text(self) -> str:
        """Prometheus text exposition with the metric names of the engine it serves as (config.metrics_as: its
        profile's names by role, vLLM's by default; a role that engine has no name for is left out) and a
        model_name label."""
        c = self.counters
        label = 'model_name="' + self.model.replace("\\", "\\\\").replace('"', '\\"') + '"'
        served = engines.profile(self.config.metrics_as).metrics
        by_role: list[tuple[str, str, str, list[tuple[str, float]]]] = [
            ("running", "gauge", "Number of requests in model execution batches.", [("", self.running)]),
            ("waiting", "gauge", "Number of requests waiting to be processed.", [("", self.waiting)]),
            ("prompt_tokens", "counter", "Number of prefill tokens processed.", [("", c.prompt_tokens)]),
            ("generation_tokens", "counter", "Number of generation tokens processed.", [("", c.generation_tokens)]),
            ("cache_queries", "counter", "Prefix cache queries, in queried tokens.", [("", c.prefix_queries)]),
            ("cache_hits", "counter", "Prefix cache hits, in cached tokens.", [("", c.prefix_hits)]),
            (
                "success",
                "counter",
                "Count of successfully processed requests.",
                [(f'finished_reason="{k}",', float(v)) for k, v in sorted(c.success.items())],
            ),
            ("spec_drafts", "counter", "Number of spec decoding drafts.", [("", c.spec_drafts)]),
            ("spec_draft_tokens", "counter", "Number of draft tokens.", [("", c.spec_draft_tokens)]),
            ("spec_accepted", "counter", "Number of accepted tokens.", [("", c.spec_accepted_tokens)]),
            (
                "spec_per_pos",
                "counter",
                "Accepted tokens per draft position.",
                [(f'position="{k}",', v) for k, v in enumerate(c.spec_accepted_per_pos)],
            ),
        ]
        families = [
            (served[role].removesuffix("_total") if kind == "counter" else served[role], kind, help_, samples)
            for role, kind, help_, samples in by_role
            if role in served
        ]
        hidden = set(self.config.hide_counters)
        lines: list[str] = []
        for name, kind, help_, samples in families:
            sample_name = name + "_total" if kind == "counter" else name
            if name in hidden or sample_name in hidden or not samples:  # no samples: no family (per position)
                continue
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(f"{sample_name}{{{extra}{label}}} {float(value)!r}" for extra, value in samples)
        return "\n".join(lines) + "\n"
