"""CUDA graphs: replaying the fixed-shape steps gives exactly the eager output. The GPU test needs
CUDA; its CPU twin runs the same decode loop through the emulated graph (same static-buffer
contract: inputs copied into fixed tensors, outputs overwritten in place at every replay)."""

import copy

import pytest
import torch

from specdec.decoder.cuda_graphs import EmulatedGraph, Graphs, allow_host_sync, graph_mode
from specdec.decoder.engine import Engine, SamplingParams
from specdec.decoder.kv_cache import KVCache
from specdec.decoder.proposers import FeatureDraftProposer

METHODS = ["ar", "mtp", "heads", "draft", "eagle", "ngram"]


def engines(bundle, mode, k=3, min_span=256):
    return {m: Engine(bundle, m, k=k, cuda_graphs=mode, min_span=min_span) for m in METHODS}


def run_all(engines, prompts, n=24):
    return {m: e.generate(prompts, max_new_tokens=n).tokens for m, e in engines.items()}


def test_emulated_graphs_match_eager_for_every_proposer(tiny_bundle, code_prompts):
    """Eager attention reads exactly the live slots; the graphs read a bucket of 8, 16, 32, ... slots
    (one capture per width and bucket, the run crossing several): the same tokens."""
    eager = run_all(engines(tiny_bundle, "off"), code_prompts)
    twins = engines(tiny_bundle, "emulate", min_span=8)
    assert all(e.cache.span == e.cache.slots_read(torch.tensor([3])) == e.max_len for e in twins.values())
    assert run_all(twins, code_prompts) == eager
    assert run_all(twins, code_prompts[:1]) == {m: t[:1] for m, t in eager.items()}  # graphs per batch size
    assert run_all(twins, code_prompts) == eager  # and back: each width keeps its graphs over the same caches
    for e in twins.values():
        assert len(e.graphs.captured) > 0 and all(isinstance(g, EmulatedGraph) for g in e.graphs.captured.values())
        assert {rows for _, _, rows, _ in e.graphs.captured if rows} == {1, 4}  # one capture per width
        # alone, the 9-token prompt starts in the bucket of 16; at batch 4 the 23-token one ends past 32
        assert {16, 32, 64} <= {span for name, span, _, _ in e.graphs.captured if name in ("plain", "verify")}


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


def test_graphs_that_read_every_slot_decode_the_same(tiny_bundle, code_prompts):
    """The old fixed shape, one bucket of the whole cache: stale and empty slots past a row's length
    are masked, so reading them changes no token."""
    for m in ("ar", "mtp"):
        eager = Engine(tiny_bundle, m, k=3, cuda_graphs="off").generate(code_prompts, max_new_tokens=24).tokens
        whole = Engine(tiny_bundle, m, k=3, cuda_graphs="emulate", min_span=2048)
        assert whole.generate(code_prompts, max_new_tokens=24).tokens == eager, m
        assert {span for _, span, _, _ in whole.graphs.captured if span} == {whole.max_len} == {2048}


def test_the_host_span_covers_every_position_a_step_reads(tiny_bundle, code_prompts, monkeypatch):
    """The engine picks each step's span from lengths it tracks on the host (no sync); a running row
    must never read or write a position at or past it, in any cache (the target's or a proposer's)."""
    real, checked = KVCache.slots_read, []

    def slots_read(cache, positions):
        s = real(cache, positions)
        if cache.span is not None:  # a step, or a prefill (its span: the prompts' slots, padded under graphs)
            with allow_host_sync():  # the probe reads values; the step itself does not
                start = cache.lengths.storage_offset()  # the view's first row (a staged prefill's: past the capacity)
                running = ~engine.rows.done[start: start + positions.shape[0]]
                assert s == cache.span and int(positions[running].max()) < s
            checked.append(s)
        return s

    monkeypatch.setattr(KVCache, "slots_read", slots_read)
    for m in ("ar", "mtp", "draft"):
        for mode in ("off", "emulate"):
            engine = Engine(tiny_bundle, m, k=3, cuda_graphs=mode, min_span=8)
            engine.generate(code_prompts, max_new_tokens=20)
    assert len(checked) > 100
    # eager reads exactly up to the last position: a 9-token prompt's prefill its 9 slots, then plain steps 10 and 11
    engine = Engine(tiny_bundle, "ar", cuda_graphs="off")
    checked.clear()
    engine.generate(code_prompts[:1], max_new_tokens=3)
    assert checked == [9, 10, 11]


def test_compile_is_not_cut_off_after_eight_captures():
    """Graphs with compile: one torch.compile per capture, all of the same function; past dynamo's
    default of 8 recompiles it would quietly run the rest unfused."""
    import torch._dynamo

    torch._dynamo.reset()
    traced = []
    real_compile = torch.compile
    graphs = Graphs("emulate", compile=True)
    try:
        torch.compile = lambda fn, **kw: real_compile(fn, backend=lambda gm, _: traced.append(gm) or gm.forward, **kw)
        x = torch.arange(40.0)
        for span in range(1, 13):  # one capture per span, as per KV bucket
            assert graphs("double", lambda t: t[:span] * 2, x, span=span).tolist() == (x[:span] * 2).tolist()
    finally:
        torch.compile = real_compile
    assert len(graphs.captured) == len(traced) == 12


@pytest.mark.slow
def test_compile_inside_the_bucketed_graphs_traces_each_capture_whole(tiny_bundle, code_prompts, monkeypatch):
    """compile=True: each (width, bucket) capture of the target's step is one torch.compile trace
    without graph breaks (fullgraph) and decodes as eager. The backend here only records the traced
    graph: inductor's kernels are the GPU's business (benchmarks/gpu_floor.py measures them)."""
    import torch._dynamo

    torch._dynamo.reset()
    traced, real_compile = [], torch.compile

    def record(gm, example_inputs):
        traced.append(gm)
        return gm.forward

    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, backend=record, fullgraph=True, **kw))
    captures = 0
    # the 9-token prompt alone: 16 new tokens cross from the bucket of 16 into 32 (40 reached 64 too, a trace more)
    for m, prompts, n in (("ar", code_prompts, 40), ("eagle", code_prompts[:1], 16)):
        eager = Engine(tiny_bundle, m, k=3, cuda_graphs="off").generate(prompts, max_new_tokens=n).tokens
        e = Engine(tiny_bundle, m, k=3, cuda_graphs="emulate", compile=True, min_span=8)
        assert e.generate(prompts, max_new_tokens=n).tokens == eager, m
        assert len({span for _, span, _, _ in e.graphs.captured}) >= 2  # crossed a bucket
        captures += len(e.graphs.captured)
    assert len(traced) == captures


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
    graphed = engines(bundle, "on", min_span=16)  # buckets of 16, 32, 64 slots: a run crosses several
    assert all(e.graph_mode == "cuda" for e in graphed.values())
    assert run_all(graphed, code_prompts) == eager
    # batch 4 -> 1 -> 4: a real graph bakes in the addresses of the caches it was captured with
    assert run_all(graphed, code_prompts[:1]) == {m: t[:1] for m, t in eager.items()}
    assert run_all(graphed, code_prompts) == eager


def join_and_leave(engine, prompts, n=20):
    """Requests admitted every other step into reused rows (the server's pattern); tokens per request."""


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
        graphed = Engine(bundle, method, k=3, max_batch=3, cuda_graphs="on", min_span=16)
        assert join_and_leave(graphed, code_prompts) == eager, method


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA; the CPU twin traces the same captures")
def test_compiled_steps_in_bucketed_cuda_graphs_match_eager_on_gpu(code_prompts):
    from specdec.zoo import load_bundle

    bundle = load_bundle("tiny", device="cuda", dtype=torch.float32)
    for m, prompts in (("ar", code_prompts), ("eagle", code_prompts[:1])):
        eager = Engine(bundle, m, k=3, cuda_graphs="off").generate(prompts, max_new_tokens=40).tokens
        e = Engine(bundle, m, k=3, cuda_graphs="on", compile=True, min_span=16)
        assert e.generate(prompts, max_new_tokens=40).tokens == eager, m
        assert len({span for _, span, _, _ in e.graphs.captured}) >= 2


@pytest.mark.slow  # 3.5 s of test-quick's 93 (2026-11-28): `make test` runs it
def test_a_greedy_admission_replays_a_captured_prefill(tiny_bundle):
    """Under graphs a greedy prefill is captured once per row count and prompt bucket (the prompts padded to both) and
    replayed after: every proposer decodes as eager. A sampled first token, or a prompt past the last bucket,
    prefills eagerly."""
    from specdec.decoder.engine import PREFILL_BUCKETS

    short, mid, long = [5, 6, 7], list(range(100, 120)), list(range(100, 100 + PREFILL_BUCKETS[-1] + 1))
    for m in ("ar", "eagle", "mtp", "draft", "heads", "ngram"):
        eager, graphed = (Engine(tiny_bundle, m, k=3, max_batch=3, cuda_graphs=c) for c in ("off", "emulate"))
        for prompts in ([short], [short[:2]], [mid, short], [long]):  # the second replays the first's capture
            assert graphed.generate(prompts, max_new_tokens=6).tokens == eager.generate(prompts, max_new_tokens=6).tokens, m
        assert sorted((name, span, shapes[0]) for name, span, _, shapes in graphed.prefills.captured) == [
            ("prefill 1", 16, (1, 16)), ("prefill 2", 32, (2, 32))], m
    graphed.generate([short], max_new_tokens=2, temperature=1.0)
    assert len(graphed.prefills.captured) == 2  # sampled: eager


HOLES_PROMPTS = [[5, 6, 7], list(range(100, 120)), [40, 41], [9, 8, 7, 6], list(range(60, 75)), [3], [11, 12, 13]]


def admit_into_holes(engine):
    """Admit, step, cancel, admit into the holes; -> each request's tokens, and the slots each admission took."""
    out, where, rid = {}, [], {}  # rid: slot -> request index

    def admit(ids, n):
        ups = engine.admit([HOLES_PROMPTS[i] for i in ids], SamplingParams(max_new_tokens=n))
        where.append([u.slot for u in ups])
        for i, u in zip(ids, ups):
            rid[u.slot] = i
            out[i] = list(u.tokens)

    def step(times):
        for _ in range(times):
            for u in engine.step():
                out[rid[u.slot]] += u.tokens

    admit([0, 1, 2], 40)  # three rows at once: padded to four staged rows
    step(2)
    engine.retire(1)  # request 1 leaves: slot 1 is free, and 3.. after it
    admit([3, 4], 30)  # slots 1 and 3: not consecutive, one replay
    step(2)
    admit([5], 20)  # slot 4: the one-row capture, replayed at another slot
    step(2)
    admit([6], 10)
    while engine.running:
        step(1)
    return out, where


@pytest.mark.slow  # 3.9 s of test-quick's 93 (2026-11-28): `make test` runs it
def test_a_captured_prefill_serves_any_free_slots(tiny_bundle):
    """A staged prefill fills the rows past the capacity, then copies them into the free slots it was given (an
    input of the capture): requests that join a running batch in scattered slots, several at once, decode as they
    do eagerly, for every proposer, and a capture made for one set of slots is replayed for another."""
    from specdec.decoder.engine import STAGE_ROWS

    for m in ("ar", "eagle", "mtp", "draft", "heads"):
        eager = Engine(tiny_bundle, m, k=3, max_batch=6, cuda_graphs="off")
        graphed = Engine(tiny_bundle, m, k=3, max_batch=6, cuda_graphs="emulate")
        (want, slots), (got, slots_g) = admit_into_holes(eager), admit_into_holes(graphed)
        assert slots == slots_g == [[0, 1, 2], [1, 3], [4], [5]]
        assert got == want, m
        assert sorted({(name, shapes[0][0]) for name, _, _, shapes in graphed.prefills.captured}) == [
            ("prefill 1", 1), ("prefill 2", 2), ("prefill 4", 4)], m  # slots 4 and 5 replayed one capture
        assert graphed.cache.batch == 6 + STAGE_ROWS and eager.cache.batch == 6  # the staging rows: under graphs only


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA; test_a_captured_prefill_serves_any_free_slots "
                    "is its CPU twin (emulated graphs)")
def test_a_captured_prefill_serves_any_free_slots_on_gpu():
    """The same admissions under real CUDA graphs (fp32): the staged prefill and its copy into the free slots decode as
    eager, token for token."""
    from specdec.zoo import load_bundle

    bundle = load_bundle("tiny", device="cuda", dtype=torch.float32)
    for m in ("ar", "eagle", "mtp", "draft", "heads"):
        eager = Engine(bundle, m, k=3, max_batch=6, cuda_graphs="off")
        graphed = Engine(bundle, m, k=3, max_batch=6, cuda_graphs="on")
        (want, slots), (got, slots_g) = admit_into_holes(eager), admit_into_holes(graphed)
        assert slots == slots_g and got == want, m
        assert {name for name, _, _, _ in graphed.prefills.captured} == {"prefill 1", "prefill 2", "prefill 4"}, m


def test_a_tree_engine_compiled_whole_leaves_its_several_token_captures_untuned(tiny_bundle, code_prompts, monkeypatch):
    """compile="step" on a tree: the drafter's extend and tree captures and the tree's verify read several tokens a
    row, so inductor compiles them without coordinate-descent tuning (Graphs' tune=False); a plain step at one row is
    still tuned. Read where inductor would read it: in the capture's first call (the one that compiles), here with
    torch.compile replaced by a recorder (the compiled tokens are test_regional's and the GPU tests' business)."""
    import torch._inductor.config as inductor_config

    traced = []

    def recorder(fn, **kw):
        def first(*args):
            if not getattr(first, "seen", False):
                first.seen = True
                traced.append(inductor_config.coordinate_descent_tuning)
            return fn(*args)
        return first

    monkeypatch.setattr(torch, "compile", recorder)
    for method, topk, tuned in (("eagle", 2, False), ("ar", 1, True)):
        traced.clear()
        e = Engine(tiny_bundle, method, k=3, topk=topk, cuda_graphs="emulate", compile="step", min_span=8)
        e.generate(code_prompts[:1], max_new_tokens=8)
        captured = len(e.graphs.captured) + (len(e.proposer.graphs.captured) if e.proposer else 0)
        assert len(traced) == captured >= (3 if topk > 1 else 1) and set(traced) == {tuned}, (method, traced)
    assert inductor_config.coordinate_descent_tuning is False  # put back after each capture


@pytest.mark.parametrize("gpu_present, why", [(False, "no CUDA device"), (True, "the model is on the CPU")])
def test_an_eager_cpu_run_says_why_once(monkeypatch, capsys, gpu_present, why):
    """A model on the CPU of a GPU machine (Lab 2's memory-bound demo) is not told there is no CUDA device."""
    from specdec.decoder import cuda_graphs

    monkeypatch.setattr(cuda_graphs, "_said_eager", False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu_present)
    cuda_graphs.say_eager_once("cpu")
    cuda_graphs.say_eager_once("cpu")
    assert capsys.readouterr().err == f"specdec: {why}, so no CUDA graphs: the decoder runs eager\n"
