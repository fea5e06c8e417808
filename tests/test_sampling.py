"""At temperature > 0 speculative decoding keeps the target's distribution (chi-square), and the
same test rejects a planted bug: after a rejection, sampling from q instead of the residual."""

import itertools

import pytest
import torch

import specdec.decoder.engine as decode_mod
from specdec.decoder.bundle import ModelBundle
from specdec.decoder.draft_modules import MTPLayer
from specdec.decoder.engine import Decoder
from specdec.decoder.model import ModelConfig, Transformer, init_weights
from specdec.sim.stats import chi_square_test

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
    return ModelBundle(name="random", target=target, tokenizer=None, draft=draft, mtp=peaked(MTPLayer(cfg)))


@torch.no_grad()
def exact_joint(target, n: int) -> dict:
    """p(x1..xn | prompt) for every sequence, by brute force over V^n continuations."""
    probs = {}
    for seq in itertools.product(range(V), repeat=n):
        ids = torch.tensor([PROMPT + list(seq)])
        logp = target(ids)[0][0].float().div(T).log_softmax(-1)
        probs[seq] = float(sum(logp[len(PROMPT) - 1 + i, s] for i, s in enumerate(seq)).exp())
    return probs


def sample_joint(bundle, method, n, seed):
    dec = Decoder(bundle, cuda_graphs="off")
    res = dec.generate([PROMPT] * N_ROWS, method, k=2, max_new_tokens=n, temperature=T, seed=seed, stop_at_eos=False)
    return [tuple(t) for t in res.tokens], res


def chi2(bundle, method, n=3, seed=0):
    joint = exact_joint(bundle.target, n)
    seqs = list(joint)
    index = {s: i for i, s in enumerate(seqs)}
    samples, res = sample_joint(bundle, method, n, seed)
    return chi_square_test([index[s] for s in samples], [joint[s] for s in seqs]), res


@pytest.mark.parametrize("method", ["draft", "mtp", "ngram"])
def test_speculative_sampling_keeps_the_target_distribution(bundle, method):
    """The first three tokens: token 1 from the prefill, tokens 2-3 from a verify step (k = 2)."""
    result, res = chi2(bundle, method)
    assert res.stats.acceptance_rate < 0.95  # rejections happen, so the residual is exercised
    assert result.pvalue > 1e-3, f"{method}: chi2 {result.statistic:.1f} on {result.dof} dof, p = {result.pvalue:.2e}"


def test_the_same_test_rejects_sampling_from_q_after_a_rejection(bundle, monkeypatch):
    def buggy(draft, q_probs, target_logits, temperature, generator=None):
        accept, _ = real(draft, q_probs, target_logits, temperature, generator)
        B, k = draft.shape
        rows = torch.arange(B)
        q = q_probs[rows, accept.clamp(max=k - 1)]
        p = (target_logits[rows, accept].float() / temperature).softmax(-1)
        dist = torch.where((accept < k).unsqueeze(1), q, p)  # the bug: q instead of the residual
        return accept, torch.multinomial(dist, 1, generator=generator).squeeze(1)

    real = decode_mod.sample_accept
    monkeypatch.setattr(decode_mod, "sample_accept", buggy)
    result, _ = chi2(bundle, "draft")
    assert result.pvalue < 1e-6, f"the planted bug went unnoticed: p = {result.pvalue:.2e}"
