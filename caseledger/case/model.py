"""The case model: what to measure, frozen under its content hash (see case.plan for the impact table).

Input boundary: every number and string has a documented bound, far above what a real campaign needs (the
seeds: N 640, C 64, 131072 input tokens) and low enough that a typo (1e12) is refused at freeze instead of
hanging it, exhausting memory or flooding HANDOFF.md. Integers and booleans are strict (`true` is no 1, 5.0
is no 5) and floats must be finite (NaN/Infinity would be stored as null).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SerializerFunctionWrapHandler,
    StringConstraints,
    Tag,
    model_serializer,
    model_validator,
)

from caseledger.case.metrics import PrimaryMetric
from caseledger.procs import INHERITED_ENV, INHERITED_ENV_PREFIXES
from caseledger.records import SCENARIO_PATTERN as SCENARIO_PATTERN  # re-exported: the case's names
from caseledger.records import NativeRule

MAX_REQUESTS = 1_000_000  # N: 1500x the seeds' 640
MAX_CONCURRENCY = 100_000  # C
MAX_LOAD_PROCESSES = 64  # load.processes: client processes of one formal load
MAX_TOKENS = 2_097_152  # tokens per prompt or per output (2 Mi: 16x the seeds' 131072-token inputs)
MAX_DATASET_TOKENS = 1_073_741_824  # entries x input_tokens materialized at freeze (2**30, ~15 min to generate)
MAX_TIMEOUT_S = 86_400.0  # one day: per-request timeout, health wait
MAX_SEED = 2**63 - 1  # seeds fit a signed 64-bit integer (the canonical JSON encoder's limit)
MAX_URL = 2048
MAX_PATH = 4096  # PATH_MAX
MAX_ARG = 32_768  # one argv element or env value
MAX_ARGS = 1024  # argv elements, env entries
# one SSE event the load client holds while it arrives: streamed chunks are a few KB (usage, timings,
# logprobs), so 8 MiB is a thousand times that, and 64 streams at once still hold at most 512 MiB
DEFAULT_MAX_EVENT_BYTES = 8 * 2**20
MIN_EVENT_BYTES, MAX_EVENT_BYTES = 2**16, 2**30  # under 64 KiB a chunk with logprobs may not fit; over 1 GiB: a typo

# what a pattern means, in words, for the answer to a draft that breaks it (case/store.py explain)
PATTERN_RULES = {
    SCENARIO_PATTERN: "must start with a letter or digit, followed by letters, digits, '.', '_' or '-' "
    "(at most 200 characters), e.g. 'copy-128k-1k-prefix90'"
}

_Arg = Annotated[str, StringConstraints(max_length=MAX_ARG)]
_EnvName = Annotated[str, StringConstraints(min_length=1, max_length=256)]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, defer_build=True)


class Endpoint(_Model):
    base_url: str = Field(
        description="OpenAI-compatible base URL including /v1, e.g. http://127.0.0.1:18080/v1 (at most 2048 "
        "characters)",
        pattern=r"^https?://[^\s/]+(/\S*)?$",
        max_length=MAX_URL,
        examples=["http://127.0.0.1:18080/v1"],
    )
    model: str = Field(
        description="Model name sent in requests and expected from /v1/models (at most 500 characters)",
        min_length=1,
        max_length=500,
    )


class Target(_Model):
    endpoints: list[Endpoint] = Field(
        min_length=1,
        max_length=256,
        description="Endpoints (routes) of the serving target, at most 256; requests are spread round-robin",
    )
    api: Literal["chat", "completions"] = Field("chat", description="API flavour: /chat/completions or /completions")
    cards: int = Field(
        1,
        ge=1,
        le=65_536,
        strict=True,
        description="Accelerator cards behind the target (1..65536), the divisor of per-card figures",
    )
    metrics_url: str | None = Field(
        None,
        max_length=MAX_URL,
        description="Prometheus /metrics URL for spec-decode counters (at most 2048 characters); null: derived "
        "from the first endpoint",
    )
    api_key_env: str | None = Field(
        None,
        description="Name of the environment variable holding the API key (referenced, never copied)",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        max_length=256,
    )
    context_tokens: int | None = Field(
        None,
        ge=2,
        le=16_777_216,
        strict=True,
        description="Context length each request gets on the served model (prompt + max_tokens), e.g. llama.cpp's "
        "-c divided by -np; preflight refuses a dataset with a longer request. null: unknown (the reference target "
        "uses service.reference.max_model_len)",
        examples=[2048],
    )
    lease_host: LeaseHost | None = Field(
        None,
        description="Keep the target's lease in a directory on this host over SSH, so controllers on different "
        "hosts see one owner (e.g. the target's own host); null: service.ssh's host when the service runs over "
        "SSH, else the controller host's lease directory",
    )

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # unset context_tokens and lease_host are left out of the canonical JSON, so cases frozen before them
        # keep their ids
        data: dict[str, Any] = handler(self)
        if self.context_tokens is None:
            data.pop("context_tokens", None)
        if self.lease_host is None:
            data.pop("lease_host", None)
        return data


class ReferenceConfig(_Model):
    """Performance model of the embedded reference target (adapter 'reference')."""

    prefill_tokens_per_s: float = Field(
        20000.0, gt=0, le=1e15, strict=True, description="Prefill rate shared by requests in prefill (at most 1e15)"
    )
    decode_step_s: float = Field(
        0.004, ge=0, le=60, strict=True, description="Decode step time at batch size 1 (0..60 s)"
    )
    decode_step_per_seq_s: float = Field(
        0.0005, ge=0, le=60, strict=True, description="Added step time per extra sequence in batch (0..60 s)"
    )
    slots: int = Field(
        8, ge=1, le=MAX_CONCURRENCY, strict=True, description="Concurrent sequences (1..100000); more wait in queue"
    )
    cache_blocks: int = Field(
        4096, ge=0, le=16_777_216, strict=True, description="Prefix-cache capacity in blocks (LRU), at most 16777216"
    )
    block_size: int = Field(
        16, ge=1, le=65_536, strict=True, description="Prefix-cache block size in tokens (1..65536)"
    )
    spec_tokens: int = Field(
        0, ge=0, le=1024, strict=True, description="Draft tokens per step (0..1024); 0 disables speculative decoding"
    )
    spec_accept: float = Field(0.7, ge=0, le=1, strict=True, description="Probability each draft token is accepted")
    hide_counters: list[Annotated[str, StringConstraints(max_length=200)]] = Field(
        default_factory=list,
        max_length=64,
        description="Spec-decode counter names left out of /metrics (tests of NOT_OBSERVED)",
    )
    max_model_len: int | None = Field(
        None,
        ge=2,
        le=16_777_216,
        strict=True,
        description="Context limit (2..16777216): prompt + max_tokens above it is rejected with HTTP 400 (like vLLM)",
    )
    error_rate: float = Field(
        0.0, ge=0, le=1, strict=True, description="Fault: share of requests answered with HTTP 500"
    )
    crash_after: int | None = Field(
        None,
        ge=1,
        le=1_000_000_000,
        strict=True,
        description="Fault: exit the server after this many requests (at most 1e9)",
    )
    stall_after: int | None = Field(
        None,
        ge=1,
        le=1_000_000_000,
        strict=True,
        description="Fault: stall streams forever after this many requests (at most 1e9)",
    )
    seed: int = Field(
        0,
        ge=-MAX_SEED - 1,
        le=MAX_SEED,
        strict=True,
        description="Seed of the target's random choices (a signed 64-bit integer)",
    )


class SSH(_Model):
    """An SSH login on the host that runs the service (adapter 'command'). Only paths are stored: the key file
    is referenced, never read into the ledger, events or reports."""

    host: str = Field(
        description="Host name or address of the machine that runs the service (sshd listens there; at most "
        "253 characters)",
        pattern=r"^[^\s@/-][^\s@/]*$",
        max_length=253,
        examples=["gpu-node-3", "10.0.0.7"],
    )
    port: int = Field(22, ge=1, le=65535, strict=True, description="sshd port on the host")
    user: str = Field(
        description="Login user on the host (at most 256 characters)",
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$",
        max_length=256,
        examples=["bench"],
    )
    key_path: str = Field(
        description="Path of the private key file on the controller's host (absolute or ~/...): referenced, "
        "never read into the ledger, events or reports; keep it outside the workspace (at most 4096 characters)",
        pattern=r"^(/|~)",
        max_length=MAX_PATH,
        examples=["~/.ssh/id_ed25519"],
    )
    known_hosts: str | None = Field(
        None,
        description="Path of the known_hosts file the host key is verified against (absolute or ~/...); null "
        "requires accept_unknown_host_key: true (at most 4096 characters)",
        pattern=r"^(/|~)",
        max_length=MAX_PATH,
        examples=["~/.ssh/known_hosts"],
    )
    accept_unknown_host_key: bool = Field(
        False,
        strict=True,
        description="Connect without verifying the host key (only with known_hosts null); must be set "
        "explicitly, and is recorded with the case and the service evidence",
    )

    @model_validator(mode="after")
    def _host_key_policy(self) -> SSH:
        if self.known_hosts is None and not self.accept_unknown_host_key:
            raise ValueError(
                "service.ssh.known_hosts is null: set it to a known_hosts file, or set "
                "service.ssh.accept_unknown_host_key: true explicitly (the host key is then not verified)"
            )
        if self.known_hosts is not None and self.accept_unknown_host_key:
            raise ValueError(
                "service.ssh.known_hosts and accept_unknown_host_key: true contradict each other; "
                "keep known_hosts (verified) or set it to null (unverified)"
            )
        return self


class LeaseHost(SSH):
    """The host whose directory holds the target's lease (target.lease_host): an SSH login as in service.ssh
    (the key referenced by path, never copied) and the directory there. Every controller that may drive the
    target must name the same host, login user and directory: that is how controllers on different hosts see
    each other."""

    dir: str | None = Field(
        None,
        max_length=MAX_PATH,
        pattern=r"^/[^\x00\n]*$",
        description="Absolute directory on the lease host for the lease files (created 0700); null: "
        "~/.local/state/caseledger/leases of the login user (at most 4096 characters)",
        examples=["/var/lib/caseledger/leases"],
    )

    @model_validator(mode="after")
    def _host_key_policy(self) -> LeaseHost:  # replaces SSH's check: the messages name target.lease_host
        if self.known_hosts is None and not self.accept_unknown_host_key:
            raise ValueError(
                "target.lease_host.known_hosts is null: set it to a known_hosts file, or set "
                "target.lease_host.accept_unknown_host_key: true explicitly (the host key is then not "
                "verified)"
            )
        if self.known_hosts is not None and self.accept_unknown_host_key:
            raise ValueError(
                "target.lease_host.known_hosts and accept_unknown_host_key: true contradict each other; "
                "keep known_hosts (verified) or set it to null (unverified)"
            )
        return self


_LLAMA_FLAG = {"draft_model": "-md", "spec_type": "--spec-type", "draft_max": "--spec-draft-n-max"}


class Speculative(_Model):
    """Speculative decoding of a command-adapter service. Each field fills its placeholder in service.argv
    ({draft_model}, {spec_type}, {draft_max}), so changing one is a service change: a restart with the new argv."""

    draft_model: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_PATH,
        description="Draft model file; fills {draft_model} (llama.cpp: -md {draft_model}). Its sha256 is part "
        "of the service identity, like the target model's (at most 4096 characters)",
        examples=["models/gemma-3-270m-q4_k_m.gguf"],
    )
    spec_type: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.,-]+$",
        max_length=200,
        description="Speculative method; fills {spec_type} (llama.cpp: --spec-type {spec_type}, e.g. draft-simple)",
        examples=["draft-simple"],
    )
    draft_max: int | None = Field(
        None,
        ge=1,
        le=1024,
        strict=True,
        description="Draft tokens per step (1..1024); fills {draft_max} (llama.cpp: --spec-draft-n-max {draft_max})",
        examples=[4],
    )


SPECULATIVE_PLACEHOLDERS = tuple("{" + name + "}" for name in Speculative.model_fields)
"""The argv placeholders filled from service.speculative: {draft_model}, {spec_type}, {draft_max}."""


class FileRef(_Model):
    """A file that defines a component (weights, expert layout, config): its content hash joins the component's
    identity, and `held` files are checked in the live process's open and mapped files."""

    path: str = Field(
        min_length=1,
        max_length=MAX_PATH,
        description="Path on the component's host; relative paths are relative to the workspace (at "
        "most 4096 characters)",
        examples=["models/gemma-3-270m-q4_k_m.gguf"],
    )
    sha256: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{64}$",
        description="Pinned content hash; null: hashed when the service phase runs (cached by size, mtime and inode)",
    )
    held: bool = Field(
        False,
        strict=True,
        description="The process keeps this file open or mapped while it serves (llama.cpp mmaps its "
        "GGUF): the service phase refuses a process that does not hold this very file",
    )


_PLACEHOLDERS = ("{host}", "{port}", "{model}")


class Component(_Model):
    """One process of a multi-process service (prefill, decode, router, a DP route...). Each is started,
    verified, reused and repaired on its own: a child changing only one component's argv restarts that one."""

    name: str = Field(
        min_length=1,
        max_length=64,
        pattern=r"^[a-z0-9][a-z0-9_-]*$",
        description="Component name, unique in the service (lowercase letters, digits, _ and -)",
        examples=["decode"],
    )
    role: str = Field(
        "worker",
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="What it does: prefill, decode, router, worker... (recorded, shown in evidence)",
    )
    argv: list[_Arg] = Field(
        min_length=1,
        max_length=MAX_ARGS,
        description="Launch argv (a list, never a shell string); '{host}', '{port}' and "
        "'{model}' are filled from its first route",
    )
    env: dict[_EnvName, _Arg] = Field(
        default_factory=dict,
        max_length=MAX_ARGS,
        description="Environment, as service.env ('${NAME}' references resolved at launch, never stored)",
    )
    routes: list[Annotated[int, Field(ge=0, le=255, strict=True)]] = Field(
        default_factory=list,
        max_length=256,
        description="Indices into target.endpoints this component serves (its port is checked to be held by it); "
        "[] for a component behind a router",
    )
    health_url: str | None = Field(
        None,
        max_length=MAX_URL,
        description="Health URL; null: <origin of its first route>/health (required when routes is [])",
    )
    health_timeout_s: float = Field(
        180.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        strict=True,
        description="How long to wait for health after a start (at most 86400 s)",
    )
    ssh: SSH | None = Field(None, description="Run it on a remote host over SSH; null: local")
    files: list[FileRef] = Field(
        default_factory=list,
        max_length=64,
        description="Files that define it (weights, layout, config): hashes join its identity",
    )

    @model_validator(mode="after")
    def _remote_paths_absolute(self) -> Component:
        rel = next((f.path for f in self.files if not f.path.startswith("/")), None)
        if self.ssh is not None and rel is not None:
            raise ValueError(
                f"service.components '{self.name}': files path '{rel[:80]}' is relative but the component "
                "runs on ssh.host; give the absolute path on that host"
            )
        return self

    @model_validator(mode="after")
    def _placeholders_need_a_route(self) -> Component:
        if not self.routes:
            used = [p for p in _PLACEHOLDERS if any(p in a for a in self.argv)]
            if used:
                raise ValueError(
                    f"service.components '{self.name}': argv uses {used[0]} but routes is []; give it "
                    "a route or write the value in argv"
                )
            if self.health_url is None:
                raise ValueError(f"service.components '{self.name}': routes is [], so health_url is required")
        return self


AdapterKind = Literal["reference", "external", "command"]  # one adapter module each (caseledger.services.kinds)


class Service(_Model):
    adapter: AdapterKind = Field(
        "reference",
        description="reference: the embedded reference target; external: an already-running endpoint; "
        "command: caseledger starts argv (locally, or on service.ssh.host) and reads its effective argv back",
    )
    argv: list[_Arg] = Field(
        default_factory=list,
        max_length=MAX_ARGS,
        description="Launch argv for adapter 'command' (a list, never a shell string: case fields must not "
        "become shell syntax; at most 1024 elements of 32768 characters). '{port}' and '{host}' are filled from "
        "the first endpoint",
    )
    env: dict[_EnvName, _Arg] = Field(
        default_factory=dict,
        max_length=MAX_ARGS,
        description="Environment for the launched service: literal non-secret values, or '${NAME}' references "
        "resolved from the caller's environment at launch (never stored). The service gets only these plus "
        f"{', '.join(INHERITED_ENV)} and {'*, '.join(INHERITED_ENV_PREFIXES)}* from the caller (never its other "
        "variables; declare LD_LIBRARY_PATH, CUDA_VISIBLE_DEVICES etc. here); at most 1024 entries",
    )
    health_url: str | None = Field(
        None, max_length=MAX_URL, description="Health URL (at most 2048 characters); null: <endpoint origin>/health"
    )
    health_timeout_s: float = Field(
        180.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        strict=True,
        description="How long to wait for health after a start (at most 86400 s)",
    )
    identity_command: list[_Arg] | None = Field(
        None,
        max_length=MAX_ARGS,
        description="Optional argv printing the live service identity (adapter 'external'); it runs with the "
        "same minimal environment as a launched service",
    )
    recovery_target: str | None = Field(
        None, max_length=64, description="Case id of the verified service to roll back to when this one fails"
    )
    reference: ReferenceConfig = Field(
        default_factory=ReferenceConfig, description="Reference target model (adapter 'reference' only)"
    )
    ssh: SSH | None = Field(
        None,
        description="Run adapter 'command' on a remote host over SSH (launch, /proc read-back, stop all go "
        "through it); null: local. Health is still checked at health_url",
    )

    speculative: Speculative | None = Field(
        None,
        description="Speculative decoding (adapter 'command'): draft model, method and draft length, each filling "
        "its placeholder in argv; null: none declared",
    )
    components: list[Component] = Field(
        default_factory=list,
        max_length=64,
        description="Processes of a multi-process service (adapter 'command'), e.g. prefill + decode + router, or "
        "one engine per route; each started, verified, reused and repaired on its own. [] : the single process "
        "of service.argv",
    )

    @model_serializer(mode="wrap")
    def _omit_unset_speculative(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # unset speculative and components are left out of the canonical JSON, so cases frozen before the fields
        # existed keep their case ids
        data: dict[str, Any] = handler(self)
        if self.speculative is None:
            data.pop("speculative", None)
        if not self.components:
            data.pop("components", None)
        return data

    @model_validator(mode="after")
    def _components_alone(self) -> Service:
        if not self.components:
            return self
        if self.adapter != "command":
            raise ValueError(f"service.components needs adapter 'command', not '{self.adapter}'")
        clash = [f for f in ("argv", "env", "ssh", "speculative", "health_url") if getattr(self, f)]
        if clash:
            raise ValueError(
                f"service.{clash[0]} is set beside service.components: with components, each component "
                f"has its own argv, env, ssh and health_url; move it into the component"
            )
        names = [c.name for c in self.components]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup:
            raise ValueError(f"service.components: the name '{dup}' is used twice; names must be unique")
        return self

    @model_validator(mode="after")
    def _speculative_in_argv(self) -> Service:
        values = self.speculative.model_dump() if self.speculative is not None else {}
        if self.speculative is not None and self.adapter != "command":
            raise ValueError(
                f"service.speculative is only used by adapter 'command', not '{self.adapter}' (the "
                "reference target drafts with service.reference.spec_tokens)"
            )
        argv = "\0".join(self.argv)
        for name, placeholder in zip(Speculative.model_fields, SPECULATIVE_PLACEHOLDERS, strict=True):
            used = placeholder in argv
            if values.get(name) is None and used:
                raise ValueError(f"service.argv uses {placeholder} but service.speculative.{name} is not set")
            if values.get(name) is not None and not used:
                raise ValueError(
                    f"service.speculative.{name} is set but service.argv has no {placeholder}: the "
                    f"value would never reach the engine; add it to argv (e.g. llama.cpp "
                    f"{_LLAMA_FLAG[name]} {placeholder})"
                )
        return self

    @model_validator(mode="after")
    def _ssh_needs_command(self) -> Service:
        if self.ssh is not None and self.adapter != "command":
            raise ValueError(
                f"service.ssh is only used by adapter 'command', not '{self.adapter}'; "
                "set service.ssh to null or use adapter 'command'"
            )
        return self


class LengthDistribution(_Model):
    """A length drawn per entry (dataset.input_tokens or dataset.output_tokens as an object), seeded by
    dataset.seed: fixed, uniform on [min, max], or normal / lognormal truncated to [min, max] and rounded."""

    distribution: Literal["fixed", "uniform", "normal", "lognormal"] = Field(
        description="fixed: always value; uniform: integers min..max equally likely; normal, lognormal: mean and "
        "stdev of the length itself, truncated to [min, max] (resampled, never clipped) and rounded",
        examples=["lognormal"],
    )
    value: int | None = Field(None, ge=1, le=MAX_TOKENS, strict=True, description="fixed: the length (1..2097152)")
    mean: float | None = Field(
        None,
        gt=0,
        le=MAX_TOKENS,
        strict=True,
        description="normal, lognormal: mean of the length in tokens",
        examples=[512.0],
    )
    stdev: float | None = Field(
        None,
        gt=0,
        le=MAX_TOKENS,
        strict=True,
        description="normal, lognormal: standard deviation of the length in tokens",
        examples=[128.0],
    )
    min: int = Field(1, ge=1, le=MAX_TOKENS, strict=True, description="Shortest length (1..2097152)")
    max: int = Field(
        MAX_TOKENS,
        ge=1,
        le=MAX_TOKENS,
        strict=True,
        description="Longest length (1..2097152); the bound of what is materialized and of the context check",
    )

    @model_validator(mode="after")
    def _complete(self) -> LengthDistribution:
        d = self.distribution
        if self.min > self.max:
            raise ValueError(f"length distribution: min {self.min} > max {self.max}; give min <= max")
        if d == "fixed":
            if self.value is None or self.mean is not None or self.stdev is not None:
                raise ValueError(
                    "length distribution 'fixed' takes value (and nothing else): e.g. "
                    "{'distribution': 'fixed', 'value': 256}"
                )
        elif self.value is not None:
            raise ValueError(
                f"length distribution '{d}' takes no value (only 'fixed' does); use min/max"
                + ("" if d == "uniform" else ", mean and stdev")
            )
        if d == "uniform" and (self.mean is not None or self.stdev is not None or "max" not in self.model_fields_set):
            raise ValueError(
                "length distribution 'uniform' takes min and max only: e.g. {'distribution': "
                "'uniform', 'min': 64, 'max': 512}"
            )
        if d in ("normal", "lognormal") and (self.mean is None or self.stdev is None):
            raise ValueError(
                f"length distribution '{d}' needs mean and stdev (of the length, in tokens), and "
                "optionally min/max: e.g. {'distribution': '" + d + "', 'mean': 512, 'stdev': 128, "
                "'min': 16, 'max': 2048}"
            )
        return self

    @property
    def longest(self) -> int:
        return self.value if self.distribution == "fixed" and self.value is not None else self.max


Length = int | LengthDistribution
LENGTH_TAGS = ("tokens", "distribution")  # the branches of a length field, as they appear in validation error paths


def _length_kind(v: Any) -> str:
    return "distribution" if isinstance(v, dict | LengthDistribution) else "tokens"


# an integer, or a distribution (an object): the branch is chosen by the value's kind, so an out-of-range integer
# is reported as that, not as "not a distribution" too
_LengthField = Annotated[
    Annotated[Annotated[int, Field(ge=1, le=MAX_TOKENS, strict=True)], Tag("tokens")]
    | Annotated[LengthDistribution, Tag("distribution")],
    Discriminator(_length_kind),
]


MAX_SESSIONS = 100_000  # conversations per dataset
MAX_TURNS = 1024  # turns per conversation
MAX_THINK_MS = 3_600_000  # one hour between two turns


class Sessions(_Model):
    """Multi-turn conversations (dataset.sessions, source 'synthetic'): `count` conversations of `turns` turns
    each. Every turn sends the conversation so far (the earlier user messages and the replies the server gave)
    plus a new user message of dataset.input_tokens body tokens, and asks dataset.output_tokens; turn k leaves
    only after turn k-1's response ended and think_time_ms passed. N (load.requests) is the total of turns."""

    count: int = Field(
        description="Conversations (sessions), 1..100000", ge=1, le=MAX_SESSIONS, strict=True, examples=[8]
    )
    turns: Annotated[
        Annotated[Annotated[int, Field(ge=1, le=MAX_TURNS, strict=True)], Tag("tokens")]
        | Annotated[LengthDistribution, Tag("distribution")],
        Discriminator(_length_kind),
    ] = Field(
        description="Turns per conversation (1..1024), or a distribution drawn per conversation (seeded by "
        "dataset.seed, as lengths are)",
        examples=[4, {"distribution": "uniform", "min": 2, "max": 6}],
    )
    think_time_ms: Annotated[
        Annotated[Annotated[int, Field(ge=0, le=MAX_THINK_MS, strict=True)], Tag("tokens")]
        | Annotated[LengthDistribution, Tag("distribution")],
        Discriminator(_length_kind),
    ] = Field(
        0,
        description="Wait between a turn's response end and the next turn's send, ms (0..3600000), or a "
        "distribution drawn per turn",
        examples=[0, {"distribution": "uniform", "min": 200, "max": 800}],
    )

    @model_validator(mode="after")
    def _bounds(self) -> Sessions:
        if isinstance(self.turns, LengthDistribution) and self.turns.longest > MAX_TURNS:
            raise ValueError(
                f"dataset.sessions.turns: max {self.turns.longest} is above {MAX_TURNS} turns; set "
                f"its max to at most {MAX_TURNS}"
            )
        if isinstance(self.think_time_ms, LengthDistribution) and self.think_time_ms.longest > MAX_THINK_MS:
            raise ValueError(
                f"dataset.sessions.think_time_ms: max {self.think_time_ms.longest} is above "
                f"{MAX_THINK_MS} ms; set its max to at most {MAX_THINK_MS}"
            )
        return self

    def fixed_total(self) -> int | None:
        """Total turns (N) when turns is an integer; None when each conversation draws its own."""
        return self.count * self.turns if isinstance(self.turns, int) else None


def longest(x: Length) -> int:
    """The largest length a dataset.input_tokens / output_tokens value can give."""
    return x if isinstance(x, int) else x.longest


def max_tokens_bound(case: Case) -> int | None:
    """The most output tokens any request of the case asks for; None when each trace row sets its own."""
    if case.load.max_tokens is not None:
        return case.load.max_tokens
    if case.dataset.source == "trace":
        return None
    return longest(case.dataset.output_tokens)


class Dataset(_Model):
    source: Literal["synthetic", "prefix_cache", "file", "trace"] = Field(
        "synthetic",
        description="synthetic: exact token lengths; prefix_cache: shared prefix per group + unique suffix; "
        "file: JSONL of prompts inside the workspace, hashed as is; trace: a Mooncake-style JSONL (timestamp ms, "
        "input_length, output_length, hash_ids) inside the workspace, each hash id one shared block of "
        "block_size tokens",
    )
    entries: int | None = Field(
        None,
        ge=1,
        le=MAX_REQUESTS,
        strict=True,
        description="Entries materialized, one per formal request (1..1000000); null: filled with load.requests",
    )
    input_tokens: _LengthField = Field(
        256,
        description="Body tokens per entry (before the chat template), 1..2097152, or a length distribution "
        "drawn per entry (synthetic, prefix_cache); entries x the longest input at most 2**30",
        examples=[256, {"distribution": "lognormal", "mean": 512, "stdev": 256, "min": 32, "max": 4096}],
    )
    output_tokens: _LengthField = Field(
        64,
        description="Output tokens per request (max_tokens; ignore_eos fixes it), 1..2097152, or a length "
        "distribution drawn per entry (then load.max_tokens must stay null)",
        examples=[64, {"distribution": "uniform", "min": 16, "max": 256}],
    )
    prefix_ratio: float = Field(
        0.0, ge=0, lt=1, strict=True, description="prefix_cache: minimum expected hit ratio per entry"
    )
    block_size: int = Field(
        16, ge=1, le=65_536, strict=True, description="Cache block size the hit ratio is aligned to (1..65536)"
    )
    prefix_groups: int = Field(
        1,
        ge=1,
        le=MAX_REQUESTS,
        strict=True,
        description="prefix_cache: number of distinct shared prefixes (1..1000000)",
    )
    tokenizer: str = Field(
        "builtin",
        min_length=1,
        max_length=MAX_PATH,
        description="Tokenizer: 'builtin' (a small BPE the project generates) or a local path for "
        "transformers.AutoTokenizer (no hub access at run time); at most 4096 characters",
    )
    tokenizer_revision: str | None = Field(
        None, max_length=200, description="Tokenizer revision recorded in the identity (at most 200 characters)"
    )
    chat_template: bool = Field(
        True, strict=True, description="Count tokens with the chat template applied (what the server sees)"
    )
    path: str | None = Field(
        None,
        max_length=MAX_PATH,
        description="file, trace: JSONL path relative to the workspace (file: one {'prompt': ...} "
        "per line; trace: one request per line), at most 4096 characters",
    )
    sha256: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{64}$",
        description="trace: sha256 of the file at dataset.path; null: filled at freeze (the "
        "case id and the dataset id then cover the trace's content)",
    )
    seed: int = Field(
        0, ge=-MAX_SEED - 1, le=MAX_SEED, strict=True, description="Generator seed (a signed 64-bit integer)"
    )
    sessions: Sessions | None = Field(
        None,
        description="Multi-turn conversations (source 'synthetic', target.api 'chat'): input_tokens is each "
        "turn's new user message, output_tokens each turn's reply; later turns carry the earlier turns. null: every "
        "entry is a single-turn request",
    )

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # unset sha256 and sessions are left out of the canonical JSON, so cases frozen before the fields existed
        # keep their ids
        data: dict[str, Any] = handler(self)
        if self.sha256 is None:
            data.pop("sha256", None)
        if self.sessions is None:
            data.pop("sessions", None)
        return data

    @model_validator(mode="after")
    def _source_fields(self) -> Dataset:
        if self.sha256 is not None and self.source != "trace":
            raise ValueError(f"dataset.sha256 is only used by source 'trace', not '{self.source}'; remove it")
        if self.source in ("file", "trace") and isinstance(self.input_tokens, LengthDistribution):
            raise ValueError(
                f"dataset.input_tokens is a distribution but source '{self.source}' takes its lengths "
                "from the file; give an integer or use source 'synthetic' or 'prefix_cache'"
            )
        if self.sessions is not None and self.source != "synthetic":
            raise ValueError(
                f"dataset.sessions needs source 'synthetic' (it is '{self.source}'): each turn's user "
                "message is generated; set source 'synthetic' or remove dataset.sessions"
            )
        if self.source == "trace" and isinstance(self.output_tokens, LengthDistribution):
            raise ValueError(
                "dataset.output_tokens is a distribution but source 'trace' takes output_length from "
                "each row; give an integer (unused) or leave it out"
            )
        return self


class LoadHost(SSH):
    """The host the load client runs on (load.host): an SSH login as in service.ssh (the key referenced by path,
    never copied), the interpreter there that imports the same caseledger, and the directory it works in."""

    python: str = Field(
        "python3",
        min_length=1,
        max_length=MAX_PATH,
        pattern=r"^[^\s]+$",
        description="Interpreter on the load host that imports the same caseledger version (checked at preflight; "
        "at most 4096 characters)",
        examples=["/opt/caseledger/.venv/bin/python"],
    )
    workdir: str = Field(
        "/tmp/caseledger-load",
        max_length=MAX_PATH,
        pattern=r"^/[^\x00]*$",
        description="Absolute directory on the load host for the run's copy of the case and dataset and for the "
        "client's raw records (at most 4096 characters)",
    )
    reconnect_s: float = Field(
        60.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        strict=True,
        description="How long the controller keeps reconnecting to a lost load host before the run ends "
        "end_unknown (the remote client keeps running; resume re-attaches), at most 86400 s",
    )

    @model_validator(mode="after")
    def _host_key_policy(self) -> LoadHost:  # replaces SSH's check: the messages name load.host
        if self.known_hosts is None and not self.accept_unknown_host_key:
            raise ValueError(
                "load.host.known_hosts is null: set it to a known_hosts file, or set "
                "load.host.accept_unknown_host_key: true explicitly (the host key is then not verified)"
            )
        if self.known_hosts is not None and self.accept_unknown_host_key:
            raise ValueError(
                "load.host.known_hosts and accept_unknown_host_key: true contradict each other; "
                "keep known_hosts (verified) or set it to null (unverified)"
            )
        return self


class LoadHostShare(LoadHost):
    """One entry of load.hosts: a load host (the login, interpreter and directory of load.host) and how many of
    the formal load's client processes run there."""

    processes: int = Field(
        1,
        ge=1,
        le=MAX_LOAD_PROCESSES,
        strict=True,
        description="Load client processes on this host (1..64; default 1); the processes of all hosts, in list "
        "order, share the formal load as load.processes does on one host",
    )

    @model_validator(mode="after")
    def _host_key_policy(self) -> LoadHostShare:  # replaces LoadHost's check: the messages name load.hosts
        if self.known_hosts is None and not self.accept_unknown_host_key:
            raise ValueError(
                "load.hosts[].known_hosts is null: set it to a known_hosts file, or set "
                "accept_unknown_host_key: true explicitly in that entry (the host key is then not verified)"
            )
        if self.known_hosts is not None and self.accept_unknown_host_key:
            raise ValueError(
                "load.hosts[].known_hosts and accept_unknown_host_key: true contradict each other; "
                "keep known_hosts (verified) or set it to null (unverified)"
            )
        return self


class Load(_Model):
    requests: int = Field(
        description="Formal requests N (1..1000000)", ge=1, le=MAX_REQUESTS, strict=True, examples=[640]
    )
    concurrency: int = Field(
        description="Maximum requests in flight C (1..100000)", ge=1, le=MAX_CONCURRENCY, strict=True, examples=[64]
    )
    rate: float | None = Field(
        None,
        gt=0,
        le=1_000_000,
        strict=True,
        description="Request rate r per second (at most 1000000); null: unlimited",
    )
    arrival: Literal["constant", "poisson", "gamma", "trace"] = Field(
        "poisson",
        description="Arrival process for rate r; trace: each request at its trace row's timestamp (dataset "
        "source 'trace', rate null), a fixed schedule scaled by load.time_scale",
    )
    time_scale: float = Field(
        1.0,
        gt=0,
        le=1000,
        strict=True,
        description="arrival 'trace': factor on the trace's time offsets (0.5 replays twice as "
        "fast, 2 at half speed), at most 1000",
    )
    burstiness: float = Field(
        1.0, gt=0, le=1000, strict=True, description="gamma shape (at most 1000); 1.0 is poisson, lower is burstier"
    )
    timeout_s: float = Field(
        600.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        strict=True,
        description="Per-request timeout (at most 86400 s); a stalled stream ends as an error",
    )
    max_tokens: int | None = Field(
        None,
        ge=1,
        le=MAX_TOKENS,
        strict=True,
        description="max_tokens per request (1..2097152); null: dataset.output_tokens",
    )
    ignore_eos: bool = Field(True, strict=True, description="Ask the server to ignore EOS so output length is fixed")
    salt: bool = Field(
        True, strict=True, description="Salt each entry's unique part per run so a warm cache cannot over-hit"
    )
    host: LoadHost | None = Field(
        None,
        description="Run the load client on another host over SSH (the same login form as service.ssh, plus the "
        "interpreter and directory there); null: on the controller's host",
    )
    hosts: list[LoadHostShare] | None = Field(
        None,
        max_length=MAX_LOAD_PROCESSES,
        description="Several load hosts, each with its client processes (at least 2 entries; one host is "
        "load.host): the formal load is dealt over the processes of all hosts in list order; null: load.host "
        "or the controller's host",
    )
    max_failed_share: float = Field(
        0.0,
        ge=0,
        le=1,
        strict=True,
        description="Share of formal requests that may fail (0..1) before the load phase fails, classed by cause "
        "(4xx hot_entry, 401/403 auth, 429/503 overload, timeouts/resets/broken streams service); 0: any failure",
    )
    max_event_bytes: int = Field(
        DEFAULT_MAX_EVENT_BYTES,
        ge=MIN_EVENT_BYTES,
        le=MAX_EVENT_BYTES,
        strict=True,
        description="Largest SSE event the load client accepts, in bytes (65536..1073741824; default 8 MiB): a "
        "longer one fails its request as a broken stream (class stream) and is not buffered further",
    )
    processes: int = Field(
        1,
        ge=1,
        le=MAX_LOAD_PROCESSES,
        strict=True,
        description="Load client processes sharing the formal load (1..64; default 1): request i goes to the "
        "process that owns slot i mod C of the C slots (dealt in contiguous blocks, C split as evenly as it goes); "
        "a conversation stays in one process; C and the arrival schedule stay global",
    )

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # an unset host and the defaults of fields added later are left out of the canonical JSON, so cases
        # frozen before the fields existed keep their ids
        data: dict[str, Any] = handler(self)
        if self.host is None:
            data.pop("host", None)
        if self.hosts is None:
            data.pop("hosts", None)
        if self.max_failed_share == 0.0:
            data.pop("max_failed_share", None)
        if self.max_event_bytes == DEFAULT_MAX_EVENT_BYTES:
            data.pop("max_event_bytes", None)
        if self.time_scale == 1.0:
            data.pop("time_scale", None)
        if self.processes == 1:
            data.pop("processes", None)
        return data

    @property
    def total_processes(self) -> int:
        """The client processes of the formal load: load.processes, or the sum over load.hosts."""
        return sum(h.processes for h in self.hosts) if self.hosts else self.processes

    def host_shares(self) -> list[tuple[LoadHost, range]]:
        """Each load host with the indices (0..P-1, over all hosts in list order) of the client processes it
        runs; [] when the load runs on the controller's host."""
        if self.host is not None:
            return [(self.host, range(self.processes))]
        out: list[tuple[LoadHost, range]] = []
        k = 0
        for h in self.hosts or []:
            out.append((h, range(k, k + h.processes)))
            k += h.processes
        return out

    def _check_hosts(self) -> None:
        if self.hosts is None:
            return
        if self.host is not None:
            raise ValueError(
                "load.host and load.hosts are both set: one load host is load.host (with load.processes), "
                "several are load.hosts (each with its processes); remove one of them"
            )
        if len(self.hosts) < 2:
            raise ValueError(
                f"load.hosts has {len(self.hosts)} entr{'y' if self.hosts else 'ies'}: one load host is "
                "written load.host (its processes as load.processes), so that one load has one spelling and one "
                "case id; use load.host"
            )
        if self.processes != 1:
            raise ValueError(
                f"load.processes {self.processes} with load.hosts: each entry's processes says how many run "
                f"on that host (the total is their sum, {self.total_processes}); remove load.processes"
            )
        seen: dict[tuple[str, int, str], int] = {}
        for i, h in enumerate(self.hosts):
            at = (h.host, h.port, h.workdir.rstrip("/"))
            if at in seen:
                raise ValueError(
                    f"load.hosts[{i}] repeats load.hosts[{seen[at]}] ({h.host}:{h.port}, workdir {h.workdir}): "
                    "both would write one remote run directory; merge them into one entry with processes "
                    f"{self.hosts[seen[at]].processes + h.processes}, or give each its own workdir"
                )
            seen[at] = i

    @model_validator(mode="after")
    def _trace_schedule(self) -> Load:
        self._check_hosts()
        if self.total_processes > self.concurrency:
            what = "the processes of load.hosts" if self.hosts else "load.processes"
            raise ValueError(
                f"{what} {self.total_processes} > load.concurrency {self.concurrency}: each client process "
                f"needs at least one of the C slots; lower {what} or raise load.concurrency"
            )
        if self.arrival == "trace" and self.rate is not None:
            raise ValueError(
                f"load.arrival 'trace' replays the trace's timestamps, so load.rate must be null (it is "
                f"{self.rate:g}); set rate null, or pick another arrival to send the trace's requests "
                "at a rate"
            )
        if self.time_scale != 1.0 and self.arrival != "trace":
            raise ValueError(
                f"load.time_scale {self.time_scale:g} only scales arrival 'trace' (arrival is "
                f"'{self.arrival}'); remove it or set load.arrival 'trace'"
            )
        return self


class Warmup(_Model):
    requests: int = Field(
        4,
        ge=0,
        le=MAX_REQUESTS,
        strict=True,
        description="Warmup requests after a service (re)start (0..1000000); 0 disables",
    )
    concurrency: int = Field(2, ge=1, le=MAX_CONCURRENCY, strict=True, description="Warmup concurrency (1..100000)")
    max_tokens: int = Field(
        8, ge=1, le=MAX_TOKENS, strict=True, description="Output tokens per warmup request (1..2097152)"
    )


class Cache(_Model):
    min_hit_ratio: float | None = Field(
        None,
        ge=0,
        le=1,
        strict=True,
        description="Minimum per-request cached/prompt ratio to check; null: no cache target",
    )
    seed_per_route: bool = Field(True, strict=True, description="Seed every route's prefixes before the check")
    check_requests: int = Field(2, ge=1, le=10_000, strict=True, description="Check requests per route (1..10000)")


class Window(_Model):
    min_requests: int = Field(
        1, ge=1, le=MAX_REQUESTS, strict=True, description="Fewest requests for the window to count (1..1000000)"
    )
    min_duration_s: float = Field(
        0.0,
        ge=0,
        le=MAX_TIMEOUT_S * 30,
        strict=True,
        description="Shortest duration for the window to count (at most 30 days in s)",
    )


class NativeWindow(Window):
    rule: NativeRule = Field(
        "aisbench",
        description="aisbench: from the second request reaching peak concurrency to the last moment at peak; "
        "sglang: longest span with concurrency >= ratio * peak",
    )
    ratio: float = Field(0.9, gt=0, le=1, strict=True, description="sglang rule: share of the peak concurrency")


class Evidence(_Model):
    """When a window's evidence is not trusted: its figures are then NOT_OBSERVED or flagged as distorted, and the
    decision is 'insufficient' naming why."""

    max_invalid_share: float = Field(
        0.0,
        ge=0,
        le=1,
        strict=True,
        description="Share of a window's successful requests whose server counts fail the checks (0..1) above "
        "which the window's figures are NOT_OBSERVED; 0: any invalid request",
    )
    max_stall_s: float = Field(
        1.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        strict=True,
        description="A load client stalled this long or longer inside a window (s) distorts it: repeat the run",
    )
    max_other_cpu_share: float = Field(
        0.25,
        gt=0,
        le=1,
        strict=True,
        description="Share of the host's CPU (0..1] used by processes other than the load client, the service and "
        "caseledger during a window above which the window is distorted (a contended host): repeat on a quiet host",
    )


class Measurement(_Model):
    whole: Window = Field(default_factory=Window, description="Whole window: first send to last end")
    native: NativeWindow = Field(default_factory=NativeWindow, description="Native (steady-state) window")
    spec_decode: Literal["auto", "vllm", "sglang", "llamacpp", "none"] = Field(
        "auto", description="Which /metrics counter names to read for speculative decoding"
    )
    evidence: Evidence = Field(
        default_factory=Evidence, description="Thresholds past which a window's evidence is not trusted"
    )

    @model_serializer(mode="wrap")
    def _omit_default_evidence(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # default thresholds are left out of the canonical JSON, so cases frozen before them keep their ids
        data: dict[str, Any] = handler(self)
        if self.evidence == Evidence():
            data.pop("evidence", None)
        return data


_MAX_LIMIT_MS = MAX_TIMEOUT_S * 1000  # a latency limit above one day is a typo


def _limit(what: str) -> Any:
    return Field(
        None,
        gt=0,
        le=_MAX_LIMIT_MS,
        strict=True,
        description=f"Upper bound on {what} of the decision window, ms (at most 86400000); null: no limit",
    )


class Limits(_Model):
    """Upper bounds on window latency percentiles: a run above one is 'close (limit ...)' whatever its
    throughput, and never the scenario's best."""

    ttft_p50_ms: float | None = _limit("TTFT p50")
    ttft_p99_ms: float | None = _limit("TTFT p99")
    tpot_p50_ms: float | None = _limit("TPOT p50")
    tpot_p99_ms: float | None = _limit("TPOT p99")
    itl_p50_ms: float | None = _limit("ITL p50 (chunk gaps)")
    itl_p99_ms: float | None = _limit("ITL p99 (chunk gaps)")
    e2e_p50_ms: float | None = _limit("E2E p50")
    e2e_p99_ms: float | None = _limit("E2E p99")

    def bounds(self) -> dict[str, float]:
        """The limits that are set, name -> bound (ms)."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


def _slo(what: str) -> Any:
    return Field(
        None,
        gt=0,
        le=_MAX_LIMIT_MS,
        strict=True,
        description=f"A request counts as good only if its own {what} is at most this, ms (at most "
        "86400000); null: not a condition",
    )


class Goodput(_Model):
    """Per-request limits of goodput (as vLLM's --goodput and AIPerf's define it): good requests per second are
    successful requests whose own TTFT, TPOT and E2E are each at most the limits set here."""

    ttft_ms: float | None = _slo("TTFT")
    tpot_ms: float | None = _slo("TPOT (1-token outputs have none and meet it)")
    e2e_ms: float | None = _slo("E2E")

    @model_validator(mode="after")
    def _one_set(self) -> Goodput:
        if self.ttft_ms is None and self.tpot_ms is None and self.e2e_ms is None:
            raise ValueError("decision.goodput sets no limit: give ttft_ms, tpot_ms or e2e_ms, or set it to null")
        return self


class Decision(_Model):
    primary_metric: PrimaryMetric = Field(
        "output_throughput_per_card", description="Metric the decision compares; 'goodput' needs decision.goodput"
    )
    window: Literal["whole", "native"] = Field("whole", description="Window the decision compares on")
    baseline: str | None = Field(None, max_length=64, description="Case id of the scenario baseline; null: the parent")
    min_effect: float = Field(
        0.02,
        ge=0,
        le=1000,
        strict=True,
        description="Smallest relative improvement that counts as 'keep' (at most 1000)",
    )
    limits: Limits = Field(
        default_factory=Limits,
        description="Upper bounds on latency percentiles of the decision window, e.g. "
        "{'tpot_p99_ms': 10}; a run above one is closed and never the scenario's best",
    )
    goodput: Goodput | None = Field(None, description="Per-request limits for the goodput metric; null: no goodput")

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # unset limits and goodput are left out of the canonical JSON, so cases frozen before the fields existed
        # keep their case ids
        data: dict[str, Any] = handler(self)
        if not self.limits.bounds():
            data.pop("limits", None)
        if self.goodput is None:
            data.pop("goodput", None)
        return data

    @model_validator(mode="after")
    def _goodput_needs_limits(self) -> Decision:
        if self.primary_metric == "goodput" and self.goodput is None:
            raise ValueError(
                "decision.primary_metric 'goodput' needs decision.goodput (e.g. {'tpot_ms': 10}): "
                "which requests count as good"
            )
        return self


class Case(_Model):
    """A case: what to measure. Frozen under the hash of its canonical JSON."""

    schema_: str | None = Field(
        None, alias="$schema", max_length=MAX_URL, description="JSON Schema reference for editors (ignored)"
    )
    scenario: str = Field(
        description="Name grouping comparable cases: a letter or digit, then letters, digits, '.', '_', '-' (at most "
        "200 characters)",
        min_length=1,
        max_length=200,
        pattern=SCENARIO_PATTERN,
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
    deadline: AwareDatetime | None = Field(
        None, description="Time (with its UTC offset, e.g. 2026-12-01T18:00:00Z) after which no formal load may start"
    )
    decision: Decision = Field(default_factory=Decision, description="How keep/close is decided")

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _consistent(self) -> Case:
        if self.dataset.source in ("file", "trace") and not self.dataset.path:
            raise ValueError(
                f"dataset.path is required when dataset.source is '{self.dataset.source}': a JSONL "
                "file inside the workspace, relative to it"
            )
        if self.load.arrival == "trace" and self.dataset.source != "trace":
            raise ValueError(
                f"load.arrival 'trace' needs dataset.source 'trace' (it is '{self.dataset.source}'): "
                "the schedule comes from the trace's timestamps"
            )
        if isinstance(self.dataset.output_tokens, LengthDistribution) and self.load.max_tokens is not None:
            raise ValueError(
                "dataset.output_tokens is a distribution, so load.max_tokens must be null (each request "
                "asks for its own drawn length); remove load.max_tokens"
            )
        if self.dataset.source == "prefix_cache" and self.dataset.prefix_ratio <= 0:
            raise ValueError("dataset.prefix_ratio must be > 0 when dataset.source is 'prefix_cache'")
        if self.service.adapter == "command" and not self.service.argv and not self.service.components:
            raise ValueError("service.argv (or service.components) is required when service.adapter is 'command'")
        if self.service.components:
            served = [r for c in self.service.components for r in c.routes]
            n = len(self.target.endpoints)
            bad = next((r for r in served if r >= n), None)
            if bad is not None:
                raise ValueError(
                    f"service.components: route {bad} does not exist (target.endpoints has {n}); "
                    f"routes are indices 0..{n - 1}"
                )
            twice = next((r for r in served if served.count(r) > 1), None)
            if twice is not None:
                raise ValueError(
                    f"service.components: route {twice} is served by two components; give each route one component"
                )
            missing = [r for r in range(n) if r not in served]
            if missing:
                url = self.target.endpoints[missing[0]].base_url
                raise ValueError(
                    f"service.components: route {missing[0]} ({url}) is served by no component; add it "
                    "to one component's routes"
                )
        if self.dataset.sessions is not None:
            self._sessions_consistent(self.dataset.sessions)
        if self.dataset.entries is not None and self.dataset.entries < self.load.requests:
            raise ValueError(
                f"dataset.entries ({self.dataset.entries}) < load.requests ({self.load.requests}): "
                "one entry per request; raise dataset.entries or leave it null"
            )
        entries = self.dataset.entries or self.load.requests
        if (
            self.dataset.source not in ("file", "trace")
            and entries * longest(self.dataset.input_tokens) > MAX_DATASET_TOKENS
        ):
            raise ValueError(
                f"dataset.input_tokens x entries (load.requests or dataset.entries) = "
                f"{longest(self.dataset.input_tokens)} "
                f"x {entries} exceeds {MAX_DATASET_TOKENS} tokens materialized at freeze; lower load.requests "
                "or dataset.input_tokens"
            )
        return self

    def _sessions_consistent(self, ss: Sessions) -> None:
        if self.target.api != "chat":
            raise ValueError(
                "dataset.sessions needs target.api 'chat': a later turn sends the conversation as "
                "messages; set target.api 'chat' or remove dataset.sessions"
            )
        if self.load.rate is not None:
            raise ValueError(
                f"dataset.sessions: load.rate must be null (it is {self.load.rate:g}): a conversation's "
                "turns follow each other (after think_time_ms), and load.concurrency conversations run "
                "at once; set load.rate null"
            )
        total = ss.fixed_total()
        if total is not None and total != self.load.requests:
            raise ValueError(
                f"dataset.sessions: {ss.count} conversations x {ss.turns} turns = {total} requests, but "
                f"load.requests is {self.load.requests}; N is the total of turns: set load.requests to "
                f"{total}"
            )
        if self.dataset.entries is not None and self.dataset.entries != self.load.requests:
            raise ValueError(
                f"dataset.sessions: dataset.entries ({self.dataset.entries}) must be null or equal "
                f"load.requests ({self.load.requests}): one entry per turn; a subset of turns would "
                "cut conversations; remove dataset.entries"
            )

    def filled(self) -> Case:
        """Defaults made explicit: the form that is hashed and stored."""
        data = self.model_dump(mode="json", by_alias=False, exclude={"schema_"})
        if data["dataset"]["entries"] is None:
            data["dataset"]["entries"] = data["load"]["requests"]
        if (
            data["load"]["max_tokens"] is None
            and isinstance(data["dataset"]["output_tokens"], int)
            and data["dataset"]["source"] != "trace"
        ):  # drawn or per-row lengths: each request asks its own
            data["load"]["max_tokens"] = data["dataset"]["output_tokens"]
        if data["target"]["metrics_url"] is None:
            data["target"]["metrics_url"] = origin(data["target"]["endpoints"][0]["base_url"]) + "/metrics"
        if data["service"]["health_url"] is None and not data["service"].get("components"):
            data["service"]["health_url"] = health_url_of(data["target"]["endpoints"][0]["base_url"])
        return Case.model_validate(data)

    def canonical(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude={"schema_"})

    def env_names(self) -> set[str]:
        """Variables of the caller's environment this case needs: its API key variable and the ${VAR}
        references in service.env (caseledger's processes get these and the basics, nothing else)."""
        envs = [self.service.env, *(c.env for c in self.service.components)]
        names = {m.group(1) for env in envs for v in env.values() if (m := ENV_REF.fullmatch(v))}
        return names | ({self.target.api_key_env} if self.target.api_key_env else set())

    def measured(self) -> dict[str, Any]:
        """What is measured: the canonical form without lineage (parent, note) and the decision. The case id
        hashes this, so the same measurement frozen under another parent, note, limit or objective is the same
        case (the decision lives with the scenario: case/store.py scenario_decision)."""
        return {k: v for k, v in self.canonical().items() if k not in LINEAGE_FIELDS and k != "decision"}


ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")  # service.env value '${VAR}': the caller's $VAR (fullmatch)
LINEAGE_FIELDS = ("parent", "note")  # recorded with each freeze (ledger/cases/<id>.lineage.jsonl), not hashed


def origin(base_url: str) -> str:
    """scheme://host:port of a base URL."""
    scheme, _, rest = base_url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"


def health_url_of(base_url: str) -> str:
    """The default health URL of an endpoint: <origin>/health."""
    return origin(base_url) + "/health"
