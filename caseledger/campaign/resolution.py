"""What an answer rests on and what could change it (pure: no I/O): the points that may still win with the runs
they need, the resolution reached between the leader and the runner-up with what a finer one would cost, and
whether any setting beats the campaign's base beyond noise.

Noise shrinks with the square root of the requests a comparison rests on, so resolving a gap of g where the
noise is s needs about (s / g)^2 times the requests measured so far.
"""

from __future__ import annotations

import math

from caseledger.campaign import drift, planner
from caseledger.campaign.model import Repeats


def could_change(pl: planner.Standing, by_id: dict[str, planner.PointObs], repeats: Repeats) -> str:
    """'; could change it: -np=4 C=8 (30.3, better; tpot_p99_ms met in 2/3 runs): 1 more run settles it' for each
    point better than the leader whose limit is uncertain; '' when none."""
    said = []
    for cid in pl.challengers:
        p = by_id.get(cid)
        if p is None or p.mean is None:
            continue
        left = repeats.settle_runs - p.runs
        need = f"{left} more run(s) settle it" if left > 0 else f"its settle runs are spent ({repeats.settle_runs})"
        said.append(f"{p.label} ({p.mean:.4g}, better; {', '.join(p.uncertain)}): {need}")
    return "; could change it: " + "; ".join(said) if said else ""


def resolution(
    pl: planner.Standing, by_id: dict[str, planner.PointObs], requests_per_run: dict[str, int | None], min_effect: float
) -> str:
    """'; resolution: leader and runner-up within ±6.1% (gap 2.0%); to resolve 2% needs about 290 more requests
    each' (or 'resolved: gap 9% beyond ±4%'); '' without both."""
    lead, second = by_id.get(pl.leader or ""), by_id.get(pl.runner_up or "")
    if lead is None or second is None or pl.noise_rel is None or pl.gap_rel is None:
        return ""
    noise, gap = pl.noise_rel, pl.gap_rel
    host = (
        f", widened by their host contention {pl.contention_gap:.0%} apart"
        if pl.contention_gap > drift.CONTENTION_GAP
        else ""
    )
    if gap > noise:
        once = "" if lead.runs > 1 and second.runs > 1 else " (one run of a side: its run-to-run noise unknown)"
        return f"; resolution: gap {gap:.1%} beyond ±{noise:.1%}{host}{once}"
    target = max(min_effect, gap, 0.005)
    sizes = [(p.runs * n) for p in (lead, second) if (n := requests_per_run.get(p.case_id))]
    text = f"; resolution: leader and runner-up within ±{noise:.1%} (gap {gap:.1%}){host}"
    if not sizes or noise <= target:
        return text
    more = math.ceil(min(sizes) * ((noise / target) ** 2 - 1))
    return text + f"; to resolve {target:.1%} needs about {more} more requests each"


def versus_base(pl: planner.Standing, by_id: dict[str, planner.PointObs], base_id: str, higher: bool) -> str:
    """'; no setting beats the base C=4 beyond noise (leader +3.1% vs ±8.0%)' when the campaign's base is a measured
    point within every limit, not the leader, and the leader's gain over it is within their noise; '' otherwise."""
    lead, base = by_id.get(pl.leader or ""), by_id.get(base_id)
    if lead is None or base is None or lead is base or not base.meets or lead.mean is None or base.mean is None:
        return ""
    gain = (lead.mean - base.mean) / abs(base.mean) * (1 if higher else -1)
    apart = planner.contention_apart(lead, base)
    noise = math.hypot(lead.noise_rel, base.noise_rel, planner.CONTENTION_NOISE * apart)
    if gain > noise and lead.runs > 1 and base.runs > 1:
        return ""
    if gain > noise:  # beyond the noise seen, but one run of either side: its run-to-run noise is unknown
        return f"; the gain over the base {base.label} ({gain:+.1%}) rests on one run of either: not settled"
    return f"; no setting beats the base {base.label} beyond noise (leader {gain:+.1%} vs ±{noise:.1%})"
