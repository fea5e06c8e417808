"""At temperature > 0 speculative decoding keeps the target's distribution (chi-square over the
joint distribution of the first tokens), for every proposer, with and without top-p/top-k, and the
same test rejects a planted bug: after a rejection, sampling from q instead of the residual."""

import itertools

import pytest
import torch
from quick import later

import specdec.decoder.step as step_mod
from specdec.decoder.bundle import ModelBundle
from specdec.decoder.checkpoint import eagle_config
from specdec.decoder.draft_modules import EagleHead, MTPHeads, MTPLayer
from specdec.decoder.engine import Engine
from specdec.decoder.model import ModelConfig, Transformer, init_weights
from specdec.decoder.verify import sample
from specdec.sim.stats import ChiSquareResult, chi_square_test

V, N_ROWS, T = 6, 6000, 1.0
PROMPT = [1, 4, 2]


def peaked(model, std=0.9):
    """Random weights large enough for peaked, clearly different p and q (small inits give ~uniform)."""
    init_weights(model, std)
    return model.eval()


@pytest.fixture(scope="module")
def bundle():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    target = peaked(Transformer(cfg))
    draft = peaked(Transformer(ModelConfig(**{**cfg.__dict__, "num_hidden_layers": 1, "extra": {}})))
    return ModelBundle(name="random", target=target, tokenizer=None, draft=draft, mtp=peaked(MTPLayer(cfg)),
                       heads=peaked(MTPHeads(cfg.hidden_size, 2)), eagle=peaked(EagleHead(eagle_config(cfg))))


@torch.no_grad()
def exact_joint(target, n: int, top_p: float = 1.0, top_k: int = 0) -> dict:
    """p(x1..xn | prompt) for every sequence, by brute force over V^n continuations (each step's
    distribution truncated by top_p / top_k, written out here independently of the decoder)."""
    probs = {}
    for seq in itertools.product(range(V), repeat=n):
        ids = torch.tensor([PROMPT + list(seq)])
        step = target(ids)[0][0].float().div(T).softmax(-1)
        total = 1.0
        for i, s in enumerate(seq):
            row = step[len(PROMPT) - 1 + i]
            order = row.argsort(descending=True).tolist()
            kept, mass = [], 0.0
            for rank, tok in enumerate(order):
                if (top_k and rank >= top_k) or (top_p < 1 and mass >= top_p):
                    break
                kept.append(tok)
                mass += float(row[tok])
            total *= float(row[s]) / mass if s in kept else 0.0
        if total > 0:
            probs[seq] = total
    return probs


def sample_joint(bundle, method, n, seed, k=2, **kw):
    dec = Engine(bundle, method, k=k, max_batch=N_ROWS, max_len=16, cuda_graphs="off")
    res = dec.generate([PROMPT] * N_ROWS, max_new_tokens=n, temperature=T, seed=seed, stop_at_eos=False, **kw)
    return [tuple(t) for t in res.tokens], res


def chi2(bundle, method, n=3, seed=0, k=2, top_p=1.0, top_k=0):
    joint = exact_joint(bundle.target, n, top_p, top_k)
    seqs = list(joint)
    index = {s: i for i, s in enumerate(seqs)}
    samples, res = sample_joint(bundle, method, n, seed, k, top_p=top_p, top_k=top_k)
    if any(s not in index for s in samples):
        return ChiSquareResult(float("inf"), 0, 0.0), res  # a token outside the truncated distribution
    return chi_square_test([index[s] for s in samples], [joint[s] for s in seqs]), res


@pytest.mark.parametrize("method", ["draft", "mtp", *later("ngram", "heads", "eagle")])
def test_speculative_sampling_keeps_the_target_distribution(bundle, method):
    """The first three tokens: token 1 from the prefill, tokens 2-3 from a verify step (k = 2)."""
    result, res = chi2(bundle, method)
    assert res.stats.acceptance_rate < 0.95  # rejections happen, so the residual is exercised
    assert result.pvalue > 1e-3, f"{method}: chi2 {result.statistic:.1f} on {result.dof} dof, p = {result.pvalue:.2e}"


@pytest.mark.parametrize("method", ["draft", "eagle"])
def test_the_bonus_token_keeps_the_target_distribution(bundle, method):
    """k = 1: when the draft is accepted, token 3 is the bonus drawn from the target's last row."""
    result, res = chi2(bundle, method, k=1)
    assert res.stats.histogram[1] > 500  # the bonus was drawn often
    assert result.pvalue > 1e-3, f"{method}: chi2 {result.statistic:.1f} on {result.dof} dof, p = {result.pvalue:.2e}"


@pytest.mark.parametrize("top_p,top_k", [(0.8, 0), (1.0, 3)])
def test_sampling_keeps_the_truncated_distribution(bundle, top_p, top_k):
    """Lossless with respect to the top-p / top-k target: the drafts are drawn from the truncated
    draft distribution, and the residual is taken against the truncated target."""
    result, _ = chi2(bundle, "mtp", top_p=top_p, top_k=top_k)
    assert result.pvalue > 1e-3, f"chi2 {result.statistic:.1f} on {result.dof} dof, p = {result.pvalue:.2e}"


def test_the_same_test_rejects_sampling_from_q_after_a_rejection(bundle, monkeypatch):
    def buggy(drafts, q, p, u):
        accepted, _ = real(drafts, q, p, u)
        B, k = drafts.shape
        rows = torch.arange(B)
        q_next = q[rows, accepted.clamp(max=k - 1)]
        dist = torch.where((accepted < k).unsqueeze(1), q_next, p[rows, accepted])  # q, not the residual
        return accepted, sample(dist, u[:, k])

    real = step_mod.accept
    monkeypatch.setattr(step_mod, "accept", buggy)
    result, _ = chi2(bundle, "draft")
    assert result.pvalue < 1e-6, f"the planted bug went unnoticed: p = {result.pvalue:.2e}"
