"""Regional compilation (specdec/decoder/regions.py, `Engine(compile="layers")`): one decoder layer traced once for
every layer, the LM head one more region, the rest of the step eager inside the (here emulated) CUDA graph; and the
`--compile-scope` flag. Most tests swap in a backend that records what dynamo traced and runs it as traced (no
inductor); one compiles with inductor's C++ backend for real."""

import pytest
import torch

from specdec.decoder.cuda_graphs import INDUCTOR_OPTIONS, Graphs, compile_scope
from specdec.decoder.engine import Engine
from specdec.decoder.kv_cache import KVCache
from specdec.decoder.model import Linear, ModelConfig, Transformer
from specdec.decoder.regions import Regions


def region_of(gm: torch.fx.GraphModule) -> str:
    """Which region a traced graph is, read off its inputs (dynamo names a module's parameters by their path)."""
    names = " ".join(n.name for n in gm.graph.nodes if n.op == "placeholder")
    if "self_attn" in names:
        return "layer"
    return "head" if "norm" in names else "logits"


@pytest.fixture
def traces(monkeypatch):
    """Every graph dynamo traces from here on, as (region, inductor's options while it traced, code); the backend
    runs the traced graph as is, and fullgraph=True makes a graph break an error."""
    import torch._dynamo
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()  # no earlier test's traces of the same methods
    seen, real_compile = [], torch.compile

    def record(gm, example_inputs):
        seen.append((region_of(gm), {k: getattr(inductor_config, k) for k in INDUCTOR_OPTIONS}, gm.code))
        return gm.forward

    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, backend=record, fullgraph=True, **kw))
    yield seen
    torch._dynamo.reset()


def small_model(layers: int = 3) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2)
    return Transformer(cfg).eval()


@torch.no_grad()
def test_one_trace_serves_every_layer_and_a_new_shape_adds_one_layer_and_one_head(traces):
    model, regions = small_model(layers=3), Regions()

    def step(width: int, T: int, span: int):
        """The model's forward over T tokens of `width` rows, eager and with its regions compiled, on equal caches."""
        ids = torch.randint(0, 64, (width, T))
        pos = torch.arange(T).expand(width, T) + 5
        eager, compiled = (KVCache.for_model(model, width, 32).rows(0, width, span) for _ in range(2))
        want = model(ids, pos, eager)
        with regions.active():
            got = model(ids, pos, compiled)
        # close, not equal: traced, a one-row Linear is a multiply-and-sum, not the eager matmul
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(want, got))
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(eager.k + eager.v, compiled.k + compiled.v))

    step(width=1, T=1, span=16)
    assert [r for r, _, _ in traces] == ["layer", "head"]  # 3 layers, one trace
    step(width=1, T=1, span=16)
    assert len(traces) == 2  # the same shapes: nothing traced again
    step(width=2, T=1, span=16)  # a new width
    step(width=2, T=4, span=16)  # a verify block
    step(width=2, T=4, span=32)  # a new KV bucket: the layers read more slots, the head is the same
    assert [r for r, _, _ in traces[2:]] == ["layer", "head", "layer", "head", "layer"]
    # inductor tunes a trace's kernels by coordinate descent only where it reads one token (regions.tunes)
    assert [opts["coordinate_descent_tuning"] for _, opts, _ in traces] == [True, True] + [False] * 5


@torch.no_grad()
def test_outside_an_active_regions_a_region_runs_as_written(traces):
    model = small_model()
    model(torch.zeros(1, 3, dtype=torch.long))  # training-style forward: no cache, nothing compiled
    assert traces == []


def test_compile_scope_names_what_is_compiled():
    assert [compile_scope(c) for c in (False, None, True, "step", "layers")] == [None, None, "step", "step", "layers"]
    with pytest.raises(ValueError, match="step, layers"):
        compile_scope("whole")
    g = Graphs("emulate", compile="layers")
    assert g.compile and g.scope == "layers" and isinstance(g.regions, Regions)
    assert Graphs("emulate", compile=True).regions is None


@pytest.mark.parametrize("method,topk", [("ar", 1)] + [pytest.param(m, t, marks=pytest.mark.slow)  # 3 s each
                                                         for m, t in (("eagle", 1), ("mtp", 1), ("mtp", 2))])
def test_regional_compiled_greedy_decoding_equals_eager(tiny_bundle, code_prompts, traces, method, topk):
    """Layers and heads compiled (target and drafter), the rest eager in the emulated graphs, KV buckets crossed:
    eager's tokens. Each capture of the target adds at most one layer and one head trace (the tiny target has 4
    layers), and every trace ran with inductor's options set."""
    prompts = code_prompts if method == "ar" else code_prompts[:1]
    # the 9-token prompt alone: 16 new tokens cross from the bucket of 16 into 32 (30 reached 64 too, a capture and
    # its traces more that showed nothing new)
    n = 30 if method == "ar" else 16
    eager = Engine(tiny_bundle, method, k=3, topk=topk, cuda_graphs="off").generate(prompts, max_new_tokens=n).tokens
    e = Engine(tiny_bundle, method, k=3, topk=topk, cuda_graphs="emulate", compile="layers", min_span=8)
    assert e.proposer is None or e.proposer.graphs.regions is e.graphs.regions  # one Regions for the engine
    assert e.generate(prompts, max_new_tokens=n).tokens == eager
    assert len({span for _, span, _, _ in e.graphs.captured}) >= 2  # crossed a bucket
    layers = sum(r == "layer" for r, _, _ in traces)
    assert tiny_bundle.target.config.num_hidden_layers == 4 and layers < 4 * len(e.graphs.captured)
    if method == "ar":  # the target alone: a layer trace per (width, bucket), one head trace per width
        assert layers == len(e.graphs.captured) and sum(r == "head" for r, _, _ in traces) == 1
    else:  # the drafter's layer and the LM head read through `Transformer.logits` were compiled too
        assert {"layer", "head", "logits"} <= {r for r, _, _ in traces}
    # inductor's options held in every trace; tuned where the trace reads one token (regions.tunes), else not
    assert all(options == {**INDUCTOR_OPTIONS, "coordinate_descent_tuning": options["coordinate_descent_tuning"]}
               for _, options, _ in traces)


def test_a_one_row_layer_takes_the_linear_fast_path_inside_its_region(tiny_bundle, code_prompts, traces):
    """At one row each projection of a compiled layer and the LM head is `Linear`'s multiply-and-sum."""
    e = Engine(tiny_bundle, "ar", cuda_graphs="emulate", compile="layers")
    e.generate(code_prompts[:1], max_new_tokens=4)
    per_layer = sum(isinstance(m, Linear) for m in tiny_bundle.target.layers[0].modules())
    assert [(r, code.count(".sum(")) for r, _, code in traces] == [("layer", per_layer), ("head", 1)]


@pytest.mark.slow  # inductor compiles C++ for a layer and the head: about 20 s on a cold cache
def test_regional_compile_with_inductor_decodes_as_eager(tiny_bundle, code_prompts):
    import torch._dynamo

    torch._dynamo.reset()
    eager = Engine(tiny_bundle, "ar", cuda_graphs="off").generate(code_prompts[:1], max_new_tokens=16).tokens
    e = Engine(tiny_bundle, "ar", cuda_graphs="emulate", compile="layers")
    assert e.generate(code_prompts[:1], max_new_tokens=16).tokens == eager
    assert len(e.graphs.regions.fns) == 2  # Block.forward and Transformer.head, each compiled once
    torch._dynamo.reset()


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA; the CPU twins above trace the same regions")
def test_regional_compiled_steps_in_cuda_graphs_match_eager_on_gpu(code_prompts):
    from specdec.zoo import load_bundle

    bundle = load_bundle("tiny", device="cuda", dtype=torch.float32)
    for m, topk, prompts in (("ar", 1, code_prompts), ("eagle", 1, code_prompts[:1]), ("mtp", 2, code_prompts[:1])):
        eager = Engine(bundle, m, k=3, topk=topk, cuda_graphs="off").generate(prompts, max_new_tokens=40).tokens
        e = Engine(bundle, m, k=3, topk=topk, cuda_graphs="on", compile="layers", min_span=16)
        assert e.generate(prompts, max_new_tokens=40).tokens == eager, (m, topk)
        assert len({span for _, span, _, _ in e.graphs.captured}) >= 2


# --- the flag -----------------------------------------------------------------------------------------------


class Reached(Exception):
    """What a stand-in Engine raises with the arguments it was given."""


@pytest.mark.parametrize("verb", ["decode", "serve"])
@pytest.mark.parametrize("scope", ["layers", "step", None])
def test_compile_scope_reaches_the_engine(monkeypatch, verb, scope):
    """The flag reaches Engine; without it decode compiles each step whole and serve by layers (a server captures
    every batch width: compiled whole, an 8B server's widths took minutes each)."""
    import importlib

    from specdec.cli import fast, main

    # serve builds its engine in serve_engine.py, in the engine process
    module = importlib.import_module(f"specdec.cli.{verb}_engine" if verb == "serve" else f"specdec.cli.{verb}")

    def engine(*args, **kwargs):
        raise Reached(kwargs)

    monkeypatch.setattr(module, "Engine", engine)
    if verb == "serve":  # the engine is built here, not in a spawned engine process that the stand-in cannot reach
        monkeypatch.setattr(importlib.import_module("specdec.cli.serve"), "start_engine",
                            lambda build, options: build(options))
    monkeypatch.setattr(fast, "compile_choice", lambda mode, *a: mode == "on")  # a CPU refuses --compile on
    extra = ["--port", "0"] if verb == "serve" else []
    with pytest.raises(Reached) as got:
        main([verb, "--model", "tiny", "--device", "cpu", "--compile", "on", *(["--compile-scope", scope] if scope else []),
              "--compile-cache", "none", *extra])
    assert got.value.args[0]["compile"] == (scope or {"decode": "step", "serve": "layers"}[verb])


def test_a_bad_compile_scope_is_a_usage_error(capsys):
    from specdec.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["decode", "--compile-scope", "whole"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "specdec decode: error: argument --compile-scope: invalid choice: 'whole'" in err
    assert "step" in err.splitlines()[-1] and "layers" in err.splitlines()[-1]
