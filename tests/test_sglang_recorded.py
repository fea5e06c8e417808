"""The client's readings on responses recorded from real SGLang 0.5.16 serving the tiny zoo on an H200
(tests/fixtures/sglang/real_0516_zoo.json; benchmarks/gpu_lab3.py recorded them, benchmarks/trim_sglang_fixtures.py
trimmed them): each reading is checked against what the raw answer says by another route."""

import json
from pathlib import Path

import pytest

from specdec.decoder.methods import method_named
from specdec.grading.registry import get_exercise, run_check
from specdec.serving.measure import records
from specdec.serving.measure.records import MetricsSnapshot, ServerInfo, record_from_response, record_from_stream

REAL = json.loads((Path(__file__).parent / "fixtures" / "sglang" / "real_0516_zoo.json").read_text())["servers"]
SPEC = ("nextn", "eagle")


def events(recorded: dict) -> list[tuple[float, dict]]:
    return [(t, c) for t, c in recorded["events"] if c != "[DONE]"]


@pytest.mark.parametrize("name", SPEC)
def test_generate_counters_agree_with_each_other(name):
    body = REAL[name]["generate"]["response"]
    rec = record_from_response("generate", body, REAL[name]["generate"]["latency_s"])
    m = body["meta_info"]
    assert rec.completion_tokens == len(body["output_ids"]) == m["completion_tokens"]
    # the server's accept length divides every completion token; ours leaves out the prefill's
    assert m["spec_accept_length"] == pytest.approx(m["completion_tokens"] / m["spec_verify_ct"])
    assert rec.tau == pytest.approx((m["completion_tokens"] - 1) / m["spec_verify_ct"])
    hist = rec.spec.histogram
    assert sum(hist) == rec.spec.verify_ct and len(hist) == 4  # 0..3 drafts accepted per verify (3 steps)
    assert sum(i * h for i, h in enumerate(hist)) == rec.spec.correct_drafts == m["spec_num_correct_drafts"]
    assert rec.spec.proposed_drafts == 3 * rec.spec.verify_ct
    # the histogram's tokens per verify step account for every token after the prefill's, except those the
    # token budget cut from the last step (at most its 3 drafts)
    emitted = records.tau_from_histogram(hist) * rec.spec.verify_ct
    assert emitted - 3 <= m["completion_tokens"] - 1 <= emitted


def test_plain_generate_has_no_speculative_counters():
    body = REAL["plain"]["generate"]["response"]
    rec = record_from_response("generate", body, 0.1)
    assert rec.spec is None and rec.tau is None
    assert not [k for k in body["meta_info"] if k.startswith("spec_")]


@pytest.mark.parametrize("name", ("plain",) + SPEC)
def test_generate_stream_folds_to_the_unstreamed_answer(name):
    raw = REAL[name]["generate_stream"]
    evs = events(raw)
    rec = record_from_stream("generate", evs, raw["events"][-1][0])
    whole = REAL[name]["generate"]["response"]
    # greedy, same prompt: the stream's last chunk repeats the whole answer
    assert rec.text == whole["text"] and evs[-1][1]["output_ids"] == whole["output_ids"]
    assert sum(rec.chunk_tokens) == rec.completion_tokens == len(whole["output_ids"])
    assert len(rec.itl) == rec.completion_tokens - rec.chunk_tokens[0]
    assert rec.ttft == evs[0][0]
    if name == "plain":
        assert set(rec.chunk_tokens) == {1}  # one token per step
    else:
        assert max(rec.chunk_tokens) > 1  # a verify step streams its accepted drafts together
        assert rec.spec.verify_ct == evs[-1][1]["meta_info"]["spec_verify_ct"]


@pytest.mark.parametrize("name", ("plain",) + SPEC)
def test_completions_stream_usage_and_text(name):
    raw = REAL[name]["completions_stream"]
    rec = record_from_stream("completions", events(raw), raw["events"][-1][0])
    whole = REAL[name]["completions"]["response"]
    assert rec.text == whole["choices"][0]["text"]
    assert rec.completion_tokens == whole["usage"]["completion_tokens"] == raw["events"][-2][1]["usage"]["completion_tokens"]
    assert rec.finish_reason == whole["choices"][0]["finish_reason"]


def test_chat_without_a_template_is_refused_by_sglang():
    """The tiny zoo first shipped without a chat template: SGLang 0.5.16 answered 400 (specdec serve had
    invented a transcript). The zoo now ships one, and specdec serve refuses a model without one too."""
    for name in ("plain",) + SPEC:
        assert REAL[name]["chat_stream"]["status"] == 400
        assert REAL[name]["server_info"]["chat_template"] is None


@pytest.mark.parametrize("name", ("plain",) + SPEC)
def test_server_info(name):
    info = ServerInfo.parse(REAL[name]["server_info"])
    assert info.version == "0.5.16"
    if name == "plain":
        assert info.speculative_algorithm is None and info.num_draft_tokens is None
    else:
        assert info.speculative_algorithm == "EAGLE"  # NEXTN is rewritten to EAGLE
        assert method_named(name).reported == info.speculative_algorithm  # what specdec serve reports for it
        assert (info.num_steps, info.topk, info.num_draft_tokens) == (3, 1, 4)
        assert info.max_running_requests == 48  # SGLang's cap with speculation when none is set
    draft = REAL[name]["server_info"]["speculative_draft_model_path"]
    assert (draft is not None) == (name == "eagle")


def test_metrics_counters():
    spec = MetricsSnapshot.parse(REAL["nextn"]["metrics"])
    plain = MetricsSnapshot.parse(REAL["plain"]["metrics"])
    assert spec.spec_verify_calls_total is not None and spec.spec_verify_calls_total > 0
    assert spec.generation_tokens_total > spec.spec_verify_calls_total  # more than one token per verify
    assert plain.generation_tokens_total > 0
    assert not plain.spec_verify_calls_total


def test_check_prompts_accept_length_equals_the_lab2_decoders():
    """SGLang's NEXTN on the four check prompts, 128 tokens each, against the Lab 2 decoder with the same
    MTP layer and k = 3 in the same run (benchmarks/results/gpu_lab3/zoo/summary.json)."""
    summary = json.loads((Path(__file__).parents[1] / "benchmarks" / "results" / "gpu_lab3" / "zoo" / "summary.json").read_text())
    rows = REAL["nextn"]["check_prompts"]
    sglang = sum(r["completion_tokens"] for r in rows) / sum(r["spec_verify_ct"] for r in rows)
    ours = summary["lab2_decoder_mtp_k3"]["torch.float32"]["sglang_accept_length_weighted"]
    assert sglang == pytest.approx(ours, abs=0.05)


def test_lab3_checks_include_the_real_answers_and_catch_the_prefill_slip():
    """lab3.q1 grades on real SGLang answers too, and the classic slip (dividing every completion token,
    as spec_accept_length does) fails on each of them."""
    from specdec.grading import lab3

    assert len(lab3.RECORDED) >= 10 and any(m.get("spec_verify_ct") is None for m in lab3.RECORDED)
    spec = [m for m in lab3.RECORDED if m.get("spec_verify_ct")]
    assert all(m["spec_accept_length"] == pytest.approx(m["completion_tokens"] / m["spec_verify_ct"]) for m in spec)
    right = {"accept_length_of": lab3.reference_accept_length_of}
    slip = {"accept_length_of": lambda m: m["completion_tokens"] / m["spec_verify_ct"] if m.get("spec_verify_ct") else None}
    for seed in range(3):
        assert run_check(get_exercise("lab3.q1"), right, seed=seed).score == 1.0
        res = run_check(get_exercise("lab3.q1"), slip, seed=seed)
        # 13 cases, 3 of them real: it is wrong on every one with counters, and the None without counters, right
        # whatever the formula, earns nothing alone
        assert res.score == 0.0 and "first token came from the prefill" in res.message


def test_chat_with_the_zoos_template_matches_specdec_serve():
    """With the template the zoo now ships, SGLang serves chat; its prompt is the one specdec serve renders
    (same token count), and the streamed chat folds to the unstreamed answer."""
    from specdec.decoder.bundle import load_tokenizer
    from specdec.serving.server.protocol import chat_prompt
    from specdec.zoo import zoo_parts

    rec = REAL["nextn"]["chat_with_template"]
    whole = rec["chat"]["response"]
    assert rec["chat"]["status"] == 200 and rec["chat_stream"]["status"] == 200
    messages = rec["chat"]["request"]["body"]["messages"]
    tok = load_tokenizer(zoo_parts("tiny")["target"])
    assert len(tok(chat_prompt(messages, tok))["input_ids"]) == whole["usage"]["prompt_tokens"]
    streamed = record_from_stream("chat", events(rec["chat_stream"]), rec["chat_stream"]["events"][-1][0])
    assert streamed.text == whole["choices"][0]["message"]["content"]
    assert streamed.completion_tokens == whole["usage"]["completion_tokens"] == 24
    assert streamed.finish_reason == "length"
