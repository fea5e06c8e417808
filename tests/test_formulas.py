"""The i.i.d. speedup model: independent values, exact limits, the optimum by brute force."""

import math

import numpy as np
import pytest

from specdec.sim import formulas


def brute_tau(alpha: float, k: int) -> float:
    """Sum over accept lengths: P(n accepted) * (n + 1), straight from the definition."""
    probs = [alpha**n * (1 - alpha) for n in range(k)] + [alpha**k]
    return sum(p * (n + 1) for n, p in enumerate(probs))


def test_known_value():
    # (1 - 0.2^4) / (1 - 0.2) = 0.9984 / 0.8
    assert formulas.walltime_improvement(0.2, 3, 0.0) == pytest.approx(1.248, abs=1e-12)
    assert formulas.expected_tokens_per_step(0.2, 3) == pytest.approx(1.248, abs=1e-12)
    assert formulas.walltime_improvement(0.8, 4, 0.05) == pytest.approx(3.3616 / 1.2, rel=1e-12)


@pytest.mark.parametrize("k", [1, 2, 5, 16])
def test_limits_are_exact(k):
    assert formulas.expected_tokens_per_step(1.0, k) == k + 1
    assert formulas.expected_tokens_per_step(0.0, k) == 1.0
    assert formulas.walltime_improvement(1.0, k, 0.5) == (k + 1) / (k * 0.5 + 1)
    assert formulas.walltime_improvement(0.0, k, 0.0) == 1.0
    # continuous at both ends, and no cancellation just below 1
    assert formulas.expected_tokens_per_step(1 - 1e-13, k) == pytest.approx(k + 1, rel=1e-11)
    assert formulas.expected_tokens_per_step(1e-12, k) == pytest.approx(1.0, abs=1e-11)


def test_matches_definition():
    for alpha in np.linspace(0, 1, 21):
        for k in range(1, 12):
            assert formulas.expected_tokens_per_step(alpha, k) == pytest.approx(brute_tau(alpha, k), rel=1e-12)


def test_arrays_broadcast():
    alphas = np.array([0.0, 0.5, 1.0])
    ks = np.array([[1], [3]])
    out = formulas.expected_tokens_per_step(alphas, ks)
    assert out.shape == (2, 3)
    assert out[1].tolist() == pytest.approx([1.0, 1.875, 4.0])
    assert isinstance(formulas.expected_tokens_per_step(0.5, 3), float)


def test_acceptance_alpha():
    p = np.array([0.5, 0.3, 0.2, 0.0])
    q = np.array([0.1, 0.3, 0.3, 0.3])
    assert formulas.acceptance_alpha(p, q) == pytest.approx(0.1 + 0.3 + 0.2)
    assert formulas.acceptance_alpha(p, q) == pytest.approx(1 - 0.5 * np.abs(p - q).sum())  # 1 - TV
    assert formulas.acceptance_alpha(p, p) == pytest.approx(1.0)
    assert formulas.acceptance_alpha([1.0, 0.0], [0.0, 1.0]) == 0.0
    rows = formulas.acceptance_alpha(np.stack([p, q]), np.stack([q, q]))
    assert rows.tolist() == pytest.approx([0.6, 1.0])


def test_optimal_k_against_brute_force():
    rng = np.random.default_rng(0)
    for alpha, c in zip(rng.uniform(0, 1, 200), rng.uniform(0, 0.5, 200)):
        k_max = int(rng.integers(1, 40))
        values = [(alpha ** (k + 1) - 1) / ((alpha - 1) * (k * c + 1)) for k in range(1, k_max + 1)]
        best = max(values)
        first_best = 1 + next(i for i, v in enumerate(values) if v >= best * (1 - 1e-12))
        k, imp = formulas.optimal_k(alpha, c, k_max)
        assert k == first_best
        assert imp == pytest.approx(best, rel=1e-12)


def test_optimal_k_ties_and_ends():
    assert formulas.optimal_k(0.0, 0.0) == (1, 1.0)  # every k gives 1: the smallest wins
    assert formulas.optimal_k(1.0, 0.0, k_max=7) == (7, 8.0)  # a free, perfect draft: as many as allowed
    assert formulas.optimal_k(0.5, 10.0)[0] == 1
    ks, imps = formulas.optimal_k(np.array([0.6, 0.8, 0.9]), 0.05)
    assert ks.tolist() == [4, 8, 13]
    assert imps[1] == pytest.approx(formulas.walltime_improvement(0.8, 8, 0.05))


def test_speedup_from_costs_reduces_to_walltime_improvement():
    for alpha, k, c in [(0.2, 3, 0.0), (0.8, 4, 0.05), (0.95, 10, 0.2), (1.0, 2, 0.1)]:
        tau = formulas.expected_tokens_per_step(alpha, k)
        t_plain = 0.013  # seconds per target step: the unit cancels
        got = formulas.speedup_from_costs(tau, t_plain, c * t_plain, t_plain, k)
        assert got == pytest.approx(formulas.walltime_improvement(alpha, k, c), rel=1e-12)
    # a verify of k+1 positions that costs 1.5 plain steps lowers the speedup accordingly
    assert formulas.speedup_from_costs(3.0, 1.0, 0.1, 1.5, 4) == pytest.approx(3.0 / 1.9)


@pytest.mark.parametrize(
    "call",
    [
        lambda: formulas.expected_tokens_per_step(1.1, 3),
        lambda: formulas.expected_tokens_per_step(-0.1, 3),
        lambda: formulas.expected_tokens_per_step(math.nan, 3),
        lambda: formulas.expected_tokens_per_step(0.5, 0),
        lambda: formulas.expected_tokens_per_step(0.5, 2.5),
        lambda: formulas.walltime_improvement(0.5, 3, -0.1),
        lambda: formulas.optimal_k(0.5, 0.1, k_max=0),
        lambda: formulas.optimal_k(np.array([0.5, 2.0]), 0.1),
        lambda: formulas.acceptance_alpha([0.5, 0.5], [0.5, 0.5, 0.0]),
        lambda: formulas.acceptance_alpha([0.5, 0.6], [0.5, 0.5]),
        lambda: formulas.speedup_from_costs(0.5, 1.0, 0.1, 1.0, 4),  # tau counts the bonus: >= 1
        lambda: formulas.speedup_from_costs(6.0, 1.0, 0.1, 1.0, 4),  # at most k + 1
    ],
)
def test_bad_arguments_raise(call):
    with pytest.raises(ValueError):
        call()


def test_tau_from_positions_is_the_iid_formula_at_constant_alphas():
    for alpha in np.linspace(0, 1, 21):
        for k in range(1, 12):
            assert formulas.tau_from_positions([alpha] * k) == pytest.approx(
                formulas.expected_tokens_per_step(alpha, k), rel=1e-12, abs=1e-12)


def test_tau_from_positions_by_its_definition():
    """Sum over accept lengths n: P(exactly n accepted) * (n + 1), from per-position conditional acceptances."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        a = rng.uniform(0, 1, int(rng.integers(1, 9)))
        reach = np.r_[1.0, np.cumprod(a)]  # P(at least n accepted), n = 0..k
        exactly = reach - np.r_[reach[1:], 0.0]
        assert formulas.tau_from_positions(a) == pytest.approx((exactly * np.arange(1, len(a) + 2)).sum(), rel=1e-12)
    assert formulas.tau_from_positions([0.9, 0.0, 1.0]) == pytest.approx(1.9)
    assert formulas.tau_from_positions([0.9, 0.5]) > formulas.tau_from_positions([0.5, 0.9])
    for bad in ([], [1.2], [[0.5]], [math.nan]):
        with pytest.raises(ValueError):
            formulas.tau_from_positions(bad)


def test_temperature_probs_and_alpha_at_temperature():
    rng = np.random.default_rng(1)
    z = rng.normal(0, 3, 12)
    assert formulas.temperature_probs(z, 1.0) == pytest.approx(np.exp(z) / np.exp(z).sum(), rel=1e-12)
    sharp = formulas.temperature_probs(z * 1000, 0.01)  # logits / T = 1e5 * z: no overflow
    assert np.isfinite(sharp).all() and sharp[z.argmax()] == pytest.approx(1.0)
    assert formulas.temperature_probs(z, 1e6) == pytest.approx(np.full(12, 1 / 12), rel=1e-4)
    with pytest.raises(ValueError):
        formulas.temperature_probs(z, -1.0)
    d = z + rng.normal(0, 1, 12)
    assert formulas.alpha_at_temperature(z, d, 0.0) == float(z.argmax() == d.argmax())
    d_agree = d.copy()
    d_agree[z.argmax()] = d.max() + 1
    assert formulas.alpha_at_temperature(z, d_agree, 0) == 1.0
    d_other = d.copy()
    d_other[(z.argmax() + 1) % 12] = d.max() + 1
    assert formulas.alpha_at_temperature(z, d_other, 0) == 0.0
    # sampled: sum of min of the two softmaxes; near the greedy answer at a small T, near 1 at a large one
    p, q = formulas.temperature_probs(z, 0.7), formulas.temperature_probs(d, 0.7)
    assert formulas.alpha_at_temperature(z, d, 0.7) == pytest.approx(np.minimum(p, q).sum(), rel=1e-12)
    assert formulas.alpha_at_temperature(z, d_other, 1e-3) == pytest.approx(0.0, abs=1e-6)
    assert formulas.alpha_at_temperature(z, d_other, 1e4) == pytest.approx(1.0, abs=1e-3)
