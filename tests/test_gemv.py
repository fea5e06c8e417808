"""The one-row projections' split kernel (decoder/gemv.py). Its CPU twin is gemv.reference_partials: the same
partial dot products written out in torch. On the CPU the model never takes the kernel (no Triton, no GPU); the
dispatch is tested here with the twin standing in, and the kernel itself against the twin on a GPU."""

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from specdec.decoder import gemv
from specdec.decoder import model as model_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available() or gemv.triton is None,
                               reason="needs CUDA and Triton; the CPU twin: reference_partials (below)")


@pytest.mark.parametrize("tile", [gemv.Tile(1, 16, 1), gemv.Tile(4, 16, 4), gemv.Tile(8, 32, 2)])
def test_the_partials_sum_to_the_product(tile):
    torch.manual_seed(0)
    w, x = torch.randn(64, 256), torch.randn(1, 1, 256)
    parts = gemv.reference_partials(x, w, tile)
    assert parts.shape == (tile.splits, 64) and parts.dtype == torch.float32
    torch.testing.assert_close(parts.sum(0), F.linear(x, w).flatten(), rtol=1e-5, atol=1e-5)
    # each split is the dot product over its own slice of K
    k = 256 // tile.splits
    torch.testing.assert_close(parts[-1], F.linear(x[..., -k:], w[:, -k:]).flatten(), rtol=1e-5, atol=1e-5)


def test_a_tile_fits_only_a_weight_it_cuts_evenly():
    tile = gemv.Tile(rows=4, chunk=512, splits=8)
    assert tile.fits(4096, 8192)
    assert not tile.fits(4098, 8192)  # rows
    assert not tile.fits(4096, 14336)  # 14336 is not a multiple of 8 x 512


def test_the_cpu_takes_no_kernel(monkeypatch):
    saved = dict(gemv.TILES)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU, also on a GPU machine
    try:
        assert gemv.load() == {}  # no GPU: no tiles, whatever the tuned file holds
    finally:
        gemv.TILES.clear()
        gemv.TILES.update(saved)
    assert gemv.tile_for(torch.randn(1, 64), torch.randn(32, 64)) is None
    assert model_mod.KERNEL_GEMV  # on by default: a GPU with tuned tiles takes the kernel


def test_the_tuned_file_is_read_back_by_gpu(tmp_path):
    path = tmp_path / "gemv.json"
    gemv.record("GPU A", {(4096, 14336): gemv.Tile(2, 512, 4, 8, 3)}, path)
    gemv.record("GPU B", {(64, 64): gemv.Tile(1, 64, 1)}, path)
    table = json.loads(path.read_text())
    assert set(table) == {"GPU A", "GPU B"}  # a second GPU's record keeps the first's
    saved = gemv.TUNED
    try:
        gemv.TUNED = path
        assert gemv.tuned("GPU A") == {(4096, 14336): gemv.Tile(2, 512, 4, 8, 3)}
        assert gemv.tuned("GPU C") == {}
    finally:
        gemv.TUNED = saved


@pytest.mark.parametrize("tile", [gemv.Tile(1, 16, 1), gemv.Tile(4, 16, 4)])
def test_gated_partials_apply_silu_gate_times_up(tile):
    """gated: x is [gate | up] and the product is silu(gate) * up times W^T (the MLP's down projection)."""
    torch.manual_seed(0)
    w, gate_up = torch.randn(64, 256), torch.randn(1, 1, 512)
    gate, up = gate_up.chunk(2, dim=-1)
    parts = gemv.reference_partials(gate_up, w, tile, gated=True)
    torch.testing.assert_close(parts.float().sum(0), F.linear(F.silu(gate) * up, w).flatten(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gated", [True, False])
def test_a_fused_mlp_gives_down_its_gate_and_up(monkeypatch, gated):
    """A fused MLP hands [gate | up] to down_proj with gated=True: compiled at one row with the twin standing in for
    the kernel, and eager, it equals the unfused MLP (silu(gate) * up, then down). The kernel takes [gate | up] only
    where the down projection's tile is gated; with another tile it gets silu(gate) * up, computed before it."""
    from specdec.decoder.model import MLP, ModelConfig
    monkeypatch.setattr(gemv, "runs_on", lambda x: x.numel() == x.shape[-1])
    seen = []
    monkeypatch.setattr(gemv, "partials", lambda x, w, tile, gated=False: seen.append((tuple(x.shape), gated))
                        or gemv.reference_partials(x, w, tile, gated))
    monkeypatch.setattr(gemv, "TILES", {(64, 96): gemv.Tile(4, 16, 2, gated=gated)})
    cfg = ModelConfig(vocab_size=32, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, model_type="llama")
    torch.manual_seed(0)
    mlp = MLP(cfg)
    x1, x3 = torch.randn(1, 1, 64), torch.randn(1, 3, 64)
    ref1, ref3 = mlp(x1), mlp(x3)  # unfused, eager
    mlp.fuse()
    torch._dynamo.reset()
    f = torch.compile(mlp, backend="eager", dynamic=False)
    torch.testing.assert_close(f(x1), ref1, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(f(x3), ref3, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mlp(x1), ref1, rtol=1e-5, atol=1e-5)
    # the one-row down projection only: handed [gate | up] with a gated tile, silu(gate) * up with another
    assert seen == ([((1, 1, 192), True)] if gated else [((1, 1, 96), False)])
    torch._dynamo.reset()


def test_the_committed_tiles_fit_their_shapes():
    """Every tile in the committed file cuts its own weight shape evenly (else it would never run)."""
    if not gemv.TUNED.exists():
        pytest.skip("no GPU measured yet")
    for gpu, shapes in json.loads(gemv.TUNED.read_text()).items():
        for key, tile in shapes.items():
            n, k = (int(v) for v in key.split("x"))
            assert gemv.Tile(**tile).fits(n, k), (gpu, key, tile)


def test_a_compiled_linear_of_a_tuned_shape_takes_the_split_kernel(monkeypatch):
    """The dispatch in model.Linear, on the CPU with the kernel pretended present (the twin in its place): a compiled
    one-row product of a tuned weight shape runs as partials summed; other shapes, several rows, eager calls and
    KERNEL_GEMV off keep their paths; every answer equals F.linear."""
    calls = []

    def twin(x, w, tile, gated=False):
        calls.append((tuple(w.shape), tile))
        return gemv.reference_partials(x, w, tile, gated)

    monkeypatch.setattr(gemv, "runs_on", lambda x: x.numel() == x.shape[-1])
    monkeypatch.setattr(gemv, "partials", twin)
    tile = gemv.Tile(rows=4, chunk=32, splits=2)
    monkeypatch.setattr(gemv, "TILES", {(48, 64): tile})
    torch.manual_seed(0)
    tuned, other = model_mod.Linear(64, 48, bias=True), model_mod.Linear(64, 40, bias=False)
    x1, x3 = torch.randn(1, 1, 64), torch.randn(1, 3, 64)
    for lin in (tuned, other):
        torch._dynamo.reset()
        f = torch.compile(lin, backend="eager", dynamic=False)
        torch.testing.assert_close(f(x1), F.linear(x1, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(f(x3), F.linear(x3, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
    assert calls == [((48, 64), tile)]  # the tuned shape's one-row call only
    tuned(x1)  # eager: no kernel
    monkeypatch.setattr(model_mod, "KERNEL_GEMV", False)
    torch._dynamo.reset()
    torch.compile(tuned, backend="eager", dynamic=False)(x1)
    assert len(calls) == 1
    torch._dynamo.reset()


def test_the_sweep_pins_only_tiles_that_beat_inductor(tmp_path):
    """benchmarks/gpu_gemv.py's choice: a weight whose best tile is not `margin` faster than inductor's reduction keeps
    the reduction, and only the weights asked for are pinned."""
    import gpu_gemv

    def row(n, k, ours, inductor):
        best = {"us": ours, "tile": gemv.Tile(2, 64, 4).__dict__}
        return {"N": n, "K": k, "inductor": {"us": inductor}, "best": best}

    results = {"shapes": {"8b": {"o": row(64, 512, 9.0, 12.0), "down": row(64, 1024, 11.8, 12.0),
                                 "qkv": row(96, 512, 5.0, 10.0)}}}
    assert gpu_gemv.best_tiles(results, ("o", "down"), 0.03) == {(64, 512): gemv.Tile(2, 64, 4)}


def test_the_sweep_runs_on_the_cpu(tmp_path):
    """The sweep's procedure end to end on the smoke shapes (the twin timed in the kernel's place), recording into a
    tuned file of its own."""
    import gpu_gemv

    tuned = tmp_path / "gemv.json"
    assert gpu_gemv.main(["--out", str(tmp_path / "g.json"), "--shapes", "8b", "--record", "--margin", "-10",
                          "--tuned", str(tuned), "--cpu"]) == 0
    doc = json.loads((tmp_path / "g.json").read_text())
    rows = doc["shapes"]["8b"]
    assert set(rows) == set(gpu_gemv.WEIGHTS)
    for r in rows.values():
        assert r["cublas"]["max_err"] < 1e-3 and r["inductor"]["max_err"] < 1e-3
        assert r["best"] and all(t["max_err"] < 1e-3 for t in r["tiles"])
    # a margin of -10 pins every weight's best tile (the procedure, not a speed)
    assert len(json.loads(tuned.read_text())["cpu"]) == len({(r["N"], r["K"]) for r in rows.values()})


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernel_computes_its_twin_on_gpu(dtype):
    torch.manual_seed(0)
    w = torch.randn(4096, 2048, device="cuda", dtype=dtype) * 0.02
    x = torch.randn(1, 1, 2048, device="cuda", dtype=dtype)
    tol = 1e-4 if dtype == torch.float32 else 1e-2  # one split's product is rounded to bf16: an ulp apart at most
    gate_up = torch.randn(1, 1, 4096, device="cuda", dtype=dtype)  # the MLP's [gate | up] for K = 2048
    for tile in (gemv.Tile(1, 256, 1), gemv.Tile(4, 512, 4, 8, 3), gemv.Tile(16, 128, 2, 4, 1)):
        torch.testing.assert_close(gemv.partials(x, w, tile), gemv.reference_partials(x, w, tile), rtol=tol, atol=tol)
        torch.testing.assert_close(gemv.partials(gate_up, w, tile, gated=True),
                                   gemv.reference_partials(gate_up, w, tile, gated=True), rtol=tol, atol=tol)


@needs_gpu
def test_a_compiled_linear_takes_the_kernel_on_gpu(monkeypatch):
    """model.Linear compiled by inductor with a tile for its shape: the kernel runs inside the compiled graph and the
    result equals F.linear in fp32."""
    lin = model_mod.Linear(2048, 4096, bias=False).cuda()
    tile = gemv.Tile(4, 256, 4, 4, 3)
    monkeypatch.setattr(gemv, "TILES", {(4096, 2048): tile})
    calls = []
    real = gemv.partials
    monkeypatch.setattr(gemv, "partials", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = torch.randn(1, 1, 2048, device="cuda")
    torch._dynamo.reset()
    y = torch.compile(lin, dynamic=False)(x)
    torch.testing.assert_close(y, F.linear(x, lin.weight), rtol=1e-4, atol=1e-4)
    assert calls
    torch._dynamo.reset()


@needs_gpu
def test_a_compiled_model_of_tuned_shapes_computes_the_eager_logits_on_gpu(monkeypatch):
    """One layer of the 8B shape in fp32 (whose projections this GPU may have tiles for, in tuned/gemv.json): the
    compiled one-token forward, with every tuned projection through the kernel, equals the eager forward."""
    from specdec.decoder.kv_cache import KVCache
    from specdec.decoder.model import ModelConfig, Transformer, fuse_projections

    cfg = ModelConfig(vocab_size=4096, hidden_size=4096, intermediate_size=14336, num_hidden_layers=1,
                      num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=2048, model_type="llama")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = fuse_projections(Transformer(cfg).eval())
    gemv.load()
    shapes = {tuple(m.weight.shape) for m in model.modules() if isinstance(m, model_mod.Linear)}
    if not shapes & set(gemv.TILES):
        pytest.skip(f"no tuned tiles for this model's shapes on {torch.cuda.get_device_name()}")
    calls = []
    real = gemv.partials
    monkeypatch.setattr(gemv, "partials", lambda x, w, tile, gated=False: calls.append(tuple(w.shape))
                        or real(x, w, tile, gated))
    ids = torch.randint(0, 4096, (1, 8), device="cuda")
    with torch.no_grad():
        cache = KVCache.for_model(model, 1, 64).rows(0, 1, 64)
        model(ids[:, :7], torch.arange(7, device="cuda")[None], cache)
        pos = torch.tensor([[7]], device="cuda")
        eager = model(ids[:, 7:], pos, cache)[0]
        torch._dynamo.reset()
        compiled = torch.compile(lambda i, p: model(i, p, cache)[0], dynamic=False)(ids[:, 7:], pos)
    torch._dynamo.reset()
    assert set(calls) == shapes & set(gemv.TILES)  # every tuned shape went through the kernel
    torch.testing.assert_close(compiled, eager, rtol=1e-3, atol=1e-3)
