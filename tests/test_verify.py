"""Verification rules. Speculative sampling must keep the target distribution: chi-square tests
at significance level SIGNIFICANCE with fixed seeds (deterministic), and the same tests must reject
a planted bug (after a rejection, sampling from q instead of the residual)."""

import numpy as np
import pytest

from specdec.sim import montecarlo, verify
from specdec.sim.stats import chi_square_test

SIGNIFICANCE = 1e-3  # reject "samples follow p" when the p-value is below this


def random_rows(rng, v, k, alpha_range=(0.3, 0.8)):
    """k+1 target rows and k draft rows, each (p, q) pair overlapping by alpha in alpha_range."""
    p_rows, q_rows = [], []
    while len(p_rows) < k + 1:
        p, q = rng.dirichlet(np.ones(v), size=2)
        if alpha_range[0] <= np.minimum(p, q).sum() <= alpha_range[1]:
            p_rows.append(p)
            q_rows.append(q)
    return np.array(p_rows), np.array(q_rows[:k])


def run_batch(p_rows, q_rows, n, rng):
    k, v = q_rows.shape
    drafts = verify.sample_categorical(np.broadcast_to(q_rows, (n, k, v)), rng)
    return verify.speculative_sample_batch(
        np.broadcast_to(p_rows, (n, k + 1, v)), np.broadcast_to(q_rows, (n, k, v)), drafts, rng
    )


def position_pvalues(p_rows, emitted):
    """Emitted token j, where there is one, must follow p_rows[j]: the rows do not depend on context,
    and draft j is drawn independently of whether drafts 0..j-1 were accepted."""
    return [chi_square_test(emitted[:, j][emitted[:, j] >= 0], p_rows[j]).pvalue for j in range(len(p_rows))]


# --- greedy, residual, one accept/reject step ----------------------------------------------------


def test_greedy_verify():
    assert verify.greedy_verify([1, 2, 3], [1, 2, 4, 9]) == 2
    assert verify.greedy_verify([5, 2, 3], [6, 2, 3, 0]) == 0  # a later match does not count
    assert verify.greedy_verify([7, 7], [7, 7, 1]) == 2
    assert verify.greedy_verify(np.array([4]), np.array([4])) == 1  # k rows without the bonus is fine
    with pytest.raises(ValueError):
        verify.greedy_verify([1, 2, 3], [1, 2])


def test_residual_distribution():
    p = np.array([0.5, 0.3, 0.2, 0.0])
    q = np.array([0.1, 0.3, 0.3, 0.3])
    np.testing.assert_allclose(verify.residual_distribution(p, q), [1.0, 0.0, 0.0, 0.0])
    p = np.array([0.4, 0.4, 0.2])
    q = np.array([0.2, 0.3, 0.5])
    np.testing.assert_allclose(verify.residual_distribution(p, q), [2 / 3, 1 / 3, 0.0])
    # p == q: nothing is ever rejected; we return p rather than 0/0
    np.testing.assert_array_equal(verify.residual_distribution(p, p), p)
    rows = verify.residual_distribution(np.stack([p, p]), np.stack([q, p]))
    np.testing.assert_allclose(rows, [[2 / 3, 1 / 3, 0.0], p])


def test_accept_reject_step():
    p = np.array([0.5, 0.2, 0.3, 0.0])
    q = np.array([0.25, 0.4, 0.05, 0.3])
    assert verify.accept_reject_step(0, p, q, 0.999999)  # p(x) >= q(x): always accepted
    assert verify.accept_reject_step(1, p, q, 0.49)  # ratio 0.5
    assert not verify.accept_reject_step(1, p, q, 0.51)
    assert not verify.accept_reject_step(3, p, q, 0.0)  # p(x) = 0: never
    with pytest.raises(ValueError):
        verify.accept_reject_step(3, q, p, 0.5)  # q(x) = 0: x cannot have been drafted


def test_acceptance_probability_is_alpha():
    rng = np.random.default_rng(1)
    p_rows, q_rows = random_rows(rng, 6, 1)
    n = 40_000
    lengths, _ = run_batch(p_rows, q_rows, n, rng)
    alpha = np.minimum(p_rows[0], q_rows[0]).sum()
    se = np.sqrt(alpha * (1 - alpha) / n)
    assert abs(lengths.mean() - alpha) < 4 * se


def test_batch_output_shape_and_padding():
    rng = np.random.default_rng(2)
    p_rows, q_rows = random_rows(rng, 5, 3)
    n = 1000
    drafts = verify.sample_categorical(np.broadcast_to(q_rows, (n, 3, 5)), rng)
    lengths, emitted = verify.speculative_sample_batch(
        np.broadcast_to(p_rows, (n, 4, 5)), np.broadcast_to(q_rows, (n, 3, 5)), drafts, rng
    )
    assert emitted.shape == (n, 4)
    assert np.all((emitted >= 0).sum(1) == lengths + 1)
    for row, a, d in zip(emitted, lengths, drafts):
        assert np.array_equal(row[:a], d[:a]) and np.all(row[a + 1 :] == -1)


def test_single_step_shapes():
    rng = np.random.default_rng(3)
    p_rows, q_rows = random_rows(rng, 5, 3)
    a, tokens = verify.speculative_sample(p_rows, q_rows, [0, 1, 2], rng)
    assert 0 <= a <= 3 and len(tokens) == a + 1
    with pytest.raises(ValueError):
        verify.speculative_sample(p_rows[:3], q_rows, [0, 1, 2], rng)


# --- chi-square: speculative sampling keeps the target distribution ------------------------------


@pytest.mark.parametrize("v,k,seed", [(2, 1, 10), (5, 3, 11), (10, 2, 12), (50, 4, 13)])
def test_every_emitted_position_follows_target(v, k, seed):
    rng = np.random.default_rng(seed)
    p_rows, q_rows = random_rows(rng, v, k)
    _, emitted = run_batch(p_rows, q_rows, 60_000, rng)
    assert min(position_pvalues(p_rows, emitted)) >= SIGNIFICANCE


@pytest.mark.parametrize("v,k,seed", [(2, 1, 10), (5, 3, 11), (10, 2, 12), (50, 4, 13)])
def test_planted_bug_is_rejected(monkeypatch, v, k, seed):
    monkeypatch.setattr(verify, "residual_distribution", lambda p, q: q)  # the bug: resample the draft
    rng = np.random.default_rng(seed)
    p_rows, q_rows = random_rows(rng, v, k)
    _, emitted = run_batch(p_rows, q_rows, 60_000, rng)
    assert position_pvalues(p_rows, emitted)[0] < SIGNIFICANCE


def single_sequence_first_tokens(p_rows, q_rows, n, rng):
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        drafts = [verify.sample_categorical(q, rng) for q in q_rows]
        _, tokens = verify.speculative_sample(p_rows, q_rows, drafts, rng)
        out[i] = tokens[0]
    return out


def test_single_sequence_version_follows_target_and_bug_is_rejected(monkeypatch):
    rng = np.random.default_rng(20)
    p_rows, q_rows = random_rows(rng, 5, 2)
    first = single_sequence_first_tokens(p_rows, q_rows, 5000, np.random.default_rng(21))
    assert chi_square_test(first, p_rows[0]).pvalue >= SIGNIFICANCE
    monkeypatch.setattr(verify, "residual_distribution", lambda p, q: q)
    first = single_sequence_first_tokens(p_rows, q_rows, 5000, np.random.default_rng(21))
    assert chi_square_test(first, p_rows[0]).pvalue < SIGNIFICANCE


def block_pvalue(lang, k, length, sequences, seed):
    """The first `length` tokens of the loop, over several verify steps, against the chain's exact law."""
    start = 0
    res = montecarlo.run_markov(lang, k, steps=length, sequences=sequences, seed=seed, start=start, record=True)
    seqs = res.first_tokens(length)
    v = lang.vocab
    codes = (seqs * v ** np.arange(length - 1, -1, -1)).sum(1)  # block -> base-v number
    return chi_square_test(codes, _block_law(lang.target, start, length)).pvalue


def _block_law(target, start, length):
    v = target.shape[0]
    law = target[start]  # over x1
    for _ in range(length - 1):
        last = np.arange(law.size) % v  # the last token of each prefix, prefixes in base-v order
        law = (law[:, None] * target[last]).reshape(-1)
    return law


def test_block_law_helper():
    t = np.array([[0.5, 0.5], [0.1, 0.9]])
    np.testing.assert_allclose(_block_law(t, 1, 2), [0.1 * 0.5, 0.1 * 0.5, 0.9 * 0.1, 0.9 * 0.9])


@pytest.mark.parametrize("k", [1, 2, 3])
def test_full_block_follows_target_chain(k):
    lang = montecarlo.ToyLanguage.make(vocab=4, sharpness=1.5, stickiness=0.6, seed=5)
    assert block_pvalue(lang, k, length=3, sequences=40_000, seed=k) >= SIGNIFICANCE


def test_full_block_rejects_planted_bug(monkeypatch):
    monkeypatch.setattr(verify, "residual_distribution", lambda p, q: q)
    lang = montecarlo.ToyLanguage.make(vocab=4, sharpness=1.5, stickiness=0.6, seed=5)
    assert block_pvalue(lang, 2, length=3, sequences=40_000, seed=2) < SIGNIFICANCE


def test_chi_square_test_itself():
    rng = np.random.default_rng(0)
    probs = np.array([0.5, 0.3, 0.2, 0.0])
    assert chi_square_test(rng.choice(4, 5000, p=probs), probs).pvalue > SIGNIFICANCE
    assert chi_square_test(rng.choice(4, 5000, p=[0.4, 0.4, 0.2, 0.0]), probs).pvalue < SIGNIFICANCE
    assert chi_square_test(np.array([3, 0, 1]), probs).pvalue == 0.0  # an impossible token


# --- SGLang's thresholds ---------------------------------------------------------------------------


def sglang_chain_verify(p, x, coin, coin2, threshold_single, threshold_acc):
    """The kernel's rule for one draft x (a chain): accept, else sample relu(p - p(x) e_x) by inverse CDF."""
    if coin <= p[x] / threshold_acc or p[x] >= threshold_single:
        return x
    r = p.copy()
    r[x] = 0.0
    return int(np.searchsorted(np.cumsum(r), coin2 * r.sum(), side="right"))


def test_threshold_verify_at_the_defaults_keeps_p_with_lower_acceptance():
    rng = np.random.default_rng(0)
    for _ in range(20):
        p, q = rng.dirichlet(np.ones(6), size=2)
        accept, emitted = verify.threshold_verify(p, q)
        assert emitted == pytest.approx(p, abs=1e-12)
        assert accept == pytest.approx((p * q).sum()) and accept <= np.minimum(p, q).sum() + 1e-12


@pytest.mark.parametrize("single, acc", [(1.0, 1.0), (1.0, 0.5), (0.3, 1.0), (0.2, 0.4)])
def test_threshold_verify_matches_the_kernels_rule_by_sampling(single, acc):
    rng = np.random.default_rng(1)
    p, q = np.array([0.45, 0.3, 0.15, 0.1]), np.array([0.1, 0.2, 0.3, 0.4])
    accept, emitted = verify.threshold_verify(p, q, single, acc)
    n = 20_000
    drafts = rng.choice(4, size=n, p=q)
    coins, coins2 = rng.random(n), rng.random(n)
    out = np.array([sglang_chain_verify(p, x, c, c2, single, acc) for x, c, c2 in zip(drafts, coins, coins2)])
    assert chi_square_test(out, emitted).pvalue > SIGNIFICANCE
    if (single, acc) != (1.0, 1.0):  # lossy: the output no longer follows p, and a test sees it
        assert 0.5 * np.abs(emitted - p).sum() > 0.01 and chi_square_test(out, p).pvalue < SIGNIFICANCE
        assert accept > (p * q).sum()
    with pytest.raises(ValueError):
        verify.threshold_verify(p, q, 0.0, 1.0)
