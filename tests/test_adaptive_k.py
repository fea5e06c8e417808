"""Adaptive k: the engine drafts 0..k per step, as a policy chooses from the batch and the measured acceptance;
whatever it chooses, greedy output is plain decoding's, token for token."""

import itertools

import pytest

from specdec.decoder.adaptive import AdaptiveK
from specdec.decoder.engine import Engine
from specdec.decoder.methods import METHODS

PROPOSERS = [m for m in METHODS if m != "ar"]


class Scripted(AdaptiveK):
    """k from a fixed cycle, whatever was measured: every proposer meets k = 0, k_max and between, in turn."""

    def __init__(self, ks: list[int]):
        super().__init__(k_max=max(ks))
        self.ks = itertools.cycle(ks)

    def choose(self, batch: int) -> int:
        return next(self.ks)


@pytest.fixture(scope="module")
def plain(tiny_bundle, code_prompts):
    return Engine(tiny_bundle, "ar", cuda_graphs="off").generate(code_prompts, 24, stop_at_eos=False).tokens


@pytest.mark.parametrize("graphs", ["off", "emulate"])
@pytest.mark.parametrize("method", PROPOSERS)
def test_any_k_per_step_keeps_greedy_output(tiny_bundle, code_prompts, plain, method, graphs):
    e = Engine(tiny_bundle, method, k=3, cuda_graphs=graphs, min_span=8, adaptive=Scripted([0, 3, 1, 0, 0, 2, 3, 1]))
    res = e.generate(code_prompts, 24, stop_at_eos=False)
    assert res.tokens == plain
    ran = res.accepted >= 0
    assert (~ran).any() and ran.any()  # steps without drafts (reported as plain ones) and with
    assert (res.proposed[~ran] == 0).all() and res.proposed.max() == 3


def test_a_policy_may_not_ask_for_more_drafts_than_the_engine_has_room_for(tiny_bundle):
    with pytest.raises(ValueError, match="k_max"):
        Engine(tiny_bundle, "mtp", k=2, cuda_graphs="off", adaptive=AdaptiveK(4))


def measured(policy: AdaptiveK, rate: float, steps: int = 200, batch: int = 1) -> AdaptiveK:
    """Feed the policy steps whose drafts are each kept with probability `rate` (deterministic counts)."""
    k = policy.k_max
    for s in range(steps):
        accepted = [min(k, int((s * 7919 + r) % 1000 < 1000 * rate) * k) for r in range(batch)]
        policy.observe(accepted, [k] * batch)
    return policy


def test_batch_1_with_good_drafts_drafts_the_most():
    p = measured(AdaptiveK(4), 0.9)
    assert p.acceptance()[0] > 0.8 and p.choose(1) == 4


def test_drafts_that_are_never_kept_are_not_drafted():
    p = measured(AdaptiveK(4), 0.0)
    assert p.acceptance()[0] < 0.05 and p.choose(1) == 0


def test_a_large_batch_drafts_less_than_a_small_one():
    p = measured(AdaptiveK(4, knee=64), 0.7)
    ks = [p.best(b) for b in (1, 16, 64, 256)]
    assert ks[0] >= 2 and ks == sorted(ks, reverse=True) and ks[-1] == 0


def test_after_a_while_at_k_0_one_step_measures_again():
    p = measured(AdaptiveK(3, probe_every=5), 0.0)
    chosen = [p.choose(1) for _ in range(12)]
    assert chosen == [0] * 5 + [3] + [0] * 5 + [3]


def test_the_measured_acceptance_is_conditional_by_position():
    p = AdaptiveK(3, prior=0.5, decay=1.0)
    p.observe([3, 1, 0, 2], [3, 3, 3, 3])  # position 1 judged 4 times (kept 3), 2: 3 (kept 2), 3: 2 (kept 1)
    assert p.acceptance() == pytest.approx([(0.5 + 3) / 5, (0.5 + 2) / 4, (0.5 + 1) / 3])
    assert p.expected_tokens(0) == 1.0


def drafts_at(engine: Engine, prompts: list[list[int]], n: int = 32) -> dict:
    """(row, committed length before the step) -> the drafts proposed there."""
    from specdec.decoder.engine import SamplingParams

    seen = {}
    engine.admit(prompts, SamplingParams(max_new_tokens=n, stop_at_eos=False))
    while engine.live:
        before = {s: r.committed for s, r in engine.live.items()}
        for up in engine.step():
            if up.drafts:
                seen[up.slot, before[up.slot]] = up.drafts[: up.proposed]
    return seen


@pytest.mark.parametrize("method", PROPOSERS)
def test_after_steps_without_drafts_the_proposer_guesses_as_if_it_had_drafted_all_along(tiny_bundle, code_prompts,
                                                                                         method):
    """A proposer with a state of its own (the MTP layer's and EAGLE head's caches, the draft model's) must read
    the positions of the steps it skipped: its drafts at a position equal a static-k engine's there."""
    static = drafts_at(Engine(tiny_bundle, method, k=3, cuda_graphs="off"), code_prompts)
    adaptive = drafts_at(Engine(tiny_bundle, method, k=3, cuda_graphs="off", adaptive=Scripted([0, 0, 3, 1, 0, 2])),
                         code_prompts)
    common = [key for key in adaptive if key in static]
    assert len(common) >= 8, len(common)
    for key in common:
        n = min(len(adaptive[key]), len(static[key]))
        assert adaptive[key][:n] == static[key][:n], key


def test_decode_with_adaptive_k_keeps_the_output():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "specdec", "decode", "--model", "tiny", "--method", "mtp", "--k", "3",
                        "--adaptive-k", "--max-new-tokens", "32", "--compare"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "identical output: True" in r.stdout


def test_the_servers_acceptance_counts_only_the_steps_that_drafted(tiny_bundle, code_prompts):
    """meta_info's spec numbers divide by what was drafted: steps at k = 0 are plain steps, not verify steps."""
    from types import SimpleNamespace

    from specdec.decoder.engine import SamplingParams
    from specdec.serving.server.scheduler import Request, Scheduler

    ks = [0, 3, 1, 0, 2]
    engine = Engine(tiny_bundle, "mtp", k=3, cuda_graphs="off", adaptive=Scripted(ks))
    s = Scheduler(engine, tiny_bundle.tokenizer)
    events = []
    handle = SimpleNamespace(request=Request(code_prompts[0], SamplingParams(max_new_tokens=40, stop_at_eos=False),
                                             stream=False), done=False, push=events.append,
                             events=SimpleNamespace(put_nowait=events.append),
                             loop=SimpleNamespace(call_soon_threadsafe=lambda fn, *args: fn(*args)))
    s._admit([handle])
    while engine.live:
        for up in engine.step():
            s._deliver(up)
        s._flush()
    (p,) = events
    assert p.verify_ct == len(p.accepted) > 0
    drafting = itertools.cycle([k for k in ks if k])  # the k of each verify step, in turn
    assert p.drafted == sum(next(drafting) for _ in range(p.verify_ct))
    assert len(p.output_ids) == 40 and len(p.output_ids) - p.plain_tokens == 1 + sum(p.accepted) + p.verify_ct
    assert p.plain_tokens > 0
