"""vLLM (`vllm serve MODEL`, OpenAI-compatible server): v1 metric names (vllm/v1/metrics, spec_decode/metrics.py)."""

from caseledger.engines.profile import EngineProfile

PROFILE = EngineProfile(
    name="vllm",
    rank=1,
    what="vLLM: vllm serve MODEL",
    metrics={
        "running": "vllm:num_requests_running",
        "waiting": "vllm:num_requests_waiting",
        "prompt_tokens": "vllm:prompt_tokens_total",
        "generation_tokens": "vllm:generation_tokens_total",
        "cache_queries": "vllm:prefix_cache_queries_total",
        "cache_hits": "vllm:prefix_cache_hits_total",
        "success": "vllm:request_success_total",
        "spec_drafts": "vllm:spec_decode_num_drafts_total",
        "spec_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
        "spec_accepted": "vllm:spec_decode_num_accepted_tokens_total",
        "spec_per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    },
    weight_options=("--model",),
    serve_words=("serve",),
    version=(("/version", "version"),),
    commands=("vllm", "vllm.entrypoints.openai.api_server"),
)
