"""The memory-bound demo of Lab 2: step costs from the engine's phase timer, Lab 1's prediction from
them, and the oracle's greedy output equal to plain decoding on a random-weight target."""

import numpy as np
import pytest
import torch

from specdec.decoder.bundle import ModelBundle
from specdec.decoder.engine import Engine
from specdec.decoder.generate import DecodeResult
from specdec.decoder.proposers import OracleProposer
from specdec.decoder.roofline import (
    MEMORY_BOUND,
    StepCosts,
    cache_sizes,
    memory_bound_run,
    random_target,
    read_floor,
    weight_bytes,
)
from specdec.sim.formulas import expected_tokens_per_step, speedup_from_costs

SMALL = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2)


def result(k: int, steps: int, times: dict) -> DecodeResult:
    empty = np.zeros((steps, 1), dtype=np.int64)
    return DecodeResult(method="x", k=k, tokens=[[0]], prompt_lengths=[1], accepted=empty, proposed=empty,
                        steps=steps, wall_s=1.0, times=times)


def test_step_costs_are_per_step_and_per_draft():
    plain = [result(4, 10, dict(prefill=9.0, draft=0.0, verify=0.2, host=0.02)),
             result(4, 30, dict(prefill=9.0, draft=0.0, verify=0.6, host=0.02))]
    spec = [result(4, 8, dict(prefill=9.0, draft=0.32, verify=0.4, host=0.08))]
    c = StepCosts.measured(plain, spec)
    assert c.plain == pytest.approx(0.8 / 40)  # neither the prefill nor the bookkeeping is in a step's cost
    assert c.verify == pytest.approx(0.4 / 8)
    assert c.draft == pytest.approx(0.32 / 8 / 4)


def test_the_run_predicts_with_lab1s_formula_from_its_measured_costs():
    run = memory_bound_run(SMALL, new_tokens=16, repeats=2)
    c, tau = run.costs, expected_tokens_per_step(0.8, 4)
    assert 0 < c.draft < c.plain and c.verify > 0 and run.tau_formula == tau
    assert run.predicted == speedup_from_costs(tau, c.plain, c.draft, c.verify, 4)
    assert run.predicted_measured_tau == speedup_from_costs(run.tau_measured, c.plain, c.draft, c.verify, 4)
    assert 1 <= run.tau_measured <= 5 and len(run.measured_each) == 2 and run.measured > 0
    assert run.identical
    text = "\n".join(run.lines())
    assert f"measured {run.measured:.2f}x, predicted {run.predicted:.2f}x" in text and "same tokens as plain: yes" in text
    assert run.as_dict()["measured_over_predicted"] == run.measured / run.predicted


def test_weight_bytes_and_the_streaming_floor():
    m = random_target(SMALL)
    cfg = m.config
    embed = cfg.vocab_size * cfg.hidden_size * 4
    assert weight_bytes(m) == sum(p.numel() for p in m.parameters()) * 4 - embed  # a step reads one row of it
    assert read_floor(m, repeats=2) > 0
    assert all(name.startswith("L") and size > 0 for name, size in cache_sizes().items())


@pytest.mark.slow
def test_oracle_on_the_memory_bound_target_decodes_exactly_as_plain():
    """The demo's own 430 MB target: greedy output with the oracle (alpha 0.8, k 4) equals plain decoding."""
    torch.set_num_threads(1)
    target = random_target(MEMORY_BOUND)
    bundle = ModelBundle(name="memory-bound", target=target, tokenizer=None)
    prompt = [list(range(3, 11))]
    plain = Engine(bundle, "ar", max_batch=1, max_len=64).generate(prompt, max_new_tokens=24, stop_at_eos=False)
    oracle = OracleProposer.from_continuations(prompt, plain.tokens, 0.8, target.config.vocab_size, seed=3, length=80)
    spec = Engine(bundle, k=4, max_batch=1, max_len=64, proposer=oracle).generate(prompt, max_new_tokens=24,
                                                                                   stop_at_eos=False)
    assert spec.tokens == plain.tokens
    assert spec.stats.acceptance_rate < 1  # wrong drafts were proposed, and rejected
    assert spec.steps < plain.steps
