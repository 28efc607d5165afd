"""The case's service (how the serving target is brought up): the adapter kind and what each kind is (its
traits), argv and environment, the SSH login of a remote service, speculative decoding, the components of a
multi-process service and the files that define them, and the embedded reference target's performance model."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated, Literal

from pydantic import Field, StringConstraints, model_validator

from caseledger.case.bounds import (
    MAX_ARG,
    MAX_ARGS,
    MAX_CONCURRENCY,
    MAX_PATH,
    MAX_SEED,
    MAX_TIMEOUT_S,
    MAX_URL,
    OmitAtDefault,
    SectionModel,
)
from caseledger.engines import PROFILES
from caseledger.procs import INHERITED_ENV, INHERITED_ENV_PREFIXES

_Arg = Annotated[str, StringConstraints(max_length=MAX_ARG)]
_EnvName = Annotated[str, StringConstraints(min_length=1, max_length=256)]


class ReferenceConfig(OmitAtDefault):
    """Performance model of the embedded reference target (adapter 'reference')."""

    omit_at_default = ("max_batched_tokens", "spec_verify_s", "metrics_as")

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
    spec_verify_s: float = Field(
        0.0,
        ge=0,
        le=60,
        strict=True,
        description="Added decode step time per draft token verified, per sequence in the step (0..60 s): the "
        "cost of speculation beside its acceptance, so more draft tokens stop paying at some point",
    )
    max_batched_tokens: int | None = Field(
        None,
        ge=1,
        le=16_777_216,
        strict=True,
        description="Chunked prefill (like vLLM's max-num-batched-tokens): the tokens one engine step processes, "
        "decode tokens first (1 + spec_tokens per sequence), then prefill chunks in admission order; the step "
        "takes its prefill chunk / prefill_tokens_per_s longer. null: prefill runs beside decode, shared",
    )
    metrics_as: str = Field(
        "vllm",
        max_length=64,
        description="The engine whose /metrics names and version endpoint it serves (an engine profile: vllm, "
        "sglang, llamacpp, tgi, ...), to check how caseledger reads that engine",
    )
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

    @model_validator(mode="after")
    def _known_engine(self) -> ReferenceConfig:
        if self.metrics_as not in PROFILES:
            raise ValueError(
                f"service.reference.metrics_as '{self.metrics_as[:64]}' is not an engine profile: use one of "
                f"{', '.join(PROFILES)}"
            )
        return self


class SSH(SectionModel):
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


_LLAMA_FLAG = {"draft_model": "-md", "spec_type": "--spec-type", "draft_max": "--spec-draft-n-max"}


class Speculative(SectionModel):
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


class FileRef(SectionModel):
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


class Component(SectionModel):
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


@dataclass(frozen=True)
class KindTraits:
    """What the rest of caseledger asks of a service kind, answered once per kind in KIND_TRAITS; code asks the
    trait (`case.service.traits`), never the kind's name."""

    launched: bool  # caseledger starts, records, verifies and stops its processes (else it only probes them)
    runs_case_argv: bool  # its processes run the case's own argv (service.argv or service.components; then
    # service.speculative and service.ssh apply), locally or over SSH
    reference_config: bool  # service.reference configures the server (its max_model_len is the context)
    timings_per_token: bool  # the server is known to honour `timings_per_token` whatever the engine


KIND_TRAITS: Mapping[AdapterKind, KindTraits] = MappingProxyType(
    {
        "reference": KindTraits(launched=True, runs_case_argv=False, reference_config=True, timings_per_token=True),
        "external": KindTraits(launched=False, runs_case_argv=False, reference_config=False, timings_per_token=False),
        "command": KindTraits(launched=True, runs_case_argv=True, reference_config=False, timings_per_token=False),
    }
)


class Service(OmitAtDefault):
    omit_at_default = (
        "speculative",
        "components",
        "engine",
    )  # added after cases were frozen: out of the canonical JSON at default
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
    engine: str | None = Field(
        None,
        max_length=64,
        description="The serving engine (an engine profile: vllm, sglang, llamacpp, tgi, trtllm, mindie), checked "
        "against the engine detected at each start (its command in argv, its version endpoint, its /metrics names; "
        "recorded in the service evidence); a start that shows another engine fails. null: detected only",
    )

    @property
    def traits(self) -> KindTraits:
        """What this service's kind is (launched, runs the case's argv, ...): the question code asks."""
        return KIND_TRAITS[self.adapter]

    @model_validator(mode="after")
    def _known_engine(self) -> Service:
        if self.engine is not None and self.engine not in PROFILES:
            raise ValueError(
                f"service.engine '{self.engine[:64]}' is not an engine profile: use one of {', '.join(PROFILES)}, "
                "or null to have it detected"
            )
        if self.engine is not None and not self.traits.runs_case_argv:
            raise ValueError(f"service.engine is checked at a start by adapter 'command', not '{self.adapter}'")
        return self

    @model_validator(mode="after")
    def _components_alone(self) -> Service:
        if not self.components:
            return self
        if not self.traits.runs_case_argv:
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
        if self.speculative is not None and not self.traits.runs_case_argv:
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
        if self.ssh is not None and not self.traits.runs_case_argv:
            raise ValueError(
                f"service.ssh is only used by adapter 'command', not '{self.adapter}'; "
                "set service.ssh to null or use adapter 'command'"
            )
        return self


ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")  # service.env value '${VAR}': the caller's $VAR (fullmatch)
