"""llama.cpp's llama-server (`llama-server -m MODEL.gguf --metrics`).

Speculative counters carry the llamacpp: prefix (its HELP: "Total speculative decoding verification steps" for
drafts) and a per-position family; n_drafted_total / n_drafted_accepted_total are older builds' names, kept as
fallbacks. llamacpp:n_decode_total excludes speculative decoding and is not a verify count. Its responses carry
each request's draft counts (timings.draft_n, draft_n_accepted)."""

from caseledger.engines.profile import EngineProfile

PROFILE = EngineProfile(
    name="llamacpp",
    rank=3,
    what="llama.cpp: llama-server -m MODEL.gguf --metrics",
    metrics={
        "running": "llamacpp:requests_processing",
        "waiting": "llamacpp:requests_deferred",
        "prompt_tokens": "llamacpp:prompt_tokens_total",
        "generation_tokens": "llamacpp:tokens_predicted_total",
        "spec_drafts": "llamacpp:spec_decode_num_drafts_total",
        "spec_draft_tokens": "llamacpp:spec_decode_num_draft_tokens_total",
        "spec_accepted": "llamacpp:spec_decode_num_accepted_tokens_total",
        "spec_per_pos": "llamacpp:spec_decode_num_accepted_tokens_per_pos_total",
    },
    older={
        "spec_draft_tokens": ("llamacpp:n_drafted_total",),
        "spec_accepted": ("llamacpp:n_drafted_accepted_total",),
    },
    weight_options=("-m", "--model", "-md", "--model-draft", "--spec-draft-model", "--draft-model"),
    version=(("/props", "build_info"),),
    per_request_drafts=True,
    commands=("llama-server",),
)
