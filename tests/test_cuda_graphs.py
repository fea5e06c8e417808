"""CUDA graphs: replaying the fixed-shape steps gives exactly the eager output. The GPU test needs
CUDA; its CPU twin runs the same decode loop through the emulated graph (same static-buffer
contract: inputs copied into fixed tensors, outputs overwritten in place at every replay)."""

import pytest
import torch

from specdec.decoder.cuda_graphs import EmulatedGraph, graph_mode
from specdec.decoder.engine import Decoder

METHODS = ["ar", "mtp", "heads", "draft", "eagle", "ngram"]


def run_all(decoder, prompts, k=3, n=24):
    return {m: decoder.generate(prompts, m, k=k, max_new_tokens=n).tokens for m in METHODS}


def test_emulated_graphs_match_eager_for_every_proposer(tiny_bundle, code_prompts):
    eager = run_all(Decoder(tiny_bundle, cuda_graphs="off"), code_prompts)
    twin = Decoder(tiny_bundle, cuda_graphs="emulate")
    assert twin.use_graphs and twin.kv_len(torch.tensor([3])) == twin.max_len  # fixed shapes
    assert run_all(twin, code_prompts) == eager
    assert run_all(twin, code_prompts[:1]) == {m: t[:1] for m, t in eager.items()}  # graphs per batch size
    assert run_all(twin, code_prompts) == eager  # and back: each batch size keeps its caches and graphs
    assert len(twin._graphs) > 0 and all(isinstance(g, EmulatedGraph) for g in twin._graphs.values())


def test_emulated_graph_overwrites_its_outputs_in_place():
    g = EmulatedGraph(lambda x: x * 2, (torch.ones(3),))
    a = g(torch.tensor([1.0, 2.0, 3.0]))
    b = g(torch.tensor([5.0, 5.0, 5.0]))
    assert a is b and a.tolist() == [10.0, 10.0, 10.0]


def test_graph_mode_switch():
    assert graph_mode("auto", torch.device("cpu")) is None
    assert graph_mode("off", torch.device("cpu")) is None
    with pytest.raises(ValueError, match="needs a CUDA device"):
        graph_mode("on", torch.device("cpu"))
    with pytest.raises(ValueError, match="auto, on or off"):
        graph_mode("sometimes", torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA; the CPU twin above tests the same loop")
def test_cuda_graphs_match_eager_on_gpu(code_prompts):
    from specdec.zoo import load_bundle

    bundle = load_bundle("tiny", device="cuda", dtype=torch.float32)
    eager = run_all(Decoder(bundle, cuda_graphs="off"), code_prompts)
    graphed = Decoder(bundle, cuda_graphs="on")
    assert graphed.graph_mode == "cuda"
    assert run_all(graphed, code_prompts) == eager
    # batch 4 -> 1 -> 4: a real graph bakes in the addresses of the caches it was captured with
    assert run_all(graphed, code_prompts[:1]) == {m: t[:1] for m, t in eager.items()}
    assert run_all(graphed, code_prompts) == eager
