"""The Triton decode attention (decoder/decode_attention.py) against its reference, model.attention, on a GPU. The CPU
twin: model.attention itself against SDPA (tests/test_fast_paths.py); on a CPU the model never
dispatches to the kernel (below), so every CPU decode test runs the reference."""

import pytest
import torch

from specdec.decoder import decode_attention as kernel
from specdec.decoder import model as model_mod

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available() or kernel.triton is None,
                               reason="needs CUDA and Triton; on a CPU model.attention runs (tests/test_fast_paths.py)")


def test_the_cpu_runs_the_written_out_attention():
    """Off a GPU the dispatch answers no: no CPU run reaches a Triton kernel."""
    q = torch.randn(1, 2, 4, 64)
    assert not kernel.fits(q)
    assert model_mod.KERNEL_ATTENTION  # on by default: the GPU's graphs and compiled steps use it


def case(B, nkv, R, S, D, kind, dtype, device="cuda", seed=0):
    """q [B, nkv, R, D], k, v [B, nkv, S, D] as the cache's views (a longer cache cut to S slots) and a mask
    [B, 1, R, S]: 'causal' (each row's own live prefix, ending anywhere in a tile), 'tree' (random visible slots,
    slot 0 always), 'expanded' (model.attention_mask's expanded form over g heads)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(B, nkv, R, D, generator=g).to(device, dtype)
    cache_k = torch.randn(B, nkv, S + 37, D, generator=g).to(device, dtype)
    cache_v = torch.randn(B, nkv, S + 37, D, generator=g).to(device, dtype)
    k, v = cache_k[:, :, :S], cache_v[:, :, :S]  # strided views, as LayerCache.read gives
    if kind == "causal":
        ends = torch.randint(1, S + 1, (B, R), generator=g)
        mask = torch.arange(S).view(1, 1, S) < ends.unsqueeze(-1)
    elif kind == "tree":
        mask = torch.rand(B, R, S, generator=g) < 0.3
        mask[..., 0] = True
    else:
        positions = torch.randint(0, S - 4, (B, 1), generator=g) + torch.arange(4)
        return q[:, :, :4 * (R // 4)], k, v, model_mod.attention_mask(positions.to(device), S, R // 4)
    return q, k, v, mask.unsqueeze(1).to(device)


SHAPES = [  # B, nkv, R (query rows), S (slots), D
    (1, 8, 4, 1024, 128),  # the 8B shape at batch 1: 16 splits of 64 slots
    (1, 8, 4, 2048, 64),
    (3, 2, 16, 100, 64),  # a span that ends inside a tile
    (2, 4, 7, 300, 16),  # rows padded to 16
    (8, 8, 4, 512, 128),  # MAX_BATCH rows: two splits a row
    (1, 1, 64, 48, 32),  # DECODE_ROWS rows
]


@needs_gpu
@pytest.mark.gpu
def test_the_kernel_computes_the_written_out_attention():
    """For every shape and mask: fp32 equal to model.attention within float rounding; bf16 no further from the fp32
    answer than the written-out bf16 attention is. A mask that hides one more slot changes the answer: the comparison
    would catch a kernel that ignored the mask. (One test, not one per case: off a GPU it is one skip.)"""
    for shape in SHAPES:
        for kind in ("causal", "tree", "expanded"):
            where = f"{shape} {kind}"
            q, k, v, mask = case(*shape, kind, torch.float32)
            ref = model_mod.attention(q, k, v, mask)
            got = kernel.decode_attention(q, k, v, mask)
            assert got.shape == ref.shape and got.dtype == ref.dtype, where
            torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4, msg=where)
            hidden = mask.clone()
            seen = hidden[0, 0, 0].nonzero()
            if len(seen) > 1:
                hidden[0, 0, 0, seen[-1]] = False
                assert not torch.allclose(kernel.decode_attention(q, k, v, hidden), ref, atol=1e-4), where
            qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
            exact = model_mod.attention(qb.float(), kb.float(), vb.float(), mask)
            written = (model_mod.attention(qb, kb, vb, mask).float() - exact).abs().max().item()
            fused = (kernel.decode_attention(qb, kb, vb, mask).float() - exact).abs().max().item()
            assert fused <= 2 * written + 1e-3, (where, fused, written)


@needs_gpu
@pytest.mark.gpu
def test_graphs_decode_the_zoo_through_the_kernel_as_written_out(code_prompts, monkeypatch):
    """The zoo in fp32 on the GPU under CUDA graphs: every proposer's greedy tokens through the kernel equal the same
    engine's with the written-out attention, and plain decoding's."""
    from specdec.zoo import load_bundle
    from specdec.decoder.engine import Engine

    bundle = load_bundle("tiny", device="cuda", dtype=torch.float32)
    run = lambda m: Engine(bundle, m, k=3, cuda_graphs="on", min_span=16).generate(code_prompts, 32).tokens  # noqa: E731
    fused = {m: run(m) for m in ("ar", "mtp", "eagle")}
    monkeypatch.setattr(model_mod, "KERNEL_ATTENTION", False)
    written = {m: run(m) for m in ("ar", "mtp", "eagle")}
    assert fused == written
    assert fused["mtp"] == fused["ar"] == fused["eagle"]
