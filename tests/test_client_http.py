"""The client over a real socket, against the stand-in server's scripted streams (chunks of 1, 3, 2, 4
tokens at a known pace): SSE parsing, the clock per chunk, auth, /flush_cache retries, errors."""

import threading
import time

import pytest
from test_launch_lifecycle import standin

from specdec.serving.measure.client import Client, ClientError
from specdec.serving.ops.lifecycle import RUN_DIR_ENV, launch

DELAY = 0.05  # seconds before each chunk


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv(RUN_DIR_ENV, str(tmp_path_factory.mktemp("run")))
    with launch(standin("--api-key", "k", "--chunk-delay", str(DELAY), api_key="k"), progress=False) as s:
        yield s
    mp.undo()


def test_generate_stream_times_each_chunk_and_divides_by_its_tokens(server):
    rec = server.client().generate("one two three", max_new_tokens=10)
    assert rec.chunk_tokens == [1, 3, 2, 4] and rec.completion_tokens == 10 and rec.prompt_tokens == 3
    assert len(rec.itl) == 9 and rec.ttft >= DELAY  # the server sleeps DELAY before each chunk
    # one gap per chunk, shared equally by the tokens it carries
    per_chunk = [rec.itl[0:3], rec.itl[3:5], rec.itl[5:9]]
    assert all(len(set(itl)) == 1 for itl in per_chunk)
    last_chunk = rec.ttft + sum(rec.itl)
    assert last_chunk >= 4 * DELAY * 0.99 and last_chunk <= rec.e2e_latency + 1e-9
    assert rec.spec.verify_ct == 3 and rec.tau == pytest.approx(9 / 3)
    assert rec.text.split() == [f"t{i}" for i in range(10)]


def test_openai_streams_and_plain_answers(server):
    c = server.client()
    rec = c.completion("a b", max_tokens=7)
    assert rec.chunk_tokens == [1, 3, 2, 1] and rec.completion_tokens == 7 and len(rec.itl) == 6
    rec = c.generate([5, 6, 7, 8], max_new_tokens=5, stream=False)
    assert rec.completion_tokens == 5 and rec.prompt_tokens == 4 and rec.ttft is None and rec.spec.verify_ct == 2
    rec = c.completion("a b", max_tokens=4, stream=False)
    assert rec.completion_tokens == 4 and rec.text.split() == ["t0", "t1", "t2", "t3"]


def test_server_state_endpoints(server):
    c = server.client()
    assert c.health() and c.server_info().version == "0.5.16" and c.model_id() == "standin"
    assert c.metrics().generation_tokens_total == 42.0
    assert c.flush_cache()


def test_the_key_is_required_and_sent(server):
    with pytest.raises(ClientError, match="HTTP 401"):
        Client(server.url).generate("x", max_new_tokens=2)
    assert Client(server.url).health()  # /health stays open, as in SGLang


def test_flush_cache_waits_while_a_request_runs(server):
    c = server.client()
    t = threading.Thread(target=c.generate, args=("x",), kwargs={"max_new_tokens": 40})
    t.start()
    deadline = time.monotonic() + 30
    while c.request("POST", "/flush_cache").status_code != 400:  # until the stream is running
        assert time.monotonic() < deadline and t.is_alive(), "the request never started"
        time.sleep(0.01)
    assert c.flush_cache(timeout=30)  # 400 while the stream runs, then 200
    t.join(timeout=5)
    assert not t.is_alive()


def test_an_unreachable_server_is_one_line():
    with pytest.raises(ClientError, match="cannot reach http://127.0.0.1:9/generate"):
        Client("http://127.0.0.1:9", timeout=2).generate("x")
    assert not Client("http://127.0.0.1:9").health()


def test_no_metrics_endpoint_gives_none(tmp_path, monkeypatch):
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path))
    with launch(standin("--no-metrics"), progress=False) as s:
        assert s.client().metrics() is None
