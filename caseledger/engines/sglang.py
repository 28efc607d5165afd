"""SGLang (`python -m sglang.launch_server --model-path MODEL`): python/sglang/srt/metrics/collector.py names."""

from caseledger.engines.profile import EngineProfile

PROFILE = EngineProfile(
    name="sglang",
    rank=2,
    what="SGLang: python -m sglang.launch_server --model-path MODEL",
    metrics={
        "running": "sglang:num_running_reqs",
        "waiting": "sglang:num_queue_reqs",
        "prompt_tokens": "sglang:prompt_tokens_total",
        "generation_tokens": "sglang:generation_tokens_total",
        # the only cumulative speculative counter: verify steps
        "spec_drafts": "sglang:spec_verify_calls_total",
    },
    spec_missing="SGLang exposes no cumulative accepted/draft token counters "
    "(sglang:spec_accept_rate and spec_accept_length are last-interval gauges)",
    weight_options=("--model-path", "--speculative-draft-model-path"),
    version=(("/get_server_info", "version"),),
    commands=("sglang.launch_server",),
)
