"""Search strategies on the engine-like reference space of tests/test_search.py (spec_tokens x max_batched_tokens x
C, 280 points, output throughput under TPOT p99 <= 8 ms and TTFT p99 <= 150 ms), measured on the simulated
reference target (target/simulate.py: the engine's own scheduler on virtual time, so the figures are exact and the
host's load does not matter). Per strategy: points measured, formal-window time the target would spend (the
loads' virtual durations), service starts (identity changes in measuring order), and the best point within the
limits against the exhaustive optimum. By hand: `.venv/bin/python bench/bench_search.py`.
"""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from caseledger.campaign.model import Budget, HalvingSearch, TpeSearch
from caseledger.campaign.search import REQUESTS, STRATEGIES, Observed, Price, Space, choose, halving, tpe
from tests.test_search import ENGINE, engine_measure, measure_engine_space, simulate_engine

FULL = 48
# what auto weighs: a start and a request as a llama-server on a CPU host measured them (start to the first formal
# request 6 s; a run of 16 requests 28 s)
PRICE = Price(start_s=6.0, request_s=28.0 / 16, said="measured on llama-server")


def run(table: dict[tuple[Any, ...], Any], propose: Any, budget: int = 10**6) -> tuple[int, float, int, float]:
    """(points, formal-window s, service starts, best objective within the limits at the base's N)."""
    observed: list[Observed] = []
    window = 0.0
    screens: dict[tuple[Any, ...], Any] = {}
    while len(observed) < budget:
        p = propose(observed)
        if p is None:
            break
        n = int(p.values.get(REQUESTS, FULL))
        point = tuple(p.values[a.path] for a in ENGINE)
        r = table[point] if n == FULL else screens.setdefault((*point, n), simulate_engine(*point, n))
        window += r.duration_s
        ob = engine_measure({point: r}, {a.path: p.values[a.path] for a in ENGINE})
        observed.append(Observed(**{**ob.__dict__, "values": p.values}))
    order = [o.service_key for o in observed]
    starts = 1 + sum(1 for a, b in itertools.pairwise(order) if a != b)
    best = max((o.value or 0.0 for o in observed if o.meets and REQUESTS not in o.values), default=0.0)
    return len(observed), window, starts, best


def main() -> None:
    t0 = time.perf_counter()
    table = measure_engine_space(FULL)
    took = time.perf_counter() - t0
    ok = [r.output_throughput for r in table.values() if r.tpot_p99_ms <= 8.0 and r.ttft_p99_ms <= 150.0]
    optimum = max(ok)
    grid_window = sum(r.duration_s for r in table.values())
    print(f"exhaustive: {len(table)} points simulated in {took:.1f} s of CPU; optimum {optimum:.1f} tok/s")
    budget = int(0.15 * len(table))
    rows: list[tuple[str, Any, int]] = []  # (name, propose, most points)
    for seed in range(5):
        plain = TpeSearch(kind="tpe", max_points=budget, seed=seed)
        rows.append((f"tpe, seed {seed}", lambda obs, s=plain: tpe(ENGINE, s, True, obs, _live(obs)), budget))
    for seed in range(5):
        knee = TpeSearch(kind="tpe", max_points=budget, seed=seed, axis="load.concurrency", monotone=True)
        rows.append(
            (f"tpe + knee on C, seed {seed}", lambda obs, s=knee: tpe(ENGINE, s, True, obs, _live(obs)), budget)
        )
    for seed in range(5):  # auto with a budget of 15% of the space: it keeps a share for settle runs
        chosen, why = choose(Space(ENGINE, [], limits=True, requests=FULL), Budget(measurements=budget), PRICE, seed)
        if seed == 0:
            print(why)
        propose = STRATEGIES[chosen.kind]
        rows.append(
            (
                f"auto, seed {seed}",
                lambda obs, s=chosen, f=propose: f(ENGINE, s, True, obs, _live(obs), full_requests=FULL),
                chosen.cap or budget,
            )
        )
    for screen, eta in ((6, 3), (4, 3), (6, 2)):
        h = HalvingSearch(kind="halving", screen_requests=screen, eta=eta)
        rows.append(
            (
                f"halving from N={screen}, eta {eta}",
                lambda obs, s=h: halving(ENGINE, s, True, obs, _live(obs), full_requests=FULL),
                10**6,
            )
        )
    print("| strategy | points | formal windows (s) | vs grid | service starts | best / optimum |")
    print("|---|---|---|---|---|---|")
    print(f"| grid | {len(table)} | {grid_window:.0f} | 1.00 | 40 | 1.000 |")
    only = sys.argv[1] if len(sys.argv) > 1 else ""  # a prefix: only those strategies ('auto')
    for name, propose, cap in rows:
        if name.startswith(only):
            points, window, starts, best = run(table, propose, cap)
            print(
                f"| {name} | {points} | {window:.0f} | {window / grid_window:.2f} | {starts} | {best / optimum:.3f} |"
            )


def _live(observed: list[Observed]) -> str | None:
    return observed[-1].service_key if observed else None


if __name__ == "__main__":
    main()
