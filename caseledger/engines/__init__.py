"""Engine profiles: what caseledger knows about each serving engine, one module each, registered here.

A profile holds its /metrics names by role (profile.ROLES), the argv options that name its weights, its version
endpoint and whether its responses carry per-request draft counts. Everything else reads engines through this
registry: no engine's counter name is written outside its module (tests/test_engines.py checks it). Adding an
engine is a module here (found by its `PROFILE`) plus, for `caseledger init`, a template in TEMPLATES; the init
choices, the CLI help and case.measurement.spec_decode are derived from the profiles.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections.abc import Iterable
from pathlib import Path

from caseledger.engines.profile import IN_FLIGHT, ROLES, EngineProfile

TEMPLATES = Path(__file__).resolve().parent.parent / "data" / "templates"  # package data, one draft per engine
NOT_MODULES = ("profile",)  # modules of this package that are not an engine


def discover(package: str, path: Iterable[str]) -> dict[str, EngineProfile]:
    """Every engine module's PROFILE in `package` (its folder: `path`), by rank; a module without one, one named
    apart from its engine, or two engines of one rank is refused, naming the fix."""
    found: list[EngineProfile] = []
    for info in pkgutil.iter_modules(list(path)):
        if info.name in NOT_MODULES:
            continue
        p = getattr(importlib.import_module(f"{package}.{info.name}"), "PROFILE", None)
        if not isinstance(p, EngineProfile) or p.name != info.name:
            raise ValueError(
                f"engine module {package}.{info.name} has no PROFILE = EngineProfile(name='{info.name}', ...): "
                "define it there, or name the module in engines.NOT_MODULES"
            )
        found.append(p)
    ranks = [p.rank for p in found]
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"engine profiles share a rank: {sorted((p.rank, p.name) for p in found)}; give each its own")
    return {p.name: p for p in sorted(found, key=lambda p: p.rank)}


PROFILES: dict[str, EngineProfile] = discover(__name__, __path__)
"""Engine name -> profile, in rank order (every list of engines is in this order)."""


def profile(name: str) -> EngineProfile:
    """The profile of `name`; ValueError naming the known engines."""
    if name not in PROFILES:
        raise ValueError(f"unknown engine '{name}': known engines are {', '.join(PROFILES)}")
    return PROFILES[name]


def names(role: str) -> tuple[str, ...]:
    """Every engine's sample names for `role`, engine by engine (current names before older ones)."""
    return tuple(n for p in PROFILES.values() for n in p.names(role))


def in_flight_gauges() -> tuple[str, ...]:
    return tuple(n for role in IN_FLIGHT for n in names(role))


def weight_options() -> tuple[str, ...]:
    """The argv options of every engine whose value names model weights (an unknown command: any of them)."""
    return tuple(dict.fromkeys(o for p in PROFILES.values() for o in p.weight_options))


def serve_words() -> tuple[str, ...]:
    return tuple(dict.fromkeys(w for p in PROFILES.values() for w in p.serve_words))


def version_endpoints() -> tuple[tuple[str, str], ...]:
    """(path, JSON field) of every engine's version report, in registry order, each once."""
    return tuple(dict.fromkeys(v for p in PROFILES.values() for v in p.version))


def templated() -> tuple[str, ...]:
    """The engines `caseledger init` writes a case draft for: those with a template, in rank order."""
    return tuple(n for n in PROFILES if (TEMPLATES / f"{n}.json").is_file())


def counting_drafts() -> tuple[str, ...]:
    """The engines whose /metrics counts speculative verify steps: the counter families spec_decode may name."""
    return tuple(n for n, p in PROFILES.items() if p.names("spec_drafts"))


SPEC_DECODE: tuple[str, ...] = ("auto", *counting_drafts(), "none")
"""case.measurement.spec_decode's values: auto (the family found), each counting engine's, none (not read)."""


COMMAND_WORDS = 4  # argv words looked at for the command: 'python3 -m sglang.launch_server', 'uv run vllm serve'


def detect(argv: list[str], version_path: str | None = None, metric_names: Iterable[str] = ()) -> str | None:
    """The engine a live service is, as evidence: 'llamacpp (argv: llama-server)', 'tgi (/info)', 'vllm (/metrics:
    4 of its names)'; None when nothing tells one engine apart. Read in that order: the command in its argv, the
    version endpoint that answered when only one engine has it, the engine whose /metrics names it serves most."""
    for word in argv[:COMMAND_WORDS]:
        for p in PROFILES.values():
            if os.path.basename(word) in p.commands or word in p.commands:
                return f"{p.name} (argv: {os.path.basename(word)})"
    if version_path is not None:
        having = [p.name for p in PROFILES.values() if any(path == version_path for path, _ in p.version)]
        if len(having) == 1:
            return f"{having[0]} ({version_path})"
    served = set(metric_names)
    scores = sorted(((sum(n in served for n in p.metrics.values()), p.name) for p in PROFILES.values()), reverse=True)
    if scores and scores[0][0] > 0 and (len(scores) == 1 or scores[1][0] < scores[0][0]):
        return f"{scores[0][1]} (/metrics: {scores[0][0]} of its names)"
    return None


def detected_name(detected: str | None) -> str | None:
    """The engine's name in a detect() answer ('llamacpp (argv: llama-server)' -> 'llamacpp')."""
    return detected.split(" (", 1)[0] if detected else None


__all__ = [
    "IN_FLIGHT",
    "PROFILES",
    "ROLES",
    "SPEC_DECODE",
    "TEMPLATES",
    "EngineProfile",
    "counting_drafts",
    "detect",
    "detected_name",
    "discover",
    "in_flight_gauges",
    "names",
    "profile",
    "serve_words",
    "templated",
    "version_endpoints",
    "weight_options",
]
