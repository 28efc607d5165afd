"""The campaign model: a base case, axes over case fields, the search, the repeat policy and the decision.

A campaign is frozen under the hash of what it measures (its base case's id and its axes): its points are
frozen cases. The search, the repeats and the decision are how it is asked and answered, recorded beside it
(like a scenario's decision), so changing a limit re-decides the same points and sends no request.
"""

from __future__ import annotations

import itertools
import math
import operator
import re
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    TypeAdapter,
    field_validator,
    model_validator,
)

from caseledger.case.decision import Decision
from caseledger.case.model import SCENARIO_PATTERN, Case
from caseledger.case.plan import DERIVED, argv_options, delta, flatten

MAX_AXES = 4
MAX_VALUES = 64
MAX_POINTS = 256  # the product of the axes: a campaign of days, not a typo of 10^6 points

# A case field by path: dotted names, list items by index or (components) by name, and an argv flag in brackets:
# 'load.concurrency', 'service.env.OMP_NUM_THREADS', 'service.argv[-np]', 'service.components.decode.argv[-np]'
AXIS_PATH = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_-]+)*(\[-{1,2}[A-Za-z0-9][A-Za-z0-9_.-]*\])?$"
_FLAG = re.compile(r"^(?P<path>[^\[]+)\[(?P<flag>[^\]]+)\]$")
CONSTRAINT = re.compile(r"^(?P<a>\S+) (?P<op>>=|<=|>|<|==|!=) (?P<b>\S+)$")
MAX_CONSTRAINTS = 8
_OPS: dict[str, Callable[[Any, Any], Any]] = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
    "==": operator.eq,
    "!=": operator.ne,
}


def allowed(constraints: list[str], values: dict[str, Scalar]) -> bool:
    """Whether a point's values satisfy every relation ('A >= B': A an axis path, B an axis path, a number,
    true/false or a word). A relation on an axis the point leaves out (its `when` does not hold) holds."""
    for c in constraints:
        m = CONSTRAINT.match(c)
        if m is None:
            return False
        a, op, b = m.group("a"), m.group("op"), m.group("b")
        right: Any = values[b] if b in values else _literal(b)
        if a not in values or (right is None and "." in b):
            continue  # an axis this point leaves out
        try:
            if not _OPS[op](values[a], right):
                return False
        except TypeError:  # e.g. a string against a number: the draft was checked, a proposal cannot be
            return False
    return True


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _literal(text: str) -> Scalar | None:
    """B of a relation when it is not an axis: a number, true/false, or a word (an axis path: None)."""
    if (n := _number(text)) is not None:
        return n
    if text in ("true", "false"):
        return text == "true"
    return None if "." in text or "[" in text else text


def active(axes: list[Axis], values: dict[str, Scalar]) -> dict[str, Scalar]:
    """The point's values without the axes whose `when` does not hold (the base's value stays there)."""
    out = dict(values)
    for a in axes:
        if a.when is not None and a.path in out and not allowed([a.when], out):
            del out[a.path]
    return out


# short labels of the fields agents sweep most (DESIGN.md: N, C, r)
_SHORT = {"load.concurrency": "C", "load.requests": "N", "load.rate": "r"}

Scalar = int | float | str | bool
SERVICE_PREFIXES = ("service.", "target.")  # an axis under these changes the service identity: a start


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Axis(_Model):
    path: str = Field(
        description="Case field by path: 'load.concurrency', 'service.env.NAME', an argv flag as "
        "'service.argv[-np]' (the value after it; true/false: the bare flag or none), a component's as "
        "'service.components.decode.argv[-np]'",
        pattern=AXIS_PATH,
        max_length=300,
    )
    values: list[Scalar] | None = Field(
        None,
        min_length=1,
        max_length=MAX_VALUES,
        description="Values the field takes, one point each (at most 64); or a range: low, high (and step, log)",
    )
    low: int | float | None = Field(None, description="A range's lowest value (with high); integers: an integer range")
    high: int | float | None = Field(None, description="A range's highest value, included")
    step: int | float | None = Field(
        None,
        gt=0,
        description="A range's step (an integer range: 1 by default); a float range without one is continuous "
        "(search kind 'tpe' only)",
    )
    log: bool = Field(False, strict=True, description="A log range (tpe)")
    when: str | None = Field(
        None,
        max_length=300,
        description="Only where 'A op B' holds (A another axis, B a value), e.g. 'service.argv[--spec-type] == "
        "ngram'; elsewhere the field keeps the base's value",
    )

    @model_validator(mode="after")
    def _values_or_range(self) -> Axis:
        ranged = self.low is not None or self.high is not None
        if (self.values is None) != ranged:
            raise ValueError(f"campaign.axes '{self.path}': give values, or a range (low and high), not both")
        if ranged:
            if self.low is None or self.high is None or not self.low < self.high:
                raise ValueError(f"campaign.axes '{self.path}': a range needs low < high")
            if self.log and self.low <= 0:
                raise ValueError(f"campaign.axes '{self.path}': a log range needs low > 0")
            if self.log and self.step not in (None, 1):
                raise ValueError(f"campaign.axes '{self.path}': a log range takes no step")
            if self.integer and self.step is not None and not isinstance(self.step, int):
                raise ValueError(f"campaign.axes '{self.path}': an integer range takes an integer step")
        return self

    @field_validator("values")
    @classmethod
    def _distinct(cls, values: list[Scalar] | None) -> list[Scalar] | None:
        seen: list[Scalar] = []
        for v in values or []:
            if any(type(v) is type(w) and v == w for w in seen):
                raise ValueError(f"value {v!r} is given twice: each value is one point; give it once")
            seen.append(v)
        return values

    @property
    def integer(self) -> bool:
        """An integer range (low and high are integers)."""
        return isinstance(self.low, int) and isinstance(self.high, int)

    def grid(self) -> list[Scalar] | None:
        """Every value of the axis, in order of declaration (a range: ascending); None for a continuous range."""
        if self.values is not None:
            return list(self.values)
        assert self.low is not None and self.high is not None
        if self.integer:
            return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))
        if self.step is None:
            return None
        n = int((self.high - self.low) / self.step + 1e-9)
        return [round(self.low + k * self.step, 12) for k in range(n + 1)]

    def size(self) -> float:
        """How many values the axis has (inf for a continuous range), without listing them."""
        if self.values is not None:
            return float(len(self.values))
        assert self.low is not None and self.high is not None
        step = self.step or (1 if self.integer else None)
        return float(int((self.high - self.low) / step + 1e-9) + 1) if step else float("inf")

    def label(self, value: Scalar) -> str:
        """'C=8', '-np=4', 'OMP_NUM_THREADS=2': the point's value of this axis in short."""
        m = _FLAG.match(self.path)
        name = m.group("flag") if m else _SHORT.get(self.path, self.path.rsplit(".", 1)[-1])
        text = f"{value:g}" if isinstance(value, float) else str(value)
        return f"{name}={text}"


_MOVED = {"max_starts": "starts", "max_minutes": "minutes"}  # search fields that moved to campaign.budget


class _Search(_Model):
    """What every search kind shares. Each kind has its own fields: another kind's is refused, naming it."""

    proposes: ClassVar[bool] = False  # its strategy proposes points after the start; else all are frozen up front

    @model_validator(mode="before")
    @classmethod
    def _own_fields(cls, data: Any) -> Any:  # JSON: the search as given
        if not isinstance(data, dict):
            return data
        kind = data.get("kind", "grid")
        for name, value in data.items():
            if name in _MOVED:
                raise ValueError(
                    f"campaign.search.{name} moved to campaign.budget.{_MOVED[name]} (a budget of every search "
                    f'kind): write "budget": {{"{_MOVED[name]}": {value}}} beside search'
                )
            if name not in cls.model_fields:
                takes = [k for k, c in KINDS.items() if name in c.model_fields]
                raise ValueError(
                    f"campaign.search.{name} is not a field of kind '{kind}' (its fields: "
                    f"{', '.join(cls.model_fields)}): drop it"
                    + (f", or use kind {' or '.join(repr(k) for k in takes)}" if takes else "")
                )
        return data

    @property
    def cap(self) -> int | None:
        """The most points it proposes (tpe's max_points); None: the space or its screens bound it."""
        return None

    @property
    def knee(self) -> str | None:
        """The ordered axis it bisects (a knee's, or tpe's knee per setting); None: none."""
        return None

    def identity(self) -> dict[str, Any]:  # JSON: the hashed part of a proposing search
        """How a proposing search proposes, as the campaign id hashes it."""
        return self.model_dump(mode="json")

    def describe(self, points: int) -> str:
        """The search in a few words, for every view: 'grid over 6 points'."""
        return f"grid over {points} points"


class GridSearch(_Search):
    kind: Literal["grid"] = Field("grid", description="grid: every point")


class KneeSearch(_Search):
    kind: Literal["knee"] = Field(description="knee: bisect `axis` to its largest value within the limits")
    axis: str | None = Field(None, max_length=300, description="The ordered numeric axis, e.g. 'load.concurrency'")
    monotone: bool = Field(
        False, strict=True, description="Required true: every limit only worsens as the axis grows (skips are implied)"
    )

    @property
    def knee(self) -> str | None:
        return self.axis

    def describe(self, points: int) -> str:
        return f"knee on {self.axis} over {points} points"


class TpeSearch(_Search):
    proposes: ClassVar[bool] = True
    kind: Literal["tpe"] = Field(description="tpe: Optuna's TPE proposes points, up to max_points")
    max_points: int | None = Field(None, ge=2, le=MAX_POINTS, strict=True, description="Required: most points")
    seed: int = Field(0, ge=0, le=2**31 - 1, strict=True, description="Same results, same proposals")
    axis: str | None = Field(None, max_length=300, description="Optional: a knee on it per setting tpe proposes")
    monotone: bool = Field(False, strict=True, description="Required true with an axis (as knee's)")
    neighbours: int | None = Field(None, ge=1, le=MAX_POINTS, strict=True, description="Points per started service (3)")

    @property
    def cap(self) -> int | None:
        return self.max_points

    @property
    def knee(self) -> str | None:
        return self.axis

    def identity(self) -> dict[str, Any]:  # JSON: the hashed part of a tpe search
        # neighbours only when given: the ids of tpe campaigns frozen before it hold
        return self.model_dump(mode="json", exclude={"neighbours"} if self.neighbours is None else set())

    def describe(self, points: int) -> str:
        return f"tpe: {points} of at most {self.max_points} points proposed (seed {self.seed})"


class HalvingSearch(_Search):
    proposes: ClassVar[bool] = True
    kind: Literal["halving"] = Field(
        description="halving: all points at screen_requests, the best 1/eta again at eta times N, to the base's"
    )
    screen_requests: int | None = Field(None, ge=1, le=1_000_000, strict=True, description="Required: N of screen 1")
    eta: int = Field(3, ge=2, le=16, strict=True, description="1/eta go on to the next screen, eta times N")

    def identity(self) -> dict[str, Any]:  # JSON: the hashed part of a halving search
        # the shape halving ids were hashed with when one Search model held every kind's fields: those ids hold
        return {"max_points": None, "seed": 0, "axis": None, "monotone": False, **self.model_dump(mode="json")}

    def describe(self, points: int) -> str:
        return f"halving: {points} points proposed (screens from N={self.screen_requests}, 1/{self.eta} go on)"


class AutoSearch(_Search):
    proposes: ClassVar[bool] = True  # chosen at freeze (campaign/search.choose): no point is frozen before that
    kind: Literal["auto"] = Field(
        description="auto: chosen at freeze from the space, the costs and the budget, with why"
    )
    seed: int = Field(0, ge=0, le=2**31 - 1, strict=True, description="Seed of the strategy it chooses")


KINDS: dict[str, type[_Search]] = {
    "grid": GridSearch,
    "knee": KneeSearch,
    "tpe": TpeSearch,
    "halving": HalvingSearch,
    "auto": AutoSearch,
}
PROPOSING = tuple(k for k, c in KINDS.items() if c.proposes)  # kinds whose points are proposed after the freeze


def _kind_of(data: Any) -> str:  # JSON or a model: the discriminator (no kind: a grid)
    return str(data.get("kind", "grid")) if isinstance(data, dict) else str(getattr(data, "kind", ""))


Search = Annotated[
    Annotated[GridSearch, Tag("grid")]
    | Annotated[KneeSearch, Tag("knee")]
    | Annotated[TpeSearch, Tag("tpe")]
    | Annotated[HalvingSearch, Tag("halving")]
    | Annotated[AutoSearch, Tag("auto")],
    Discriminator(
        _kind_of,
        custom_error_type="search_kind",
        custom_error_message="campaign.search.kind is one of 'grid', 'knee', 'tpe', 'halving', 'auto'",
    ),
]
SEARCH: TypeAdapter[Search] = TypeAdapter(Search)


def stored_search(data: dict[str, Any]) -> Search:  # JSON: a policy's search
    """A search as a policy recorded it. Policies written when one model held every kind's fields carry the
    others' too, unused (at their defaults, or ignored): only the kind's own are read."""
    cls = KINDS.get(_kind_of(data))
    own = {k: v for k, v in data.items() if cls is None or k in cls.model_fields}
    return SEARCH.validate_python(own)


class Budget(_Model):
    """A run that would pass it is not started (campaign/budget.py)."""

    measurements: int | None = Field(None, ge=1, le=10_000, strict=True, description="Most runs (repeats count)")
    starts: int | None = Field(None, ge=1, le=10_000, strict=True, description="Most service starts")
    minutes: float | None = Field(None, gt=0, le=43_200, description="Most minutes from the first start")

    def given(self) -> bool:
        return any(v is not None for v in (self.measurements, self.starts, self.minutes))


class Repeats(_Model):
    runs: int = Field(1, ge=1, le=20, strict=True, description="Valid runs of every measured point (1..20)")
    settle_runs: int = Field(
        3,
        ge=1,
        le=20,
        strict=True,
        description="Most valid runs of a point the answer depends on (1..20); past it: a tie",
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


CaseRef = Annotated[str, StringConstraints(pattern=r"^c-[0-9a-f]{12}$")]  # a frozen case's id

MAX_POOL = 16
POOL_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class PoolTarget(_Model):
    """One target of a campaign's pool: the base case with the fields that say where it runs changed."""

    name: str = Field(
        pattern=POOL_NAME,
        description="Its name in every answer (a letter or digit, then letters, digits, '.', '_', '-'; at most 64)",
        examples=["node-b"],
    )
    set: dict[str, Scalar] = Field(
        default_factory=dict,
        max_length=16,
        description="Where it differs from the base, by axis path under target. or service. (endpoint, port, SSH "
        "host); {}: the base as written",
    )

    @field_validator("set")
    @classmethod
    def _where_only(cls, v: dict[str, Scalar]) -> dict[str, Scalar]:
        for path in v:
            if not re.match(AXIS_PATH, path) or not path.startswith(("target.", "service.")):
                raise ValueError(
                    f"'{path[:200]}' is not a path under target. or service.: a pool's targets differ in where "
                    "they run (endpoint, port, host), never in what is measured"
                )
        return v


class CampaignDraft(_Model):
    """What freeze_case takes under the key 'campaign'."""

    name: str = Field(
        description="Campaign name (like a scenario name)",
        pattern=SCENARIO_PATTERN,
        max_length=200,
        examples=["ref-c-knee"],
    )
    base: dict[str, Any] | CaseRef | None = Field(  # JSON: a case draft
        None,
        description="The base case: a case draft, a draft's path ('cases/vllm.json'), or a frozen case's id "
        "('c-...', as base_case)",
    )
    base_case: str | None = Field(
        None, pattern=r"^c-[0-9a-f]{12}$", description="A frozen case id to start from (instead of base)"
    )
    axes: list[Axis] = Field(min_length=1, max_length=MAX_AXES, description="The fields the points vary (1..4)")
    search: Search = Field(
        default_factory=GridSearch,
        description="How points are chosen, by kind; none given: grid, or auto when the space exceeds the budget",
    )
    budget: Budget = Field(
        default_factory=Budget,
        description="What it may spend, any search kind",
    )
    repeats: Repeats = Field(default_factory=Repeats, description="How often points run, where noise decides")
    decision: Decision | None = Field(
        None,
        description="The scenario's decision: primary_metric, window, limits (e.g. tpot_p99_ms), min_effect. Not "
        "in the campaign id: frozen again with another limit, it is re-decided, 0 requests sent. Absent: the base's",
    )
    constraints: list[str] = Field(
        default_factory=list,
        max_length=MAX_CONSTRAINTS,
        description="Relations every point keeps: 'A op B', A an axis path, B an axis path or a number, op one of "
        ">= <= > < == != (a grid leaves the other points out, a search never proposes them)",
    )
    pool: list[PoolTarget] = Field(
        default_factory=list,
        max_length=MAX_POOL,
        description="Targets declared equivalent (same hardware and model), 2..16: points run on them in parallel, "
        "one owner each; each point's runs name their target. []: the base's one target",
    )
    note: str = Field("", max_length=2000, description="Free text: what the person asked")

    @model_validator(mode="before")
    @classmethod
    def _base_by_id(cls, data: Any) -> Any:  # JSON: the draft as given
        """base given as a frozen case's id: the same as base_case."""
        if isinstance(data, dict) and isinstance(data.get("base"), str) and "base_case" not in data:
            return {**{k: v for k, v in data.items() if k != "base"}, "base_case": data["base"]}
        return data

    @model_validator(mode="before")
    @classmethod
    def _auto_by_default(cls, data: Any) -> Any:  # JSON: the draft as given
        """No search kind and a budget smaller than the grid (its measurements, or its service starts): auto."""
        search = data.get("search", {}) if isinstance(data, dict) else None
        if not isinstance(search, dict) or "kind" in search or not isinstance(data.get("budget"), dict):
            return data
        try:
            axes = [Axis.model_validate(a) for a in data.get("axes") or []]
            budget = Budget.model_validate(data["budget"])
            runs = Repeats.model_validate(data.get("repeats") or {}).runs
        except (ValueError, TypeError):
            return data  # the fields' own checks say what is wrong
        size = math.prod(a.size() for a in axes)
        idents = math.prod(a.size() for a in axes if a.path.startswith(SERVICE_PREFIXES))
        over = (budget.measurements is not None and size * runs > budget.measurements) or (
            budget.starts is not None and idents > budget.starts
        )
        return {**data, "search": {**search, "kind": "auto"}} if axes and over else data

    @model_validator(mode="after")
    def _consistent(self) -> CampaignDraft:
        if (self.base is None) == (self.base_case is None):
            raise ValueError("campaign: give exactly one of base (a case draft) or base_case (a frozen case id)")
        paths = [a.path for a in self.axes]
        if len(set(paths)) != len(paths):
            raise ValueError("campaign.axes: a path appears twice; give each field one axis")
        _check_pool(self.pool, paths)
        for c in self.constraints:
            m = CONSTRAINT.match(c)
            if m is None or m.group("a") not in paths or (m.group("b") not in paths and _number(m.group("b")) is None):
                raise ValueError(
                    f"campaign.constraints: '{c[:200]}' is not 'A op B' with A one of the axes {paths}, op one of "
                    ">= <= > < == != and B an axis path or a number (one space either side of op)"
                )
        for ax in self.axes:
            m = CONSTRAINT.match(ax.when or "")
            if ax.when is not None and (
                m is None or m.group("a") not in paths or m.group("a") == ax.path or _literal(m.group("b")) is None
            ):
                raise ValueError(
                    f"campaign.axes '{ax.path}': when '{ax.when[:200]}' is not 'A op B' with A another axis of "
                    f"{paths} and B a number, true/false or a word (one space either side of op)"
                )
        n = math.prod(a.size() for a in self.axes)
        s = self.search
        if isinstance(s, TpeSearch):
            if s.max_points is None:
                raise ValueError("campaign.search.kind 'tpe' proposes points until search.max_points: set it (e.g. 30)")
        elif n > MAX_POINTS and not isinstance(s, AutoSearch):
            size = "a continuous range" if math.isinf(n) else f"{n:.0f} points (the product of the axes' values)"
            raise ValueError(
                f"campaign.axes: {size} exceed(s) the {MAX_POINTS} a {s.kind} enumerates; use search.kind 'tpe' "
                "with max_points (a model-based search proposes points one at a time), or 'auto' with a "
                "campaign.budget, or fewer values"
            )
        if isinstance(s, HalvingSearch):
            base_n = (self.base or {}).get("load", {}).get("requests") if isinstance(self.base, dict) else None
            if s.screen_requests is None or (isinstance(base_n, int) and s.screen_requests >= base_n):
                raise ValueError(
                    "campaign.search.kind 'halving' screens every point with fewer requests first: set "
                    "search.screen_requests below the base's load.requests (e.g. a quarter of it)"
                )
        if self.constraints and not s.proposes and not self.combos():
            raise ValueError(f"campaign.constraints: no point of the axes keeps them all ({self.constraints})")
        if isinstance(s, KneeSearch) or s.knee is not None:
            self._check_knee(s.knee, s.kind, paths)
        return self

    def _check_knee(self, axis: str | None, kind: str, paths: list[str]) -> None:
        if axis not in paths:
            raise ValueError(
                f"campaign.search.axis {axis!r} is not one of the axes {paths}: name the ordered "
                "axis the knee is searched on"
            )
        values = next(a.grid() or [] for a in self.axes if a.path == axis)
        if not values or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            raise ValueError(
                f"campaign.search.axis {axis}: a knee needs numeric values (a list, or a range with a step)"
            )
        if not getattr(self.search, "monotone", False):
            raise ValueError(
                f"campaign.search.kind '{kind}' with an axis bisects it: declare search.monotone: true (every "
                "limit only gets worse as the axis grows), or drop search.axis"
                + (" (or use kind 'grid')" if kind == "knee" else "")
            )
        if not (self.decision and self.decision.limits.bounds()):
            raise ValueError(
                "campaign.search.axis: a knee looks for the largest value within the limits: set "
                "campaign.decision.limits (e.g. {'tpot_p99_ms': 50})"
            )

    def combos(self) -> list[dict[str, Scalar]]:
        """Every point's values, path -> value, in the axes' order (the knee axis ascending); none for a search
        that proposes its points."""
        if self.search.proposes:
            return []  # proposed one at a time (campaign/search.py), each frozen when proposed
        return self.space()

    def space(self) -> list[dict[str, Scalar]]:
        return space_of(self.axes, self.constraints, self.search.knee)

    def policy(self) -> dict[str, Any]:  # JSON: written to policy.jsonl
        """How the campaign is asked (recorded beside it, not hashed): search, repeats, budget, name, note."""
        return {
            "name": self.name,
            "search": self.search.model_dump(mode="json"),
            "repeats": self.repeats.model_dump(mode="json"),
            "note": self.note,
            # only when given: the policies of campaigns frozen without one stay the same
            **({"budget": self.budget.model_dump(mode="json")} if self.budget.given() else {}),
        }


def _check_pool(pool: list[PoolTarget], paths: list[str]) -> None:
    if len(pool) == 1:
        raise ValueError("campaign.pool: one target is no pool; name 2..16 targets, or drop pool (the base's target)")
    names = [t.name for t in pool]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"campaign.pool: the name(s) {twice} appear twice; give each target its own name")
    for t in pool:
        both = sorted(set(t.set) & set(paths))
        if both:
            raise ValueError(
                f"campaign.pool '{t.name}': {both} is an axis too; a pool's targets differ in where they run, the "
                "axes in what is measured: drop it from set"
            )


def space_of(axes: list[Axis], constraints: list[str], ascending: str | None = None) -> list[dict[str, Scalar]]:
    """Every combination of the axes' values that keeps the constraints, in the axes' order (the axis named
    `ascending` sorted: a knee's)."""
    grids = [(a.path, a.grid() or []) for a in axes]
    ordered = [(p, sorted(v, key=float) if p == ascending else v) for p, v in grids]
    names = [p for p, _ in ordered]
    every = [active(axes, dict(zip(names, vals, strict=True))) for vals in itertools.product(*(v for _, v in ordered))]
    unique = {tuple(sorted((p, repr(x)) for p, x in v.items())): v for v in every}  # an inactive axis: one point
    return [v for v in unique.values() if allowed(constraints, v)]


def label_of(axes: list[Axis], values: dict[str, Scalar]) -> str:
    """A point's label: every axis value that tells it apart, in the axes' order ('-np=2 C=8'); a field a
    strategy set beside the axes (a screen's N) follows them ('-np=2 C=8 N=16')."""
    by_path = {a.path: a for a in axes}
    return " ".join(
        by_path[p].label(v) if p in by_path else Axis(path=p, values=[v]).label(v) for p, v in values.items()
    )


def setting_label(first: Case, case: Case, axes: list[str]) -> str:
    """Every knob `case` sets away from `first` (the scenario's first case) that is not one of `axes` (the paths
    its campaign's label already names), in the words of an axis label: '-b=512 -ub=512', 'C=4'. A point labelled
    by its own campaign's axes alone would hide what its campaign's base changed."""
    said: list[str] = []
    mine = flatten(case.canonical())
    for d in delta(first, case):
        if d.path in DERIVED and mine.get(d.path) == mine.get(DERIVED[d.path]):
            continue  # follows its source field: not a knob of its own
        if isinstance(d.old, list) and isinstance(d.new, list) and d.path.endswith("argv"):
            old, new = dict(argv_options([str(x) for x in d.old])), dict(argv_options([str(x) for x in d.new]))
            for flag in [*old, *(k for k in new if k not in old)]:
                if f"{d.path}[{flag}]" in axes or old.get(flag, "-") == new.get(flag, "-"):
                    continue
                name = flag or "(positional)"
                said.append(f"no {name}" if flag not in new else name if new[flag] is None else f"{name}={new[flag]}")
        elif d.path not in axes:
            value = d.new if isinstance(d.new, str | int | float | bool) else "…"
            said.append(Axis(path=d.path, values=[value]).label(value))
    return " ".join(said)


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
    if isinstance(value, bool):  # a switch: true passes the bare flag, false leaves it out
        argv[:] = [a for a in argv if not (a == flag or (isinstance(a, str) and a.startswith(flag + "=")))]
        if value:
            argv.append(flag)
        return
    text = f"{value:g}" if isinstance(value, float) else str(value)
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
