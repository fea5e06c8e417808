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


def test_the_crossover_and_the_exercises_first_level_are_two_names():
    levels, plain, spec = [1, 2, 4, 8], [100, 180, 300, 400], [180, 250, 310, 380]
    assert lab3.reference_first_level_not_paying(levels, plain, spec) == 8
    crossed = compare.crossover([(c, s / p) for c, p, s in zip(levels, plain, spec)])
    assert crossed["status"] == "crosses" and 4 < crossed["concurrency"] < 8
    assert not hasattr(lab3, "reference_crossover") and not hasattr(records, "pooled_accept_length")
