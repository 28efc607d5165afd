"""A campaign's budget as accounting (pure: no I/O): what it spent (runs, service starts, minutes), whether its
next run fits, what is left, and the part of the space it did not test when the budget ended it.

Every search kind is bounded the same way: a run that would pass any part of the budget is not started (a
repeat, a settle run or a control run is a run like any other), and the campaign ends with what it has.
Minutes count from the driver's first start; a run's minutes are estimated from the ledger (campaign/costs.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from caseledger.campaign.model import Axis, Budget, Scalar, label_of, space_of
from caseledger.campaign.search import key

MAX_LISTED = 6  # untested points named one by one; the rest counted
MAX_ENUMERATED = 4096  # a space larger than this (or continuous) is described by its axes, not listed


@dataclass
class Account:
    """A budget and what is spent against it; `take` books the next run when it fits."""

    budget: Budget
    measurements: int = 0
    starts: int = 0
    minutes: float = 0.0

    def refusal(self, *, start: bool, minutes: float | None = None) -> str | None:
        """Why one more run (with a service start, costing about `minutes`) would pass the budget; None: it fits."""
        b = self.budget
        if b.measurements is not None and self.measurements >= b.measurements:
            return f"its budget of {b.measurements} measurement(s) is spent ({self.measurements})"
        if start and b.starts is not None and self.starts >= b.starts:
            return f"its budget of {b.starts} service start(s) is spent ({self.starts})"
        if b.minutes is not None:
            if self.minutes >= b.minutes:
                return f"its budget of {b.minutes:g} minute(s) is spent ({self.minutes:.1f})"
            if minutes is not None and self.minutes + minutes > b.minutes:
                return (
                    f"its next run (about {minutes:.1f} min) would pass its budget of {b.minutes:g} minute(s) "
                    f"({self.minutes:.1f} spent)"
                )
        return None

    def take(self, *, start: bool, minutes: float | None = None) -> str | None:
        """Book one more run when it fits (None); else why not, and nothing is booked."""
        why = self.refusal(start=start, minutes=minutes)
        if why is None:
            self.measurements += 1
            self.starts += int(start)
            self.minutes += minutes or 0.0
        return why

    def exhausted(self) -> str | None:
        """Why no run at all fits any more (its measurements or minutes are spent); None while one may."""
        return self.refusal(start=False)

    def said(self) -> str | None:
        """'budget: 18/25 measurements, 3/6 starts, 9.5/30 min (left: 7 measurements, 3 starts, 20.5 min)';
        None without a budget."""
        b = self.budget
        parts = [
            (self.measurements, b.measurements, "measurements", "{:d}"),
            (self.starts, b.starts, "starts", "{:d}"),
            (self.minutes, b.minutes, "min", "{:.1f}"),
        ]
        given = [(spent, cap, unit, fmt) for spent, cap, unit, fmt in parts if cap is not None]
        if not given:
            return None
        spent_said = ", ".join(f"{fmt.format(spent)}/{cap:g} {unit}" for spent, cap, unit, fmt in given)
        left = ", ".join(f"{fmt.format(max(cap - spent, 0))} {unit}" for spent, cap, unit, fmt in given)
        return f"budget: {spent_said} (left: {left})"


def untested(axes: list[Axis], constraints: list[str], measured: list[dict[str, Scalar]]) -> str | None:
    """The part of the space no run measured, compactly: '3 of 6 points never measured: C=8, C=16, C=32', and
    the axis values no measured point had ('never tried: -np=8'); None when every point was measured. A point
    measured at any N (a halving screen) counts as tested."""
    paths = {a.path for a in axes}
    seen = {key({p: v for p, v in m.items() if p in paths}) for m in measured}
    size = math.prod(a.size() for a in axes)
    never = _never_tried(axes, measured)
    tail = f"; never tried: {never}" if never else ""
    if math.isinf(size) or size > MAX_ENUMERATED:
        what = "a continuous space" if math.isinf(size) else f"{size:.0f} points"
        return f"{len(seen)} point(s) of {what} measured{tail}"
    space = space_of(axes, constraints)
    left = [v for v in space if key(v) not in seen]
    if not left:
        return None
    labels = [label_of(axes, v) for v in left]
    more = f" (+{len(labels) - MAX_LISTED} more)" if len(labels) > MAX_LISTED else ""
    return f"{len(left)} of {len(space)} points never measured: {', '.join(labels[:MAX_LISTED])}{more}{tail}"


def _never_tried(axes: list[Axis], measured: list[dict[str, Scalar]]) -> str:
    """Each listed axis's values that no measured point had: '-np=8; C=16, C=32' (only when some were tried)."""
    out = []
    for a in axes:
        values = a.grid()
        if values is None or len(axes) == 1:
            continue  # a continuous axis has no list; with one axis the points are the values
        had = {key({a.path: m[a.path]}) for m in measured if a.path in m}
        left = [a.label(v) for v in values if key({a.path: v}) not in had]
        if left and len(left) < len(values):
            out.append(
                ", ".join(left[:MAX_LISTED]) + (f" (+{len(left) - MAX_LISTED} more)" if len(left) > MAX_LISTED else "")
            )
    return "; ".join(out)
