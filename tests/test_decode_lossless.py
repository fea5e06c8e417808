"""Lossless: at temperature 0 (fp32) speculative output equals plain decoding token for token, for
every proposer at batch 1 and 4, and plain decoding equals transformers' greedy generate."""

import pytest
import torch
from quick import later

from specdec.decoder.engine import Engine
from specdec.decoder.proposers import OracleProposer

METHODS = ["mtp", "heads", "draft", "eagle", "ngram"]
N = 40


@pytest.fixture(scope="module")
def plain(engine, code_prompts):
    return engine("ar").generate(code_prompts, max_new_tokens=N)


def test_plain_equals_transformers_generate(tiny_bundle, plain, code_prompts):
    from transformers import AutoModelForCausalLM  # imported here: at collection, every worker would pay its seconds

    hf = AutoModelForCausalLM.from_pretrained(str(tiny_bundle.paths["target"]), dtype=torch.float32).eval()
    eos = tiny_bundle.eos_token_ids[0]
    for b, p in enumerate(code_prompts):
        out = hf.generate(torch.tensor([p]), do_sample=False, max_new_tokens=N, eos_token_id=eos,
                          pad_token_id=tiny_bundle.target.config.pad_token_id)
        assert out[0, len(p):].tolist() == plain.tokens[b], f"row {b}"


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("k", [3, *later(1)])
def test_speculative_equals_plain_batch4(engine, plain, code_prompts, method, k):
    res = engine(method, k).generate(code_prompts, max_new_tokens=N)
    assert res.tokens == plain.tokens
    assert res.stats is not None and 1.0 <= res.stats.tau <= k + 1
    assert res.steps < plain.steps or method == "ngram"  # fewer target forwards than plain


@pytest.mark.parametrize("method", METHODS)
def test_speculative_equals_plain_batch1(engine, plain, code_prompts, method):
    for b in (0, 3):
        res = engine(method, 4).generate([code_prompts[b]], max_new_tokens=N)
        assert res.tokens[0] == plain.tokens[b]


def test_eos_and_max_tokens_stop_each_row(tiny_bundle, code_prompts):
    """A row stops at EOS (kept) or at max_new_tokens; stopped rows do not advance."""
    res = Engine(tiny_bundle, "mtp", k=4).generate(code_prompts, max_new_tokens=7)
    assert all(1 <= len(t) <= 7 for t in res.tokens)
    # Make EOS a token the model will produce: the 3rd greedy token of row 0.
    ref = Engine(tiny_bundle, "ar").generate(code_prompts, max_new_tokens=12)
    eos = ref.tokens[0][2]
    tiny_bundle.target.config.eos_token_id = eos
    try:
        for m in ("ar", "mtp", "ngram"):
            r = Engine(tiny_bundle, m, k=4).generate(code_prompts, max_new_tokens=12)
            assert r.tokens[0] == ref.tokens[0][:3]
            for b, t in enumerate(r.tokens):
                cut = ref.tokens[b].index(eos) + 1 if eos in ref.tokens[b] else 12
                assert t == ref.tokens[b][:cut]
    finally:
        tiny_bundle.target.config.eos_token_id = 0


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_oracle_is_lossless_and_hits_its_acceptance(tiny_bundle, plain, code_prompts, alpha):
    ref = Engine(tiny_bundle, "ar").generate(code_prompts, max_new_tokens=N, stop_at_eos=False)
    oracle = OracleProposer.from_continuations(code_prompts, ref.tokens, alpha, tiny_bundle.target.config.vocab_size,
                                               seed=1, length=200)
    res = Engine(tiny_bundle, k=3, proposer=oracle).generate(code_prompts, max_new_tokens=N, stop_at_eos=False)
    assert res.tokens == ref.tokens
    by_pos = res.stats.by_position
    if alpha == 1.0:  # every step but a row's last (cut short at max_new_tokens) accepts all k
        body = res.accepted[:-1]
        assert (body[body >= 0] == 3).all()
    elif alpha == 0.0:
        assert by_pos.max() == 0.0
    else:
        assert 0.3 < by_pos[0] < 0.7


def test_bad_input_is_a_clear_error(tiny_bundle, engine, code_prompts):
    with pytest.raises(ValueError, match="k must be"):
        Engine(tiny_bundle, "mtp", k=0)
    with pytest.raises(ValueError, match="at least one token"):
        engine("ar").generate([[]])
    with pytest.raises(ValueError, match="unknown method"):
        Engine(tiny_bundle, "medusa")
    with pytest.raises(ValueError, match="cache slots"):
        engine("ar").generate(code_prompts, max_new_tokens=10_000)


def test_stats_count_what_was_emitted(engine, code_prompts):
    """tau x steps (+ the prefill token) equals the tokens each row kept, even when the last step
    was cut short by max_new_tokens."""
    res = engine("mtp", 4).generate(code_prompts, max_new_tokens=13, stop_at_eos=False)
    a = res.accepted
    for b, toks in enumerate(res.tokens):
        row = a[:, b][a[:, b] >= 0]
        assert len(toks) == 13 == 1 + int((row + 1).sum())
