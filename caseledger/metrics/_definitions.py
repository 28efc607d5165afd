"""What every figure of a result means: the formula each processor version computes it with."""

from __future__ import annotations

from caseledger.metrics._models import STEP_GAP_MS

DEFINITIONS: dict[str, str] = {
    "ttft": "first content-bearing chunk arrival - send (chunk_ns[0] - send_ns), per successful request, ms",
    "e2e": "response end - send (end_ns - send_ns; end = [DONE]/close after the last chunk), per successful "
    "request, ms",
    "tpot": "(E2E - TTFT) / (completion_tokens - 1) per successful request with "
    "usage.completion_tokens >= 2; undefined for 1-token outputs (excluded, counted in the window notes), ms",
    "itl": "gaps between consecutive content chunks of the same successful request (chunk_ns[j] - "
    "chunk_ns[j-1], j >= 1), pooled over requests, ms",
    "itl_token_aware": "each chunk gap (j >= 1) divided by the tokens chunk j carried and counted once per "
    "token; tokens per chunk from chunk_tokens, or 1 each when the number of content chunks equals "
    "usage.completion_tokens; requests with neither are excluded; chunk 0 belongs to TTFT, ms",
    "itl_step": f"gaps between engine steps: the chunk gaps (j >= 1) of at least STEP_GAP_MS = {STEP_GAP_MS:g} ms of "
    f"the same successful request, pooled over requests; a chunk arriving less than {STEP_GAP_MS:g} ms after the one "
    "before came from the same engine step (a verify step of speculative decoding streams its accepted tokens "
    "together) and is merged into it, ms",
    "input_body": "body tokens before the chat template, from the dataset identity (record input_tokens_body)",
    "input_chat": "chat-template prompt tokens, from the dataset identity (record input_tokens_chat)",
    "prompt": "server usage.prompt_tokens",
    "output": "server usage.completion_tokens",
    "arrival_error": "send_ns - sched_ns of every request of a scheduled load (rate set, or arrival 'trace'), where "
    "sched_ns = the load's start + the request's planned offset on the same monotonic clock, ms",
    "planned_shared_tokens": "trace: the chat tokens of a request's prompt that an earlier request of the run "
    "already sent (the chat-template head, the first word and the run's salt slot, the leading hash-id blocks an "
    "earlier row had); compared with usage cached_tokens per request",
    "sessions": "dataset.sessions: turn k of a conversation is sent after turn k-1's response ended (+ think time) "
    "and carries the earlier user messages and the replies the server streamed; its planned_shared_tokens = turn "
    "k-1's usage.prompt_tokens + usage.completion_tokens (the history the server counted), compared with turn k's "
    "cached_tokens; a conversation is complete when every planned turn succeeded; its duration is its first send to "
    "its last recorded end",
    "prompt_tokens_for_rates": "server usage.prompt_tokens, falling back to input_tokens_chat where the "
    "server gave none",
    "request_throughput": "successful requests credited to the window / window duration",
    "output_throughput": "output tokens (usage.completion_tokens of successful requests) credited to the "
    "window / window duration",
    "input_throughput": "prompt tokens (prompt_tokens_for_rates) of successful requests credited to the "
    "window / window duration (nominal: cached tokens included)",
    "total_throughput": "(input + output tokens) / window duration",
    "per_card": "a throughput / case.target.cards",
    "goodput": "good requests credited to the window / window duration; a successful request is good when its "
    "own TTFT, TPOT and E2E are each <= case.decision.goodput's limits (a limit left null is no condition; a "
    "1-token output has no TPOT and meets a TPOT limit), as vLLM's --goodput and AIPerf's goodput count them",
    "noise": "bootstrap: the window's successful requests resampled with replacement (numpy default_rng, fixed "
    "seed), the decision metric recomputed per resample (rates scale the window figure by the resampled / "
    "observed sum of what they count, divided by the resampled / observed sum of the requests' E2E: the window "
    "of a held concurrency lasts about sum(E2E) / C, so fixed-length outputs still vary in time; percentiles are "
    "taken of the resampled values); the interval is the "
    "(1-level)/2 and (1+level)/2 quantiles of the resampled figures",
    "percentiles": "numpy.percentile, method 'linear' (interpolation between closest ranks)",
    "concurrency": "requests in flight at the client: +1 at send_ns, -1 at end_ns (failed requests "
    "included); at equal timestamps ends are applied before sends",
    "mean_concurrency": "time integral of concurrency over the window / window duration",
    "window_whole": "first send to last end; every request is credited",
    "window_native_aisbench": "AISBench stable stage: P = peak concurrency; from the send of the second "
    "request that brings concurrency to P until the moment concurrency last leaves P; requests that START "
    "inside [start, end] are credited with all their tokens",
    "window_native_sglang": "longest span in which concurrency >= ceil(ratio * P); requests that START "
    "inside are credited for request counts, latency and input tokens; output tokens are credited by "
    "their own chunk timestamps inside the span (chunks of unknown token count get completion_tokens / "
    "chunks each)",
    "cache_hit_ratio": "usage.prompt_tokens_details.cached_tokens / chat-template prompt tokens "
    "(usage.prompt_tokens, falling back to input_tokens_chat), per successful request",
    "uncached_input_throughput": "sum(prompt tokens - cached tokens) of the credited requests / duration: "
    "the input the server recomputed",
    "spec_verify_step": "one target forward pass that verifies a draft: llama.cpp counts it in "
    "spec_decode_num_drafts_total (a decode step without a draft is no verify step), vLLM in "
    "spec_decode_num_drafts_total (one per request per scheduled step with draft tokens), SGLang in "
    "spec_verify_calls_total; per request, a step starts at each chunk whose cumulative draft count rose "
    "(llama.cpp timings.draft_n with timings_per_token; the reference target alike)",
    "spec_acceptance_length": "AL = output tokens / verify steps, output tokens = usage.completion_tokens "
    "(the first token, produced by prefill, and truncated drafts included, as the seeds count it); from "
    "counters: verify steps = Δ drafts counter and output tokens = sum over the whole window's successful "
    "requests; per request: both summed over the window's successful requests",
    "spec_acceptance_length_counters": "1 + Δ accepted tokens / Δ drafts, from counters alone",
    "spec_acceptance_length_accepted": "per request: 1 + accepted tokens / verify steps (llama.cpp's 'mean "
    "len': leaves out the first token and decode steps without a draft)",
    "spec_acceptance_rate": "strict acceptance rate = accepted draft tokens / draft tokens proposed (Δ "
    "counters, or per-request timings.draft_n_accepted / timings.draft_n)",
    "spec_acceptance_by_position": "verify steps whose draft token at position k (0-based) was accepted / "
    "verify steps; counters: Δ accepted_per_pos{position=k} / Δ drafts",
    "spec_scope": "counters are read before and after the formal load, so they cover the whole window only "
    "(warmup and route checks happen before the first snapshot); per-request counts cover any window",
    "spec_agreement": "whole window: per-request sums of the successful requests vs the counter deltas "
    "(which also count failed requests and anything else the server did between the snapshots)",
    "count_checks": "a successful request is invalid when usage.completion_tokens < 0, > the request's "
    "max_tokens, < its content chunks (each carries >= 1 token), or > 4 x content chunks + its accepted draft "
    "tokens + 1 (one token per chunk, up to 4 when an engine sends a character's byte tokens together; not applied "
    "when the counters show speculative decoding without per-request draft counts); or when prompt_tokens <= 0, "
    "cached_tokens < 0 or cached_tokens > prompt_tokens. Invalid requests are excluded from every figure; a window "
    "whose invalid share of its successful requests exceeds measurement.evidence.max_invalid_share has no figures",
    "stall": "a gap of >= 0.2 s in the load client's 50 ms event-loop ticker (load/stalls.jsonl); a window holding "
    "stalls of measurement.evidence.max_stall_s or more in all is distorted",
    "host_other_cpu": "(busy - ours) / all CPU time over the window's samples of /proc (every 0.5 s by the "
    "controller), ours = every process in the sessions of the load client, the service and the controller; above "
    "measurement.evidence.max_other_cpu_share the window is distorted (a contended host)",
    "failures": "a request with ok=false is failed: counted by error_class, excluded from latency, token "
    "and throughput figures, included in concurrency",
}
