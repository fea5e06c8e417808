"""Fuzzing `specdec serve` with hypothesis: a few hundred generated requests to /generate, /v1/completions
and /v1/chat/completions, built from the fields SGLang's API knows (values of any JSON type) and from
unknown ones. Every answer must be a success or a 4xx with a JSON message, never a 5xx; afterwards the
engine holds no row and a greedy generation still equals decoding alone."""

from __future__ import annotations

import time

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serve_tools import idle, running_server

from specdec.decoder.engine import Engine

CASES = 300
PROMPT = "Monday, Tuesday, Wednesday,"

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-3, 40),
                    st.floats(allow_nan=False, allow_infinity=False), st.floats(-2, 3), st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                           max_leaves=12)
prompts = st.one_of(st.text(max_size=40), st.lists(st.integers(-2, 5000), max_size=8),
                    st.lists(st.text(max_size=12), max_size=3), st.lists(st.lists(st.integers(0, 4000), max_size=4),
                                                                         max_size=3), json_values)
numbers = {key: st.one_of(st.integers(-2, 12), json_values) for key in
           ("max_new_tokens", "max_tokens", "top_k", "n", "seed")}
numbers |= {key: st.one_of(st.floats(-1, 2), json_values) for key in ("temperature", "top_p")}
flags = {key: st.one_of(st.booleans(), json_values) for key in ("stream", "ignore_eos", "return_spec_trace")}
stops = st.one_of(st.text(max_size=4), st.lists(st.text(max_size=4), max_size=20), json_values)


def body(prompt_key: str, where_numbers: str) -> st.SearchStrategy[dict]:
    known = {prompt_key: prompts, "stop": stops, **flags, "stream_options": json_values}
    sampling = st.fixed_dictionaries({}, optional={**numbers, "stop": stops, "ignore_eos": flags["ignore_eos"]})
    if where_numbers == "sampling_params":
        known["sampling_params"] = st.one_of(sampling, json_values)
    else:
        known |= numbers
    return st.fixed_dictionaries({}, optional=known).flatmap(
        lambda d: st.dictionaries(st.text(max_size=10), json_values, max_size=2).map(lambda extra: {**extra, **d}))


messages = st.one_of(st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "x"])},
                                                    optional={"content": st.one_of(st.text(max_size=20), json_values)}),
                              max_size=3), json_values)
near_valid = st.fixed_dictionaries({key: st.integers(-2, 12) for key in ("max_new_tokens",)},
                                   optional={"temperature": st.floats(-0.5, 2), "top_p": st.floats(-0.5, 1.5),
                                             "top_k": st.integers(-3, 50), "seed": st.integers(-5, 2**65),
                                             "stop": stops, "n": st.integers(0, 3), "ignore_eos": st.booleans()})
requests_ = st.one_of(
    st.tuples(st.just("/generate"), st.fixed_dictionaries({"text": st.text(min_size=1, max_size=30),
                                                           "sampling_params": near_valid},
                                                          optional={"stream": st.booleans()})),
    st.tuples(st.just("/v1/completions"), st.fixed_dictionaries(
        {"prompt": st.one_of(st.text(min_size=1, max_size=30), st.lists(st.text(min_size=1, max_size=9), max_size=3))},
        optional={"max_tokens": st.integers(-1, 10), "stream": st.booleans(), "seed": st.integers(-5, 2**65),
                  "temperature": st.floats(0, 2), "n": st.integers(0, 3), "stream_options": json_values})),
    st.tuples(st.just("/generate"), body("text", "sampling_params")),
    st.tuples(st.just("/generate"), body("input_ids", "sampling_params")),
    st.tuples(st.just("/v1/completions"), body("prompt", "top")),
    st.tuples(st.just("/v1/chat/completions"), body("prompt", "top").map(
        lambda d: {**{k: v for k, v in d.items() if k != "prompt"}, "messages": d.get("prompt")})),
    st.tuples(st.just("/v1/chat/completions"), st.fixed_dictionaries({"messages": messages}, optional=numbers)),
)


@pytest.fixture(scope="module")
def server(tiny_bundle):
    # a short context bounds what any generated request can cost: at most 64 tokens
    with running_server(tiny_bundle, "mtp", k=3, max_batch=4, max_len=64) as (url, scheduler):
        yield url, scheduler


def test_fuzzed_requests_never_harm_the_server(server, tiny_bundle):
    url, scheduler = server
    seen = {"cases": 0, "4xx": 0, "2xx": 0}
    t0 = time.monotonic()

    @settings(max_examples=CASES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(requests_)
    def one(case):
        path, payload = case
        r = requests.post(url + path, json=payload, timeout=60)
        seen["cases"] += 1
        assert r.status_code < 500, (path, payload, r.status_code, r.text[:300])
        if r.status_code >= 400:
            seen["4xx"] += 1
            assert r.json()["message"], r.text
        else:
            seen["2xx"] += 1
            r.content  # a stream is read to its end

    one()
    print(f"\n{seen['cases']} fuzzed requests ({seen['2xx']} served, {seen['4xx']} refused) in "
          f"{time.monotonic() - t0:.1f} s")
    assert seen["cases"] >= CASES * 0.9 and seen["2xx"] > 0 and seen["4xx"] > 0

    assert idle(scheduler, timeout=30)  # no row and no waiting request is left
    ids = tiny_bundle.tokenizer(PROMPT)["input_ids"]
    alone = Engine(tiny_bundle, "ar", max_batch=1, max_len=64, cuda_graphs="off").generate(
        [ids], max_new_tokens=12, stop_at_eos=False).tokens[0]
    r = requests.post(f"{url}/generate", json={"input_ids": ids, "sampling_params": {
        "max_new_tokens": 12, "temperature": 0, "ignore_eos": True}}, timeout=60)
    assert r.status_code == 200 and r.json()["output_ids"] == alone
