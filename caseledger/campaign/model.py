"""The campaign model: a base case, axes over case fields, the search, the repeat policy and the decision.

A campaign is frozen under the hash of what it measures (its base case's id and its axes): its points are
frozen cases. The search, the repeats and the decision are how it is asked and answered, recorded beside it
(like a scenario's decision), so changing a limit re-decides the same points and sends no request.
"""

from __future__ import annotations

import itertools
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from caseledger.case.decision import Decision
from caseledger.case.model import SCENARIO_PATTERN

MAX_AXES = 4
MAX_VALUES = 64
MAX_POINTS = 256  # the product of the axes: a campaign of days, not a typo of 10^6 points

# A case field by path: dotted names, list items by index or (components) by name, and an argv flag in brackets:
# 'load.concurrency', 'service.env.OMP_NUM_THREADS', 'service.argv[-np]', 'service.components.decode.argv[-np]'
AXIS_PATH = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_-]+)*(\[-{1,2}[A-Za-z0-9][A-Za-z0-9_.-]*\])?$"
_FLAG = re.compile(r"^(?P<path>[^\[]+)\[(?P<flag>[^\]]+)\]$")
# short labels of the fields agents sweep most (DESIGN.md: N, C, r)
_SHORT = {"load.concurrency": "C", "load.requests": "N", "load.rate": "r"}

Scalar = int | float | str | bool


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Axis(_Model):
    path: str = Field(
        description="Case field by path: 'load.concurrency', 'service.env.NAME', an argv flag as "
        "'service.argv[-np]' (the value after the flag), a component's as "
        "'service.components.decode.argv[-np]'",
        pattern=AXIS_PATH,
        max_length=300,
        examples=["load.concurrency"],
    )
    values: list[Scalar] = Field(
        min_length=1, max_length=MAX_VALUES, description="Values the field takes, one point each (at most 64)"
    )

    @field_validator("values")
    @classmethod
    def _distinct(cls, values: list[Scalar]) -> list[Scalar]:
        seen: list[Scalar] = []
        for v in values:
            if any(type(v) is type(w) and v == w for w in seen):
                raise ValueError(f"value {v!r} is given twice: each value is one point; give it once")
            seen.append(v)
        return values

    def label(self, value: Scalar) -> str:
        """'C=8', '-np=4', 'OMP_NUM_THREADS=2': the point's value of this axis in short."""
        m = _FLAG.match(self.path)
        name = m.group("flag") if m else _SHORT.get(self.path, self.path.rsplit(".", 1)[-1])
        text = f"{value:g}" if isinstance(value, float) else str(value)
        return f"{name}={text}"


class Search(_Model):
    kind: Literal["grid", "knee"] = Field(
        "grid",
        description="grid: every point; knee: on the ordered axis `axis`, bisect to the largest value that "
        "meets every limit (the other axes are a grid), like vLLM's serve_sla",
    )
    axis: str | None = Field(
        None, max_length=300, description="knee: the ordered (numeric) axis path, e.g. 'load.concurrency'"
    )
    monotone: bool = Field(
        False,
        strict=True,
        description="knee: declare that every limit only gets worse as the axis grows, so a value above one "
        "that breaks a limit breaks it too, and a value below one that meets them meets them too: those points are "
        "skipped with this reason. Required by knee (points are skipped only under a declared monotonicity)",
    )


class Repeats(_Model):
    runs: int = Field(1, ge=1, le=20, strict=True, description="Valid runs of every measured point (1..20)")
    settle_runs: int = Field(
        3,
        ge=1,
        le=20,
        strict=True,
        description="Most valid runs of a point whose verdict depends on the noise: the leader and the runner-up "
        "when they are within noise of each other, a limit verdict within its interval (1..20); past it: a tie",
    )
    budget: int = Field(
        8,
        ge=0,
        le=1000,
        strict=True,
        description="Most repeat runs in the whole campaign beyond `runs` per point (0..1000)",
    )
    max_attempts: int = Field(
        3,
        ge=1,
        le=20,
        strict=True,
        description="Runs of a point that end without a valid result (distorted, failed) before it is given up",
    )


class CampaignDraft(_Model):
    """What freeze_case takes under the key 'campaign'."""

    name: str = Field(
        description="Campaign name (like a scenario name)",
        pattern=SCENARIO_PATTERN,
        max_length=200,
        examples=["ref-c-knee"],
    )
    base: dict[str, Any] | None = Field(  # JSON: a case draft
        None, description="The base case draft (as in cases/*.json); or base_case"
    )
    base_case: str | None = Field(
        None, pattern=r"^c-[0-9a-f]{12}$", description="A frozen case id to start from (instead of base)"
    )
    axes: list[Axis] = Field(min_length=1, max_length=MAX_AXES, description="The fields the points vary (1..4)")
    search: Search = Field(default_factory=Search, description="grid, or a knee search on one ordered axis")
    repeats: Repeats = Field(default_factory=Repeats, description="How often points run, where noise decides")
    decision: Decision | None = Field(
        None,
        description="Objective (primary_metric, window), limits, min_effect: the scenario's decision. Not "
        "part of the campaign id: freezing the campaign again with another limit re-decides it, 0 requests sent. "
        "null: the base case's scenario decision",
    )
    note: str = Field("", max_length=2000, description="Free text: what the person asked")

    @model_validator(mode="after")
    def _consistent(self) -> CampaignDraft:
        if (self.base is None) == (self.base_case is None):
            raise ValueError("campaign: give exactly one of base (a case draft) or base_case (a frozen case id)")
        paths = [a.path for a in self.axes]
        if len(set(paths)) != len(paths):
            raise ValueError("campaign.axes: a path appears twice; give each field one axis")
        n = 1
        for a in self.axes:
            n *= len(a.values)
        if n > MAX_POINTS:
            raise ValueError(
                f"campaign.axes: {n} points (the product of the axes' values) exceed {MAX_POINTS}; "
                "split the campaign or use fewer values"
            )
        s = self.search
        if s.kind == "knee":
            if s.axis not in paths:
                raise ValueError(
                    f"campaign.search.axis {s.axis!r} is not one of the axes {paths}: name the ordered "
                    "axis the knee is searched on"
                )
            values = next(a.values for a in self.axes if a.path == s.axis)
            if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
                raise ValueError(f"campaign.search.axis {s.axis}: a knee needs numeric values")
            if not s.monotone:
                raise ValueError(
                    "campaign.search.kind 'knee' skips points: declare search.monotone: true (every "
                    "limit only gets worse as the axis grows), or use kind 'grid'"
                )
            if not (self.decision and self.decision.limits.bounds()):
                raise ValueError(
                    "campaign.search.kind 'knee' looks for the largest value within the limits: set "
                    "campaign.decision.limits (e.g. {'tpot_p99_ms': 50})"
                )
        return self

    def combos(self) -> list[dict[str, Scalar]]:
        """Every point's values, path -> value, in the axes' order (the knee axis ascending)."""
        axes = [(a.path, sorted(a.values) if a.path == self.search.axis else a.values) for a in self.axes]
        return [dict(zip([p for p, _ in axes], vals, strict=True)) for vals in itertools.product(*(v for _, v in axes))]

    def label(self, values: dict[str, Scalar]) -> str:
        by_path = {a.path: a for a in self.axes}
        return " ".join(by_path[p].label(v) for p, v in values.items())

    def policy(self) -> dict[str, Any]:  # JSON: written to policy.jsonl
        """How the campaign is asked (recorded beside it, not hashed): search, repeats, name, note."""
        return {
            "name": self.name,
            "search": self.search.model_dump(mode="json"),
            "repeats": self.repeats.model_dump(mode="json"),
            "note": self.note,
        }


def apply_axis(draft: dict[str, Any], path: str, value: Scalar) -> None:  # JSON: a case draft, edited by path
    """Set `path` of a case draft (a filled canonical dict, changed in place) to `value`; ValueError naming the
    path when it does not lead to a field."""
    m = _FLAG.match(path)
    field, flag = (m.group("path"), m.group("flag")) if m else (path, None)
    parts = field.split(".")
    node: Any = draft
    for i, part in enumerate(parts[:-1]):
        node = _step(node, part, ".".join(parts[: i + 1]))
    last = parts[-1]
    if flag is None:
        if isinstance(node, dict) and (last in node or parts[-2:-1] == ["env"]):
            node[last] = value
            return
        raise ValueError(
            f"campaign.axes path '{path}': '{field}' is not a field of the base case (see caseledger://schema/case)"
        )
    argv = node.get(last) if isinstance(node, dict) else None
    if not isinstance(argv, list):
        raise ValueError(f"campaign.axes path '{path}': '{field}' is not an argv list of the base case")
    text = f"{value:g}" if isinstance(value, float) else str(value).lower() if isinstance(value, bool) else str(value)
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            argv[i + 1] = text
            return
        if isinstance(arg, str) and arg.startswith(flag + "="):
            argv[i] = f"{flag}={text}"
            return
    argv.extend([flag, text])  # a flag the base does not pass: appended


def _step(node: Any, part: str, where: str) -> Any:
    if isinstance(node, dict) and part in node:
        return node[part]
    if isinstance(node, list):
        if part.isdigit() and int(part) < len(node):
            return node[int(part)]
        named = [x for x in node if isinstance(x, dict) and x.get("name") == part]
        if named:
            return named[0]
    raise ValueError(f"campaign.axes path: '{where}' is not in the base case (see caseledger://schema/case)")
