"""Lab 1's tree formula against the Lab 2 decoder: per-depth acceptance recorded from the engine's tree steps
(specdec/decoder/tree_accept.py), fed to DraftTree, predicts the measured tau."""

import numpy as np
import pytest
import torch
from quick import later

from specdec.decoder.tree_accept import DepthAcceptance, TreeRecorder, TreeStep, siblings
from specdec.sim.tree import DraftTree

BOUND = 0.08  # what the formula achieves on these prompts: 4 to 6% under the measured tau (the test's shapes)


def test_siblings_count_and_rank_by_score():
    parents = np.array([-1, -1, 0, 0, 0, 1])
    scores = np.array([-0.5, -0.2, -1.0, -0.7, -3.0, -0.9])
    widths, ranks = siblings(parents, scores)
    assert widths.tolist() == [2, 2, 3, 3, 3, 1]
    assert ranks.tolist() == [1, 0, 1, 0, 2, 0]


def test_a_chain_formula_is_exact_and_reversed_depths_are_not():
    """For a chain the product of the per-depth acceptances telescopes to the share that reached each depth."""
    rng = np.random.default_rng(0)
    alive = rng.random((500, 5)) < [0.5, 0.6, 0.7, 0.8, 0.9]  # acceptance that grows with depth, as on the zoo
    accepted = alive.cumprod(1).sum(1)  # 0..5 drafts of 5
    table = DepthAcceptance.from_chain(accepted, 5)
    assert table.chain().tau() == pytest.approx(accepted.mean() + 1, abs=1e-12)
    assert DraftTree.chain(table.accept[::-1, 0, 0]).tau() != pytest.approx(accepted.mean() + 1, rel=0.05)


def test_the_table_counts_offers_and_hits_along_the_accepted_path():
    """Two recorded steps of one tree (root: children 0 and 1; node 0: child 2): one accepts node 1 then stops,
    one accepts nodes 0 and 2 (the tree's bottom)."""
    shape = dict(parents=np.array([-1, -1, 0]), widths=np.array([2, 2, 1]), ranks=np.array([0, 1, 0]),
                 depths=np.array([1, 1, 2]))
    rec = TreeRecorder([TreeStep(**shape, path=[1], missed=False), TreeStep(**shape, path=[0, 2], missed=False)])
    t = rec.table()
    assert t.offered[0, 1].tolist() == [2, 2] and t.hits[0, 1].tolist() == [1, 1]  # depth 1, two siblings
    assert t.offered[1, 0, 0] == 1 and t.hits[1, 0, 0] == 1  # depth 2 only under node 0
    assert rec.measured_tau() == pytest.approx(2.5)
    assert rec.predicted_by_depth().tolist() == pytest.approx([1.0, 0.5])


@pytest.fixture(scope="module")
def zoo():
    from specdec.zoo.corpus import CATEGORIES, build_corpus
    from specdec.zoo.evaluate import category_prompts, load_zoo_bundle, tokenized_heldout, trained_tokenizer
    from specdec.zoo.recipes import RECIPES
    from specdec.zoo.registry import PACKAGE_DIR

    torch.set_num_threads(1)
    bundle, meta = load_zoo_bundle(PACKAGE_DIR / "tiny")
    tok = trained_tokenizer(bundle.paths["target"])
    prompts = category_prompts(tokenized_heldout(tok, build_corpus(seed=RECIPES[meta["recipe"]].seed)), 4, 32,
                               bundle.eos_token_ids[0])
    return bundle, [p for c in CATEGORIES for p in prompts[c]]


@pytest.mark.parametrize("method,shape", [("eagle", (4, 2, 8)), ("mtp", (5, 4, 16)),
                                          *later(("eagle", (4, 4, 8)), ("eagle", (5, 4, 16)))])
def test_the_formula_predicts_the_decoders_tree_tau(zoo, method, shape):
    """The zoo, three prompt categories, greedy fp32: within BOUND, under (the rerank draws a deep narrow tree where
    the drafter is sure, and there acceptance is above its average at each depth); the share of steps that
    accepted depth 1 is exact by construction, and fed the depths in reverse order the formula misses it."""
    from specdec.decoder.engine import Engine

    bundle, prompts = zoo
    steps, topk, ndt = shape
    engine = Engine(bundle, method, k=steps, topk=topk, num_draft_tokens=ndt, max_batch=len(prompts), cuda_graphs="off")
    rec = TreeRecorder().attach(engine)
    result = engine.generate(prompts, max_new_tokens=32, stop_at_eos=False)
    assert len(rec.steps) == (result.accepted >= 0).sum()  # every running row's step, once
    measured, predicted = rec.measured_tau(), rec.predicted_tau()
    assert predicted == pytest.approx(measured, rel=BOUND) and predicted < measured
    table = rec.table()
    assert rec.predicted_by_depth()[0] == pytest.approx(rec.measured_by_depth()[0], abs=1e-9)
    reversed_ = DepthAcceptance(table.hits[::-1], table.offered[::-1])
    assert abs(rec.predicted_by_depth(reversed_)[0] - rec.measured_by_depth()[0]) > 0.05
