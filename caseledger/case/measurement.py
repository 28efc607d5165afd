"""The case's measurement: the whole and native windows and the thresholds past which a window's evidence is not
trusted."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from caseledger.case.bounds import MAX_REQUESTS, MAX_TIMEOUT_S, OmitAtDefault, SectionModel
from caseledger.engines import SPEC_DECODE
from caseledger.records import NativeRule

if TYPE_CHECKING:
    SpecDecode = str
else:  # the values come from the engine profiles (caseledger.engines.SPEC_DECODE): a new engine adds its own
    SpecDecode = Literal[SPEC_DECODE]


class Window(SectionModel):
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


class Evidence(SectionModel):
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


class Measurement(OmitAtDefault):
    omit_at_default = ("evidence",)  # added after cases were frozen: out of the canonical JSON at default
    whole: Window = Field(default_factory=Window, description="Whole window: first send to last end")
    native: NativeWindow = Field(default_factory=NativeWindow, description="Native (steady-state) window")
    spec_decode: SpecDecode = Field("auto", description="Which /metrics counter names to read for speculative decoding")
    evidence: Evidence = Field(
        default_factory=Evidence, description="Thresholds past which a window's evidence is not trusted"
    )
