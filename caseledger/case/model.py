"""The case model: what to measure, frozen under its content hash (see case.plan for the impact table).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Endpoint(_Model):
    base_url: str = Field(
        description="OpenAI-compatible base URL including /v1, e.g. http://127.0.0.1:18080/v1",
        pattern=r"^https?://[^\s/]+(/\S*)?$",
        examples=["http://127.0.0.1:18080/v1"],
    )
    model: str = Field(description="Model name sent in requests and expected from /v1/models", min_length=1)


class Target(_Model):
    endpoints: list[Endpoint] = Field(
        min_length=1, description="Endpoints (routes) of the serving target; requests are spread round-robin"
    )
    api: Literal["chat", "completions"] = Field("chat", description="API flavour: /chat/completions or /completions")
    cards: int = Field(1, ge=1, description="Accelerator cards behind the target, the divisor of per-card figures")
    metrics_url: str | None = Field(
        None, description="Prometheus /metrics URL for spec-decode counters; null: derived from the first endpoint"
    )
    api_key_env: str | None = Field(
        None,
        description="Name of the environment variable holding the API key (referenced, never copied)",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
    )


class ReferenceConfig(_Model):
    """Performance model of the embedded reference target (adapter 'reference')."""

    prefill_tokens_per_s: float = Field(20000.0, gt=0, description="Prefill rate shared by requests in prefill")
    decode_step_s: float = Field(0.004, ge=0, description="Decode step time at batch size 1")
    decode_step_per_seq_s: float = Field(0.0005, ge=0, description="Added step time per extra sequence in batch")
    slots: int = Field(8, ge=1, description="Concurrent sequences; more wait in queue")
    cache_blocks: int = Field(4096, ge=0, description="Prefix-cache capacity in blocks (LRU)")
    block_size: int = Field(16, ge=1, description="Prefix-cache block size in tokens")
    spec_tokens: int = Field(0, ge=0, description="Draft tokens per step; 0 disables speculative decoding")
    spec_accept: float = Field(0.7, ge=0, le=1, description="Probability each draft token is accepted")
    hide_counters: list[str] = Field(
        default_factory=list, description="Spec-decode counter names left out of /metrics (tests of NOT_OBSERVED)"
    )
    max_model_len: int | None = Field(
        None, ge=2, description="Context limit: prompt + max_tokens above it is rejected with HTTP 400 (like vLLM)"
    )
    error_rate: float = Field(0.0, ge=0, le=1, description="Fault: share of requests answered with HTTP 500")
    crash_after: int | None = Field(None, ge=1, description="Fault: exit the server after this many requests")
    stall_after: int | None = Field(None, ge=1, description="Fault: stall streams forever after this many requests")
    seed: int = Field(0, description="Seed of the target's random choices")


class SSH(_Model):
    """An SSH login on the host that runs the service (adapter 'command'). Only paths are stored: the key file
    is referenced, never read into the ledger, events or reports."""

    host: str = Field(
        description="Host name or address of the machine that runs the service (sshd listens there)",
        pattern=r"^[^\s@/-][^\s@/]*$", examples=["gpu-node-3", "10.0.0.7"],
    )
    port: int = Field(22, ge=1, le=65535, description="sshd port on the host")
    user: str = Field(description="Login user on the host", pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$",
                      examples=["bench"])
    key_path: str = Field(
        description="Path of the private key file on the controller's host (absolute or ~/...): referenced, "
        "never read into the ledger, events or reports; keep it outside the workspace",
        pattern=r"^(/|~)", examples=["~/.ssh/id_ed25519"],
    )
    known_hosts: str | None = Field(
        None,
        description="Path of the known_hosts file the host key is verified against (absolute or ~/...); null "
        "requires accept_unknown_host_key: true",
        pattern=r"^(/|~)", examples=["~/.ssh/known_hosts"],
    )
    accept_unknown_host_key: bool = Field(
        False,
        description="Connect without verifying the host key (only with known_hosts null); must be set "
        "explicitly, and is recorded with the case and the service evidence",
    )

    @model_validator(mode="after")
    def _host_key_policy(self) -> SSH:
        if self.known_hosts is None and not self.accept_unknown_host_key:
            raise ValueError("service.ssh.known_hosts is null: set it to a known_hosts file, or set "
                             "service.ssh.accept_unknown_host_key: true explicitly (the host key is then not verified)")
        if self.known_hosts is not None and self.accept_unknown_host_key:
            raise ValueError("service.ssh.known_hosts and accept_unknown_host_key: true contradict each other; "
                             "keep known_hosts (verified) or set it to null (unverified)")
        return self


class Service(_Model):
    adapter: Literal["reference", "external", "command"] = Field(
        "reference",
        description="reference: the embedded reference target; external: an already-running endpoint; "
        "command: caseledger starts argv (locally, or on service.ssh.host) and reads its effective argv back",
    )
    argv: list[str] = Field(
        default_factory=list,
        description="Launch argv for adapter 'command' (a list, never a shell string: case fields must not "
        "become shell syntax). '{port}' and '{host}' are filled from the first endpoint",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment for the launched service: literal non-secret values, or '${NAME}' references "
        "resolved from the caller's environment at launch (never stored)",
    )
    health_url: str | None = Field(None, description="Health URL; null: <endpoint origin>/health")
    health_timeout_s: float = Field(180.0, gt=0, description="How long to wait for health after a start")
    identity_command: list[str] | None = Field(
        None, description="Optional argv printing the live service identity (adapter 'external')"
    )
    recovery_target: str | None = Field(
        None, description="Case id of the verified service to roll back to when this one fails"
    )
    reference: ReferenceConfig = Field(
        default_factory=ReferenceConfig, description="Reference target model (adapter 'reference' only)"
    )
    ssh: SSH | None = Field(
        None,
        description="Run adapter 'command' on a remote host over SSH (launch, /proc read-back, stop all go "
        "through it); null: local. Health is still checked at health_url",
    )

    @model_validator(mode="after")
    def _ssh_needs_command(self) -> Service:
        if self.ssh is not None and self.adapter != "command":
            raise ValueError(f"service.ssh is only used by adapter 'command', not '{self.adapter}'; "
                             "set service.ssh to null or use adapter 'command'")
        return self


class Dataset(_Model):
    source: Literal["synthetic", "prefix_cache", "file"] = Field(
        "synthetic",
        description="synthetic: exact token lengths; prefix_cache: shared prefix per group + unique suffix; "
        "file: JSONL of prompts inside the workspace, hashed as is",
    )
    entries: int | None = Field(
        None, ge=1, description="Entries materialized, one per formal request; null: filled with load.requests"
    )
    input_tokens: int = Field(256, ge=1, description="Body tokens per entry (before the chat template)")
    output_tokens: int = Field(64, ge=1, description="Output tokens per request (max_tokens; ignore_eos fixes it)")
    prefix_ratio: float = Field(0.0, ge=0, lt=1, description="prefix_cache: minimum expected hit ratio per entry")
    block_size: int = Field(16, ge=1, description="Cache block size the hit ratio is aligned to")
    prefix_groups: int = Field(1, ge=1, description="prefix_cache: number of distinct shared prefixes")
    tokenizer: str = Field(
        "builtin",
        description="Tokenizer: 'builtin' (a small BPE the project generates) or a local path for "
        "transformers.AutoTokenizer (no hub access at run time)",
    )
    tokenizer_revision: str | None = Field(None, description="Tokenizer revision recorded in the identity")
    chat_template: bool = Field(True, description="Count tokens with the chat template applied (what the server sees)")
    path: str | None = Field(None, description="file: JSONL path relative to the workspace, one {'prompt': ...}")
    seed: int = Field(0, description="Generator seed")


class Load(_Model):
    requests: int = Field(description="Formal requests N", ge=1, examples=[640])
    concurrency: int = Field(description="Maximum requests in flight C", ge=1, examples=[64])
    rate: float | None = Field(None, gt=0, description="Request rate r per second; null: unlimited")
    arrival: Literal["constant", "poisson", "gamma"] = Field("poisson", description="Arrival process for rate r")
    burstiness: float = Field(1.0, gt=0, description="gamma shape; 1.0 is poisson, lower is burstier")
    timeout_s: float = Field(600.0, gt=0, description="Per-request timeout; a stalled stream ends as an error")
    max_tokens: int | None = Field(None, ge=1, description="max_tokens per request; null: dataset.output_tokens")
    ignore_eos: bool = Field(True, description="Ask the server to ignore EOS so output length is fixed")
    salt: bool = Field(True, description="Salt each entry's unique part per run so a warm cache cannot over-hit")


class Warmup(_Model):
    requests: int = Field(4, ge=0, description="Warmup requests after a service (re)start; 0 disables")
    concurrency: int = Field(2, ge=1, description="Warmup concurrency")
    max_tokens: int = Field(8, ge=1, description="Output tokens per warmup request")


class Cache(_Model):
    min_hit_ratio: float | None = Field(
        None, ge=0, le=1, description="Minimum per-request cached/prompt ratio to check; null: no cache target"
    )
    seed_per_route: bool = Field(True, description="Seed every route's prefixes before the check")
    check_requests: int = Field(2, ge=1, description="Check requests per route")


class Window(_Model):
    min_requests: int = Field(1, ge=1, description="Fewest requests for the window to count")
    min_duration_s: float = Field(0.0, ge=0, description="Shortest duration for the window to count")


class NativeWindow(Window):
    rule: Literal["aisbench", "sglang"] = Field(
        "aisbench",
        description="aisbench: from the second request reaching peak concurrency to the last moment at peak; "
        "sglang: longest span with concurrency >= ratio * peak",
    )
    ratio: float = Field(0.9, gt=0, le=1, description="sglang rule: share of the peak concurrency")


class Measurement(_Model):
    whole: Window = Field(default_factory=Window, description="Whole window: first send to last end")
    native: NativeWindow = Field(default_factory=NativeWindow, description="Native (steady-state) window")
    spec_decode: Literal["auto", "vllm", "sglang", "llamacpp", "none"] = Field(
        "auto", description="Which /metrics counter names to read for speculative decoding"
    )


class Decision(_Model):
    primary_metric: Literal[
        "output_throughput", "output_throughput_per_card", "request_throughput", "ttft_p50", "ttft_p99",
        "tpot_p50", "tpot_p99", "e2e_p50", "e2e_p99",
    ] = Field("output_throughput_per_card", description="Metric the decision compares")
    window: Literal["whole", "native"] = Field("whole", description="Window the decision compares on")
    baseline: str | None = Field(None, description="Case id of the scenario baseline; null: the parent")
    min_effect: float = Field(0.02, ge=0, description="Smallest relative improvement that counts as 'keep'")


class Case(_Model):
    """A case: what to measure. Frozen under the hash of its canonical JSON."""

    schema_: str | None = Field(None, alias="$schema", description="JSON Schema reference for editors (ignored)")
    scenario: str = Field(
        description="Name grouping comparable cases", min_length=1, pattern=r"^[A-Za-z0-9._-]+$",
        examples=["copy-128k-1k-prefix90"],
    )
    parent: str | None = Field(None, description="Case id this case derives from", pattern=r"^c-[0-9a-f]{12}$")
    note: str = Field("", description="Free text: why this candidate", max_length=2000)
    target: Target = Field(description="Where requests go")
    service: Service = Field(default_factory=Service, description="How the serving target is brought up")
    dataset: Dataset = Field(default_factory=Dataset, description="What is sent")
    load: Load = Field(description="How much is sent, how fast")
    warmup: Warmup = Field(default_factory=Warmup, description="Warmup after a service start")
    cache: Cache = Field(default_factory=Cache, description="Prefix-cache preparation and check")
    measurement: Measurement = Field(default_factory=Measurement, description="Windows and counters")
    deadline: datetime | None = Field(None, description="UTC time after which no formal load may start")
    decision: Decision = Field(default_factory=Decision, description="How keep/close is decided")

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _consistent(self) -> Case:
        if self.dataset.source == "file" and not self.dataset.path:
            raise ValueError("dataset.path is required when dataset.source is 'file'")
        if self.dataset.source == "prefix_cache" and self.dataset.prefix_ratio <= 0:
            raise ValueError("dataset.prefix_ratio must be > 0 when dataset.source is 'prefix_cache'")
        if self.service.adapter == "command" and not self.service.argv:
            raise ValueError("service.argv is required when service.adapter is 'command'")
        if self.dataset.entries is not None and self.dataset.entries < self.load.requests:
            raise ValueError(
                f"dataset.entries ({self.dataset.entries}) < load.requests ({self.load.requests}): "
                "one entry per request; raise dataset.entries or leave it null"
            )
        return self

    def filled(self) -> Case:
        """Defaults made explicit: the form that is hashed and stored."""
        data = self.model_dump(mode="json", by_alias=False, exclude={"schema_"})
        if data["dataset"]["entries"] is None:
            data["dataset"]["entries"] = data["load"]["requests"]
        if data["load"]["max_tokens"] is None:
            data["load"]["max_tokens"] = data["dataset"]["output_tokens"]
        if data["target"]["metrics_url"] is None:
            data["target"]["metrics_url"] = origin(data["target"]["endpoints"][0]["base_url"]) + "/metrics"
        if data["service"]["health_url"] is None:
            data["service"]["health_url"] = origin(data["target"]["endpoints"][0]["base_url"]) + "/health"
        return Case.model_validate(data)

    def canonical(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude={"schema_"})


def origin(base_url: str) -> str:
    """scheme://host:port of a base URL."""
    scheme, _, rest = base_url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"
