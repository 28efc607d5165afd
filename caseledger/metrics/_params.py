"""The processing parameters as applied and their directory key (no numpy: readers of results import this)."""

from __future__ import annotations

from caseledger.case.model import Case
from caseledger.metrics._models import NATIVE_RULES, RATIO_MAX, RATIO_MIN_EXCLUSIVE, NativeRule
from caseledger.metrics._result import Params


def params_key(rule: str, ratio: float | None) -> str:
    """Directory key of the processing parameters: 'aisbench' or 'sglang-r0.9'."""
    return rule if rule != "sglang" else f"sglang-r{ratio:g}"


def resolve_params(case: Case, rule: str | None, ratio: float | None) -> Params:
    """Parameters as applied: CLI/API overrides over the case's measurement.native."""
    chosen = rule or case.measurement.native.rule
    if chosen not in NATIVE_RULES:
        raise ValueError(f"unknown native rule '{chosen}'; known: {', '.join(NATIVE_RULES)}")
    eff_rule: NativeRule = "sglang" if chosen == "sglang" else "aisbench"
    eff_ratio: float | None = None
    if eff_rule == "sglang":
        eff_ratio = float(ratio if ratio is not None else case.measurement.native.ratio)
        if not RATIO_MIN_EXCLUSIVE < eff_ratio <= RATIO_MAX:
            raise ValueError(
                f"native ratio {eff_ratio} is outside ({RATIO_MIN_EXCLUSIVE:g}, {RATIO_MAX:g}]; "
                "e.g. 0.9 = 90% of peak concurrency"
            )
    return Params(native_rule=eff_rule, native_ratio=eff_ratio, spec_decode=case.measurement.spec_decode)
