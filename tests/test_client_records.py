"""Every metric the client computes, on recorded SGLang responses (tests/fixtures/sglang/, each file
says where it comes from): accept length per request and across requests, per-position acceptance
from the histogram, ITL divided by the tokens of each chunk, and each version's field names."""

import json
import math
from pathlib import Path

import pytest

from specdec.serving.measure.records import (
    MetricsSnapshot,
    RequestRecord,
    ServerInfo,
    SpecStats,
    accept_length_sglang,
    acceptance_by_position,
    aggregate_acceptance,
    conditional_acceptance_by_position,
    interval_accept_length,
    parse_prometheus,
    record_from_response,
    record_from_stream,
    tau,
    tau_from_histogram,
)

FIXTURES = Path(__file__).parent / "fixtures" / "sglang"
ZOO = json.loads((FIXTURES / "zoo_0516_generate.json").read_text())["modes"]
META = json.loads((FIXTURES / "meta_by_version.json").read_text())
OPENAI = json.loads((FIXTURES / "openai_0516.json").read_text())


def zoo_records(mode: str) -> list[RequestRecord]:
    return [record_from_response("generate", {"text": "", "meta_info": m}, m["e2e_latency"]) for m in ZOO[mode]["meta_info"]]


@pytest.mark.parametrize("mode", ["nextn", "eagle", "standalone"])
def test_per_request_accept_length_and_sglangs_own_field(mode):
    for rec in zoo_records(mode):
        m, ct = rec.meta_info, rec.spec.verify_ct
        assert rec.tau == pytest.approx((m["completion_tokens"] - 1) / ct)
        # SGLang's spec_accept_length counts the prefill token: completion / verify, exactly
        assert accept_length_sglang(rec.completion_tokens, ct) == pytest.approx(m["spec_accept_length"], rel=1e-12)
        assert rec.tau < rec.spec.server_accept_length
        h = rec.spec.histogram
        assert sum(h) == ct and sum(i * x for i, x in enumerate(h)) == rec.spec.correct_drafts
        assert rec.spec.proposed_drafts == 3 * ct  # chain of 3 drafts per verify (topk 1, 4 draft tokens)


def test_token_weighted_acceptance_across_requests_on_the_nextn_record():
    agg = aggregate_acceptance(zoo_records("nextn"))
    cts = [m["spec_verify_ct"] for m in ZOO["nextn"]["meta_info"]]  # 45, 40, 35, 64
    assert cts == [45, 40, 35, 64] and agg["spec_verify_ct"] == 184 and agg["completion_tokens"] == 512
    assert agg["accept_length"] == pytest.approx((512 - 4) / 184)
    # the recording script weighted SGLang's way, sum(completion) / sum(verify)
    assert agg["accept_length_sglang"] == pytest.approx(ZOO["nextn"]["accept_length_weighted_by_script"])
    # token weighting is not the mean of per-request values
    mean = sum(r.tau for r in zoo_records("nextn")) / 4
    assert abs(mean - agg["accept_length"]) > 0.05
    # summed histogram [51, 22, 22, 89]: position j accepted in sum(h[j:]) / 184 of the verify steps
    assert agg["acceptance_by_position"] == pytest.approx([133 / 184, 111 / 184, 89 / 184])


def test_server_wide_average_is_read_but_differs_from_the_per_request_figure():
    recorded = ZOO["nextn"]["avg_spec_accept_length"][0]
    info = ServerInfo.parse({"version": "0.5.16", "internal_states": [{"avg_spec_accept_length": recorded}]})
    assert info.avg_spec_accept_length == 3.0375
    assert info.avg_spec_accept_length != pytest.approx(aggregate_acceptance(zoo_records("nextn"))["accept_length"], abs=0.1)


def test_plain_decoding_has_no_acceptance():
    recs = zoo_records("plain")
    assert all(r.spec is None and r.tau is None for r in recs)
    assert aggregate_acceptance(recs)["accept_length"] is None


def test_per_position_acceptance_from_the_h200_histogram():
    h = META["0.5.16_spec"]["spec_correct_drafts_histogram"]  # [80, 59, 14, 4] over 157 verify steps
    assert acceptance_by_position(h) == pytest.approx([77 / 157, 18 / 157, 4 / 157])
    assert conditional_acceptance_by_position(h) == pytest.approx([77 / 157, 18 / 77, 4 / 18])
    assert tau_from_histogram(h) == pytest.approx(1 + 99 / 157)
    assert math.isnan(conditional_acceptance_by_position([5, 0, 0])[1])
    for bad in ([], [0, 0], [3, -1]):
        with pytest.raises(ValueError):
            acceptance_by_position(bad)
    with pytest.raises(ValueError):
        tau(10, 0)


@pytest.mark.parametrize("version", ["0.5.10_spec", "0.5.16_spec", "0.5.23_spec"])
def test_every_versions_field_names_give_the_same_counters(version):
    s = SpecStats.from_meta(META[version])
    assert (s.verify_ct, s.correct_drafts, s.proposed_drafts, s.histogram) == (157, 99, 471, [80, 59, 14, 4])
    rec = record_from_response("generate", {"meta_info": META[version]}, 1.0)
    assert rec.tau == pytest.approx(255 / 157)


@pytest.mark.parametrize("version", ["0.5.16_plain", "0.5.5_plain"])
def test_plain_meta_info_of_every_version_has_no_spec_stats(version):
    assert SpecStats.from_meta(META[version]) is None


def test_the_generate_stream_divides_each_gap_by_the_tokens_of_its_chunk():
    fx = json.loads((FIXTURES / "generate_stream_0516.json").read_text())
    rec = record_from_stream("generate", [tuple(e) for e in fx["events"]], fx["t_end"])
    assert rec.chunk_tokens == [1, 3, 1, 3] and rec.ttft == pytest.approx(0.2)
    # gaps 0.03 (3 tokens), 0.02 (1 token), 0.03 (3 tokens): one ITL entry per token
    assert rec.itl == pytest.approx([0.01] * 3 + [0.02] + [0.01] * 3)
    assert len(rec.itl) == rec.completion_tokens - 1
    assert rec.text == " Tuesday, Wednesday Thursday, Friday,"
    assert rec.tpot == pytest.approx((0.281 - 0.2) / 7)
    assert rec.tau == pytest.approx(7 / 3) and rec.spec.histogram == [1, 0, 2, 0]
    assert rec.verify_time == pytest.approx((0.281 - 0.2) / 3)
    assert rec.finish_reason == {"type": "length", "length": 8} and rec.server_e2e_latency == 0.279
    assert rec.output_ids == [11, 5, 12, 5, 13, 5, 14, 5]  # the last chunk's: every chunk repeats the ids so far
    rec.prompt = "Monday,"
    assert rec.summary(ids=True)["output_ids"] == rec.output_ids and rec.summary(ids=True)["prompt"] == "Monday,"
    assert "output_ids" not in rec.summary() and "prompt" not in rec.summary()


def test_the_chat_stream_counts_tokens_from_usage_and_skips_the_role_chunk():
    rec = record_from_stream("chat", [tuple(e) for e in OPENAI["chat_stream"]], 0.152)
    assert rec.ttft == pytest.approx(0.1) and rec.chunk_tokens == [1, 3, 1]
    assert rec.itl == pytest.approx([0.01] * 3 + [0.02])
    assert rec.text == " Tuesday, Wednesday, Thursday," and rec.completion_tokens == 5 and rec.prompt_tokens == 20
    assert rec.finish_reason == "length" and rec.spec is None


def test_a_stream_without_per_chunk_counts_is_never_guessed():
    events = [tuple(e) for e in OPENAI["completion_stream_without_continuous_usage"]]
    rec = record_from_stream("completions", events, 0.072)
    assert rec.completion_tokens == 3 and rec.chunk_tokens == [1, 1, 1]  # 3 chunks for 3 tokens: one each, certain
    assert rec.itl == pytest.approx([0.01, 0.02])
    events[-1] = (0.071, {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5}})
    rec = record_from_stream("completions", events, 0.072)
    assert rec.completion_tokens == 5 and rec.itl == [] and rec.chunk_tokens == []  # 5 tokens in 3 chunks: unknown split
    assert rec.ttft == pytest.approx(0.04)


def test_non_streaming_openai_answers():
    c = record_from_response("completions", OPENAI["completion"], 0.5)
    assert (c.text, c.completion_tokens, c.prompt_tokens, c.finish_reason) == (" Tuesday, Wednesday", 4, 8, "length")
    assert c.ttft is None and c.tpot is None and c.itl == []
    ch = record_from_response("chat", OPENAI["chat"], 0.5)
    assert (ch.text, ch.completion_tokens, ch.finish_reason) == ("Tuesday", 2, "stop")


def test_an_error_mid_stream_is_raised_not_folded():
    events = [(0.1, {"text": "a", "meta_info": {"completion_tokens": 1}}),
              (0.2, {"error": {"message": "prompt too long", "code": 400}})]
    with pytest.raises(ValueError, match="prompt too long"):
        record_from_stream("generate", events, 0.3)
    with pytest.raises(ValueError, match="kind must be"):
        record_from_stream("embeddings", [], 0.0)


def test_server_info_of_each_version():
    fx = json.loads((FIXTURES / "server_info.json").read_text())
    nextn = ServerInfo.parse(fx["0.5.16_nextn"])
    assert (nextn.version, nextn.speculative_algorithm, nextn.num_draft_tokens) == ("0.5.16", "EAGLE", 4)
    assert nextn.avg_spec_accept_length == 3.0375 and nextn.max_running_requests == 48 and nextn.step_time == {}
    plain = ServerInfo.parse(fx["0.5.16_plain"])
    assert plain.avg_spec_accept_length is None and plain.speculative_algorithm is None
    new = ServerInfo.parse(fx["0.5.23_step_time"])
    assert new.step_time == pytest.approx({1: 0.005, 8: 0.012, 32: 0.030})  # medians over both DP ranks
    assert new.avg_spec_accept_length == pytest.approx(3.0) and new.last_gen_throughput == 150.0
    # a run's width the server never stepped at full: the widest batch below it, none below the narrowest
    assert (new.step_time_at(8), new.step_time_at(16), new.step_time_at(64)) == pytest.approx((0.012, 0.012, 0.030))
    assert new.step_time_at(0) is None and nextn.step_time_at(4) is None


def test_prometheus_metrics():
    text = (FIXTURES / "metrics_0516.txt").read_text()
    samples = parse_prometheus(text)
    labels, value = samples["sglang:generation_tokens_total"][0]
    assert value == 400.0 and labels["label_with_escapes"] == 'a \\"quoted\\" b, c=d'
    assert math.isnan(samples["sglang:gen_throughput"][0][1])
    snap = MetricsSnapshot.parse(text)
    assert snap.spec_accept_length == 3.0  # a gauge: averaged over ranks
    assert snap.spec_verify_calls_total == 160.0  # a counter: summed (its _created sample is another name)
    assert snap.generation_tokens_total == 400.0 and snap.num_running_reqs == 5.0
    later = MetricsSnapshot.parse(text.replace("} 100.0", "} 140.0").replace("} 400.0", "} 520.0"))
    assert interval_accept_length(snap, later) == pytest.approx(120 / 40)
    assert interval_accept_length(snap, snap) is None
    assert MetricsSnapshot.parse("").spec_verify_calls_total is None


def test_summary_is_json_without_text():
    rec = zoo_records("eagle")[0]
    s = rec.summary()
    json.dumps(s)
    assert s["spec_verify_ct"] == 50 and s["accept_length"] == pytest.approx(127 / 50) and "text" not in s


def test_one_token_weighted_accept_length_for_records_runs_and_metas():
    """records.pooled_tau is the one rule: a request of 11 tokens over 2 steps and one of 31 over 5
    give (10 + 30) / 7, not the mean of 5.0 and 6.0; parts without verify steps are left out."""
    from specdec.grading.lab3 import reference_overall_accept_length
    from specdec.serving.measure.compare import tau_of_runs
    from specdec.serving.measure.records import pooled_tau

    assert pooled_tau([(11, 1, 2), (31, 1, 5), (9, 1, 0)]) == pytest.approx(40 / 7)
    assert pooled_tau([(9, 1, None)]) is None
    metas = [{"completion_tokens": 11, "spec_verify_ct": 2}, {"completion_tokens": 31, "spec_verify_ct": 5},
             {"completion_tokens": 9}]
    assert reference_overall_accept_length(metas) == pytest.approx(40 / 7)
    runs = [{"spec_completion_tokens": 42, "spec_requests": 2, "spec_verify_ct": 7},
            {"spec_completion_tokens": 9, "spec_requests": 1, "spec_verify_ct": None}]
    assert tau_of_runs(runs) == pytest.approx(40 / 7)
