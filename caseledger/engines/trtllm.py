"""TensorRT-LLM's OpenAI-compatible server (`trtllm-serve MODEL`): the weights are the positional path after the
command; its /metrics is JSON iteration statistics, not Prometheus text, so no counter is read from it."""

from caseledger.engines.profile import EngineProfile

PROFILE = EngineProfile(
    name="trtllm",
    rank=5,
    what="TensorRT-LLM: trtllm-serve MODEL",
    spec_missing="trtllm-serve's /metrics is JSON iteration statistics, not Prometheus counters",
    serve_words=("trtllm-serve",),
    version=(("/version", "version"),),
    commands=("trtllm-serve",),
)
