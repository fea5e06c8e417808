"""At temperature > 0 a draft tree keeps the target's distribution: chi-square over the first four tokens
(token 1 from the prefill, tokens 2-4 from one tree verify: the root's candidates, a depth-2 node's and the
bonus), with the random peaked bundle of tests/test_sampling.py; the same test rejects a planted bug (after a
rejected candidate, the next is judged against the same r, not against r without it). The decoder runs under
the emulated CUDA graphs (the tree drafted and verified in captured steps), one case also eagerly."""

import pytest
import torch
from test_sampling import N_ROWS, PROMPT, T, bundle, exact_joint  # noqa: F401 (bundle: a fixture)

import specdec.decoder.verify as verify_mod
from specdec.decoder.engine import Engine
from specdec.sim.stats import chi_square_test


def tree_chi2(bundle, method, topk, num_draft_tokens, n=4, seed=0, top_p=1.0, top_k=0,  # noqa: F811
              graphs="emulate"):
    joint = exact_joint(bundle.target, n, top_p, top_k)
    index = {s: i for i, s in enumerate(joint)}
    dec = Engine(bundle, method, k=2, topk=topk, num_draft_tokens=num_draft_tokens, max_batch=N_ROWS, max_len=24,
                 cuda_graphs=graphs, min_span=24)
    res = dec.generate([PROMPT] * N_ROWS, max_new_tokens=n, temperature=T, seed=seed, stop_at_eos=False, top_p=top_p,
                       top_k=top_k)
    assert all(tuple(t) in index for t in res.tokens), "a token outside the (truncated) target distribution"
    if graphs == "emulate":  # the sampled verify replayed its capture (the planted bug runs there too)
        assert any(name.startswith("tree/") for name, *_ in dec.graphs.captured), list(dec.graphs.captured)
    return chi_square_test([index[tuple(t)] for t in res.tokens], list(joint.values())), res


@pytest.mark.parametrize("method,topk,num_draft_tokens,graphs",
                         [("eagle", 2, 7, "emulate"),  # test-quick runs one drafter; make test all three (2 s each)
                          pytest.param("mtp", 3, 10, "emulate", marks=pytest.mark.slow),
                          pytest.param("heads", 3, 8, "emulate", marks=pytest.mark.slow),
                          pytest.param("eagle", 2, 7, "off", marks=pytest.mark.slow)])  # eager: the same rule, 2 s
def test_a_sampled_tree_keeps_the_target_distribution(bundle, method, topk, num_draft_tokens, graphs):  # noqa: F811
    """Under the emulated graphs (the drafter's tree and the verify replayed) and eagerly."""
    result, res = tree_chi2(bundle, method, topk, num_draft_tokens, graphs=graphs)
    hist = res.stats.histogram  # verify steps with 0, 1, 2 drafts accepted
    assert hist[0] > 300 and hist[1] > 300 and hist[2] > 50, hist  # rejections, depth-2 walks, bonus tokens
    assert result.pvalue > 1e-3, f"chi2 {result.statistic:.1f} on {result.dof} dof, p = {result.pvalue:.2e}"


def test_a_sampled_tree_keeps_the_truncated_distribution(bundle):  # noqa: F811
    """top-k 3: a candidate outside the target's three likeliest has p = 0 there and is always rejected."""
    result, _ = tree_chi2(bundle, "mtp", 3, 10, top_k=3)
    assert result.pvalue > 1e-3, f"chi2 {result.statistic:.1f} on {result.dof} dof, p = {result.pvalue:.2e}"


def test_the_same_test_rejects_a_rejected_candidate_left_in_r(bundle, monkeypatch):  # noqa: F811
    real = verify_mod.candidates_accept

    def buggy(r, q, candidates, valid, u):  # each candidate judged against p itself: the rejected stay in r
        index = torch.full_like(candidates[:, 0], -1)
        for i in range(candidates.shape[1]):
            x = candidates[:, i : i + 1]
            ok = (index < 0) & valid[:, i] & (u[:, i] < r.gather(1, x)[:, 0])
            index = torch.where(ok, i, index)
        return index, real(r, q, candidates, valid, u)[1]

    monkeypatch.setattr(verify_mod, "candidates_accept", buggy)
    result, _ = tree_chi2(bundle, "eagle", 2, 5)
    assert result.pvalue < 1e-6, f"the planted bug went unnoticed: p = {result.pvalue:.2e}"
