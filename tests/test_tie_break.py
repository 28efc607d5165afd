"""A tie on the primary metric names the better of the tied points on decision.tie_break (TTFT p99 by default),
with its gap and noise, or says the tie-break is within noise too."""

from __future__ import annotations

from caseledger.campaign.view import tie_break
from caseledger.case.decision import Decision


def test_a_tie_names_the_point_with_half_the_ttft_p99_and_its_gap() -> None:
    said = tie_break("ttft_p99_ms", [("C=4", [3700.0, 3650.0]), ("C=2", [1800.0, 1850.0])])
    assert said.startswith("; tie-break on ttft_p99_ms: C=2 better, 1825 vs 3675 ms for C=4 (-50%"), said
    assert "run-to-run ±1%" in said


def test_a_tie_break_within_its_own_noise_stays_a_tie_and_nothing_is_said_without_figures() -> None:
    said = tie_break("ttft_p99_ms", [("A", [100.0, 130.0]), ("B", [110.0, 112.0])])
    assert "within noise" in said and "still a tie" in said and "better" not in said, said
    assert tie_break("ttft_p99_ms", [("A", []), ("B", [1.0])]) == ""
    close = tie_break("ttft_p99_ms", [("A", [2019.0]), ("B", [2043.0])])  # one run each, 1% apart: no call
    assert "still a tie" in close and "better" not in close, close
    assert tie_break("ttft_p99_ms", []) == ""


def test_the_default_tie_break_is_ttft_p99_and_it_is_not_written_into_frozen_cases() -> None:
    assert Decision().tie_break == "ttft_p99_ms"
    assert "tie_break" not in Decision().model_dump(mode="json")  # frozen cases' canonical JSON stays as it was
    assert Decision(tie_break="e2e_p99_ms").model_dump(mode="json")["tie_break"] == "e2e_p99_ms"
