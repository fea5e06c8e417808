"""An in-process `specdec serve` for tests: the real app, engine and scheduler, on a free port."""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager

import requests
import uvicorn

from specdec.decoder.engine import Engine
from specdec.decoder.methods import METHODS
from specdec.serving.server.scheduler import Scheduler
from specdec.serving.server.app import ServerArgs, bind, build_app
from specdec.serving.server.engine_process import Loaded, engine_facts


@contextmanager
def running_server(bundle, method="mtp", k=4, max_batch=8, max_len=512, api_key=None, topk=1, num_draft_tokens=None,
                   cuda_graphs="off", **engine_args):
    """Yields (base URL, scheduler); stops the server and its engine thread on exit. cuda_graphs "emulate": the
    engine steps through the CPU twin of CUDA graphs, as a GPU server's would."""
    engine = Engine(bundle, method, k=k, max_batch=max_batch, max_len=max_len, cuda_graphs=cuda_graphs, topk=topk,
                    num_draft_tokens=num_draft_tokens, **engine_args)
    scheduler = Scheduler(engine, bundle.tokenizer)
    facts = engine_facts(Loaded(engine, bundle.tokenizer, device="cpu", dtype="float32"))
    with served(scheduler, lambda port: ServerArgs(
            model_path=str(bundle.paths.get("target", "")), served_model_name="tiny",
            speculative_algorithm=METHODS[method].reported, specdec_method=method,
            speculative_num_steps=None if method == "ar" else k, host="127.0.0.1", port=port,
            max_running_requests=max_batch, context_length=max_len, api_key_set=bool(api_key),
            device="cpu", dtype="float32", speculative_eagle_topk=None if method == "ar" else topk,
            speculative_num_draft_tokens=None if method == "ar" else engine.shape.num_draft_tokens),
            api_key, facts) as url:
        yield url, scheduler


@contextmanager
def served(scheduler, args_at, api_key=None, facts=None):
    """uvicorn in a thread over a started scheduler (in-process Scheduler or EngineProxy), on a free port:
    args_at(port) gives its ServerArgs; yields the base URL; stops the server, then the scheduler."""
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(build_app(scheduler, args_at(port), api_key, facts), log_level="warning"))
    scheduler.start()
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        scheduler.stop()
        sock.close()


def stream_events(url: str, body: dict, headers=None, timeout=60) -> list[dict]:
    """The JSON objects of an SSE response, up to `data: [DONE]` (which must come last)."""
    out, done = [], False
    with requests.post(url, json=body, stream=True, timeout=timeout, headers=headers) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line:
                continue
            assert line.startswith(b"data: ") and not done, line
            payload = line[len(b"data: "):]
            if payload == b"[DONE]":
                done = True
            else:
                out.append(json.loads(payload))
    assert done, "the stream did not end with [DONE]"
    return out


def idle(scheduler, timeout: float = 10) -> bool:
    """Nothing running or waiting within `timeout` seconds: every row was freed."""
    deadline = time.monotonic() + timeout
    while scheduler.busy or scheduler.engine.running:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def build_zoo_engine(options: dict):
    """In a spawned engine process: the tiny zoo's Engine, as running_server builds it (module-level, so it pickles
    by name; the engine process imports this module from the tests' folder, which the spawn puts on its path)."""
    import torch

    from specdec.zoo import load_bundle

    torch.set_num_threads(1)
    options = dict(options)
    slow = options.pop("slow_state_s", 0)  # planted: the engine process answers state() this much later
    if slow:
        from specdec.serving.server.engine_process import RemoteScheduler

        state = RemoteScheduler.state
        RemoteScheduler.state = lambda self: (time.sleep(slow), state(self))[1]
    bundle = load_bundle("tiny", device="cpu", dtype=torch.float32)
    method = options.pop("method")
    return Loaded(Engine(bundle, method, cuda_graphs="off", **options), bundle.tokenizer,
                  model_path=str(bundle.paths.get("target", "")), name="tiny")


@contextmanager
def running_two_process_server(method="mtp", k=4, max_batch=8, max_len=512, api_key=None, **engine_args):
    """As running_server, with the engine in a process of its own (as `specdec serve` runs it): yields
    (base URL, EngineProxy); stops the server and the engine process on exit."""
    from specdec.serving.server.proxy import start_engine

    proxy = start_engine(build_zoo_engine, dict(method=method, k=k, max_batch=max_batch, max_len=max_len,
                                                **engine_args), timeout=120)
    with served(proxy, lambda port: ServerArgs(
            model_path=proxy.engine.model_path, served_model_name="tiny",
            speculative_algorithm=METHODS[method].reported, specdec_method=method,
            speculative_num_steps=None if method == "ar" else k, host="127.0.0.1", port=port,
            max_running_requests=max_batch, context_length=max_len, api_key_set=bool(api_key),
            device="cpu", dtype="float32"), api_key) as url:
        yield url, proxy
