"""The fast path is the path users run: what `specdec decode` and `specdec serve` load (fused projections)."""

import argparse
import sys

import pytest
import torch

from specdec.decoder.engine import Engine
from specdec.decoder.methods import METHODS


@pytest.fixture(scope="module")
def fused_bundle():
    from specdec.zoo import load_bundle

    return load_bundle("tiny", device="cpu", dtype=torch.float32, fuse=True)


def is_fused(module: torch.nn.Module) -> bool:
    """Every attention packs q/k/v and every MLP gate/up; none keeps the separate matmuls."""
    names = {n.rsplit(".", 1)[-1] for n, _ in module.named_modules()}
    return {"qkv_proj", "gate_up_proj"} <= names and not names & {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"}


def cli_args(verb: str, *argv: str) -> argparse.Namespace:
    import importlib

    p = argparse.ArgumentParser()
    importlib.import_module(f"specdec.cli.{verb}").add_arguments(p)
    return p.parse_args(list(argv))


def test_every_part_with_layers_is_fused(fused_bundle):
    for part in ("target", "draft", "mtp", "eagle"):
        assert is_fused(getattr(fused_bundle, part)), part


@torch.no_grad()
def test_fused_logits_equal_unfused_and_transformers(tiny_bundle, fused_bundle, code_prompts):
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([code_prompts[2]])
    ours = fused_bundle.target(ids)[0]
    assert (ours - tiny_bundle.target(ids)[0]).abs().max().item() < 1e-5
    hf = AutoModelForCausalLM.from_pretrained(str(tiny_bundle.paths["target"]), dtype=torch.float32).eval()
    assert (ours - hf(ids).logits).abs().max().item() < 1e-4


@pytest.mark.parametrize("method", list(METHODS))
def test_every_proposer_decodes_the_same_tokens_fused(tiny_bundle, fused_bundle, code_prompts, method):
    """Greedy, a ragged batch: fusing changes no token of any proposer (nor its acceptance)."""
    runs = [Engine(b, method, k=3, cuda_graphs="off").generate(code_prompts, 24) for b in (tiny_bundle, fused_bundle)]
    assert runs[0].tokens == runs[1].tokens
    assert (runs[0].accepted == runs[1].accepted).all()


@pytest.mark.parametrize("verb", ["decode", "serve"])
def test_the_cli_loads_the_fused_model_unless_told_not_to(verb):
    from specdec.cli import fast

    b = fast.load(cli_args(verb), ("draft",), "cpu", torch.float32, draft=None)
    assert is_fused(b.target) and is_fused(b.draft)
    b = fast.load(cli_args(verb, "--no-fuse"), (), "cpu", torch.float32)
    assert not is_fused(b.target) and hasattr(b.target.layers[0].self_attn, "q_proj")


# --- --compile and its persistent cache ---------------------------------------------------------------------

SHAPE = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
             num_key_value_heads=8, head_dim=128, attention_bias=False, tie_word_embeddings=False)


def test_the_cache_key_names_shape_dtype_gpu_and_torch():
    from specdec.decoder.compile_cache import cache_key

    key = cache_key(SHAPE, "bfloat16", "NVIDIA H200", "2.13.0+cu128")
    assert key == cache_key(dict(SHAPE, name="ignored", rope_theta=1.0), "bfloat16", "NVIDIA H200", "2.13.0+cu128")
    assert key.startswith("NVIDIA_H200-torch2.13.0+cu128-bfloat16-L32-H4096-") and "/" not in key
    others = [cache_key(dict(SHAPE, num_hidden_layers=16), "bfloat16", "NVIDIA H200", "2.13.0+cu128"),
              cache_key(dict(SHAPE, vocab_size=32000), "bfloat16", "NVIDIA H200", "2.13.0+cu128"),
              cache_key(dict(SHAPE, tie_word_embeddings=True), "bfloat16", "NVIDIA H200", "2.13.0+cu128"),
              cache_key(SHAPE, "float16", "NVIDIA H200", "2.13.0+cu128"),
              cache_key(SHAPE, "bfloat16", "NVIDIA H100 80GB HBM3", "2.13.0+cu128"),
              cache_key(SHAPE, "bfloat16", "NVIDIA H200", "2.12.0+cu128")]
    assert len({key, *others}) == 7
    # the compile scope: "step" keeps the key it had before scopes existed, "layers" has a folder of its own
    assert cache_key(SHAPE, "bfloat16", "NVIDIA H200", "2.13.0+cu128", "step") == key
    layers = cache_key(SHAPE, "bfloat16", "NVIDIA H200", "2.13.0+cu128", "layers")
    assert layers != key and layers.startswith("NVIDIA_H200-torch2.13.0+cu128-bfloat16-L32-H4096-layers-")


def test_each_row_count_has_its_own_compile_cache():
    """A server of 64 rows failed at start on the folder a server of 16 had written (compile_cache.cache_key's
    docstring): the rows are in the key, read from serve's --max-running-requests and decode's --batch."""
    from types import SimpleNamespace

    from specdec.cli.fast import engine_rows
    from specdec.decoder.compile_cache import cache_key

    assert engine_rows(SimpleNamespace(max_running_requests=64)) == 64
    assert engine_rows(SimpleNamespace(batch=3)) == 3
    keys = {rows: cache_key(SHAPE, "bfloat16", "NVIDIA H200", "2.13.0+cu128", rows=rows) for rows in (16, 64)}
    assert keys[16] != keys[64] and "-R64-" in keys[64]
    assert keys[16] == cache_key(SHAPE, "bfloat16", "NVIDIA H200", "2.13.0+cu128", rows=16)


def test_a_trees_compile_cache_is_its_own():
    """--compile auto reads a folder's presence: a chain's warm folder must not start a tree's minutes of compiling
    unasked (under "step" a tree's drafter compiles too), and a chain's key is the one it always had."""
    from types import SimpleNamespace

    from specdec.cli.fast import drafter_key
    from specdec.decoder.compile_cache import cache_key

    args = lambda **kw: SimpleNamespace(**dict(dict(k=7, topk=1, num_draft_tokens=None, compile_scope="step",  # noqa: E731
                                                    method="eagle"), **kw))
    assert drafter_key(args()) == "" and drafter_key(args(topk=4, compile_scope="layers")) == ""
    tree = drafter_key(args(topk=4, num_draft_tokens=16))
    assert tree == "eagle-tree7x4x16" != drafter_key(args(topk=4, num_draft_tokens=8))
    chain = cache_key(SHAPE, "bfloat16", "NVIDIA H200", "2.13.0+cu128")
    assert cache_key(SHAPE, "bfloat16", "NVIDIA H200", "2.13.0+cu128", "step", "") == chain
    assert tree in cache_key(SHAPE, "bfloat16", "NVIDIA H200", "2.13.0+cu128", "step", tree) != chain


def test_the_cache_lives_where_the_environment_says(tmp_path, monkeypatch):
    import os

    from specdec.decoder import compile_cache
    from specdec.decoder.cuda_graphs import use_cache

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv(compile_cache.CACHE_ENV, raising=False)
    assert compile_cache.cache_root() == tmp_path / "home" / ".cache" / "specdec" / "compile"
    monkeypatch.setenv(compile_cache.CACHE_ENV, str(tmp_path / "c"))
    assert compile_cache.cache_root() == tmp_path / "c"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", os.environ.get("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor")))
    assert use_cache(tmp_path / "c" / "k").is_dir()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "c" / "k")


@pytest.mark.parametrize("mode,device,graphs,cached,expect", [
    ("auto", "cpu", "auto", True, False), ("off", "cuda", "auto", True, False), ("auto", "cuda", "auto", True, True),
    ("auto", "cuda", "auto", False, False), ("auto", "cuda", "off", True, False), ("on", "cuda", "auto", False, True)])
def test_compile_auto_is_on_only_on_a_gpu_whose_cache_holds_the_kernels(mode, device, graphs, cached, expect):
    from specdec.cli.fast import compile_choice

    assert compile_choice(mode, device, graphs, cached) is expect


def test_compile_on_without_a_gpu_is_a_clear_error():
    from specdec.cli.common import UsageError
    from specdec.cli.fast import compile_choice

    with pytest.raises(UsageError, match="--compile on needs a CUDA device"):
        compile_choice("on", "cpu", "auto", True)
    with pytest.raises(UsageError, match="--compile on needs CUDA graphs"):
        compile_choice("on", "cuda", "off", True)


@pytest.mark.parametrize("verb", ["decode", "serve"])
def test_the_cli_says_compile_on_on_a_cpu_in_one_line_and_writes_nothing_home(tmp_path, verb):
    import os
    import subprocess
    import sys

    env = {**os.environ, "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    env.pop("SPECDEC_COMPILE_DIR", None)
    extra = ["--port", "0"] if verb == "serve" else ["--max-new-tokens", "4"]
    r = subprocess.run([sys.executable, "-m", "specdec", verb, "--model", "tiny", "--compile", "on", *extra],
                       capture_output=True, text=True, env=env, timeout=120)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("specdec: no CUDA")]
    assert r.returncode == 2 and len(lines) == 1 and "--compile on needs a CUDA device" in lines[0], r.stderr
    assert not (tmp_path / ".cache" / "specdec" / "compile").exists()


def test_decode_on_a_cpu_runs_uncompiled_by_default(tmp_path):
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    env.pop("SPECDEC_COMPILE_DIR", None)
    r = subprocess.run([sys.executable, "-m", "specdec", "decode", "--model", "tiny", "--max-new-tokens", "8", "--json"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["fused"] is True and out["compiled"] is False and out["compile_scope"] is None
    assert not (tmp_path / ".cache" / "specdec" / "compile").exists()


def test_compiling_says_so_and_how_long(capsys):
    from types import SimpleNamespace

    from specdec.cli.fast import compiling

    ran = []
    compiling(SimpleNamespace(compile_dir="/cache/x"), SimpleNamespace(graphs=SimpleNamespace(compile=True, scope="step")),
              lambda: ran.append(1))
    err = capsys.readouterr().err
    assert ran == [1]
    assert "compiling the decode step (first start on this GPU: up to ~1-2 min a batch width; later starts read the cache " \
        "in /cache/x)" in err
    assert "compiled in" in err
    # a server compiles each of its batch widths: it says how many, and which scope compiles once for all
    compiling(SimpleNamespace(), SimpleNamespace(graphs=SimpleNamespace(compile=True, scope="step")), lambda: None, 5)
    assert "a batch width, 5 widths here: --compile-scope layers compiles once for all" in capsys.readouterr().err
    compiling(SimpleNamespace(), SimpleNamespace(graphs=SimpleNamespace(compile=True, scope="layers")),
              lambda: ran.append(2))
    assert "compiling the decoder layers and LM head" in capsys.readouterr().err
    compiling(SimpleNamespace(), SimpleNamespace(graphs=SimpleNamespace(compile=True, scope="step"), tree=object()),
              lambda: ran.append(2))
    assert "compiling the decode step and the tree's drafter (first start on this GPU: ~0.5-1 min a batch width" in (
        capsys.readouterr().err)
    compiling(SimpleNamespace(), SimpleNamespace(graphs=SimpleNamespace(compile=False, scope=None)), lambda: ran.append(3))
    assert ran == [1, 2, 2, 3] and capsys.readouterr().err == ""


# --- random weights in a model's shape (SGLang's --load-format dummy) ---------------------------------------

def test_the_named_shapes_are_the_meta_models_sizes():
    from specdec.zoo.dummy import shape_config, target_bytes

    assert target_bytes(shape_config("8b")[0], torch.bfloat16) == 2 * 8_030_261_248  # Llama 3.1 8B's parameters
    assert target_bytes(shape_config("1b")[0], torch.bfloat16) == 2 * 1_235_814_400  # Llama 3.2 1B's (tied)


def test_random_weights_take_a_models_shape_and_are_seeded(tiny_bundle):
    from specdec.zoo.dummy import random_bundle

    a, b = random_bundle("tiny"), random_bundle("tiny")
    assert a.target.config.to_hf() == tiny_bundle.target.config.to_hf()
    assert a.mtp is not None and a.eagle is not None and a.heads is not None and a.draft is None
    assert torch.equal(a.target.layers[0].mlp.up_proj.weight, b.target.layers[0].mlp.up_proj.weight)
    assert not torch.equal(a.target.layers[0].mlp.up_proj.weight, tiny_bundle.target.layers[0].mlp.up_proj.weight)
    assert a.tokenizer.decode(a.tokenizer("hello")["input_ids"]) == "hello"


def test_random_weights_say_what_they_cannot_do():
    from specdec.zoo import ModelNotFound
    from specdec.zoo.dummy import random_bundle

    with pytest.raises(ModelNotFound, match="without a draft model"):
        random_bundle("8b", ("draft",))
    with pytest.raises(ModelNotFound, match="the target alone needs 29.9 GiB in float32; cpu has 1.0 GiB free"):
        random_bundle("8b", (), free=2**30)  # a machine of 1 GiB: the 8B shape is refused, never allocated


def test_serve_answers_from_random_weights():
    import requests
    from test_serve_robust import start_serve, stop_group

    p, url = start_serve("--random-weights", "tiny", "--port", "0", "--speculative-algorithm", "mtp", "--k", "2")
    try:
        r = requests.post(f"{url}/generate", json={"text": "def main(", "sampling_params": {
            "max_new_tokens": 12, "temperature": 0, "ignore_eos": True}}, timeout=60)
        assert r.status_code == 200, r.text
        out = r.json()
        assert len(out["output_ids"]) == 12 and out["meta_info"]["spec_verify_ct"] >= 1
        info = requests.get(f"{url}/server_info", timeout=30).json()
        assert info["speculative_algorithm"] == "EAGLE" and info["specdec_method"] == "mtp"  # SGLang's name, ours
    finally:
        stop_group(p)


@pytest.mark.parametrize("compiled,expect", [(False, [1, 1]), (True, [1, 1, 2, 4, 8, 12])])
def test_a_compiled_server_warms_every_width_before_it_listens(compiled, expect):
    """Engine.width rounds the running rows up to a power of two, capped at the capacity: each is a capture, which
    compiled costs seconds; they are made at the start, not while the first clients wait."""
    from types import SimpleNamespace

    from specdec.serving.server.engine_process import warm_up

    batches = []
    engine = SimpleNamespace(device=torch.device("cuda"), capacity=12, graphs=SimpleNamespace(compile=compiled),
                             generate=lambda prompts, **kw: batches.append(len(prompts)), policy=None)
    warm_up(engine)
    assert batches == expect


def test_a_server_with_adaptive_k_warms_every_k_and_forgets_the_warm_ups_times():
    """Adaptive k runs each k `tries` steps at a new width before its times decide: the warm-up's greedy requests are
    long enough for every k to run (each a capture), and the policy then forgets those steps' times."""
    from types import SimpleNamespace

    from specdec.decoder.adaptive import AdaptiveK
    from specdec.serving.server.engine_process import warm_up

    policy, budgets = AdaptiveK(3, tries=3), []
    policy.timed(1, 0, 1.0)
    engine = SimpleNamespace(device=torch.device("cuda"), capacity=2, graphs=SimpleNamespace(compile=True),
                             generate=lambda prompts, **kw: budgets.append(kw["max_new_tokens"]), policy=policy,
                             max_len=512, block=4)
    warm_up(engine)
    assert budgets[0] == budgets[-1] == 3 * (1 + 2 + 3 + 4) + 1  # every k's steps, each keeping up to k + 1 tokens
    assert policy.runs == {} and policy.seconds == {}


@pytest.mark.parametrize("moved", [False, True])
def test_a_reloaded_kernel_keeps_the_config_an_earlier_start_tuned(monkeypatch, moved):
    """pytorch/pytorch#172819 as torch 2.11 has it: its recheck ignores the autotune cache for a one-config kernel, so
    run() tunes the kernel again (coordinate descent) at every warm start. keep_tuned_configs makes the reloaded kernel
    take the cached, tuned config: marked when it is the heuristic one, compiled when the tuner moved off it."""
    import importlib
    from types import SimpleNamespace

    from specdec.decoder import cuda_graphs

    th = importlib.import_module("torch._inductor.runtime.triton_heuristics")
    heuristic = SimpleNamespace(kwargs={"XBLOCK": 64}, name="heuristic")
    tuned = SimpleNamespace(kwargs={"XBLOCK": 128 if moved else 64}, name="tuned", found_by_coordesc=True)
    monkeypatch.setattr(th.CachingAutotuner, "recheck_autotune_cache", lambda self, reload: None)  # 2.11: nothing
    monkeypatch.setattr(th, "check_autotune_cache", lambda configs, filename, meta: (
        [tuned], None, {"autotune_cache_state": "hit"}) if filename == "k.py" else (configs, None, {}))
    monkeypatch.setattr(th, "triton_config_to_hashable", lambda c: tuple(sorted(c.kwargs.items())))
    kernel = SimpleNamespace(compile_results=[SimpleNamespace(config=heuristic)], filename="k.py",
                             inductor_meta={"coordinate_descent_tuning": True}, fn=SimpleNamespace(fn=None))
    kernel._precompile_config = lambda c: SimpleNamespace(config=c)
    reload = lambda: SimpleNamespace(fn="the kernel's source")  # noqa: E731
    th.CachingAutotuner.recheck_autotune_cache(kernel, reload)  # the planted bug: the tuned config is not taken
    assert not getattr(kernel.compile_results[0].config, "found_by_coordesc", False)

    assert cuda_graphs.keep_tuned_configs() and cuda_graphs.keep_tuned_configs()  # twice: wrapped once
    assert th.CachingAutotuner.recheck_autotune_cache.keeps_tuned
    th.CachingAutotuner.recheck_autotune_cache(kernel, reload)
    config = kernel.compile_results[0].config
    assert config.found_by_coordesc and config.kwargs["XBLOCK"] == (128 if moved else 64)
    assert (config is tuned and kernel.fn == "the kernel's source") if moved else (config is heuristic)
    never = SimpleNamespace(compile_results=[SimpleNamespace(config=heuristic)], filename="other.py",
                            inductor_meta={"coordinate_descent_tuning": True}, fn=None)
    th.CachingAutotuner.recheck_autotune_cache(never, reload)  # never tuned: left for run() to tune
    assert never.compile_results[0].config is heuristic


def test_pinned_tile_sizes_reach_torchs_autotune_cache_in_another_folder(tmp_path, monkeypatch):
    """A tuning torch saved in one compile cache, collected (compile_cache.collect_tuned), pinned for a GPU kind and
    installed into a fresh folder by use_cache, is what torch's own autotune cache reads there for a kernel of the
    same source: the fresh compile takes the pinned tile sizes instead of tuning. (CPU: a stand-in for Triton's
    Config; torch's cache code is the real one.)"""
    import json
    from types import SimpleNamespace

    from torch._inductor.runtime.autotune_cache import AutotuneCache

    from specdec.decoder import compile_cache, cuda_graphs

    def config(block):
        return SimpleNamespace(kwargs={"XBLOCK": block, "R0_BLOCK": 128}, num_warps=4, num_stages=1)

    candidates = [config(32), config(64), config(128)]
    meta = {"autotune_local_cache": True, "coordinate_descent_tuning": False}
    kernel = "xy/cxyz0123.py"  # a kernel's source file, by path inside the cache (its name hashes its source)

    def cache_for(folder):
        (folder / "xy").mkdir(parents=True, exist_ok=True)
        return AutotuneCache.create(meta, str(folder / kernel), "candidates-hash")

    cache_for(tmp_path / "first").save(candidates[1], 5_000_000_000)  # the first compile tuned XBLOCK 64
    tuned = compile_cache.collect_tuned(tmp_path / "first")
    assert len(tuned) == 1 and next(iter(tuned.values()))["XBLOCK"] == 64
    assert "time_taken_ms" not in next(iter(tuned.values()))
    assert cache_for(tmp_path / "fresh").read_best(meta, candidates) is None  # a fresh folder: torch would tune

    gpu, triton_version = "NVIDIA H200", "3.6.0"
    pins = tmp_path / "tuned"
    pins.mkdir()
    (pins / compile_cache.tuned_name(gpu, torch.__version__, triton_version)).write_text(
        json.dumps({"configs": tuned}))
    monkeypatch.setattr(compile_cache, "TUNED_DIR", pins)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: gpu)
    monkeypatch.setitem(sys.modules, "triton", SimpleNamespace(__version__=triton_version))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # use_cache sets it; restored after
    cuda_graphs.use_cache(tmp_path / "fresh")
    assert cache_for(tmp_path / "fresh").read_best(meta, candidates) is candidates[1]
    assert compile_cache.install_tuned(tmp_path / "fresh", tuned) == 0  # already in place: nothing written

    monkeypatch.setenv(compile_cache.TUNED_ENV, "off")  # to measure without them, or to pin new ones
    assert compile_cache.pinned_tuned(gpu, torch.__version__, triton_version) == {}
    monkeypatch.delenv(compile_cache.TUNED_ENV)
    assert compile_cache.pinned_tuned("NVIDIA H100 80GB HBM3", torch.__version__, triton_version) == {}  # another kind
    with pytest.raises(ValueError, match="not a path inside"):
        compile_cache.install_tuned(tmp_path / "fresh", {"../../etc/x.best_config": {}})
