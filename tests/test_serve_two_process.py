"""`specdec serve` with its engine in a process of its own: the same answers as the in-process server, token for
token; cancel, state and flush through the pipe; and a lifecycle where neither process outlives the other
(the engine killed: /health 503 and the server exits 1; the server killed: the engine exits)."""

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from serve_tools import running_server, running_two_process_server, stream_events

from specdec.decoder.engine import Engine, SamplingParams
from specdec.serving.ops.lifecycle import pid_alive
from specdec.serving.server.engine_process import RemoteScheduler
from specdec.serving.server.proxy import apply
from specdec.serving.server.scheduler import Progress, Request
from specdec.serving.server.wire import Delta

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["import os\nimport sys\n\ndef main(", "Monday, Tuesday, Wednesday,",
           "class Queue:\n    def __init__(self, maxsize=0):\n        self.", "x = 1\nfor i in range(10):\n",
           "def add(a, b):\n    return", "# a comment\n"]


@pytest.fixture(scope="module")
def servers(tiny_bundle):
    """(in-process URL, two-process URL, the proxy): the same engine settings, NEXTN with k 4."""
    with running_server(tiny_bundle, "mtp", k=4, max_batch=8) as (url, _), \
            running_two_process_server("mtp", k=4, max_batch=8) as (url2, proxy):
        yield url, url2, proxy


def generate(url, text, n, stream=False, **extra):
    body = {"text": text, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True, **extra},
            "stream": stream}
    if stream:
        return stream_events(f"{url}/generate", body)
    r = requests.post(f"{url}/generate", json=body, timeout=60)
    r.raise_for_status()
    return r.json()


def test_greedy_answers_match_the_in_process_server_token_for_token(servers):
    url, url2, _ = servers
    jobs = [(p, 8 + 7 * i) for i, p in enumerate(PROMPTS)]
    with ThreadPoolExecutor(len(jobs)) as pool:  # concurrent: they share the running batch
        one = list(pool.map(lambda j: generate(url, *j), jobs))
        two = list(pool.map(lambda j: generate(url2, *j), jobs))
    for a, b in zip(one, two):
        assert b["output_ids"] == a["output_ids"] and b["text"] == a["text"]
        assert b["meta_info"]["completion_tokens"] == a["meta_info"]["completion_tokens"]
        assert b["meta_info"]["spec_verify_ct"] == a["meta_info"]["spec_verify_ct"]


def test_streams_match_the_in_process_server(servers):
    url, url2, _ = servers
    jobs = [(p, 40) for p in PROMPTS]
    with ThreadPoolExecutor(len(jobs)) as pool:
        one = list(pool.map(lambda j: generate(url, *j, stream=True), jobs))
        two = list(pool.map(lambda j: generate(url2, *j, stream=True), jobs))
    for a, b in zip(one, two):
        assert len(b) > 1  # it streamed
        assert b[-1]["output_ids"] == a[-1]["output_ids"] and b[-1]["text"] == a[-1]["text"]
        for event in b:  # every chunk is a prefix of the final answer, as in-process
            assert event["output_ids"] == b[-1]["output_ids"][:len(event["output_ids"])]
            assert b[-1]["text"].startswith(event["text"])


def test_openai_streams_stop_strings_and_traces_match(servers):
    url, url2, _ = servers
    body = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 30, "temperature": 0, "stream": True,
            "stop": [")"], "return_spec_trace": True}
    texts = []
    for u in (url, url2):
        events = stream_events(f"{u}/v1/completions", body)
        texts.append("".join(c["choices"][0]["text"] for c in events if c.get("choices")))
    assert texts[1] == texts[0] and ")" not in texts[1]
    a, b = (generate(u, PROMPTS[1], 20, return_spec_trace=True) for u in (url, url2))
    assert b["meta_info"].get("spec_trace") == a["meta_info"].get("spec_trace")


def test_a_caller_leaving_frees_its_row(servers):
    _, url2, proxy = servers
    body = {"text": PROMPTS[2], "stream": True, "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}
    with requests.post(f"{url2}/generate", json=body, stream=True, timeout=60) as r:
        next(line for line in r.iter_lines() if line)  # one chunk, then hang up
    deadline = time.monotonic() + 20
    while proxy.busy and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not proxy.busy and not proxy.handles


def test_state_flush_server_info_and_metrics_through_the_pipe(servers):
    _, url2, proxy = servers
    generate(url2, PROMPTS[3], 12)
    deadline = time.monotonic() + 20
    while proxy.busy and time.monotonic() < deadline:  # a previous test's cancelled row may still be freed
        time.sleep(0.05)
    state = proxy.state()
    assert state["counters"]["requests"] >= 1 and state["num_running_reqs"] == 0
    assert "avg_spec_accept_length" in state and proxy.flush() is True
    assert "avg_spec_accept_length" not in proxy.state()
    info = requests.get(f"{url2}/server_info", timeout=10).json()
    assert info["internal_states"][0]["memory_usage"]["weight"] >= 0 and info["max_total_num_tokens"] == 8 * 512
    assert "sglang:num_requests_total" in requests.get(f"{url2}/metrics", timeout=10).text


def test_requests_the_engine_refuses_fail_alone(servers):
    """A request that gets past the HTTP side's checks but not the engine's: its caller gets the error, the
    engine goes on (and a bad request over HTTP is a 400, as in-process)."""
    _, url2, proxy = servers

    async def submit(ids):
        handle = proxy.submit(Request(ids, SamplingParams(max_new_tokens=4, stop_at_eos=False), stream=False))
        event = await asyncio.wait_for(handle.events.get(), 30)
        while isinstance(event, Progress) and event.finish_reason is None:
            event = await asyncio.wait_for(handle.events.get(), 30)
        return event

    bad = asyncio.run(submit([10 ** 9]))  # a token id past the vocabulary
    assert isinstance(bad, ValueError) and "token ids" in str(bad)
    good = asyncio.run(submit([1, 2, 3]))
    assert isinstance(good, Progress) and len(good.output_ids) == 4
    r = requests.post(f"{url2}/generate", json={"input_ids": [10 ** 9]}, timeout=10)
    assert r.status_code == 400 and proxy.alive
    assert requests.get(f"{url2}/health", timeout=10).status_code == 200


class ListConn:
    """A pipe's sending end that keeps what was sent."""

    def __init__(self):
        self.sent = []

    def send(self, message):
        self.sent.append(message)


def test_each_step_sends_only_what_is_new(tiny_bundle):
    """The engine side alone (no process): a streamed request's deltas carry a step's tokens and text, not the
    whole output, and applied in order they rebuild what the in-process scheduler would have sent."""
    engine = Engine(tiny_bundle, "ar", max_batch=2, max_len=512, cuda_graphs="off")
    conn = ListConn()
    scheduler = RemoteScheduler(engine, tiny_bundle.tokenizer, conn)
    scheduler.start()
    ids = tiny_bundle.tokenizer(PROMPTS[0])["input_ids"]
    scheduler.receive(("submit", 7, Request(ids, SamplingParams(max_new_tokens=80, stop_at_eos=False))))
    deadline = time.monotonic() + 60
    while not any(isinstance(e, Delta) and e.finish_reason for m in list(conn.sent) for _, e in m[1]):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    scheduler.stop()
    deltas = [e for kind, events in conn.sent if kind == "events" for key, e in events]
    assert len(deltas) == 80 and all(isinstance(d, Delta) for d in deltas)
    expected = engine.generate([ids], max_new_tokens=80, stop_at_eos=False).tokens[0]
    final_text = tiny_bundle.tokenizer.decode(expected, skip_special_tokens=True)
    p = Progress()
    for d in deltas[:-1]:
        assert len(d.ids) == 1 and len(d.tail) < 40  # one token a step (plain decoding), its few characters
        apply(p, d)
        assert final_text.startswith(p.text) and p.output_ids == expected[:len(p.output_ids)]
    apply(p, deltas[-1])
    assert p.output_ids == expected and p.finish_reason == {"type": "length", "length": 80}
    assert p.text == final_text
    assert not scheduler.handles  # forgotten once finished


def test_the_engine_process_killed_turns_health_503_and_fails_its_requests():
    with running_two_process_server("ar", max_batch=4) as (url, proxy):
        result = {}

        def long_request():
            body = {"text": PROMPTS[0], "sampling_params": {"max_new_tokens": 450, "ignore_eos": True}}
            result["r"] = requests.post(f"{url}/generate", json=body, timeout=60)

        caller = threading.Thread(target=long_request)
        caller.start()
        deadline = time.monotonic() + 30
        while not proxy.handles and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(proxy.process.pid, signal.SIGKILL)
        t0 = time.monotonic()
        while requests.get(f"{url}/health", timeout=10).status_code != 503:
            assert time.monotonic() - t0 < 2, "/health still 200 two seconds after the engine died"
            time.sleep(0.02)
        caller.join(30)
        assert result["r"].status_code == 503 and "engine" in result["r"].json()["message"]
        assert not proxy.alive and "exited" in str(proxy.error)
        assert requests.post(f"{url}/generate", json={"text": "x"}, timeout=10).status_code == 503


# -- the real `specdec serve`, as a process --------------------------------------------------------------
def children(pid: int) -> list[int]:
    """Live child processes of pid (from /proc; zombies count as gone)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] not in "ZX":
                out.append(int(d.name))
    return out


def engine_pid(pid: int) -> int:
    """The spawned engine process among pid's children (the other is multiprocessing's resource tracker)."""
    for child in children(pid):
        if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
            return child
    raise AssertionError(f"no engine process under {pid}")


@pytest.fixture
def serve():
    """Start `specdec serve --model tiny` in a session of its own; yields (Popen, url, its children); kills
    whatever is left at the end."""
    started = []

    def start():
        proc = subprocess.Popen([sys.executable, "-m", "specdec", "serve", "--model", "tiny", "--port", "0"],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        started.append(proc)
        lines = []
        while not (lines and "listening on" in lines[-1]):
            line = proc.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        url = re.search(r"http://\S+", lines[-1]).group(0)
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.05)
        return proc, url, children(proc.pid)

    yield start
    for proc in started:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def gone(pids: list[int], within: float) -> list[int]:
    deadline = time.monotonic() + within
    while any(map(pid_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if pid_alive(p)]


def test_serve_exits_1_when_its_engine_process_dies(serve):
    proc, url, kids = serve()
    os.kill(engine_pid(proc.pid), signal.SIGKILL)
    assert proc.wait(timeout=30) == 1
    out = proc.stdout.read()
    assert "the engine stopped" in out and "status 1" in out
    assert gone(kids, 5) == []


def test_the_engine_process_exits_when_serve_is_killed(serve):
    proc, url, kids = serve()
    engine = engine_pid(proc.pid)
    proc.kill()  # SIGKILL: no handler, no finally; the engine's pipe closes
    proc.wait()
    assert gone([engine], 5) == [], "the engine process outlived its server"
    assert gone(kids, 5) == []


def test_ctrl_c_to_the_process_group_drains_and_stops_both(serve):
    """A terminal's Ctrl-C reaches both processes: the engine ignores it, the server drains, then stops it."""
    proc, url, kids = serve()
    result = {}
    caller = threading.Thread(target=lambda: result.update(r=requests.post(f"{url}/generate", json={
        "text": PROMPTS[0], "sampling_params": {"max_new_tokens": 60, "ignore_eos": True}}, timeout=60)))
    caller.start()
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=30) == 0
    caller.join(30)
    assert result["r"].status_code == 200 and result["r"].json()["meta_info"]["completion_tokens"] == 60
    assert proc.stdout.read().rstrip().endswith("specdec serve: stopped")
    assert gone(kids, 5) == []


def test_a_missing_model_is_still_one_line_and_status_2():
    out = subprocess.run([sys.executable, "-m", "specdec", "serve", "--model", "/no/such/model", "--port", "0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == ["specdec serve: error: unknown model '/no/such/model': not a zoo name "
                                                "(known: tiny), a directory, or a Hugging Face id"]


def test_cuda_without_a_gpu_is_still_one_line_and_status_2():
    """The engine process decides the device now (its default needs torch): the same one-line usage error."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    out = subprocess.run([sys.executable, "-m", "specdec", "serve", "--device", "cuda", "--port", "0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == ["specdec serve: error: --device cuda but no CUDA device is visible; "
                                                "use --device cpu"]


# -- the HTTP process runs no model: it never imports torch (a start would pay that import twice) ----------------
HTTP_SIDE = ("specdec.cli.serve", "specdec.serving.server.app", "specdec.serving.server.proxy",
             "specdec.serving.server.protocol", "specdec.serving.server.scheduler", "specdec.serving.server.wire",
             "specdec.zoo.tokenizer", "uvicorn")  # the zoo's tokenizer arrives pickled; run() imports uvicorn


def test_the_http_side_imports_no_torch():
    code = (f"import sys, specdec.cli as c; c.build_parser('serve'); import {', '.join(HTTP_SIDE)}; "
            "print(sorted(m for m in ('torch', 'specdec.decoder.engine') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_only_the_engine_process_loads_torch(serve):
    """The running server, after a request: torch's library is mapped in the engine process, not the HTTP one."""
    proc, url, _ = serve()
    body = {"text": PROMPTS[0], "sampling_params": {"max_new_tokens": 4}}
    assert requests.post(f"{url}/generate", json=body, timeout=60).status_code == 200

    def maps_torch(pid: int) -> bool:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()

    assert maps_torch(engine_pid(proc.pid)) and not maps_torch(proc.pid)


def test_a_slow_answer_from_the_engine_process_does_not_stall_the_event_loop():
    """/server_info waits for the engine process's state(); /health, asked meanwhile, must not wait behind it
    (the round trip runs off the event loop). Order only, no timings: /health answers first."""
    with running_two_process_server("ar", max_batch=2, slow_state_s=2.0) as (url, _):
        done: list[str] = []

        def get(path):
            requests.get(f"{url}{path}", timeout=60).raise_for_status()
            done.append(path)

        info = threading.Thread(target=get, args=("/server_info",))
        info.start()
        time.sleep(0.3)  # /server_info is in its handler, waiting for the engine process
        get("/health")
        info.join()
        assert done == ["/health", "/server_info"]
