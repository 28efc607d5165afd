"""The case model: what to measure, frozen under its content hash (see case.plan for the impact table).

A case is built from sections, each in its own module: target, service, dataset, measurement and decision; the
bounds every field is checked against are in case.bounds. Here: the load (how much is sent, how fast, from which
host), warmup, cache preparation, and the case that holds them all.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AwareDatetime, ConfigDict, Field, model_validator

# the sections of a case live in their own modules; the names other modules and tests read from here are re-exported
from caseledger.case.bounds import (
    DEFAULT_MAX_EVENT_BYTES as DEFAULT_MAX_EVENT_BYTES,
)
from caseledger.case.bounds import (
    MAX_CONCURRENCY,
    MAX_EVENT_BYTES,
    MAX_LOAD_PROCESSES,
    MAX_PATH,
    MAX_REQUESTS,
    MAX_TIMEOUT_S,
    MAX_TOKENS,
    MAX_URL,
    MIN_EVENT_BYTES,
    OmitAtDefault,
    SectionModel,
)
from caseledger.case.dataset import Dataset as Dataset
from caseledger.case.dataset import LengthDistribution as LengthDistribution
from caseledger.case.dataset import Sessions, longest
from caseledger.case.decision import Decision as Decision
from caseledger.case.decision import Limits as Limits
from caseledger.case.measurement import Measurement
from caseledger.case.service import ENV_REF, SSH
from caseledger.case.service import Service as Service
from caseledger.case.target import Target, health_url_of, origin
from caseledger.records import SCENARIO_PATTERN as SCENARIO_PATTERN  # re-exported: the case's names

LINEAGE_FIELDS = ("parent", "note")  # recorded with each freeze (ledger/cases/<id>.lineage.jsonl), not hashed


def max_tokens_bound(case: Case) -> int | None:
    """The most output tokens any request of the case asks for; None when each trace row or file line may set
    its own (each raw record then carries what its request asked)."""
    if case.load.max_tokens is not None:
        return case.load.max_tokens
    if case.dataset.source in ("trace", "file"):
        return None
    return longest(case.dataset.output_tokens)


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


class Load(OmitAtDefault):
    omit_at_default = (
        "host",
        "hosts",
        "max_failed_share",
        "max_event_bytes",
        "time_scale",
        "processes",
    )  # added after cases were frozen: out of the canonical JSON at default
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


class Warmup(SectionModel):
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


class Cache(SectionModel):
    min_hit_ratio: float | None = Field(
        None,
        ge=0,
        le=1,
        strict=True,
        description="Minimum per-request cached/prompt ratio to check; null: no cache target",
    )
    seed_per_route: bool = Field(True, strict=True, description="Seed every route's prefixes before the check")
    check_requests: int = Field(2, ge=1, le=10_000, strict=True, description="Check requests per route (1..10000)")


class Case(SectionModel):
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
        if self.service.traits.runs_case_argv and not self.service.argv and not self.service.components:
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
        # the tokens a freeze may generate are bounded where the freeze sees every dataset it would generate
        # (a campaign's points, a trace's rows): datasets.check_generation, before anything is written
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
            and data["dataset"]["source"] not in ("trace", "file")
        ):  # drawn or per-row lengths (a trace row's, a file line's): each request asks its own
            data["load"]["max_tokens"] = data["dataset"]["output_tokens"]
        if data["target"]["metrics_url"] is None:
            data["target"]["metrics_url"] = origin(data["target"]["endpoints"][0]["base_url"]) + "/metrics"
        if data["service"]["health_url"] is None and not data["service"].get("components"):
            data["service"]["health_url"] = health_url_of(data["target"]["endpoints"][0]["base_url"])
        return Case.model_validate(data)

    def canonical(self) -> dict[str, Any]:  # JSON: a pydantic dump
        return self.model_dump(mode="json", exclude={"schema_"})

    def env_names(self) -> set[str]:
        """Variables of the caller's environment this case needs: its API key variable and the ${VAR}
        references in service.env (caseledger's processes get these and the basics, nothing else)."""
        envs = [self.service.env, *(c.env for c in self.service.components)]
        names = {m.group(1) for env in envs for v in env.values() if (m := ENV_REF.fullmatch(v))}
        return names | ({self.target.api_key_env} if self.target.api_key_env else set())

    def measured(self) -> dict[str, Any]:  # JSON: a pydantic dump
        """What is measured: the canonical form without lineage (parent, note) and the decision. The case id
        hashes this, so the same measurement frozen under another parent, note, limit or objective is the same
        case (the decision lives with the scenario: case/store.py scenario_decision)."""
        return {k: v for k, v in self.canonical().items() if k not in LINEAGE_FIELDS and k != "decision"}
