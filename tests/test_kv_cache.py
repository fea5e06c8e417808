"""The KV cache: provisional writes, commit and rollback move lengths; the next logits always equal
a fresh recompute of the committed tokens."""

import random

import pytest
import torch

from specdec.decoder.kv_cache import KVCache
from specdec.decoder.model import ModelConfig, Transformer


@pytest.fixture(scope="module")
def small_model():
    torch.manual_seed(1)
    cfg = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return Transformer(cfg).eval()


@torch.no_grad()
def test_commit_and_rollback_invariant(small_model):
    """Random provisional writes, commits and rollbacks on 3 rows; after each, feed one more token
    through the cache and compare with a full recompute of that row's committed tokens."""
    rng = random.Random(0)
    B, S = 3, 96
    cache = KVCache.for_model(small_model, B, S)
    committed = [[] for _ in range(B)]
    for it in range(40):
        op = rng.choice(["write", "write", "rollback"])
        if op == "write":  # a verify-like step: w provisional tokens, then keep a prefix of each row
            w = rng.randint(1, 5)
            ids = torch.randint(0, 97, (B, w))
            small_model(ids, cache.positions(w), cache)
            keep = torch.tensor([rng.randint(0, w) for _ in range(B)])
            if int((cache.lengths + keep).max()) >= S - 6:
                keep[:] = 0
            for b in range(B):
                committed[b] += ids[b, : int(keep[b])].tolist()
            cache.commit(keep)
        else:
            back = torch.tensor([rng.randint(0, len(c)) for c in committed])
            cache.rollback(back)
            committed = [c[: int(n)] for c, n in zip(committed, back)]
        assert cache.lengths.tolist() == [len(c) for c in committed]
        probe = torch.randint(0, 97, (B, 1))
        logits, _ = small_model(probe, cache.positions(1), cache)  # provisional: not committed
        for b in range(B):
            fresh = small_model(torch.tensor([committed[b] + [int(probe[b])]]))[0][0, -1]
            assert torch.allclose(logits[b, 0], fresh, atol=1e-5), f"row {b} after {it} ops"


def test_commit_beyond_capacity_and_bad_rollback_are_errors(small_model):
    cache = KVCache.for_model(small_model, 2, 8)
    cache.commit(torch.tensor([3, 5]))
    with pytest.raises(ValueError, match="only move lengths back"):
        cache.rollback(torch.tensor([4, 5]))
    with pytest.raises(RuntimeError, match="overflow"):
        cache.commit(torch.tensor([0, 4]))


def test_rollback_moves_lengths_without_copying(small_model):
    cache = KVCache.for_model(small_model, 1, 16)
    small_model(torch.tensor([[1, 2, 3, 4]]), cache.positions(4), cache)
    cache.commit(4)
    before = cache.k[0].clone()
    ptr = cache.k[0].data_ptr()
    cache.rollback(2)
    assert cache.lengths.tolist() == [2]
    assert cache.k[0].data_ptr() == ptr and torch.equal(cache.k[0], before)


@torch.no_grad()
def test_attention_over_the_live_prefix_equals_attention_over_every_slot(small_model):
    """A step's span (exact, or rounded up to a bucket as under graphs) reads a prefix of the slots;
    stale keys past a row's length, in or out of that prefix, are masked: the logits of every slot."""
    B, S = 3, 96
    cache = KVCache.for_model(small_model, B, S)
    small_model(torch.randint(0, 97, (B, 80)), cache.positions(80), cache)  # stale keys up to slot 79
    cache.commit(torch.tensor([20, 9, 31]))
    ids, pos = torch.randint(0, 97, (B, 4)), cache.positions(4)  # a verify-like block, last position 34
    full = cache.rows(0, B, S)  # the span of every slot
    reference, _ = small_model(ids, pos, full)
    for span in (35, 64, 96):
        logits, _ = small_model(ids, pos, cache.rows(0, B, span))
        assert torch.allclose(logits, reference, atol=1e-6), span
    assert full.slots_read(pos) == 96 and cache.rows(0, B, 35).slots_read(pos) == 35 and cache.slots_read(pos) == 35
