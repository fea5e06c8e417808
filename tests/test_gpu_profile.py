"""benchmarks/gpu_profile.py runs only on a GPU; on the CPU, what can rot without one: its arguments are
checked before any work, and each candidate it swaps in is put back afterwards."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import gpu_profile  # noqa: E402

import specdec.decoder.cuda_graphs as graphs_mod  # noqa: E402
import specdec.decoder.model as model_mod  # noqa: E402
from specdec.decoder.kv_cache import KVCache  # noqa: E402
from specdec.decoder.step import Rows  # noqa: E402


def test_an_unknown_variant_is_refused_before_any_work(tmp_path, capsys):
    code, err = refused(["--out", str(tmp_path / "p.json"), "--variants", "compile+cdt; realize_opcount 8"], capsys)
    assert code == 2 and "unknown variant 'realize_opcount 8'" in err
    assert not list(tmp_path.iterdir())


def refused(argv: list[str], capsys) -> tuple[int, str]:
    """gpu_profile's main(argv) in this process (on a CPU it would fail at the first CUDA call if it got that far):
    (exit status, stderr)."""
    with pytest.raises(SystemExit) as stop:
        gpu_profile.main(argv)
    return stop.value.code, capsys.readouterr().err


def test_every_swap_is_put_back():
    import torch._inductor.config as inductor_config

    saved = (model_mod.DECODE_ROWS, model_mod.Linear.forward, Rows.sampling, dict(graphs_mod.INDUCTOR_OPTIONS),
             torch.nn.functional.linear, inductor_config.coordinate_descent_tuning, model_mod.KERNEL_ATTENTION,
             model_mod.ROPE_IN_KERNEL, model_mod.RMSNorm.forward, model_mod.KERNEL_GEMV, model_mod.ROPE_ONCE)
    with gpu_profile.Swap(sdpa=True, cublas=True, sampling_path=True, cdt=True, linear=lambda *a: None,
                          inductor={"realize_opcount_threshold": 8}, kernel_attention=False, rope_in_kernel=True,
                          norm_apart=True, gemv=not model_mod.KERNEL_GEMV, rope_once=not model_mod.ROPE_ONCE):
        assert model_mod.DECODE_ROWS == 0 and model_mod.Linear.forward is gpu_profile.cublas_forward
        assert not model_mod.KERNEL_ATTENTION  # the written-out attention, even on a GPU
        assert model_mod.ROPE_IN_KERNEL and model_mod.RMSNorm.forward is gpu_profile.norm_apart_forward
        assert model_mod.KERNEL_GEMV is not saved[-2] and model_mod.ROPE_ONCE is not saved[-1]
        assert graphs_mod.INDUCTOR_OPTIONS == {"coordinate_descent_tuning": True, "realize_opcount_threshold": 8}
        rows = Rows.empty(KVCache(1, 2, 1, 4, 8), 8, 1)
        rows.sampling = False
        assert rows.sampling  # the sampling path, whatever the engine sets
    assert saved == (model_mod.DECODE_ROWS, model_mod.Linear.forward, Rows.sampling, graphs_mod.INDUCTOR_OPTIONS,
                     torch.nn.functional.linear, inductor_config.coordinate_descent_tuning, model_mod.KERNEL_ATTENTION,
                     model_mod.ROPE_IN_KERNEL, model_mod.RMSNorm.forward, model_mod.KERNEL_GEMV, model_mod.ROPE_ONCE)


def test_an_unknown_part_or_a_compiled_variant_that_is_not_a_plain_step_is_refused(tmp_path, capsys):
    for extra, said in ((["--parts", "host,hosts"], "unknown part 'hosts'"),
                        (["--parts", "compiled", "--compiled-variants", "graph"], "'graph' is not one"),
                        (["--fresh-repeat", "-1"], "--fresh-repeat takes a number of compiles >= 1")):
        code, err = refused(["--out", str(tmp_path / "p.json"), *extra], capsys)
        assert code == 2 and said in err, err
    assert not list(tmp_path.iterdir())


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")  # eager on purpose: the CPU's twin
def test_every_attention_candidate_computes_the_written_out_attention():
    """The candidates the attention part times on a GPU (FlexAttention's two maskings among them), run eager on the
    CPU over a decode step's folded query rows: each equals model.attention, the reference, and a candidate that
    ignored the mask would not."""
    torch.manual_seed(0)
    nkv, g, T, S, d = 2, 4, 2, 48, 16
    q, k, v = torch.randn(1, nkv, g * T, d), torch.randn(1, nkv, S, d), torch.randn(1, nkv, S, d)
    pos = 30 + torch.arange(T)
    mask = (torch.arange(S) <= pos.view(T, 1)).repeat(g, 1).view(1, 1, g * T, S)  # rows (head in group, token)
    ref = model_mod.attention(q, k, v, mask)
    cands = gpu_profile.attention_candidates(mask)
    assert {"manual", "manual_compiled", "flex_score_mod", "flex_block_mask", "sdpa_auto"} <= set(cands)
    for name, f in cands.items():
        if name in ("sdpa_cudnn", "sdpa_efficient"):  # kernels of a CUDA build only
            continue
        assert torch.allclose(f(q, k, v), ref, atol=1e-5), name
    assert not torch.allclose(model_mod.attention(q, k, v, torch.ones_like(mask)), ref, atol=1e-3)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_the_flex_variant_decodes_as_the_written_out_attention(tiny_bundle):
    """The step variant with FlexAttention in model.attention's place (what the GPU run compiles) decodes the zoo's
    prompt greedily to the same tokens as the written-out attention, on the CPU, eager; and the swap is put back."""
    from specdec.decoder.engine import Engine

    prompt = tiny_bundle.tokenizer("def main(argv):\n")["input_ids"]
    run = lambda: Engine(tiny_bundle, "mtp", k=3, max_batch=1, max_len=96).generate([prompt], 24)  # noqa: E731
    plain = run()
    kw = gpu_profile.VARIANTS["compile+cdt, realize_opcount 8, flex attention"][0]
    with gpu_profile.Swap(decode_attention=kw["decode_attention"]):
        assert model_mod.attention is gpu_profile.flex_attention_masked
        flexed = run()
    assert model_mod.attention is not gpu_profile.flex_attention_masked
    assert flexed.tokens == plain.tokens and len(plain.tokens[0]) == 24


def test_a_norm_kept_apart_computes_the_norm_and_stays_one_op_when_compiled():
    """The "norms apart" variants' RMSNorm: the same numbers as model.RMSNorm, and under torch.compile an op of its own
    in the traced graph (not decomposed into the multiplies inductor would fuse into the next matmul)."""
    torch.manual_seed(0)
    norm = model_mod.RMSNorm(64, 1e-5)
    norm.weight.data.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, 64)
    torch.testing.assert_close(gpu_profile.norm_apart_forward(norm, x), norm(x), rtol=0, atol=0)
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch.compile(lambda t: gpu_profile.norm_apart_forward(norm, t) @ torch.ones(64, 8), backend=backend)(x)
    torch._dynamo.reset()
    assert any("specdec_bench.rms_norm" in t for t in seen) and not any("rms_norm.default" in t and "aten" in t for t in seen), seen


def test_a_fresh_repeat_runs_each_compile_in_its_own_process_with_empty_caches(tmp_path, capsys):
    """--fresh-repeat's loop on the CPU, its child processes played by a stand-in: interleaved A B A B, each with its
    own empty cache folders, every run's entries gathered into one JSON and the children's files removed."""
    calls = []

    def fake_run(cmd, env):
        calls.append((cmd, env["TORCHINDUCTOR_CACHE_DIR"], env["TRITON_CACHE_DIR"]))
        assert not any(Path(env["TORCHINDUCTOR_CACHE_DIR"]).parent.iterdir())  # nothing cached before it
        out = Path(cmd[cmd.index("--out") + 1])
        name = cmd[cmd.index("--variants") + 1]
        ms = 4.5 + len(calls) / 100
        out.write_text(json.dumps({"env": {"device": "stand-in"}, "sections": {"variants": [
            {"shape": "8b", "variant": name, "ms": ms}]}}))
        out.with_suffix(".log").write_text("log\n")
        return subprocess.CompletedProcess(cmd, 0)

    out = tmp_path / "repeat.json"
    assert gpu_profile.fresh_repeat(["A", "B"], "8b", 2, out, 100.0, run=fake_run) == 0
    assert [c[0][c[0].index("--variants") + 1] for c in calls] == ["A", "B", "A", "B"]
    assert len({c[1] for c in calls}) == 4 and len({c[2] for c in calls}) == 4  # a fresh cache for each compile
    assert all("--parts" in c[0] and c[0][c[0].index("--parts") + 1] == "variants" for c in calls)
    doc = json.loads(out.read_text())
    assert [(r["compile"], r["variant"]) for r in doc["runs"]] == [(1, "A"), (1, "B"), (2, "A"), (2, "B")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repeat.json"]
    assert "A: 4.510, 4.530 ms (spread 0.4%)" in capsys.readouterr().out
