"""Tree speculation, simulated: the expected accept length of a draft tree against Monte Carlo of greedy
verification, and several candidates per position verified losslessly (chi-square at SIGNIFICANCE with fixed
seeds, and the same test rejecting planted bugs: the target not updated between siblings, or not renormalised)."""

import numpy as np
import pytest

from specdec.sim import formulas, verify
from specdec.sim.stats import chi_square_test
from specdec.sim.tree import DraftTree, tree_pays, tree_speedup

SIGNIFICANCE = 1e-3
RANKS = [0.6, 0.15, 0.08, 0.05]  # P(the draft's rank-r candidate is the target's argmax)
TREES = {
    "chain": DraftTree.chain([0.9, 0.7, 0.5, 0.3]),
    "full 2x2x1": DraftTree.full([2, 2, 1], RANKS),
    "best 8": DraftTree.best(8, RANKS),
    "lopsided": DraftTree((-1, -1, -1, 0, 0, 3, 1, 5), (0.5, 0.3, 0.2, 0.7, 0.3, 1.0, 0.4, 0.25)),
}


@pytest.mark.parametrize("name", TREES)
def test_formula_matches_monte_carlo(name):
    tree = TREES[name]
    accepted, last = tree.simulate(100_000, np.random.default_rng(0))
    se = accepted.std() / np.sqrt(accepted.size)
    assert abs(accepted.mean() - tree.expected_accepted()) < 4 * se, (accepted.mean(), tree.expected_accepted())
    assert accepted.max() <= tree.depth
    assert np.array_equal(accepted, [len(tree.path_to(n)) for n in last])


def test_monte_carlo_rejects_siblings_counted_as_independent():
    """The test can fail: the accepts summed with no product over the path, far outside the interval."""
    tree = TREES["lopsided"]
    accepted, _ = tree.simulate(100_000, np.random.default_rng(1))
    se = accepted.std() / np.sqrt(accepted.size)
    assert abs(accepted.mean() - sum(tree.accept)) > 20 * se


def test_a_chain_is_tau_from_positions():
    alphas = [0.9, 0.7, 0.5, 0.3]
    assert DraftTree.chain(alphas).tau() == pytest.approx(formulas.tau_from_positions(alphas))
    assert DraftTree.chain([0.8] * 5).tau() == pytest.approx(formulas.expected_tokens_per_step(0.8, 5))


def test_by_hand():
    # root -> a (0.6) -> c (0.5);  root -> b (0.3): E = 0.6 + 0.3 + 0.6 * 0.5
    tree = DraftTree((-1, -1, 0), (0.6, 0.3, 0.5))
    assert tree.expected_accepted() == pytest.approx(1.2)
    assert tree.depth == 2 and tree.size == 3 and list(tree.depths()) == [1, 1, 2]


def test_full_and_best_trees():
    full = DraftTree.full([3, 2], RANKS)
    assert full.size == 3 + 6 and full.depth == 2
    assert full.expected_accepted() == pytest.approx(sum(RANKS[:3]) * (1 + sum(RANKS[:2])))
    for n in (1, 4, 9, 20):
        best = DraftTree.best(n, RANKS)
        assert best.size == n
        reach = best.reach()
        # ancestors first, and no other tree of n nodes does better: the n largest path products
        assert all(p < i and reach[p] >= reach[i] for i, p in enumerate(best.parents) if p >= 0)
        assert best.expected_accepted() >= DraftTree.chain([RANKS[0]] * n).expected_accepted() - 1e-12
    assert DraftTree.best(9, RANKS).expected_accepted() >= full.expected_accepted() - 1e-12
    assert DraftTree.best(6, RANKS, max_depth=2).depth == 2


@pytest.mark.parametrize("parents, accept", [((0,), (0.5,)), ((-1, 2, 0), (0.5, 0.5, 0.5)),
                                             ((-1, -1), (0.7, 0.4)), ((-1,), (1.5,)), ((-1, -1), (0.5,))])
def test_bad_trees_are_refused(parents, accept):
    with pytest.raises(ValueError):
        DraftTree(parents, accept)


def test_speedup_reuses_the_chain_model():
    chain = DraftTree.chain([0.8] * 4)
    assert tree_speedup(chain, 0.05, 0.0) == pytest.approx(formulas.walltime_improvement(0.8, 4, 0.05))
    assert tree_speedup(chain, 0.05, 0.1) < tree_speedup(chain, 0.05, 0.0)


def test_when_a_tree_pays():
    tree = DraftTree.best(16, RANKS)
    pays, mine, chain, k = tree_pays(tree, RANKS[0], c=0.05, v=0.0)  # free verify positions: width helps
    assert pays and mine > chain and 1 <= k <= 16
    pays, mine, chain, k = tree_pays(tree, RANKS[0], c=0.05, v=0.1)  # every position costs: a short chain wins
    assert not pays and mine < chain


# --- several candidates per position: lossless ---------------------------------------------------


def random_pair(rng, v, alpha_range=(0.2, 0.7)):
    while True:
        p, q = rng.dirichlet(np.ones(v), size=2)
        if alpha_range[0] <= np.minimum(p, q).sum() <= alpha_range[1]:
            return p, q


def test_one_candidate_is_the_chain_rule():
    rng = np.random.default_rng(5)
    for _ in range(50):
        p, q = random_pair(rng, 5)
        x, u = int(rng.choice(5, p=q)), float(rng.random())
        index, r = verify.multi_draft_verify(p, q, [x], [u])
        assert (index == 0) == verify.accept_reject_step(x, p, q, u)
        if index < 0:
            assert np.allclose(r, verify.residual_distribution(p, q))


def test_the_target_is_updated_between_siblings():
    p, q = np.array([0.5, 0.5, 0.0]), np.array([0.2, 0.2, 0.6])
    # candidate 0 (token 2) is rejected: r = max(0, p - q) / 0.6 = [0.5, 0.5, 0]; token 0 then has r/q = 2.5
    index, r = verify.multi_draft_verify(p, q, [2, 0], [0.5, 0.99])
    assert index == 1 and np.allclose(r, [0.5, 0.5, 0.0])
    index, r = verify.multi_draft_verify(p, q, [2, 2, 2], [0.1, 0.1, 0.1])
    assert index == -1 and np.allclose(r, [0.5, 0.5, 0.0])


@pytest.mark.parametrize("v,m,seed", [(2, 2, 30), (5, 3, 31), (8, 4, 32), (20, 2, 33)])
def test_several_candidates_keep_the_target(v, m, seed):
    rng = np.random.default_rng(seed)
    p, q = random_pair(rng, v)
    tokens, index = verify.multi_draft_sample(p, q, 40_000, m, rng)
    assert chi_square_test(tokens, p).pvalue >= SIGNIFICANCE
    ranks = verify.multi_draft_rank_accept(p, q, m)  # which candidate is accepted, -1 for none
    assert chi_square_test(index + 1, np.r_[1 - ranks.sum(), ranks]).pvalue >= SIGNIFICANCE
    assert ranks.sum() > formulas.acceptance_alpha(p, q)  # more candidates, more acceptance


BUGS = {
    "target not updated between siblings": lambda r, q: r,
    "residual not renormalised": lambda r, q: np.maximum(r - q, 0.0),
}


@pytest.mark.parametrize("bug", BUGS)
@pytest.mark.parametrize("v,m,seed", [(5, 3, 31), (8, 4, 32)])
def test_planted_bug_is_rejected(bug, v, m, seed):
    rng = np.random.default_rng(seed)
    p, q = random_pair(rng, v)
    tokens, _ = verify.multi_draft_sample(p, q, 40_000, m, rng, on_reject=BUGS[bug])
    assert chi_square_test(tokens, p).pvalue < SIGNIFICANCE


def test_candidates_the_draft_cannot_propose_are_refused():
    with pytest.raises(ValueError, match="q = 0"):
        verify.multi_draft_verify([0.5, 0.5], [1.0, 0.0], [1], [0.5])
