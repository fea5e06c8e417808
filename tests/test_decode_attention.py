"""The Triton decode attention (decoder/decode_attention.py) against its reference, model.attention, on a GPU. The CPU
twin: model.attention itself against SDPA (tests/test_fast_paths.py); on a CPU the model never
dispatches to the kernel (below), so every CPU decode test runs the reference."""

import os
import subprocess
import sys
from pathlib import Path

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



def test_only_a_chain_step_over_the_static_cache_takes_the_folded_kernel(monkeypatch):
    """The dispatch to rope_append_attention, on the CPU with the kernel pretended present: a chain's step over a
    LayerCache takes it; a tree view (write slots) and the zoo training's DepthKV (appended keys, autograd) keep the
    written-out steps, whose output is model.attention's (a miss here once broke the MTP layer's training). The
    decode kernel itself serves a LayerCache only, the tree view's too: DepthKV's steps need autograd, which the
    kernel has not (a miss there made Lab 2's tiny training on a GPU lose its attention gradients and read its
    batch-1 mask past the end: NaN losses, then an illegal memory access)."""
    from specdec.decoder.kv_cache import LayerCache
    from specdec.zoo.train import DepthKV

    calls = []
    monkeypatch.setattr(model_mod, "ROPE_IN_KERNEL", True)
    monkeypatch.setattr(kernel, "fits", lambda q: True)
    decoded = []

    def decode(q, k, v, mask):  # the kernel's reference in its place, counted
        decoded.append(q.shape)
        return model_mod.attention(q, k, v, mask)
    monkeypatch.setattr(kernel, "decode_attention", decode)

    def folded(qk, v, cos, sin, positions, k_cache, v_cache, n_slots, nh):
        calls.append(n_slots)
        return torch.zeros(qk.shape[0], nh, qk.shape[1], qk.shape[-1])  # [B, nh, T, D]
    monkeypatch.setattr(kernel, "rope_append_attention", folded)
    cfg = model_mod.ModelConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    att = model_mod.Attention(cfg).eval()
    B, T, S, D = 2, 3, 16, cfg.head_dim
    x, positions = torch.randn(B, T, 64), torch.arange(T).repeat(B, 1) + 4
    cos, sin = torch.ones(B, 1, T, D), torch.zeros(B, 1, T, D)
    mask = model_mod.attention_mask(positions, S, 2)
    fresh = lambda **kw: LayerCache(torch.zeros(B, 2, S, D), torch.zeros(B, 2, S, D), **kw)  # noqa: E731
    with torch.no_grad():
        att(x, cos, sin, fresh(), positions, mask)
        assert calls == [S]
        tree = fresh(slots=positions + 5)
        y_tree = att(x, cos, sin, tree, positions, model_mod.attention_mask(positions + 5, S, 2))
        depth = DepthKV()
        y_depth = att(x, cos, sin, depth, positions, torch.ones(1, 1, 2 * T, T, dtype=torch.bool))
    assert calls == [S], "a tree view or DepthKV reached the folded kernel"
    assert len(decoded) == 1, "DepthKV (appended keys, autograd) reached the decode kernel"  # the tree view's step
    assert depth.k.shape == (B, 2, T, D) and tree.k[:, :, 9:12].abs().sum() > 0
    assert y_tree.shape == y_depth.shape == (B, T, 64)


def case(B, nkv, R, S, D, kind, dtype, device="cuda", seed=0):
    """q [B, nkv, R, D], k, v [B, nkv, S, D] as the cache's views (a longer cache cut to S slots) and a mask
    [B, 1, R, S]: 'causal' (each row's own live prefix, ending anywhere in a tile), 'tree' (random visible slots,
    slot 0 always), 'expanded' (model.attention_mask's expanded form over g heads), 'shared' ([1, 1, R, S]: one
    causal mask for every row of the batch, as zoo/train.py's depth_mask)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(B, nkv, R, D, generator=g).to(device, dtype)
    cache_k = torch.randn(B, nkv, S + 37, D, generator=g).to(device, dtype)
    cache_v = torch.randn(B, nkv, S + 37, D, generator=g).to(device, dtype)
    k, v = cache_k[:, :, :S], cache_v[:, :, :S]  # strided views, as LayerCache.read gives
    if kind in ("causal", "shared"):
        ends = torch.randint(1, S + 1, (B if kind == "causal" else 1, R), generator=g)
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
        for kind in ("causal", "tree", "expanded", "shared"):
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


def unrolled_training_step(bundle, device: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Lab 2's Part F in small: the zoo's MTP layer chained 3 steps over windows of 16 tokens (2 x 15 query rows a key
    head: within DECODE_ROWS), the chained loss and its gradients, on `device` in fp32 -> (loss, the layer's grads)."""
    import copy

    from specdec.decoder.draft_modules import chained_soft_ce
    from specdec.zoo.train import mtp_unrolled

    target, mtp = copy.deepcopy(bundle.target).to(device), copy.deepcopy(bundle.mtp).to(device).train()
    rows = torch.randint(0, target.config.vocab_size, (4, 17), generator=torch.Generator().manual_seed(0)).to(device)
    with torch.no_grad():
        logits, h = target(rows[:, :-1])
    states = mtp_unrolled(mtp, h[:, :-1], rows[:, 1:-1], target.embed_tokens, 3)
    loss = chained_soft_ce([target.lm_head(g) for g in states], logits.softmax(-1)[:, 1:], [1.0, 0.7, 0.49])
    loss.backward()
    return loss.detach().cpu(), {n: p.grad.cpu() for n, p in mtp.named_parameters() if p.grad is not None}


@needs_gpu
@pytest.mark.gpu
def test_the_unrolled_training_on_a_gpu_equals_the_cpus(tiny_bundle):
    """The chained loss and every gradient of the MTP layer on the GPU equal the CPU's (fp32): the training's DepthKV
    keeps the written-out attention there too (the CPU twin: the dispatch test above)."""
    cpu_loss, cpu_grads = unrolled_training_step(tiny_bundle, "cpu")
    gpu_loss, gpu_grads = unrolled_training_step(tiny_bundle, "cuda")
    assert torch.isfinite(gpu_loss) and set(gpu_grads) == set(cpu_grads)
    assert any("attn" in n for n in cpu_grads)  # the attention's projections are trained
    torch.testing.assert_close(gpu_loss, cpu_loss, atol=1e-4, rtol=1e-4)
    for name, grad in cpu_grads.items():
        torch.testing.assert_close(gpu_grads[name], grad, atol=1e-4, rtol=1e-3, msg=name)


@needs_gpu
@pytest.mark.gpu
def test_graphs_decode_the_zoo_through_the_kernel_as_written_out(code_prompts, monkeypatch):
    """The zoo in fp32 on the GPU under CUDA graphs: every proposer's greedy tokens through the kernel, and through it
    with rope and the cache write folded in (ROPE_IN_KERNEL), equal the same engine's with the written-out attention,
    and plain decoding's."""
    from specdec.zoo import load_bundle
    from specdec.decoder.engine import Engine

    bundle = load_bundle("tiny", device="cuda", dtype=torch.float32)
    run = lambda m: Engine(bundle, m, k=3, cuda_graphs="on", min_span=16).generate(code_prompts, 32).tokens  # noqa: E731
    fused = {m: run(m) for m in ("ar", "mtp", "eagle")}
    monkeypatch.setattr(model_mod, "ROPE_IN_KERNEL", True)
    folded = {m: run(m) for m in ("ar", "mtp", "eagle")}
    monkeypatch.setattr(model_mod, "ROPE_IN_KERNEL", False)
    monkeypatch.setattr(model_mod, "KERNEL_ATTENTION", False)
    written = {m: run(m) for m in ("ar", "mtp", "eagle")}
    assert fused == written
    assert folded == written
    assert fused["mtp"] == fused["ar"] == fused["eagle"]


# -- rope and the cache write folded into the kernel (decode_attention.rope_append_attention, model.ROPE_IN_KERNEL) --
ROPE_SHAPES = [  # B, T (new tokens), nh, nkv, D, S_max
    (1, 1, 32, 8, 128, 1100),  # the 8B shape's decode step
    (1, 4, 32, 8, 128, 1100),  # its verify step of k = 3
    (3, 2, 8, 2, 64, 300),
    (2, 5, 4, 4, 16, 200),  # no grouping, rows padded to 16
]


def rope_case(B, T, nh, nkv, D, s_max, device, dtype, seed=0):
    """The kernel's arguments for one chain step (rows at different positions, a cache with old entries), and what
    model.Attention's written-out steps give: (y, cache k, cache v) from each, y as [B, nkv, g*T, D]."""
    from specdec.decoder.kv_cache import LayerCache

    g = torch.Generator(device="cpu").manual_seed(seed)
    qkv = torch.randn(B, T, nh + 2 * nkv, D, generator=g).to(device, dtype)
    qk, v = qkv.split([nh + nkv, nkv], dim=2)  # views, as the fused projection gives them
    positions = (torch.randint(0, s_max // 2, (B, 1), generator=g) + torch.arange(T)).to(device)
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device=device).float() / D))
    emb = torch.cat([positions.float().unsqueeze(-1) * inv] * 2, -1).unsqueeze(1)  # [B, 1, T, D]
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    old_k, old_v = (torch.randn(B, nkv, s_max, D, generator=g).to(device, dtype) for _ in range(2))
    n_slots = int(positions.max()) + 6  # a few slots past the last position, as KVCache.slots_read may give
    x = qk.transpose(1, 2).float()
    x = (x * cos.float() + model_mod.rotate_half(x) * sin.float()).to(dtype)  # rounded once, as compiled code does
    q, k = x.split([nh, nkv], dim=1)
    ref_cache = LayerCache(old_k.clone(), old_v.clone())
    ref_cache.write(k, v.transpose(1, 2), positions)
    K, V = ref_cache.read(n_slots)
    mask = model_mod.attention_mask(positions, n_slots, nh // nkv)
    ref = model_mod.attention(q.reshape(B, nkv, nh // nkv * T, D), K, V, mask)
    ck, cv = old_k.clone(), old_v.clone()
    got = kernel.rope_append_attention(qk, v, cos, sin, positions, ck, cv, n_slots, nh)
    return (got, ck, cv), (ref, ref_cache.k, ref_cache.v)


def check_rope_append(device: str) -> None:
    """fp32: the values copied into the cache exactly, the rotated keys within a rounding (a GPU may fuse the rotation's
    multiply and add), the output equal within float rounding; a kernel that scored a new key from the old cache slot
    (or skipped the write) fails."""
    for shape in ROPE_SHAPES:
        (got, ck, cv), (ref, rk, rv) = rope_case(*shape, device=device, dtype=torch.float32)
        assert torch.equal(cv, rv), shape
        torch.testing.assert_close(ck, rk, atol=1e-6, rtol=1e-6, msg=str(shape))
        torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4, msg=str(shape))


@needs_gpu
@pytest.mark.gpu
def test_rope_and_the_write_in_the_kernel_equal_the_written_out_steps():
    check_rope_append("cuda")
    for shape in ROPE_SHAPES:  # bf16: the cache within one rounding, the output as close as the kernel's own
        (got, ck, cv), (ref, rk, rv) = rope_case(*shape, device="cuda", dtype=torch.bfloat16)
        assert torch.equal(cv, rv) and (ck.float() - rk.float()).abs().max() <= 2 ** -6 * rk.float().abs().max()
        torch.testing.assert_close(got.float(), ref.float(), atol=3e-2, rtol=3e-2, msg=str(shape))


@pytest.mark.skipif(kernel.triton is None, reason="needs Triton (its interpreter runs the kernel on the CPU)")
def test_rope_and_the_write_in_the_kernel_under_tritons_interpreter():
    """The same check on the CPU, through Triton's interpreter (TRITON_INTERPRET=1, in a process of its own: the
    variable is read when Triton is imported). Where Triton is installed without a GPU, this is the kernel's twin."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    code = "import test_decode_attention as t; t.check_rope_append('cpu'); print('ok')"
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_the_steps_cos_and_sin_stay_one_op_each_when_compiled():
    """model.computed_once (ROPE_ONCE): a copy through an op torch.compile does not see into, so that the graph computes
    cos/sin once and hands the result to every layer's kernel (inductor would recompute a few-op input per kernel)."""
    x = torch.randn(2, 1, 3, 8)
    y = model_mod.computed_once(x)
    assert torch.equal(x, y) and y.data_ptr() != x.data_ptr()
    seen = []

    def backend(gm, inputs):
        seen.extend(n.target for n in gm.graph.nodes if n.op == "call_function")
        return gm

    torch._dynamo.reset()
    pos = torch.arange(3.0)
    def three_users(p):
        c = model_mod.computed_once(p.cos())
        return [c * w for w in range(3)]

    out = torch.compile(three_users, backend=backend)(pos)
    torch._dynamo.reset()
    assert seen.count(torch.ops.specdec.computed_once.default) == 1  # once, before its three users
    assert all(torch.equal(o, pos.cos() * w) for w, o in enumerate(out))
