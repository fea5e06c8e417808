"""The measuring side computes Lab 1's rules through Lab 1's code, and names its ideas once."""

import numpy as np

from specdec.grading import lab3
from specdec.serving.measure import compare, records
from specdec.sim import stats


def test_acceptance_by_position_from_a_histogram_is_lab_1s_on_the_unrolled_log():
    rng = np.random.default_rng(0)
    for _ in range(20):
        k = int(rng.integers(1, 7))
        log = rng.integers(0, k + 1, int(rng.integers(1, 300)))
        hist = np.bincount(log, minlength=k + 1).tolist()
        assert records.acceptance_by_position(hist) == stats.acceptance_by_position(log, k).tolist()
        assert records.tau_from_histogram(hist) == stats.tau_of(log, k)


def test_the_crossover_is_one_rule_for_the_report_and_both_exercises():
    levels, plain, spec = [1, 2, 4, 8], [100, 180, 300, 400], [180, 250, 310, 380]
    assert lab3.reference_first_level_not_paying(levels, plain, spec) == 8
    crossed = compare.crossover([(c, s / p) for c, p, s in zip(levels, plain, spec)])
    assert crossed["status"] == "crosses" and crossed["concurrency"] == 8
    assert compare.first_level_not_paying(levels, [s / p for p, s in zip(plain, spec)]) == 8
    speedups, level = compare.predicted_crossover(levels, 2.0, 3, [0.01] * 4, [0.012, 0.015, 0.02, 0.03],
                                                         [0.001] * 4)
    assert level == compare.first_level_not_paying(levels, speedups) == 4
    for q in (lab3.Q5, lab3.Q8):  # the grader's references are the library's rule
        assert any("compare:first_level_not_paying" in r or "compare:predicted_crossover" in r for r in q.references())
    assert not hasattr(lab3, "reference_crossover") and not hasattr(records, "pooled_accept_length")
