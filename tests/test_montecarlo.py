"""Acceptance statistics and the Monte Carlo engines."""

import numpy as np
import pytest

from specdec.sim import formulas, montecarlo
from specdec.sim.stats import (
    AcceptanceStats,
    accepted_histogram,
    acceptance_by_position,
    acceptance_rate,
    tau_of,
)

# --- acceptance statistics -----------------------------------------------------------------------


def test_stats_by_hand():
    s = AcceptanceStats.from_accepted([0, 3, 1, 2], k=3)
    assert s.tau == 2.5  # 6 accepted over 4 steps, + 1
    assert s.acceptance_rate == 0.5  # 6 of 12 proposed
    assert s.by_position.tolist() == [0.75, 0.5, 0.25]
    assert s.histogram.tolist() == [1, 1, 1, 1]
    assert s.tokens == 10 and s.steps == 4 and s.accepted == 6
    d = s.as_dict()
    assert d["tau"] == 2.5 and d["histogram"] == [1, 1, 1, 1] and d["by_position"] == [0.75, 0.5, 0.25]
    assert tau_of([0, 3, 1, 2], 3) == 2.5 and acceptance_rate([0, 3, 1, 2], 3) == 0.5
    assert accepted_histogram([2, 2], 4).tolist() == [0, 0, 2, 0, 0]


def test_stats_identities_on_random_logs():
    rng = np.random.default_rng(0)
    for _ in range(20):
        k = int(rng.integers(1, 9))
        log = rng.integers(0, k + 1, size=int(rng.integers(1, 200)))
        s = AcceptanceStats.from_accepted(log, k)
        assert s.by_position.sum() == pytest.approx(s.tau - 1)  # sum_i P(a >= i) = E[a]
        assert s.acceptance_rate == pytest.approx((s.tau - 1) / k)
        assert s.histogram.sum() == s.steps == len(log)
        assert np.all(np.diff(acceptance_by_position(log, k)) <= 0)  # a later position needs the earlier


@pytest.mark.parametrize("log,k", [([0, 4], 3), ([-1], 3), ([], 3), ([1], 0), ([0.5], 2)])
def test_stats_reject_bad_logs(log, k):
    with pytest.raises(ValueError):
        AcceptanceStats.from_accepted(log, k)


# --- the i.i.d. engine against the formula -------------------------------------------------------


def exact_accepted_law(alpha, k):
    return np.array([alpha**n * (1 - alpha) for n in range(k)] + [alpha**k])


@pytest.mark.parametrize("alpha,k,seed", [(0.3, 1, 0), (0.8, 4, 1), (0.95, 8, 2), (0.6, 16, 3)])
def test_iid_engine_matches_formula(alpha, k, seed):
    steps = 200_000
    res = montecarlo.run_iid(alpha, k, steps, seed=seed)
    law = exact_accepted_law(alpha, k)
    n = np.arange(k + 1)
    # standard error of the mean accepted length, from its exact variance under the model
    se = np.sqrt((law * n**2).sum() - (law * n).sum() ** 2) / np.sqrt(steps)
    assert abs(res.stats.tau - formulas.expected_tokens_per_step(alpha, k)) < 4 * se
    # P(position i accepted) = alpha^i, each within 4 binomial standard errors
    want = alpha ** np.arange(1, k + 1)
    assert np.all(np.abs(res.stats.by_position - want) < 4 * np.sqrt(want * (1 - want) / steps) + 1e-12)
    # accepted / verified estimates alpha itself
    assert res.alpha_verified == pytest.approx(alpha, abs=0.01)


# --- the toy language ----------------------------------------------------------------------------


def test_toy_language_is_well_formed():
    lang = montecarlo.ToyLanguage.make(vocab=16, seed=3)
    np.testing.assert_allclose(lang.target.sum(1), 1)
    np.testing.assert_allclose(lang.draft.sum(1), 1)
    pi = lang.stationary()
    np.testing.assert_allclose(pi @ lang.target, pi, atol=1e-12)
    alpha = lang.alpha_by_context()
    assert alpha[lang.easy].mean() > alpha[~lang.easy].mean() + 0.3  # easy contexts: a good draft
    # sharpness controls the entropy; 0 gives uniform choices within a kind
    flat = montecarlo.ToyLanguage.make(vocab=16, sharpness=0.0, stickiness=0.5)
    assert flat.entropy_by_context() == pytest.approx(np.full(16, 4.0))
    sharp = montecarlo.ToyLanguage.make(vocab=16, sharpness=6.0)
    assert sharp.entropy_by_context().mean() < lang.entropy_by_context().mean() < 4.0


@pytest.mark.parametrize("bad", [dict(vocab=5), dict(vocab=2), dict(stickiness=1.0), dict(easy_quality=1.5),
                                 dict(sharpness=-1.0)])
def test_toy_language_rejects_bad_config(bad):
    with pytest.raises(ValueError):
        montecarlo.ToyLanguageConfig(**bad)


# --- the Markov engine ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sample", "greedy"])
def test_markov_engine_reports_consistently(mode):
    lang = montecarlo.ToyLanguage.make(seed=1)
    k = 4
    res = montecarlo.run_markov(lang, k, steps=100, sequences=50, mode=mode, seed=0, record=True)
    a, s = res.accepted, res.stats
    assert a.shape == (5000,) and a.min() >= 0 and a.max() <= k
    assert s.tau == pytest.approx(a.mean() + 1)
    assert s.tokens == (res.emitted >= 0).sum() == (a + 1).sum()
    assert s.by_position.sum() == pytest.approx(s.tau - 1)
    verified = np.minimum(a + 1, k).sum()
    assert res.alpha_verified * verified == pytest.approx(a.sum())
    per_ctx = lang.alpha_by_context() if mode == "sample" else lang.greedy_agreement()
    assert per_ctx.min() <= res.alpha_text <= per_ctx.max()
    d = res.as_dict()
    assert d["tau"] == s.tau and d["alpha_text"] == res.alpha_text and len(d["histogram"]) == k + 1


def test_first_position_accepts_with_the_contexts_alpha():
    """Each step's first draft is accepted with probability alpha(start context), exactly."""
    lang = montecarlo.ToyLanguage.make(seed=2)
    res = montecarlo.run_markov(lang, 3, steps=200, sequences=200, seed=4)
    first = res.accepted >= 1
    se = np.sqrt((res.step_alpha * (1 - res.step_alpha)).sum()) / len(first)
    assert abs(first.mean() - res.step_alpha.mean()) < 4 * se
    greedy = montecarlo.run_markov(lang, 3, steps=50, sequences=100, mode="greedy", seed=4)
    assert np.array_equal(greedy.accepted >= 1, greedy.step_alpha == 1.0)  # greedy: no chance


def test_stderr_between_sequences_sees_the_runs():
    """Steps of one sequence are correlated when contexts come in runs: the per-step standard error
    understates the spread of tau, the one from the sequences' means does not; independent contexts
    give both about the same."""
    for stickiness, low, high in [(0.5, 0.8, 1.25), (0.97, 2.0, 6.0)]:
        lang = montecarlo.ToyLanguage.make(stickiness=stickiness)
        res = montecarlo.run_markov(lang, 4, steps=300, sequences=100, seed=1)
        per_sequence = res.accepted.reshape(300, 100).mean(0)
        assert res.tau_stderr_sequences == pytest.approx(per_sequence.std(ddof=1) / 10)
        assert low < res.tau_stderr_sequences / res.stats.tau_stderr < high, stickiness
    iid = montecarlo.run_iid(0.7, 4, 1000, seed=5)
    assert iid.tau_stderr_sequences == iid.stats.tau_stderr  # one sequence of independent steps


def test_formula_holds_for_independent_contexts_and_is_optimistic_for_runs():
    """The lecture's claim, with its seeds. stickiness 0.5: the kind of the next context is independent
    of the past, so the i.i.d. formula at the text's alpha fits (within 2%). 0.9 and 0.97: easy and hard
    contexts come in runs, the loop lingers in the hard ones, and the formula is optimistic. 0: the kinds
    alternate, most steps start in an easy context, and the formula is pessimistic."""
    for stickiness, seed, low, high in [(0.5, 1, -0.02, 0.02), (0.9, 0, 0.03, 1.0), (0.97, 1, 0.05, 1.0),
                                        (0.0, 1, -1.0, -0.01)]:
        lang = montecarlo.ToyLanguage.make(stickiness=stickiness)
        res = montecarlo.run_markov(lang, 4, steps=300, sequences=200, seed=seed)
        rel = res.tau_from_alpha_text / res.stats.tau - 1
        assert low < rel < high, (stickiness, rel)


def test_markov_engine_is_deterministic_for_a_seed():
    lang = montecarlo.ToyLanguage.make(seed=7)
    a = montecarlo.run_markov(lang, 3, steps=40, sequences=20, seed=11)
    b = montecarlo.run_markov(lang, 3, steps=40, sequences=20, seed=11)
    c = montecarlo.run_markov(lang, 3, steps=40, sequences=20, seed=12)
    assert np.array_equal(a.accepted, b.accepted) and a.alpha_text == b.alpha_text
    assert not np.array_equal(a.accepted, c.accepted)
    x = montecarlo.run_iid(0.7, 4, 1000, seed=5)
    y = montecarlo.run_iid(0.7, 4, 1000, seed=5)
    assert np.array_equal(x.accepted, y.accepted)


def test_first_tokens_needs_record():
    lang = montecarlo.ToyLanguage.make(seed=0)
    res = montecarlo.run_markov(lang, 2, steps=5, sequences=3)
    with pytest.raises(ValueError):
        res.first_tokens(3)
    res = montecarlo.run_markov(lang, 2, steps=5, sequences=3, record=True)
    assert res.first_tokens(5).shape == (3, 5)  # every step emits at least one token


def test_run_sequence_with_a_policy():
    lang = montecarlo.ToyLanguage.make(seed=0)
    ks, lengths = montecarlo.run_sequence(lang, 300, lambda ks, ls: 1 + len(ks) % 3, seed=1)
    assert ks.tolist()[:4] == [1, 2, 3, 1]
    assert np.all((lengths >= 0) & (lengths <= ks))
    again = montecarlo.run_sequence(lang, 300, lambda ks, ls: 1 + len(ks) % 3, seed=1)
    assert np.array_equal(lengths, again[1])
    with pytest.raises(ValueError):
        montecarlo.run_sequence(lang, 3, lambda ks, ls: 0)


def test_engines_validate_arguments():
    lang = montecarlo.ToyLanguage.make()
    with pytest.raises(ValueError):
        montecarlo.run_markov(lang, 0, steps=10)
    with pytest.raises(ValueError):
        montecarlo.run_markov(lang, 2, steps=10, mode="beam")
    with pytest.raises(ValueError):
        montecarlo.run_iid(1.2, 3, 10)
