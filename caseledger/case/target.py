"""The case's target (where requests go): its endpoints, API flavour, cards and lease host, and the URL helpers
that derive an endpoint's origin and health URL."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from caseledger.case.bounds import MAX_PATH, MAX_URL, OmitAtDefault, SectionModel
from caseledger.case.service import SSH


class Endpoint(SectionModel):
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


class Target(OmitAtDefault):
    omit_at_default = (
        "context_tokens",
        "lease_host",
    )  # added after cases were frozen: out of the canonical JSON at default
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


def origin(base_url: str) -> str:
    """scheme://host:port of a base URL."""
    scheme, _, rest = base_url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"


def health_url_of(base_url: str) -> str:
    """The default health URL of an endpoint: <origin>/health."""
    return origin(base_url) + "/health"
