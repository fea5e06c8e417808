"""The decoder's torch rules (specdec.decoder.verify) against Lab 1's numpy reference
(specdec.sim.verify): given the same uniform numbers they must choose the same tokens."""

import numpy as np
import pytest
import torch

from specdec.decoder import verify as torch_rules
from specdec.sim import verify as reference


def distributions(rng, n, v):
    return rng.dirichlet(np.ones(v) * 0.5, size=n)


@pytest.mark.parametrize("seed", range(5))
def test_sample_is_lab1_sample_categorical(seed):
    rng = np.random.default_rng(seed)
    probs = distributions(rng, 500, 7)
    probs[:50, 3] = 0.0  # zero-probability tokens must never be chosen
    probs /= probs.sum(-1, keepdims=True)
    want = reference.sample_categorical(probs, np.random.default_rng(seed + 100))
    u = np.random.default_rng(seed + 100).random((500, 1))[:, 0]  # the draws sample_categorical makes
    got = torch_rules.sample(torch.tensor(probs), torch.tensor(u))
    assert np.array_equal(got.numpy(), want)
    assert not (got[:50] == 3).any()


@pytest.mark.parametrize("k", [1, 3, 5])
def test_accept_is_lab1_speculative_sampling(k):
    rng = np.random.default_rng(k)
    n, v = 2000, 6
    p, q = distributions(rng, n * (k + 1), v).reshape(n, k + 1, v), distributions(rng, n * k, v).reshape(n, k, v)
    drafts = reference.sample_categorical(q, rng)
    want_len, want_emitted = reference.speculative_sample_batch(p, q, drafts, np.random.default_rng(7))
    draws = np.random.default_rng(7)  # speculative_sample_batch draws the k accept tests, then one token
    u = np.concatenate([draws.random((n, k)), draws.random((n, 1))], 1)
    got_len, got_next = torch_rules.accept(torch.tensor(drafts), torch.tensor(q), torch.tensor(p), torch.tensor(u))
    assert np.array_equal(got_len.numpy(), want_len)
    assert np.array_equal(got_next.numpy(), want_emitted[np.arange(n), want_len])
    assert 0 < (want_len == k).sum() < n  # both rejections and bonus tokens happened


def test_greedy_accept_is_lab1_greedy_verify():
    rng = np.random.default_rng(0)
    logits = torch.tensor(rng.normal(size=(300, 5, 11)))
    best = logits.argmax(-1).numpy()
    drafts = np.where(rng.random((300, 4)) < 0.7, best[:, :4], rng.integers(0, 11, (300, 4)))
    got_len, got_next = torch_rules.greedy_accept(torch.tensor(drafts), logits)
    want_len = reference.greedy_verify_batch(drafts, best)
    assert np.array_equal(got_len.numpy(), want_len)
    assert np.array_equal(got_next.numpy(), best[np.arange(300), want_len])


def test_greedy_is_the_temperature_zero_case():
    """A greedy row: p is one-hot on the argmax, so any uniform draws give the argmax decisions."""
    logits = torch.randn(64, 4, 9)
    drafts = logits[:, :3].argmax(-1)
    drafts[::2, 1] = (drafts[::2, 1] + 1) % 9
    p = torch_rules.token_probs(logits, torch.zeros(64))
    for u in (torch.zeros(64, 4), torch.rand(64, 4) * 0.999):
        assert all(torch.equal(a, b) for a, b in zip(torch_rules.accept(drafts, None, p, u),
                                                      torch_rules.greedy_accept(drafts, logits)))


def test_top_p_and_top_k_truncate_per_row():
    probs = torch.tensor([[[0.5, 0.3, 0.15, 0.05]]] * 3)
    out = torch_rules.truncate(probs, torch.tensor([0.7, 1.0, 1.0]), torch.tensor([0, 0, 1]))
    assert torch.allclose(out[0, 0], torch.tensor([0.5, 0.3, 0, 0]) / 0.8)  # 0.5 < 0.7, 0.8 reaches it
    assert torch.allclose(out[1, 0], probs[1, 0])  # top_p 1: nothing cut
    assert torch.allclose(out[2, 0], torch.tensor([1.0, 0, 0, 0]))  # top_k 1


@pytest.mark.parametrize("V", [128256, 151936, 50257, 96])
def test_argmax_in_two_passes_is_torchs_argmax(V):
    """verify.argmax compiled (each slice's maximum, then the best slice) picks what logits.argmax(-1) picks, the
    first of equal maxima included: logits rounded to few values tie everywhere, in bf16 and fp32, [B, V] and
    [B, T, V]."""
    torch.manual_seed(V)
    f = torch.compile(torch_rules.argmax, backend="eager", dynamic=False, fullgraph=True)
    for shape in ((3, V), (2, 4, V)):
        for dtype in (torch.float32, torch.bfloat16):
            x = (torch.randn(shape) * 2).round().to(dtype)  # a handful of values: every maximum has ties
            x[0, ..., -1] = 100.0  # a maximum in the last slice
            x.view(-1, V)[-1, 7] = x.view(-1, V)[-1, V // 2] = 100.0  # two equal maxima in different slices
            assert torch.equal(f(x), x.argmax(-1)), (shape, dtype)
    torch._dynamo.reset()
