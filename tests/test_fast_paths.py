"""The fast paths of a decode step against the readable ones they stand in for (CPU twins of what a GPU runs).

- `Linear` under torch.compile, one row: a multiply-and-sum instead of cuBLAS's one-row kernels
- `attention` for a decode step's few query rows: matmul, softmax, matmul instead of the fused SDPA
- greedy rows: the argmax instead of sampling a one-hot distribution
"""

import pytest
import torch
import torch.nn.functional as F

import specdec.decoder.model as model_mod
from specdec.decoder.cuda_graphs import INDUCTOR_OPTIONS
from specdec.decoder.engine import Engine, SamplingParams
from specdec.decoder.kv_cache import KVCache
from specdec.decoder.model import Linear, attention, attention_mask


@pytest.mark.parametrize("bias", [False, True])
def test_one_row_linear_under_compile_is_the_matmul(bias):
    torch.manual_seed(0)
    layer = Linear(48, 80, bias=bias)
    compiled = torch.compile(layer, backend="eager", fullgraph=True)  # dynamo traces: is_compiling() is true
    for shape in ((1, 1, 48), (1, 48), (2, 1, 48), (1, 3, 48)):  # one row takes the fast path, more rows do not
        x = torch.randn(shape)
        got = compiled(x)
        assert got.shape == (*shape[:-1], 80)
        assert torch.allclose(got, F.linear(x, layer.weight, layer.bias), atol=1e-5), shape


def test_the_fast_path_is_taken_only_under_compile(monkeypatch):
    """Eager calls stay on nn.Linear (the reduction would hold an [N, K] product in memory)."""
    layer, calls = Linear(8, 4), []
    real = torch.Tensor.sum
    monkeypatch.setattr(torch.Tensor, "sum", lambda *a, **k: calls.append(1) or real(*a, **k))
    layer(torch.randn(1, 1, 8))
    assert calls == []


@pytest.mark.parametrize("T", [1, 4])
def test_decode_attention_is_sdpa(T):
    torch.manual_seed(1)
    B, h, S, D = 2, 3, 20, 16
    q, k, v = torch.randn(B, h, 2 * T, D), torch.randn(B, h, S, D), torch.randn(B, h, S, D)
    positions = torch.tensor([[5 + t for t in range(T)], [11 + t for t in range(T)]])
    mask = attention_mask(positions, S, group=2)  # two query heads per key/value head
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(attention(q, k, v, mask), want, atol=1e-5)
    bad = attention(q, k, v, ~mask | (torch.arange(S) == 0))  # a mask read backwards must show
    assert not torch.allclose(bad, want, atol=1e-2)


def test_the_model_decodes_the_same_through_either_attention(tiny_bundle, code_prompts, monkeypatch):
    target = tiny_bundle.target
    cache = KVCache.for_model(target, 1, 64)
    ids = torch.tensor([code_prompts[0]])
    pos = torch.arange(ids.shape[1]).unsqueeze(0)
    target(ids, pos, cache)
    cache.commit(ids.shape[1])
    block, bpos = torch.tensor([[5, 6, 7]]), cache.positions(3)
    fast, _ = target(block, bpos, cache)
    monkeypatch.setattr(model_mod, "DECODE_ROWS", 0)  # every step through SDPA
    fused, _ = target(block, bpos, cache)
    assert torch.allclose(fast, fused, atol=1e-4)


@pytest.mark.parametrize("method", ["ar", "mtp"])
def test_greedy_steps_take_the_argmax_that_sampling_a_one_hot_gives(tiny_bundle, code_prompts, method, monkeypatch):
    """At temperature 0 the step reads the argmax; forcing it down the sampling path (one-hot
    distributions, random uniforms) must give the same tokens."""
    fast = Engine(tiny_bundle, method, k=3, cuda_graphs="off").generate(code_prompts, max_new_tokens=20)
    real = Engine._flags

    def as_if_sampling(self, rows):
        real(self, rows)
        rows.sampling = self.rows.sampling = True

    monkeypatch.setattr(Engine, "_flags", as_if_sampling)
    slow = Engine(tiny_bundle, method, k=3, cuda_graphs="off").generate(code_prompts, max_new_tokens=20)
    assert slow.tokens == fast.tokens


def test_a_graph_captured_greedy_is_not_replayed_for_sampling_rows(tiny_bundle, code_prompts):
    """How a step chooses tokens is baked into its capture: greedy, sampling and top-k rows get their own
    (top_k = 1 at temperature 1 samples the argmax: the same tokens as greedy, through the top-k code)."""
    for method in ("ar", "mtp"):
        e = Engine(tiny_bundle, method, k=3, cuda_graphs="emulate")
        greedy = e.generate(code_prompts, max_new_tokens=16).tokens
        assert e.generate(code_prompts, max_new_tokens=16, temperature=1.0, top_k=1).tokens == greedy
        sampled = e.generate(code_prompts, max_new_tokens=16, temperature=1.0, seed=3).tokens
        eager = Engine(tiny_bundle, method, k=3, cuda_graphs="off").generate(code_prompts, max_new_tokens=16,
                                                                             temperature=1.0, seed=3).tokens
        assert sampled == eager != greedy
        step = "plain" if method == "ar" else "verify"
        assert {name for name, *_ in e.graphs.captured} == {step, f"{step}/top", f"{step}/sample"}
        # greedy steps read no uniforms, so none is copied into their graph; sampling steps take them
        uniforms = {name: shapes[-1] for name, _, _, shapes in e.graphs.captured}
        assert uniforms[step] is None and uniforms[f"{step}/sample"] == ((4,) if method == "ar" else (4, 4))


def test_the_step_readout_is_one_tensor_the_host_copies_once(tiny_bundle, code_prompts, monkeypatch):
    """The captured step returns what the host needs (count, accepted, done, emitted, drafts) in one tensor:
    each step reads that output of its graph with one .tolist() call, and builds nothing to read outside it."""
    reads = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append((tuple(t.shape), t.data_ptr())) or real(t))
    for method, width in (("ar", 1), ("mtp", 4)):
        e = Engine(tiny_bundle, method, k=3, cuda_graphs="emulate")
        e.admit(code_prompts, SamplingParams(max_new_tokens=16))
        reads.clear()
        steps = 0
        while e.running:
            e.step()
            steps += 1
        assert [shape for shape, _ in reads] == [(4, 3 + width + (width - 1))] * steps, (method, reads[:3])
        outputs = {(g.static_out if method == "ar" else g.static_out[0]).data_ptr() for g in e.graphs.captured.values()}
        assert {ptr for _, ptr in reads} <= outputs


def test_a_compiled_batch1_step_takes_the_fast_paths_and_decodes_as_eager(tiny_bundle, code_prompts, monkeypatch):
    """compile=True at one row: the whole step traced (fullgraph) through `Linear`'s one-row reduction, with
    inductor's options (coordinate-descent tuning, the realize threshold) set while it compiles and not after;
    the tokens are eager's."""
    import torch._dynamo
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    traced, real_compile = [], torch.compile

    def record(gm, example_inputs):  # a backend that runs the traced graph as is (no inductor in a CPU test)
        traced.append(({k: getattr(inductor_config, k) for k in INDUCTOR_OPTIONS}, gm.code))
        return gm.forward

    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, backend=record, fullgraph=True, **kw))
    eager = Engine(tiny_bundle, "ar", cuda_graphs="off").generate(code_prompts[:1], max_new_tokens=24).tokens
    e = Engine(tiny_bundle, "ar", cuda_graphs="emulate", compile=True, min_span=8)
    assert e.generate(code_prompts[:1], max_new_tokens=24).tokens == eager
    assert len(traced) == len(e.graphs.captured) >= 2  # a capture per KV bucket, each compiled once
    assert all(options == INDUCTOR_OPTIONS for options, _ in traced)
    assert {k: getattr(inductor_config, k) for k in INDUCTOR_OPTIONS} != INDUCTOR_OPTIONS  # put back after
    # a greedy plain step sums nothing but in the one-row projections, every one of the target's Linear layers
    n_linear = sum(isinstance(m, Linear) for m in tiny_bundle.target.modules())
    assert all(code.count(".sum(") == n_linear for _, code in traced), [c.count(".sum(") for _, c in traced]
