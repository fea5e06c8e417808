"""Adaptive k: the engine drafts 0..k per step, as a policy chooses from the batch and the measured acceptance;
whatever it chooses, greedy output is plain decoding's, token for token."""

import functools
import itertools

import pytest
from quick import later

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


@pytest.mark.parametrize("ks", [pytest.param([0, 3, 1, 0, 0, 2, 3, 1], id="short"), *later([0] * 13 + [3, 1], ids=["long"])])
@pytest.mark.parametrize("graphs", ["off", "emulate"])
@pytest.mark.parametrize("method", PROPOSERS)
def test_any_k_per_step_keeps_greedy_output(tiny_bundle, code_prompts, plain, method, graphs, ks):
    e = Engine(tiny_bundle, method, k=3, cuda_graphs=graphs, min_span=8, adaptive=Scripted(ks))
    res = e.generate(code_prompts, 24, stop_at_eos=False)
    assert res.tokens == plain
    ran = res.accepted >= 0
    assert (~ran).any() and ran.any()  # steps without drafts (reported as plain ones) and with
    assert (res.proposed[~ran] == 0).all() and res.proposed.max() == 3


def test_a_policy_may_not_ask_for_more_drafts_than_the_engine_has_room_for(tiny_bundle):
    with pytest.raises(ValueError, match="k_max"):
        Engine(tiny_bundle, "mtp", k=2, cuda_graphs="off", adaptive=AdaptiveK(4))


def run_policy(policy: AdaptiveK, step_s, rate: float, steps: int = 300, width: int = 1) -> list[int]:
    """Drive the policy with a fake clock: a step of k drafts takes step_s(k) seconds and each draft is kept with
    probability `rate` (deterministic counts). Returns the k chosen at each step."""
    chosen = []
    for s in range(steps):
        k = policy.choose(width)
        if k:
            kept = [int((s * 7919 + r * 104729 + i * 31) % 1000 < 1000 * rate) for r in range(width) for i in range(k)]
            accepted = [next((i for i in range(k) if not kept[r * k + i]), k) for r in range(width)]
            policy.observe(accepted, [k] * width)
        policy.timed(width, k, step_s(k))
        chosen.append(k)
    return chosen


def test_drafting_that_costs_more_than_it_gains_converges_to_plain_steps():
    """A verify step of k drafts costs (1 + 0.6 k) plain steps and a draft is kept half the time: every k > 0
    brings fewer tokens per second than a plain step, so after the exploration nearly every step is plain."""
    p = AdaptiveK(3)
    chosen = run_policy(p, lambda k: 0.01 * (1 + 0.6 * k), 0.5)
    assert p.best(1) == 0
    late = chosen[50:]
    assert late.count(0) >= 0.95 * len(late)


def test_cheap_verify_and_good_drafts_converge_to_k_max():
    p = AdaptiveK(4)
    chosen = run_policy(p, lambda k: 0.01 * (1 + 0.02 * k), 0.9)
    assert p.acceptance()[0] > 0.8 and p.best(1) == 4
    late = chosen[50:]
    assert late.count(4) >= 0.95 * len(late)


def test_each_width_bucket_has_its_own_times():
    """Batch 1 is memory-bound (verify nearly free), batch 64 compute-bound (k + 1 tokens cost k + 1 times): one policy
    drafts the most at the first and nothing at the second."""
    p = AdaptiveK(3)
    run_policy(p, lambda k: 0.01 * (1 + 0.05 * k), 0.7, width=1)
    run_policy(p, lambda k: 0.01 * (k + 1), 0.7, width=64)
    assert p.best(1) == 3 and p.best(64) == 0 and p.best(40) == 0  # 40 rows share the bucket of 64


def test_the_expected_tokens_per_second_is_the_formulas():
    """With acceptance alpha at every position, the rate of k drafts is Lab 1's (1 - alpha^(k+1)) / (1 - alpha)
    over the measured step time."""
    from specdec.sim import formulas

    p = AdaptiveK(3, prior=0.8, tries=2)
    for k in range(4):  # the first step of a shape is not timed, the second is
        p.timed(1, k, 99.0)
        p.timed(1, k, 0.01 * (1 + k))
    for k in range(4):
        want = formulas.expected_tokens_per_step(0.8, k) / (0.01 * (1 + k)) if k else 1 / 0.01
        assert p.rate(1, k) == pytest.approx(want)


def test_every_k_is_measured_first_then_the_stalest_now_and_then():
    p = AdaptiveK(2, tries=2, retry_every=10)
    chosen = run_policy(p, lambda k: 0.01 * (1 + k), 0.5, steps=30)  # plain steps win
    assert chosen[:6] == [0, 0, 1, 1, 2, 2]
    assert [i for i, k in enumerate(chosen[6:], 7) if k] == [10, 20, 30]  # the stalest k, every tenth step
    assert chosen[9] == 1 and chosen[19] == 2 and chosen[29] == 1


def test_a_slow_step_moves_the_estimate_by_at_most_twice_the_running_time():
    p = AdaptiveK(1, tries=2, time_decay=0.5)
    p.timed(1, 0, 5.0)  # a capture: not timed
    p.timed(1, 0, 1.0)
    p.timed(1, 0, 100.0)  # a pause: counted as 2.0
    assert p.seconds[1, 0] == pytest.approx(1.5)


class FakeClock:
    """A step of k drafts lasts step_s(k) seconds: the engine reads the clock at a step's start and end."""

    def __init__(self, step_s):
        self.step_s, self.t, self.reads, self.k = step_s, 0.0, 0, 0

    def __call__(self) -> float:
        self.reads += 1
        if self.reads % 2 == 0:  # a step's end
            self.t += self.step_s(self.k)
        return self.t


class Clocked(AdaptiveK):
    def choose(self, width: int) -> int:
        self.clock.k = super().choose(width)
        self.chosen = getattr(self, "chosen", []) + [self.clock.k]
        return self.clock.k


@pytest.mark.parametrize("step_s,want", [(lambda k: 1 + 0.9 * k, 0), (lambda k: 1 + 0.01 * k, 3)])
def test_the_engine_converges_to_what_its_clock_says(tiny_bundle, code_prompts, plain, step_s, want):
    """The tiny zoo's MTP layer keeps most code drafts: under a clock where each draft costs 0.9 of a plain step the
    engine ends up at k = 0, under one where drafts are free at k = 3; either way its output is plain decoding's."""
    p = Clocked(3, clock=FakeClock(step_s), retry_every=1000)
    res = Engine(tiny_bundle, "mtp", k=3, cuda_graphs="off", adaptive=p).generate(code_prompts, 24, stop_at_eos=False)
    assert res.tokens == plain
    assert p.chosen[:12] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]  # each k tried first
    assert p.best(len(code_prompts)) == want and set(p.chosen[12:]) == {want}


def test_the_engine_times_its_steps_for_the_policy(tiny_bundle, code_prompts):
    p = AdaptiveK(3)
    Engine(tiny_bundle, "mtp", k=3, cuda_graphs="off", adaptive=p).generate(code_prompts[:1], 48, stop_at_eos=False)
    assert sorted(p.seconds) == [(1, k) for k in range(4)] and all(t > 0 for t in p.seconds.values())


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


# short runs of k = 0; runs longer than the MTP layer's and EAGLE head's buffer of fresh states (read while skipping)
SKIPS = [[0, 0, 3, 1, 0, 2], [0] * 14 + [3, 2, 3, 1, 3, 2] + [0] * 9 + [3, 3, 2]]


@pytest.fixture(scope="module")
def static_drafts(tiny_bundle, code_prompts):
    """method -> a static-k engine's drafts (drafts_at, 64 tokens): greedy, so the same for every skip pattern."""
    return functools.cache(lambda method: drafts_at(Engine(tiny_bundle, method, k=3, cuda_graphs="off"),
                                                    code_prompts, 64))


@pytest.mark.parametrize("ks", [pytest.param(SKIPS[0], id="short"), *later(SKIPS[1], ids=["long"])])
@pytest.mark.parametrize("method", [PROPOSERS[0], *later(*PROPOSERS[1:])])
def test_after_steps_without_drafts_the_proposer_guesses_as_if_it_had_drafted_all_along(tiny_bundle, code_prompts,
                                                                                         static_drafts, method, ks):
    """A proposer with a state of its own (the MTP layer's and EAGLE head's caches, the draft model's) must read
    the positions of the steps it skipped: its drafts at a position equal a static-k engine's there."""
    static = static_drafts(method)
    adaptive = drafts_at(Engine(tiny_bundle, method, k=3, cuda_graphs="off", adaptive=Scripted(ks)), code_prompts, 64)
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
