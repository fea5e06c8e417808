"""The client's contract with a server speaking SGLang's HTTP API: run against a real SGLang node when
SPECDEC_SGLANG_URL names one (SPECDEC_SGLANG_API_KEY if it has a key), and against the local
`specdec serve` (the tiny zoo, NEXTN, an API key) otherwise.

    SPECDEC_SGLANG_URL=http://127.0.0.1:30000 pytest tests/test_client_contract.py
"""

import math
import os
import time

import pytest

from specdec.serving.measure.client import Client, ClientError
from specdec.serving.ops.launch import LaunchConfig, parse_version
from specdec.serving.ops.lifecycle import launch

PROMPT = "Monday, Tuesday, Wednesday,"
N = 16  # tokens per request (ignore_eos)
LOCAL_KEY = "contract-key"


@pytest.fixture(scope="module")
def server():
    """(client, its API key or None): the node in SPECDEC_SGLANG_URL, or a local `specdec serve`."""
    url = os.environ.get("SPECDEC_SGLANG_URL")
    if url:
        key = os.environ.get("SPECDEC_SGLANG_API_KEY")
        yield Client(url, api_key=key, timeout=300), key
        return
    cfg = LaunchConfig("tiny", "NEXTN", num_steps=3, topk=1, num_draft_tokens=4, backend="specdec", api_key=LOCAL_KEY)
    with launch(cfg, timeout=300, progress=False) as s:
        yield s.client(timeout=300), LOCAL_KEY


@pytest.fixture(scope="module")
def info(server):
    return server[0].server_info()


def test_health_and_version(server, info):
    client, _ = server
    assert client.health()
    assert info.version and parse_version(info.version) >= (0, 5, 5)


def test_generate_without_streaming(server):
    rec = server[0].generate(PROMPT, max_new_tokens=N, stream=False, ignore_eos=True)
    assert rec.completion_tokens == N and rec.prompt_tokens >= 1 and isinstance(rec.text, str)
    assert rec.finish_reason["type"] == "length"


def test_generate_stream_counts_every_token_once(server):
    rec = server[0].generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert rec.completion_tokens == N and sum(rec.chunk_tokens) == N
    assert len(rec.itl) == N - rec.chunk_tokens[0] and all(x >= 0 for x in rec.itl)
    assert 0 < rec.ttft <= rec.e2e_latency and rec.tpot > 0


def test_token_id_prompts(server):
    rec = server[0].generate([10, 11, 12, 13], max_new_tokens=4, stream=False, ignore_eos=True)
    assert rec.prompt_tokens == 4 and rec.completion_tokens == 4


def test_speculative_counters_are_consistent(server, info):
    if not info.speculative_algorithm:
        pytest.skip("a plain server reports no speculative counters")
    rec = server[0].generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    s, width = rec.spec, info.num_draft_tokens
    assert s is not None and 1 <= s.verify_ct <= N - 1
    assert 1 <= rec.tau <= width
    assert s.verify_ct >= math.ceil((N - 1) / width)  # a verify step commits at most num_draft_tokens tokens
    assert s.server_accept_length == pytest.approx(N / s.verify_ct, rel=1e-6)  # SGLang's definition
    if s.histogram is not None:
        assert sum(s.histogram) == s.verify_ct and sum(i * h for i, h in enumerate(s.histogram)) == s.correct_drafts


def test_openai_completions_stream_with_usage(server):
    rec = server[0].completion(PROMPT, max_tokens=N, ignore_eos=True)
    assert rec.completion_tokens == N and rec.prompt_tokens >= 1
    assert sum(rec.chunk_tokens) == N  # usage on every chunk (continuous_usage_stats)
    plain = server[0].completion(PROMPT, max_tokens=N, ignore_eos=True, stream=False)
    assert plain.completion_tokens == N and plain.text


def test_openai_chat(server):
    rec = server[0].chat(PROMPT, max_tokens=N)
    assert 1 <= rec.completion_tokens <= N and sum(rec.chunk_tokens) == rec.completion_tokens
    plain = server[0].chat(PROMPT, max_tokens=N, stream=False)
    assert 1 <= plain.completion_tokens <= N


def test_flush_cache_when_idle(server):
    assert server[0].flush_cache(timeout=30)


def test_metrics_count_generated_tokens(server, info):
    client = server[0]
    before = client.metrics()
    if before is None:
        pytest.skip("the server was started without --enable-metrics")
    client.generate(PROMPT, max_new_tokens=N, stream=False, ignore_eos=True)
    deadline = time.monotonic() + 10
    while (after := client.metrics()).generation_tokens_total < before.generation_tokens_total + N:
        assert time.monotonic() < deadline, "generation_tokens_total did not grow by the request's tokens"
        time.sleep(0.2)
    if info.speculative_algorithm and before.spec_verify_calls_total is not None:
        assert after.spec_verify_calls_total > before.spec_verify_calls_total


def test_the_api_key_is_required(server):
    client, key = server
    if not key:
        pytest.skip("this server has no API key")
    with pytest.raises(ClientError, match="HTTP 401"):
        Client(client.url).generate(PROMPT, max_new_tokens=2, stream=False)
