"""The step-level engine: rows join and leave a running batch between steps, batching changes no
token, stop ids may be a list, and acceptance counts only drafts the target could use."""

import copy

import pytest
import torch

from specdec.decoder.bundle import ModelBundle
from specdec.decoder.engine import Engine, SamplingParams
from specdec.decoder.proposers import DraftModelProposer


def run_alone(engine, prompt, n):
    return engine.generate([prompt], max_new_tokens=n, stop_at_eos=False).tokens[0]


@pytest.mark.parametrize("method", ["ar", "mtp", "draft"])
def test_rows_join_and_leave_without_changing_tokens(tiny_bundle, engine, code_prompts, method):
    """Requests admitted at different steps into reused slots decode exactly as they do alone."""
    alone = [run_alone(engine(method), p, 20) for p in code_prompts]
    e = Engine(tiny_bundle, method, k=3, max_batch=2)
    out, owner = {i: [] for i in range(4)}, {}
    queue, steps = list(range(4)), 0
    while queue or e.running:
        if queue and e.free_slots and steps % 2 == 0:  # a new request every other step, when a row is free
            i = queue.pop(0)
            up = e.admit([code_prompts[i]], SamplingParams(max_new_tokens=20, stop_at_eos=False))[0]
            owner[up.slot] = i
            out[i] += up.tokens
        for up in e.step():
            out[owner[up.slot]] += up.tokens
        steps += 1
    assert [out[i] for i in range(4)] == alone


def test_the_host_knows_each_running_rows_length_without_asking(tiny_bundle, code_prompts):
    """The engine mirrors every running row's cache length from the counts it reads at the step's one
    sync (it picks the next step's KV span from them); rows join, finish and leave."""
    e = Engine(tiny_bundle, "mtp", k=3, max_batch=2)
    queue, steps = list(range(4)), 0
    while queue or e.running:
        if queue and e.free_slots and steps % 3 == 0:
            e.admit([code_prompts[queue.pop(0)]], SamplingParams(max_new_tokens=10 + 5 * steps, stop_at_eos=False))
        e.step()
        steps += 1
        assert {s: r.committed for s, r in e.live.items()} == {s: int(e.cache.lengths[s]) for s in e.running}
    assert steps > 10 and e.live == {}


def test_a_request_arriving_mid_decode_finishes_first(tiny_bundle, code_prompts):
    e = Engine(tiny_bundle, "mtp", k=4, max_batch=4)
    long = e.admit([code_prompts[0]], SamplingParams(max_new_tokens=60, stop_at_eos=False))[0]
    finished = []
    for n in range(200):
        if n == 2:
            short = e.admit([code_prompts[1]], SamplingParams(max_new_tokens=6, stop_at_eos=False))[0]
        finished += [u.slot for u in e.step() if u.finished]
        if not e.running:
            break
    assert finished == [short.slot, long.slot] and short.slot != long.slot


def test_retire_frees_a_row_for_the_next_request(tiny_bundle, code_prompts):
    e = Engine(tiny_bundle, "ngram", k=2, max_batch=1)
    first = e.admit([code_prompts[0]], SamplingParams(max_new_tokens=50))[0]
    e.step()
    with pytest.raises(ValueError, match="free rows"):
        e.admit([code_prompts[1]], SamplingParams())
    e.retire(first.slot)
    assert e.running == [] and e.free_slots == [0]
    assert e.admit([code_prompts[1]], SamplingParams(max_new_tokens=3))[0].slot == 0


def test_list_valued_eos_stops_at_any_of_its_ids(tiny_bundle, engine, code_prompts):
    """config.json may give eos_token_id as a list: every id in it ends a row."""
    ref = engine("ar").generate(code_prompts, max_new_tokens=12, stop_at_eos=False).tokens
    second = ref[1][4]  # a token row 1 produces: make it the *second* stop id
    bundle = copy.copy(tiny_bundle)
    bundle.target = copy.copy(tiny_bundle.target)
    bundle.target.config = copy.deepcopy(tiny_bundle.target.config)
    bundle.target.config.eos_token_id = [0, second]
    for method in ("ar", "mtp"):
        res = Engine(bundle, method, k=3).generate(code_prompts, max_new_tokens=12)
        for b, toks in enumerate(res.tokens):
            cut = ref[b].index(second) + 1 if second in ref[b] else 12
            assert toks == ref[b][:cut], (method, b)


@pytest.mark.parametrize("n", [40, 41, 42])
def test_a_model_drafting_itself_is_always_accepted(tiny_bundle, code_prompts, n):
    """The target as its own draft: every judged draft is accepted, whatever max_new_tokens cuts
    (drafts past a row's budget are not counted as proposed)."""
    own = ModelBundle(name="self", target=tiny_bundle.target, tokenizer=None)
    e = Engine(own, k=4, proposer=DraftModelProposer(tiny_bundle.target))
    res = e.generate(code_prompts, max_new_tokens=n, stop_at_eos=False)
    assert res.stats.acceptance_rate == 1.0 and (res.stats.by_position == 1.0).all()
    assert all(len(t) == n for t in res.tokens)


def test_bad_requests_are_clear_errors(engine, code_prompts):
    e = engine("mtp")
    with pytest.raises(ValueError, match="token ids must be integers"):
        e.admit([[1, 2, 99999]], SamplingParams())
    with pytest.raises(ValueError, match="top_p"):
        e.admit([code_prompts[0]], SamplingParams(top_p=0.0))
    with pytest.raises(ValueError, match="temperature"):
        e.admit([code_prompts[0]], SamplingParams(temperature=-1.0))
    assert e.running == []  # nothing was admitted


def test_seeded_rows_sample_the_same_tokens_whatever_runs_beside_them(tiny_bundle, code_prompts):
    sp = SamplingParams(max_new_tokens=16, temperature=1.0, seed=7, stop_at_eos=False)
    a = Engine(tiny_bundle, "mtp", k=3, max_batch=2)
    alone = a.admit([code_prompts[2]], sp)[0].tokens
    while a.running:
        alone += [t for u in a.step() for t in u.tokens]
    b = Engine(tiny_bundle, "mtp", k=3, max_batch=2)
    b.admit([code_prompts[0]], SamplingParams(max_new_tokens=30, temperature=1.0, stop_at_eos=False))
    beside = b.admit([code_prompts[2]], sp)[0]
    got = list(beside.tokens)
    while b.running:
        got += [t for u in b.step() if u.slot == beside.slot for t in u.tokens]
    assert got == alone


def test_the_step_readout_is_read_by_name():
    """readout packs a step into one tensor (one copy to the host); to_host gives each row its fields by name."""
    import torch

    from specdec.decoder.step import RowStep, to_host

    # 2 rows, W = 3 (k = 2): row 0 kept 2 tokens with 1 draft accepted; row 1 finished, kept nothing
    packed = torch.tensor([[2, 1, 0, 11, 12, 13, 11, 99], [0, -1, 1, 0, 0, 0, 0, 0]])
    rows = to_host(packed, width=3)
    assert rows[0] == RowStep(count=2, accepted=1, done=False, emitted=[11, 12, 13], drafts=[11, 99])
    assert rows[0].tokens == [11, 12] and rows[1].tokens == [] and rows[1].done is True


def _stops_early(tiny_bundle, code_prompts):
    """A copy of the zoo whose stop id is a token rows 1 and 3 produce early: some rows end by a stop id, the others
    by their budget, at different steps."""
    ref = Engine(tiny_bundle, "ar").generate(code_prompts, max_new_tokens=16, stop_at_eos=False).tokens
    bundle = copy.copy(tiny_bundle)
    bundle.target = copy.copy(tiny_bundle.target)
    bundle.target.config = copy.deepcopy(tiny_bundle.target.config)
    bundle.target.config.eos_token_id = [ref[1][3], ref[3][6]]
    return bundle


@pytest.mark.parametrize("graphs", ["off", "emulate", pytest.param("on", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA; its CPU twin: the graphs' emulation (emulate)"))])
def test_steps_ahead_reads_each_step_as_step_does(tiny_bundle, code_prompts, graphs):
    """Engine.steps_ahead (the host a step behind the device) yields the very updates Engine.step does, step by step,
    and leaves the device in the same state, though a step runs past rows that ended (a stop id, a budget) before the
    host has read that they did. Under the CUDA graphs' CPU twin the graph's output is overwritten by the next
    replay: the readout must have been copied before it."""
    if graphs == "on":  # real CUDA graphs: the readout copied to pinned memory, read after the next launch
        from specdec.zoo import load_bundle
        tiny_bundle = load_bundle("tiny", device="cuda", dtype=torch.float32)
    bundle = _stops_early(tiny_bundle, code_prompts)
    budgets = [SamplingParams(max_new_tokens=n, temperature=t, seed=3)
               for n, t in ((16, 0.0), (16, 0.0), (9, 1.0), (16, 0.0))]
    runs = []
    for ahead in (False, True):
        # spans of just the slots a step reads (eager) or the power of two above: a step launched ahead reads the
        # slot the step before it writes
        e = Engine(bundle, "ar", max_batch=4, cuda_graphs=graphs, min_span=1)
        first = e.admit(code_prompts, budgets)
        if graphs == "off":  # eager, a step runs at its launch: every step's span covers each row's pending token
            plain = e._plain

            def checked(cache, rows, u):
                assert cache.span > int(rows.lengths.max()), (cache.span, rows.lengths.tolist())
                return plain(cache, rows, u)
            e._plain = checked
        steps = list(e.steps_ahead()) if ahead else [e.step() for _ in iter(lambda: bool(e.live), False)]
        e.sync()
        runs.append((first, steps, e.cache.lengths.tolist(), e.rows.n_new.tolist(), e.rows.tokens.tolist()))
    (first, steps, *state), (first_a, steps_a, *state_a) = runs
    assert {u.finished for s in steps for u in s} >= {"stop", "length"}  # both ways of ending happen here
    assert first_a == first and steps_a == steps and state_a == state


def test_steps_ahead_is_plain_decoding_only(engine):
    with pytest.raises(ValueError, match="plain decoding"):
        next(engine("mtp").steps_ahead())
