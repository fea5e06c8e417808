"""Real clients against `specdec serve`, unchanged (issue 18): the `openai` package, the exact requests that SGLang
0.5.16's own benchmark client sends (recorded by benchmarks/sglang_bench_client.sh record), and every answer's
shape against the answers real SGLang 0.5.16 gave to the same requests (tests/fixtures/sglang/real_0516_zoo.json)."""

import json
import logging
import threading
import time
from pathlib import Path

import pytest
import requests
from serve_tools import running_server, stream_events

from specdec.decoder.engine import Engine

FIXTURES = Path(__file__).parent / "fixtures" / "sglang"
REAL = json.loads((FIXTURES / "real_0516_zoo.json").read_text())["servers"]
BENCH = json.loads((FIXTURES / "bench_serving_0516_requests.json").read_text())["runs"]
PROMPTS = ["Monday, Tuesday, Wednesday,", "import os\nimport sys\n\ndef main(", "x = 1\nfor i in range(10):\n"]
K = 3  # SGLang's recorded NEXTN server ran 3 steps


@pytest.fixture(scope="module")
def spec(tiny_bundle):
    with running_server(tiny_bundle, "mtp", k=K, max_batch=8) as (url, scheduler):
        yield url, scheduler


@pytest.fixture(scope="module")
def plain(tiny_bundle):
    with running_server(tiny_bundle, "ar", max_batch=4) as (url, scheduler):
        yield url, scheduler


@pytest.fixture(scope="module")
def oai(spec):
    import openai  # here: at collection, every worker would pay for its import
    return openai.OpenAI(base_url=spec[0] + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def alone(tiny_bundle):
    """Greedy continuations of each prompt, 16 tokens, decoded by the engine alone, as the server's text."""
    e = Engine(tiny_bundle, "ar", max_batch=1, max_len=512, cuda_graphs="off")
    tok = tiny_bundle.tokenizer
    ids = {p: e.generate([tok(p)["input_ids"]], max_new_tokens=16, stop_at_eos=False).tokens[0] for p in PROMPTS}
    return {p: tok.decode(t, skip_special_tokens=True) for p, t in ids.items()}


# -- shapes: the same requests real SGLang 0.5.16 answered ----------------------------------------
def shape(x):
    """Keys in order, recursively; leaves as their kind (null stays null: SGLang's nulls are part of its shape)."""
    if isinstance(x, dict):
        return {k: shape(v) for k, v in x.items()}
    if isinstance(x, list):
        return [shape(x[0])] if x else []
    if x is None or isinstance(x, bool):
        return x if x is None else "bool"
    return "number" if isinstance(x, (int, float)) else type(x).__name__


def differences(ours, real, path="") -> list[str]:
    if isinstance(ours, dict) and isinstance(real, dict):
        out = [f"{path}: keys {list(ours)} != {list(real)}"] if list(ours) != list(real) else []
        return out + [d for key in set(ours) & set(real) for d in differences(ours[key], real[key], f"{path}.{key}")]
    if isinstance(ours, list) and isinstance(real, list):
        return differences(ours[0], real[0], path + "[0]") if ours and real else []
    return [] if ours == real else [f"{path}: {ours} != {real}"]


def recorded(name: str, what: str) -> dict:
    return REAL["nextn"]["chat_with_template"][what] if what.startswith("chat") else REAL[name][what]


@pytest.mark.parametrize("name", ["plain", "nextn"])
@pytest.mark.parametrize("what", ["generate", "completions", "chat"])
def test_answers_have_the_shape_sglang_0516_sent(name, what, spec, plain):
    url = (plain if name == "plain" else spec)[0]
    rec = recorded(name, what)
    r = requests.post(url + rec["request"]["path"], json=rec["request"]["body"], timeout=60)
    assert r.status_code == rec["status"] == 200
    ours = r.json()
    if name == "plain" and what == "generate":
        assert not [k for k in ours["meta_info"] if k.startswith("spec_")]  # as SGLang's plain server
    assert differences(shape(ours), shape(rec["response"])) == []


@pytest.mark.parametrize("name", ["plain", "nextn"])
@pytest.mark.parametrize("what", ["generate_stream", "completions_stream", "chat_stream"])
def test_stream_chunks_have_the_shape_sglang_0516_sent(name, what, spec, plain):
    """The first chunk (chat: the role), the second, the last two (chat: the finish chunk and usage)."""
    url = (plain if name == "plain" else spec)[0]
    rec = recorded(name, what)
    ours = stream_events(url + rec["request"]["path"], rec["request"]["body"])
    real = [c for _, c in rec["events"] if c != "[DONE]"]
    assert len(ours) >= 4
    for i in (0, 1, -2, -1):
        assert differences(shape(ours[i]), shape(real[i])) == [], i


def test_meta_info_timings_are_honest(spec):
    """Timestamps are wall-clock, in the order things happened; the latencies follow from them."""
    url, _ = spec
    before = time.time()
    meta = requests.post(url + "/generate", json={"text": PROMPTS[0], "sampling_params": {
        "max_new_tokens": 24, "temperature": 0, "ignore_eos": True}}, timeout=60).json()["meta_info"]
    after = time.time()
    stamps = [meta[k] for k in ("request_received_ts", "api_server_dispatch_finish_ts", "request_finished_ts",
                                "response_sent_to_client_ts")]
    assert before <= stamps[0] <= stamps[1] <= stamps[2] <= stamps[3] <= after, stamps
    assert meta["e2e_latency"] == pytest.approx(stamps[2] - stamps[0], abs=1e-3)
    assert meta["decode_throughput"] >= (24 - 1) / meta["e2e_latency"] > 0
    assert 0 <= meta["queue_time"] <= meta["e2e_latency"]
    assert (meta["weight_version"], meta["num_retractions"], meta["reasoning_tokens"], meta["cached_tokens"]) == \
        ("default", 0, 0, 0)


def test_queue_time_is_the_wait_for_a_row(tiny_bundle):
    """With one row, a request that arrives while another decodes waits in the queue, and says so."""
    with running_server(tiny_bundle, "ar", max_batch=1) as (url, _):
        def ask(n):
            return requests.post(url + "/generate", json={"text": PROMPTS[1], "sampling_params": {
                "max_new_tokens": n, "temperature": 0, "ignore_eos": True}}, timeout=120).json()["meta_info"]

        first = threading.Thread(target=ask, args=(200,))
        first.start()
        time.sleep(0.3)  # decoding by now
        second = ask(4)
        first.join()
    assert second["queue_time"] > 0.05 and second["e2e_latency"] > second["queue_time"]


def test_server_info_and_metrics_report_what_sglang_reports(tiny_bundle):
    with running_server(tiny_bundle, "mtp", k=K, max_batch=2) as (url, _):
        state = requests.get(url + "/server_info", timeout=10).json()["internal_states"][0]
        assert "avg_spec_accept_length" not in state  # 0.5.16 leaves it out until a verify step was counted
        assert state["max_speculative_num_draft_tokens"] == K + 1
        mem = state["memory_usage"]
        assert list(mem) == ["weight", "kvcache", "token_capacity", "graph"]
        assert mem["weight"] > 0 and mem["kvcache"] > 0 and mem["graph"] == 0  # no CUDA graphs on the CPU
        assert mem["token_capacity"] == 2 * 512
        requests.post(url + "/generate", json={"text": PROMPTS[0], "sampling_params": {
            "max_new_tokens": 32, "temperature": 0, "ignore_eos": True}}, timeout=60)
        state = requests.get(url + "/server_info", timeout=10).json()["internal_states"][0]
        assert state["avg_spec_accept_length"] >= 1
        metrics = dict(line.split("{")[0:1] + [float(line.rsplit(" ", 1)[1])] for line in
                       requests.get(url + "/metrics", timeout=10).text.splitlines() if line.startswith("sglang:"))
    assert metrics["sglang:spec_num_steps"] == K and metrics["sglang:spec_num_draft_tokens"] == K + 1
    length = metrics["sglang:spec_accept_length"]
    assert 1 <= length <= K + 1
    assert metrics["sglang:spec_accept_rate"] == pytest.approx((length - 1) / K)


def test_plain_server_info_has_no_speculative_numbers(plain):
    url, _ = plain
    state = requests.get(url + "/server_info", timeout=10).json()["internal_states"][0]
    assert state["max_speculative_num_draft_tokens"] is None and "avg_spec_accept_length" not in state
    assert "sglang:spec_" not in requests.get(url + "/metrics", timeout=10).text


def test_health_generate_probes_are_not_requests(plain):
    url, scheduler = plain
    before = dict(scheduler.state()["counters"])
    for _ in range(3):
        assert requests.get(url + "/health_generate", timeout=30).status_code == 200
    after = scheduler.state()["counters"]
    for key in ("requests", "prompt_tokens", "generation_tokens"):
        assert after.get(key, 0) == before.get(key, 0), key


# -- the openai package --------------------------------------------------------------------------
def test_openai_completions_and_a_list_prompt(oai, alone):
    one = oai.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=16, temperature=0,
                                 extra_body={"ignore_eos": True})
    assert one.choices[0].text == alone[PROMPTS[0]] and one.choices[0].finish_reason == "length"
    assert one.model == "tiny" and one.usage.completion_tokens == 16
    batch = oai.completions.create(model="tiny", prompt=PROMPTS, max_tokens=16, temperature=0,
                                   extra_body={"ignore_eos": True})
    assert [c.index for c in batch.choices] == [0, 1, 2]
    assert [c.text for c in batch.choices] == [alone[p] for p in PROMPTS]  # one choice per prompt, in order
    assert batch.usage.completion_tokens == 48
    assert batch.usage.prompt_tokens == sum(oai.completions.create(model="tiny", prompt=p, max_tokens=1).usage
                                            .prompt_tokens for p in PROMPTS)


def test_openai_token_id_prompts_and_n(oai, tiny_bundle, alone):
    ids = [tiny_bundle.tokenizer(p)["input_ids"] for p in PROMPTS[:2]]
    out = oai.completions.create(model="tiny", prompt=ids, max_tokens=16, temperature=0, n=2,
                                 extra_body={"ignore_eos": True})
    assert [c.index for c in out.choices] == [0, 1, 2, 3]  # prompt i's sample j is choice i * n + j
    assert [c.text for c in out.choices] == [alone[PROMPTS[0]]] * 2 + [alone[PROMPTS[1]]] * 2
    assert out.usage.prompt_tokens == len(ids[0]) + len(ids[1])  # counted once per prompt, as SGLang does
    assert out.usage.completion_tokens == 4 * 16
    echo = oai.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=4, temperature=0, echo=True)
    assert echo.choices[0].text.startswith(PROMPTS[0])


def test_openai_completions_stream_with_usage(oai, alone):
    chunks = list(oai.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=16, temperature=0, stream=True,
                                         stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    assert all(c.usage is None for c in chunks[:-1])
    assert "".join(c.choices[0].text for c in chunks[:-1]) == alone[PROMPTS[1]]
    assert chunks[-2].choices[0].finish_reason == "length"


def test_openai_chat(oai, spec):
    out = oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPTS[0]}],
                                      max_tokens=16, temperature=0)
    msg = out.choices[0].message
    assert msg.role == "assistant" and msg.content and msg.tool_calls is None
    assert msg.model_extra == {"reasoning_content": None}  # SGLang's field, beyond OpenAI's
    assert out.model == "tiny" and out.usage.completion_tokens <= 16 and out.choices[0].finish_reason
    parts = oai.chat.completions.create(model="tiny", temperature=0, max_tokens=16, messages=[
        {"role": "user", "content": [{"type": "text", "text": PROMPTS[0]}]}])
    assert parts.choices[0].message.content == msg.content  # a list of one text part is the same message
    # a multi-turn chat whose assistant turn only called a tool: content null
    turns = oai.chat.completions.create(model="tiny", temperature=0, max_tokens=8, messages=[
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": None},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    assert turns.choices[0].finish_reason in ("stop", "length")
    # the prompt is the template's rendering of "" for the null turn and the parts joined by a space
    meta = requests.post(spec[0] + "/v1/chat/completions", json={"messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}, {"role": "user", "content": "a b"}],
        "max_tokens": 8, "temperature": 0}, timeout=60).json()
    assert meta["choices"][0]["message"]["content"] == turns.choices[0].message.content
    assert meta["usage"]["prompt_tokens"] == turns.usage.prompt_tokens


def test_openai_chat_n(oai):
    out = oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                      temperature=0, n=3)
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert len({c.message.content for c in out.choices}) == 1  # greedy: n identical answers
    one = oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                      temperature=0)
    assert out.usage.completion_tokens == 3 * one.usage.completion_tokens
    assert out.usage.prompt_tokens == one.usage.prompt_tokens  # one prompt, counted once


def test_openai_chat_stream_with_usage(oai):
    body = dict(model="tiny", messages=[{"role": "user", "content": PROMPTS[2]}], max_tokens=16, temperature=0,
                extra_body={"ignore_eos": True})
    whole = oai.chat.completions.create(**body)
    chunks = list(oai.chat.completions.create(**body, stream=True, stream_options={"include_usage": True}))
    first, finish, last = chunks[0].choices[0], chunks[-2].choices[0], chunks[-1]
    assert (first.delta.role, first.delta.content, first.finish_reason) == ("assistant", "", None)
    assert finish.delta.content is None and finish.finish_reason == "length"  # a chunk of its own
    assert last.choices == [] and last.usage.completion_tokens == 16
    assert all(c.choices[0].finish_reason is None for c in chunks[1:-2])
    assert "".join(c.choices[0].delta.content for c in chunks[1:-2]) == whole.choices[0].message.content


def test_chat_without_max_tokens_decodes_to_the_context(tiny_bundle):
    """SGLang gives chat no default budget: it stops at EOS or where the context ends (not at 16)."""
    with running_server(tiny_bundle, "mtp", k=K, max_batch=1, max_len=96) as (url, _):
        import openai  # here: at collection, every worker would pay for its import
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        out = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                             temperature=0, extra_body={"ignore_eos": True})
        short = client.completions.create(model="tiny", prompt="hi", temperature=0, extra_body={"ignore_eos": True})
    assert out.choices[0].finish_reason == "length"
    assert out.usage.prompt_tokens + out.usage.completion_tokens + K + 1 == 96  # the engine's room for a verify
    assert short.usage.completion_tokens == 16  # completions keep OpenAI's and SGLang's default of 16


def test_unknown_fields_are_ignored_and_named_once(oai, caplog):
    caplog.set_level(logging.WARNING, logger="specdec.serve")
    for _ in range(2):
        out = oai.completions.create(model="tiny", prompt="hi", max_tokens=2, best_of=1, user="me",
                                     extra_body={"return_routed_experts": False, "a_field_from_the_future": {"x": 1}})
        assert out.usage.completion_tokens == 2
    named = [r for r in caplog.records if "a_field_from_the_future" in r.getMessage()]
    assert len(named) == 1 and "ignoring" in named[0].getMessage()
    assert not [r for r in caplog.records if "best_of" in r.getMessage() or "routed" in r.getMessage()]


@pytest.mark.parametrize("call, field", [
    (dict(prompt="hi", logprobs=2), "logprobs"),
    (dict(prompt="hi", frequency_penalty=0.5), "frequency_penalty"),
    (dict(prompt="hi", extra_body={"regex": "[ab]+"}), "regex"),
])
def test_features_that_would_change_the_answer_are_refused_naming_sglangs(oai, call, field):
    import openai  # here: at collection, every worker would pay for its import
    with pytest.raises(openai.BadRequestError) as err:
        oai.completions.create(model="tiny", max_tokens=2, **call)
    assert field in str(err.value) and "SGLang" in str(err.value)


def test_generate_n_and_a_streamed_batch(spec, tiny_bundle):
    url, _ = spec
    outs = requests.post(url + "/generate", json={"text": PROMPTS[0], "sampling_params": {
        "max_new_tokens": 8, "temperature": 0, "n": 2, "ignore_eos": True}}, timeout=60).json()
    assert isinstance(outs, list) and len(outs) == 2 and outs[0]["output_ids"] == outs[1]["output_ids"]
    events = stream_events(url + "/generate", {"text": PROMPTS[:2], "stream": True, "sampling_params": {
        "max_new_tokens": 8, "temperature": 0, "ignore_eos": True}})
    last = {e["index"]: e for e in events}
    assert sorted(last) == [0, 1] and all(e["meta_info"]["completion_tokens"] == 8 for e in last.values())


# -- the exact requests of sglang.benchmark.serving (0.5.16) ----------------------------------------
def read_like_the_benchmark(backend: str, stream: bool, r: requests.Response,
                            budget: int) -> tuple[str, int, float | None]:
    """-> (text, output tokens, spec accept length), reading the fields sglang.benchmark.serving reads, the way it
    reads them: line by line with the `data: ` prefix removed (its non-streaming sglang and completions paths
    too), or the JSON body (its non-streaming chat path). Where no usage comes, it counts the budget it asked for."""
    if backend == "sglang-oai-chat" and not stream:
        body = r.json()
        message = body["choices"][0]["message"]
        return (message.get("reasoning_content") or "") + (message.get("content") or ""), \
            body.get("usage", {}).get("completion_tokens", budget), None
    text, tokens, accept = "", budget, None
    for line in r.iter_lines():
        line = line.strip()
        if not line:
            continue
        chunk = line.decode().removeprefix("data: ")
        if chunk == "[DONE]":
            continue
        data = json.loads(chunk)
        if backend == "sglang":
            meta = data.get("meta_info") or {}
            accept = meta.get("spec_accept_length", accept)
            if data["text"]:
                text, tokens = data["text"], data["meta_info"]["completion_tokens"]
        elif backend == "sglang-oai":
            if data["choices"][0]["text"]:  # it indexes choices[0] of every chunk
                text += data["choices"][0]["text"]
                tokens = (data.get("usage") or {}).get("completion_tokens", tokens)
        else:
            tokens = (data.get("usage") or {}).get("completion_tokens", tokens)
            delta = (data.get("choices") or [{}])[0].get("delta") or {}
            text += (delta.get("reasoning_content") or "") + (delta.get("content") or "")
    return text, tokens, accept


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "no_stream"])
@pytest.mark.parametrize("backend", ["sglang", "sglang-oai", "sglang-oai-chat"])
def test_sglang_benchmark_client_requests_replayed(backend, stream, spec):
    """Every request the client sent in a recorded run (model list, warm-up, flush, prompts, server info),
    byte for byte with its headers: each answers 200 with what the client reads from it."""
    url, _ = spec
    run = BENCH[backend]["stream" if stream else "no_stream"]
    posts = [r for r in run if r["body"]]
    assert len(posts) == 3 and all(r["body"]["stream"] is stream for r in posts)  # warm-up + 2 prompts
    assert any(k in r["body"] for r in posts for k in ("return_routed_experts", "best_of", "max_completion_tokens"))
    for sent in run:
        r = requests.request(sent["method"], url + sent["path"], headers=sent["headers"], timeout=120,
                             data=json.dumps(sent["body"]) if sent["body"] else None, stream=True)
        assert r.status_code == 200, (sent["path"], r.text[:300])
        if sent["path"] == "/v1/models":
            assert r.json()["data"][0]["id"] == "tiny"
        elif sent["path"] == "/server_info":
            assert r.json()["internal_states"][0].get("avg_spec_accept_length", 0) >= 1
        elif sent["body"]:
            budget = sent["body"].get("sampling_params", sent["body"]).get(
                "max_new_tokens", sent["body"].get("max_tokens", sent["body"].get("max_completion_tokens")))
            text, tokens, accept = read_like_the_benchmark(backend, stream, r, budget)
            assert text and tokens == budget  # ignore_eos: the whole budget, as the client counts it
            if backend == "sglang" and budget > 1:  # a verify step ran: the final chunk has the counters
                assert accept is not None and accept >= 1
