"""The phases of a run by name and order: light (no case model), so the event log reads them without the case."""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    """The phases of a run, in the order they run (DESIGN.md, Phases)."""

    PREFLIGHT = "preflight"
    SERVICE = "service"
    WARMUP = "warmup"
    ROUTE_VERIFY = "route_verify"
    CACHE_PREPARE = "cache_prepare"
    LOAD = "load"
    CONFIRM_END = "confirm_end"
    POSTPROCESS = "postprocess"
    DECIDE = "decide"


PHASES: tuple[Phase, ...] = tuple(Phase)
