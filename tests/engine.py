"""Helpers for the real-engine tests: find llama-server, build command-adapter cases, read its counters.

The engine tests need CASELEDGER_LLAMA_SERVER (the llama-server binary) and CASELEDGER_LLAMA_MODEL (a gguf;
`.ci/install-llama` builds and caches both). Without them the tests skip, unless
CASELEDGER_REQUIRE_ENGINE=1 (set by `.ci/run`): then they fail, so CI never passes by skipping them.

Tokenizer: the served GGUF itself (dataset.tokenizer = the model file; caseledger converts its tokenizer once,
about a second, into $CASELEDGER_CACHE/tokenizers, with the ChatML template llama-server falls back to, BOS first):
the dataset's chat-template counts equal the server's usage.prompt_tokens exactly, which route_verify checks.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest

from caseledger.metrics import parse_prometheus

SERVER_ENV = "CASELEDGER_LLAMA_SERVER"
MODEL_ENV = "CASELEDGER_LLAMA_MODEL"
REQUIRE_ENV = "CASELEDGER_REQUIRE_ENGINE"
MODEL_ALIAS = "gemma-3-270m"
TEMPLATES = Path(__file__).resolve().parent.parent / "cases"

# llama-server counters that only move when the server does model work (prefill, decode): equal before
# and after a step means the step sent no model request.
WORK_COUNTERS = (
    "llamacpp:prompt_tokens_total",
    "llamacpp:tokens_predicted_total",
    "llamacpp:n_decode_total",
)


def llama_paths() -> tuple[str, str]:
    """(server binary, model gguf); skips the test, or fails it under CASELEDGER_REQUIRE_ENGINE=1."""
    server, model = os.environ.get(SERVER_ENV, ""), os.environ.get(MODEL_ENV, "")
    problem = None
    if not server or not model:
        problem = f"{SERVER_ENV} and {MODEL_ENV} are not both set"
    elif not os.access(server, os.X_OK):
        problem = f"{SERVER_ENV}={server} is not an executable file"
    elif not Path(model).is_file():
        problem = f"{MODEL_ENV}={model} is not a file"
    if problem is None:
        return server, model
    fix = "run `bash .ci/install-llama`, then `set -a; . ~/.cache/caseledger/llama.env; set +a`"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {problem}: the engine tests must run here; {fix}", pytrace=False)
    pytest.skip(f"no llama-server: {problem} ({fix}; {REQUIRE_ENV}=1 turns this skip into a failure)")


def llama_argv(server: str, model: str) -> list[str]:
    """The launch argv of a command-adapter case; caseledger fills {host} and {port}.

    --swa-full: Gemma 3 uses sliding-window attention; without a full-size SWA cache this llama-server
    reuses a slot's KV only for an identical prompt, so a shared prefix with a different suffix reports
    cached_tokens = 1 (seen here: 1 of 327 without the flag, 265 of 327 with it).
    """
    return [
        server,
        "-m",
        model,
        "--host",
        "{host}",
        "--port",
        "{port}",
        "-c",
        "4096",
        "-np",
        "4",
        "-t",
        "2",
        "--metrics",
        "--swa-full",
        "-a",
        MODEL_ALIAS,
    ]


def llama_draft(port: int, server: str, model: str, **over: Any) -> dict[str, Any]:
    """A small llama.cpp case: a few short chat requests, 8 output tokens, Gemma's tokenizer if cached."""
    d: dict[str, Any] = {
        "scenario": "llamacpp-test",
        "target": {"endpoints": [{"base_url": f"http://127.0.0.1:{port}/v1", "model": MODEL_ALIAS}]},
        "service": {"adapter": "command", "argv": llama_argv(server, model), "health_timeout_s": 120},
        "dataset": {"source": "synthetic", "input_tokens": 64, "output_tokens": 8, "tokenizer": model},
        "load": {"requests": 4, "concurrency": 2, "timeout_s": 300},
        "warmup": {"requests": 2, "concurrency": 2, "max_tokens": 2},
        "measurement": {"spec_decode": "llamacpp"},
    }
    for k, v in over.items():
        d[k] = {**d[k], **v} if isinstance(v, dict) and isinstance(d.get(k), dict) else v
    return d


def llama_spec_draft(port: int, server: str, model: str, draft_max: int = 4, **over: Any) -> dict[str, Any]:
    """llama_draft with speculative decoding: the same gguf as target and draft (draft-simple), the draft model,
    method and length as service.speculative fields that fill their argv placeholders."""
    d = llama_draft(port, server, model, **over)
    argv = llama_argv(server, model)
    spec_args = ["-md", "{draft_model}", "--spec-type", "{spec_type}", "--spec-draft-n-max", "{draft_max}"]
    d["service"] = {
        **d["service"],
        "argv": [*argv[:3], *spec_args, *argv[3:]],
        "speculative": {"draft_model": model, "spec_type": "draft-simple", "draft_max": draft_max},
    }
    return d


LLAMA_TEMPLATE_MODEL = "models/gemma-3-270m-q4_k_m.gguf"


def llama_template(name: str, port: int, server: str, model: str) -> dict[str, Any]:
    """A llama.cpp template of cases/ as a user fills it in: the binary, the model path (target, draft,
    tokenizer) and the port; nothing else changed."""
    d: dict[str, Any] = orjson.loads((TEMPLATES / name).read_bytes())
    old_port = d["target"]["endpoints"][0]["base_url"].rsplit(":", 1)[1].split("/")[0]

    def fill(value: str) -> str:
        return model if value == LLAMA_TEMPLATE_MODEL else value.replace(f"127.0.0.1:{old_port}", f"127.0.0.1:{port}")

    sv = d["service"]
    assert sv["argv"][0] == "llama-server", f"{name} starts another binary"
    sv["argv"] = [server, *(fill(a) for a in sv["argv"][1:])]
    sv["health_url"] = fill(sv["health_url"])
    if sv.get("speculative"):
        sv["speculative"]["draft_model"] = fill(sv["speculative"]["draft_model"])
    d["target"]["endpoints"] = [{**e, "base_url": fill(e["base_url"])} for e in d["target"]["endpoints"]]
    d["dataset"]["tokenizer"] = fill(d["dataset"]["tokenizer"])
    assert model in sv["argv"] and d["dataset"]["tokenizer"] == model, d
    return d


def counters(port: int) -> dict[str, float]:
    """llama-server's /metrics (needs --metrics), summed per name."""
    r = httpx2.get(f"http://127.0.0.1:{port}/metrics", timeout=10, trust_env=False)
    r.raise_for_status()
    return parse_prometheus(r.text)


def work(port: int) -> dict[str, float]:
    """The counters that move only with model work (see WORK_COUNTERS)."""
    c = counters(port)
    missing = [n for n in WORK_COUNTERS if n not in c]
    assert not missing, f"llama-server /metrics lacks {missing}; is --metrics in the argv?"
    return {n: c[n] for n in WORK_COUNTERS}


# ------------------------------------------------------------------------------------------------------- vLLM
# `.ci/install-vllm` writes vllm.env: the python of vLLM's own venv, the bf16 Gemma 3 270M directory (its
# tokenizer prepends BOS; chat_template.jinja beside it) and the torch.compile cache. Without them the vLLM tests
# skip, unless CASELEDGER_REQUIRE_VLLM=1 (set by `.ci/run`): then they fail.
VLLM_ENVS = (
    "CASELEDGER_VLLM_PYTHON",
    "CASELEDGER_VLLM_MODEL",
    "CASELEDGER_VLLM_CHAT_TEMPLATE",
    "CASELEDGER_VLLM_CACHE_ROOT",
)
VLLM_REQUIRE_ENV = "CASELEDGER_REQUIRE_VLLM"


@dataclass(frozen=True)
class VllmPaths:
    python: str
    model: str
    chat_template: str
    cache_root: str


def vllm_paths() -> VllmPaths:
    """vLLM's venv python, model directory, chat template and compile cache; skips the test, or fails it under
    CASELEDGER_REQUIRE_VLLM=1."""
    got = [os.environ.get(n, "") for n in VLLM_ENVS]
    problem = None
    if not all(got):
        problem = f"{', '.join(n for n, v in zip(VLLM_ENVS, got, strict=True) if not v)} not set"
    elif not os.access(got[0], os.X_OK):
        problem = f"{VLLM_ENVS[0]}={got[0]} is not an executable file"
    elif not (Path(got[1]) / "config.json").is_file():
        problem = f"{VLLM_ENVS[1]}={got[1]} holds no config.json"
    elif not Path(got[2]).is_file():
        problem = f"{VLLM_ENVS[2]}={got[2]} is not a file"
    if problem is None:
        return VllmPaths(*got)
    fix = "run `bash .ci/install-vllm`, then `set -a; . ~/.cache/caseledger/vllm.env; set +a`"
    if os.environ.get(VLLM_REQUIRE_ENV) == "1":
        pytest.fail(f"{VLLM_REQUIRE_ENV}=1 but {problem}: the vLLM tests must run here; {fix}", pytrace=False)
    pytest.skip(f"no vLLM: {problem} ({fix}; {VLLM_REQUIRE_ENV}=1 turns this skip into a failure)")


# measured figures the real-engine tests report (peak memory, AL, the cross-check's medians): printed in the
# session summary so CI's output carries them
ENGINE_NOTES: list[str] = []

VLLM_TEMPLATE_PORT = "18100"
VLLM_TEMPLATE_MODEL = "models/gemma-3-270m-bf16"


def vllm_template(name: str, port: int, paths: VllmPaths) -> dict[str, Any]:
    """A vLLM template of cases/ as a user fills it in: the venv's python, the model directory (its tokenizer and
    chat template), the compile cache and the port; nothing else changed."""
    d: dict[str, Any] = orjson.loads((TEMPLATES / name).read_bytes())
    old_port = d["target"]["endpoints"][0]["base_url"].rsplit(":", 1)[1].split("/")[0]

    def fill(value: str) -> str:
        value = value.replace(f"127.0.0.1:{old_port}", f"127.0.0.1:{port}")
        if value == f"{VLLM_TEMPLATE_MODEL}/chat_template.jinja":
            return paths.chat_template
        return paths.model if value == VLLM_TEMPLATE_MODEL else value

    sv = d["service"]
    assert sv["argv"][0] == "python3", f"{name} starts vLLM with another interpreter"
    sv["argv"] = [paths.python, *(fill(a) for a in sv["argv"][1:])]
    sv["health_url"] = fill(sv["health_url"])
    sv["env"]["VLLM_CACHE_ROOT"] = paths.cache_root
    d["target"]["endpoints"] = [{**e, "base_url": fill(e["base_url"])} for e in d["target"]["endpoints"]]
    d["dataset"]["tokenizer"] = fill(d["dataset"]["tokenizer"])
    assert paths.model in sv["argv"] and paths.chat_template in sv["argv"] and d["dataset"]["tokenizer"] == paths.model
    return d


def prometheus_labels(text: str, name: str) -> dict[str, str]:
    """The labels of the first sample of `name` in a Prometheus text (vllm:cache_config_info's are its config)."""
    for line in text.splitlines():
        if line.startswith(name + "{"):
            inner = line[len(name) + 1 : line.rindex("}")]
            return dict(re.findall(r'(\w+)="([^"]*)"', inner))
    raise AssertionError(f"{name} is not in the metrics text")
