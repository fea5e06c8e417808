"""`specdec serve` against the real engine over real HTTP: SGLang's shapes, continuous batching,
streaming, bad input that leaves the server serving, and clean shutdown."""

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from serve_tools import idle, running_server, stream_events

from specdec.decoder.engine import Engine, SamplingParams

PROMPTS = ["import os\nimport sys\n\ndef main(", "Monday, Tuesday, Wednesday,",
           "class Queue:\n    def __init__(self, maxsize=0):\n        self.", "x = 1\nfor i in range(10):\n"]


@pytest.fixture(scope="module")
def server(tiny_bundle):
    with running_server(tiny_bundle, "mtp", k=4, max_batch=8) as (url, scheduler):
        yield url, scheduler


@pytest.fixture(scope="module")
def alone(tiny_bundle):
    """Greedy continuations of each prompt decoded alone, by the engine directly (no server)."""
    e = Engine(tiny_bundle, "ar", max_batch=1, max_len=512, cuda_graphs="off")
    tok = tiny_bundle.tokenizer
    return {p: e.generate([tok(p)["input_ids"]], max_new_tokens=24, stop_at_eos=False).tokens[0] for p in PROMPTS}


def generate(url, text, n=24, **extra):
    r = requests.post(f"{url}/generate", json={"text": text, "sampling_params": {
        "max_new_tokens": n, "temperature": 0, "ignore_eos": True}, **extra}, timeout=60)
    r.raise_for_status()
    return r.json()


def test_generate_has_sglang_meta_info(server, alone):
    url, _ = server
    out = generate(url, PROMPTS[0])
    meta = out["meta_info"]
    assert out["output_ids"] == alone[PROMPTS[0]]
    assert meta["completion_tokens"] == len(out["output_ids"]) == 24
    assert meta["finish_reason"] == {"type": "length", "length": 24}
    assert meta["prompt_tokens"] > 0 and meta["e2e_latency"] > 0
    assert meta["spec_accept_length"] == pytest.approx(meta["completion_tokens"] / meta["spec_verify_ct"])
    hist = meta["spec_correct_drafts_histogram"]
    assert len(hist) == 5 and sum(hist) == meta["spec_verify_ct"]
    assert meta["spec_num_correct_drafts"] == sum(i * n for i, n in enumerate(hist))
    assert meta["spec_num_correct_drafts"] == meta["completion_tokens"] - 1 - meta["spec_verify_ct"]
    assert meta["spec_num_proposed_drafts"] == 4 * meta["spec_verify_ct"]
    assert meta["spec_accept_histogram"] == hist  # the 0.5.16 alias


def test_32_concurrent_streams_equal_decoding_alone(server, alone):
    """Batching changes no token, every stream ends with [DONE], and its token count is what the
    server reports as completion_tokens."""
    url, scheduler = server

    def one(i):
        p = PROMPTS[i % len(PROMPTS)]
        events = stream_events(f"{url}/generate", {"text": p, "stream": True, "sampling_params": {
            "max_new_tokens": 24, "temperature": 0, "ignore_eos": True}})
        return p, events

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(one, range(32)))
    for p, events in results:
        last = events[-1]
        assert last["output_ids"] == alone[p]
        assert len(last["output_ids"]) == last["meta_info"]["completion_tokens"] == 24
        assert last["meta_info"]["finish_reason"]["type"] == "length"
        lengths = [len(e["output_ids"]) for e in events]
        assert lengths == sorted(lengths) and len(events) > 1  # cumulative, as SGLang streams
    assert idle(scheduler)


def test_a_request_arriving_mid_decode_finishes_first(server):
    url, _ = server
    done = {}

    def run(name, text, n):
        generate(url, text, n)
        done[name] = time.monotonic()

    long = threading.Thread(target=run, args=("long", PROMPTS[0], 300))
    long.start()
    time.sleep(0.3)  # the long request is decoding by now
    run("short", PROMPTS[1], 8)
    long.join()
    assert done["short"] < done["long"]


def test_stop_strings_end_the_text_before_them(server, alone, tiny_bundle):
    url, _ = server
    full = tiny_bundle.tokenizer.decode(alone[PROMPTS[1]])
    stop = full[5:9]
    out = requests.post(f"{url}/generate", json={"text": PROMPTS[1], "sampling_params": {
        "max_new_tokens": 24, "temperature": 0, "stop": [stop], "ignore_eos": True}}, timeout=60).json()
    assert out["text"] == full[: full.index(stop)]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


def test_openai_streams_with_usage(server, alone, tiny_bundle):
    url, _ = server
    want = tiny_bundle.tokenizer.decode(alone[PROMPTS[2]], skip_special_tokens=True)  # as SGLang
    for path, body, chat in (
            ("/v1/completions", {"prompt": PROMPTS[2]}, False),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, True)):
        body = {**body, "model": "tiny", "max_tokens": 24, "temperature": 0, "stream": True, "ignore_eos": True,
                "stream_options": {"include_usage": True}}
        events = stream_events(url + path, body)
        usage = events[-1]
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 24
        pieces = [e["choices"][0]["delta"].get("content", "") if chat else e["choices"][0]["text"] for e in events[:-1]]
        assert events[-2]["choices"][0]["finish_reason"] == "length"
        plain = requests.post(url + path, json={**body, "stream": False}, timeout=60).json()
        text = plain["choices"][0]["message"]["content"] if chat else plain["choices"][0]["text"]
        assert "".join(pieces) == text and plain["usage"]["completion_tokens"] == 24
        if not chat:
            assert text == want
        else:
            assert events[0]["choices"][0]["delta"]["role"] == "assistant"


def test_server_info_metrics_and_flush(server):
    url, scheduler = server
    generate(url, PROMPTS[3])
    info = requests.get(f"{url}/server_info", timeout=10).json()
    assert requests.get(f"{url}/get_server_info", timeout=10).json()["version"] == info["version"]
    state = info["internal_states"][0]
    assert info["version"] and info["speculative_algorithm"] == "EAGLE" and info["specdec_method"] == "mtp" and 1 <= state["avg_spec_accept_length"] <= 5
    metrics = requests.get(f"{url}/metrics", timeout=10).text
    values = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
              if line.startswith("sglang:")}
    assert values["sglang:generation_tokens_total"] >= 24 and values["sglang:spec_verify_calls_total"] >= 1
    assert values["sglang:num_running_reqs"] == 0
    assert requests.post(f"{url}/flush_cache", timeout=10).status_code == 200
    after = requests.get(f"{url}/server_info", timeout=10).json()["internal_states"][0]
    assert "avg_spec_accept_length" not in after  # reset by the flush

    long = threading.Thread(target=generate, args=(url, PROMPTS[0], 300))
    long.start()
    time.sleep(0.3)
    assert requests.post(f"{url}/flush_cache", timeout=10).status_code == 400  # busy, as SGLang
    long.join()


def malformed(url: str) -> list[tuple[str, dict]]:
    """(path, requests.post kwargs) of bad requests of every kind."""
    gen, comp, chat = f"{url}/generate", f"{url}/v1/completions", f"{url}/v1/chat/completions"
    js = lambda d: {"data": json.dumps(d), "headers": {"content-type": "application/json"}}  # noqa: E731
    cases = [
        (gen, {"data": b"{not json"}), (gen, {"data": b"\xff\xfe\x00garbage"}), (gen, {"data": b""}),
        (gen, js([1, 2, 3])), (gen, js("text")), (gen, js({})), (gen, js({"text": ""})),
        (gen, js({"text": 5})), (gen, js({"text": "a", "input_ids": [1]})), (gen, js({"input_ids": [1, 99999]})),
        (gen, js({"input_ids": []})), (gen, js({"input_ids": [True, False]})),
        (gen, js({"text": "a", "sampling_params": {"max_new_tokens": -1}})),
        (gen, js({"text": "a", "sampling_params": {"max_new_tokens": 10**9}})),
        (gen, js({"text": "a", "sampling_params": {"max_new_tokens": "5"}})),
        (gen, js({"text": "a", "sampling_params": {"temperature": -0.5}})),
        (gen, js({"text": "a", "sampling_params": {"top_p": 0}})),
        (gen, js({"text": "a", "sampling_params": {"top_p": 1.5}})),
        (gen, js({"text": "a", "sampling_params": {"top_k": 2.5}})),
        (gen, js({"text": "a", "sampling_params": {"stop": 7}})),
        (gen, js({"text": "a", "sampling_params": {"seed": -3}})),
        (gen, js({"text": "a", "sampling_params": {"frequency_penalty": 0.5}})),
        (gen, js({"text": "a", "sampling_params": {"n": 0}})),
        (gen, js({"text": "a", "return_logprob": True})),
        (gen, js({"text": "a", "sampling_params": []})), (gen, js({"text": "a", "stream": "yes"})),
        (gen, js({"text": "a", "rid": 5})), (gen, js({"text": ["a", 3]})),
        (gen, js({"input_ids": list(range(600))})),  # longer than the context
        (comp, js({})), (comp, js({"prompt": 3})), (comp, js({"prompt": "a", "max_tokens": 0})),
        (comp, js({"prompt": "a", "n": 0})), (comp, js({"prompt": "a", "logprobs": 3})),
        (comp, js({"prompt": "a", "stream_options": 1})), (comp, js({"prompt": []})),
        (comp, js({"prompt": "a", "echo": "yes"})), (comp, js({"prompt": ["a", ""]})),
        (chat, js({})), (chat, js({"messages": []})), (chat, js({"messages": [{"role": "user"}]})),
        (chat, js({"messages": "hi"})), (chat, js({"messages": [{"role": "user", "content": 1}]})),
        (chat, js({"messages": [{"role": "user", "content": None}]})),
        (chat, js({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})),
        (chat, js({"messages": [{"role": "wizard", "content": "hi"}]})),
    ]
    return cases


def test_200_malformed_requests_then_the_server_still_serves(server, alone):
    url, scheduler = server
    cases = malformed(url)
    sent = 0
    while sent < 200:
        for target, kw in cases:
            r = requests.post(target, timeout=30, **kw)
            assert 400 <= r.status_code < 500, (target, kw, r.status_code, r.text)
            assert len(r.text.strip().splitlines()) == 1 and r.json()["message"], r.text
            sent += 1
    assert requests.get(f"{url}/health", timeout=10).status_code == 200
    assert requests.get(f"{url}/health_generate", timeout=30).status_code == 200
    assert generate(url, PROMPTS[0])["output_ids"] == alone[PROMPTS[0]]
    assert idle(scheduler) and not scheduler.waiting


def test_a_client_leaving_mid_stream_frees_its_row(server):
    url, scheduler = server
    before = scheduler.state()["counters"].get("generation_tokens", 0)
    with requests.post(f"{url}/generate", json={"text": PROMPTS[0], "stream": True, "sampling_params": {
            "max_new_tokens": 480, "temperature": 0, "ignore_eos": True}}, stream=True, timeout=60) as r:
        for _ in zip(range(3), r.iter_lines()):
            pass  # read a little, then hang up
    assert idle(scheduler, timeout=20)
    assert scheduler.state()["counters"]["generation_tokens"] - before < 480  # stopped early: its row was freed


def test_api_key_guards_what_sglang_guards(tiny_bundle):
    """As SGLang 0.5.16: /health, /health_generate, /metrics and OPTIONS stay open; the scheme in any case."""
    with running_server(tiny_bundle, "ar", max_batch=2, api_key="s3cret") as (url, _):
        for path in ("/health", "/health_generate", "/metrics"):
            assert requests.get(url + path, timeout=30).status_code == 200, path
        assert requests.options(f"{url}/generate", timeout=10).status_code != 401
        for method, path in (("get", "/server_info"), ("get", "/v1/models"), ("post", "/generate"),
                             ("post", "/flush_cache")):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
                r = getattr(requests, method)(url + path, headers=headers, timeout=10)
                assert r.status_code == 401 and "API key" in r.json()["message"], (path, headers)
        for scheme in ("Bearer", "bearer", "BEARER"):
            ok = requests.post(f"{url}/generate", json={"text": "a", "sampling_params": {"max_new_tokens": 2}},
                               headers={"Authorization": f"{scheme} s3cret"}, timeout=30)
            assert ok.status_code == 200 and ok.json()["meta_info"]["completion_tokens"] == 2
        assert "spec_verify_ct" not in ok.json()["meta_info"]  # plain decoding: no speculative counters


def test_seeded_sampling_repeats_over_http(server):
    url, _ = server
    body = {"text": PROMPTS[2], "sampling_params": {"max_new_tokens": 16, "temperature": 0.9, "top_p": 0.9,
                                                    "seed": 11}}
    a, b = (requests.post(f"{url}/generate", json=body, timeout=60).json()["output_ids"] for _ in range(2))
    assert a == b


def test_the_spec_trace_shows_each_step(server, alone):
    url, _ = server
    out = generate(url, PROMPTS[0], return_spec_trace=True)
    trace = out["meta_info"]["spec_trace"]
    assert len(trace) == out["meta_info"]["spec_verify_ct"]
    assert [t for step in trace for t in step["tokens"]] == out["output_ids"][1:]  # the first came from the prefill
    for step in trace:
        assert len(step["drafts"]) == 4 and step["tokens"][: step["accepted"]] == step["drafts"][: step["accepted"]]


def test_the_port_in_use_is_a_one_line_error():
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "specdec", "serve", "--port", str(port)], capture_output=True,
                           text=True, timeout=120)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("specdec: no CUDA")]
    assert r.returncode == 2 and len(lines) == 1 and "cannot listen" in lines[0], r.stderr


def test_chat_needs_the_models_chat_template():
    """SGLang answers 400 to a chat for a model without a template, so specdec serve does too; the zoo's
    template renders the plain transcript the zoo was trained on."""
    from types import SimpleNamespace

    from specdec.decoder.bundle import load_tokenizer
    from specdec.serving.server.protocol import BadRequest, chat_prompt
    from specdec.zoo import zoo_parts

    with pytest.raises(BadRequest, match="no chat template"):
        chat_prompt([{"role": "user", "content": "hi"}], SimpleNamespace(chat_template=None))
    tok = load_tokenizer(zoo_parts("tiny")["target"])
    assert chat_prompt([{"role": "user", "content": "hi"}], tok) == "user: hi\nassistant:"


def test_another_model_name_is_served_and_said_once(server, caplog):
    """SGLang's OpenAI endpoints (0.5 line) serve a request whatever model it names and echo the name; so does
    specdec serve, and its log says once that the name is not the served one."""
    url, _ = server
    body = {"prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0}
    with caplog.at_level("WARNING", logger="specdec.serve"):
        for name in ("gpt-4", "gpt-4", "llama"):
            r = requests.post(url + "/v1/completions", json={**body, "model": name}, timeout=60)
            assert r.status_code == 200 and r.json()["model"] == name
        for name in ("tiny", "default"):  # the served name, and what SGLang calls a request that names none
            assert requests.post(url + "/v1/completions", json={**body, "model": name}, timeout=60).status_code == 200
    said = [rec.getMessage() for rec in caplog.records if "names the model" in rec.getMessage()]
    assert len(said) == 1 and all("'gpt-4'" in s and "served all the same" in s for s in said)


def test_a_tree_is_served_with_the_same_tokens_and_sglangs_numbers(tiny_bundle, alone):
    """`specdec serve --topk 2 --num-draft-tokens 6` (the EAGLE head's tree): greedy answers equal plain decoding,
    concurrent requests too, and /server_info and meta_info say what a tree server of SGLang's says. The engine
    runs under the emulated CUDA graphs: the tree is drafted and verified in captured steps, as on a GPU."""
    with running_server(tiny_bundle, "eagle", k=3, max_batch=4, topk=2, num_draft_tokens=6,
                        cuda_graphs="emulate") as (url, sched):
        with ThreadPoolExecutor(4) as pool:
            outs = list(pool.map(lambda p: generate(url, p), PROMPTS))
        info = requests.get(f"{url}/server_info", timeout=10).json()
        metrics = requests.get(f"{url}/metrics", timeout=10).text
    for p, out in zip(PROMPTS, outs):
        meta = out["meta_info"]
        assert out["output_ids"] == alone[p], p
        assert meta["spec_accept_length"] == pytest.approx(meta["completion_tokens"] / meta["spec_verify_ct"])
        assert len(meta["spec_accept_histogram"]) == 4  # 0..3 accepted: the tree's depth bounds a path
    assert info["speculative_eagle_topk"] == 2 and info["speculative_num_draft_tokens"] == 6
    assert info["internal_states"][0]["max_speculative_num_draft_tokens"] == 6
    assert 'sglang:spec_num_draft_tokens{model_name="tiny"} 6.0' in metrics
    assert any(name == "tree" for name, *_ in sched.engine.graphs.captured)


def test_a_caller_behind_the_engine_gets_the_newest_state_and_never_skips_the_end():
    """Handle.newest: of the states queued behind the one in hand, the newest before the final state or an error;
    the final state and an error are never skipped, and an empty queue leaves the state in hand."""
    import asyncio

    from specdec.serving.server.scheduler import EngineError, Handle, Progress, Request

    async def run():
        h = Handle(Request([1], SamplingParams()), scheduler=None, loop=asyncio.get_running_loop())
        states = [Progress(output_ids=[7] * n) for n in range(1, 6)]
        states[3].finish_reason = {"type": "length"}
        for s in states[1:]:
            h.events.put_nowait(s)
        got = h.newest(states[0])
        assert got is states[3] and h.events.get_nowait() is states[4]  # stopped at the final state
        assert h.newest(states[4]) is states[4] and h.events.empty()
        error = EngineError("boom")
        for e in (states[0], error, states[1]):
            h.events.put_nowait(e)
        assert h.newest(h.events.get_nowait()) is error and h.events.get_nowait() is states[1]
        assert h.newest(error) is error

    asyncio.run(run())
