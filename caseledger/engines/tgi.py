"""Hugging Face Text Generation Inference (`text-generation-launcher --model-id MODEL`): its /metrics names
(docs: reference/metrics) and /info, whose `version` is the server's."""

from caseledger.engines.profile import EngineProfile

PROFILE = EngineProfile(
    name="tgi",
    rank=4,
    what="TGI: text-generation-launcher --model-id MODEL",
    metrics={"running": "tgi_batch_current_size", "waiting": "tgi_queue_size"},
    spec_missing="TGI exposes no speculative draft/accepted token counters",
    weight_options=("--model-id",),
    version=(("/info", "version"),),
    commands=("text-generation-launcher",),
)
