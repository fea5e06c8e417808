"""CUDA graphs: replaying the fixed-shape steps gives exactly the eager output. The GPU test needs
CUDA; its CPU twin runs the same decode loop through the emulated graph (same static-buffer
contract: inputs copied into fixed tensors, outputs overwritten in place at every replay)."""

import copy

import pytest
import torch

from specdec.decoder.cuda_graphs import EmulatedGraph, graph_mode
from specdec.decoder.engine import Engine
from specdec.decoder.proposers import FeatureDraftProposer

METHODS = ["ar", "mtp", "heads", "draft", "eagle", "ngram"]


def engines(bundle, mode, k=3):
    return {m: Engine(bundle, m, k=k, cuda_graphs=mode) for m in METHODS}


def run_all(engines, prompts, n=24):
    return {m: e.generate(prompts, max_new_tokens=n).tokens for m, e in engines.items()}


def test_emulated_graphs_match_eager_for_every_proposer(tiny_bundle, code_prompts):
    eager = run_all(engines(tiny_bundle, "off"), code_prompts)
    twins = engines(tiny_bundle, "emulate")
    assert all(e.cache.fixed_span and e.cache.span(torch.tensor([3])) == e.max_len for e in twins.values())
    assert run_all(twins, code_prompts) == eager
    assert run_all(twins, code_prompts[:1]) == {m: t[:1] for m, t in eager.items()}  # graphs per batch size
    assert run_all(twins, code_prompts) == eager  # and back: each width keeps its graphs over the same caches
    for e in twins.values():
        assert len(e.graphs.captured) > 0 and all(isinstance(g, EmulatedGraph) for g in e.graphs.captured.values())
        assert {key[1][0][0] for key in e.graphs.captured} == {1, 4}  # one capture per width


def test_graphs_belong_to_their_proposer(tiny_bundle, code_prompts):
    """Two MTP layers in one process: the second (zeroed) must not replay the first one's graphs,
    weights or cache (a zeroed layer proposes poorly: tau near 1)."""
    good = Engine(tiny_bundle, "mtp", k=4, cuda_graphs="emulate").generate(code_prompts, max_new_tokens=24)
    zeroed = copy.deepcopy(tiny_bundle.mtp)
    for p in zeroed.parameters():
        p.data.zero_()
    bad = Engine(tiny_bundle, k=4, cuda_graphs="emulate", proposer=FeatureDraftProposer(zeroed, tiny_bundle.target, "mtp"))
    res = bad.generate(code_prompts, max_new_tokens=24)
    assert res.tokens == good.tokens  # lossless either way
    assert good.stats.tau > 2.0 and res.stats.tau < 1.3


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
    eager = run_all(engines(bundle, "off"), code_prompts)
    graphed = engines(bundle, "on")
    assert all(e.graph_mode == "cuda" for e in graphed.values())
    assert run_all(graphed, code_prompts) == eager
    # batch 4 -> 1 -> 4: a real graph bakes in the addresses of the caches it was captured with
    assert run_all(graphed, code_prompts[:1]) == {m: t[:1] for m, t in eager.items()}
    assert run_all(graphed, code_prompts) == eager


def join_and_leave(engine, prompts, n=20):
    """Requests admitted every other step into reused rows (the server's pattern); tokens per request."""
    from specdec.decoder.engine import SamplingParams

    out, owner, queue, steps = {i: [] for i in range(len(prompts))}, {}, list(range(len(prompts))), 0
    while queue or engine.running:
        if queue and engine.free_slots and steps % 2 == 0:
            i = queue.pop(0)
            up = engine.admit([prompts[i]], SamplingParams(max_new_tokens=n, stop_at_eos=False))[0]
            owner[up.slot] = i
            out[i] += up.tokens
        for up in engine.step():
            out[owner[up.slot]] += up.tokens
        steps += 1
    return [out[i] for i in range(len(prompts))]


def test_emulated_graphs_stay_valid_as_rows_come_and_go(tiny_bundle, code_prompts):
    eager = join_and_leave(Engine(tiny_bundle, "eagle", k=3, max_batch=3, cuda_graphs="off"), code_prompts)
    assert join_and_leave(Engine(tiny_bundle, "eagle", k=3, max_batch=3, cuda_graphs="emulate"), code_prompts) == eager


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA; the CPU twin above tests the same loop")
def test_cuda_graphs_stay_valid_as_rows_come_and_go_on_gpu(code_prompts):
    from specdec.zoo import load_bundle

    bundle = load_bundle("tiny", device="cuda", dtype=torch.float32)
    for method in ("mtp", "draft", "heads", "ngram", "ar"):
        eager = join_and_leave(Engine(bundle, method, k=3, max_batch=3, cuda_graphs="off"), code_prompts)
        assert join_and_leave(Engine(bundle, method, k=3, max_batch=3, cuda_graphs="on"), code_prompts) == eager, method
