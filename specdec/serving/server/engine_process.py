"""The engine process of `specdec serve`: the model, the Engine and the Scheduler loop, in a process of their own.

Why: in one process the HTTP event loop (starlette and h11, one SSE chunk per request per step) and the engine
thread share one GIL; at 64 streams the loop held it about 3x as long as the engine, and the engine waited for it
after every small torch call. SGLang runs its scheduler in a process of its own for the same reason.

The Scheduler runs here unchanged; RemoteScheduler only sends its events down the pipe instead of onto asyncio
queues (one message a step, each request's as a Delta). The HTTP side is proxy.EngineProxy, which never imports
this module (nor torch): it names `serve` to the spawned process (proxy.EntryPoint). What reads the Engine lives
here too: the warm-up before serving, and the facts the HTTP process gets (engine_facts: describe, memory_usage).

Lifecycle: started with the spawn context by the HTTP process, this process ignores SIGINT, SIGTERM and SIGHUP
(Ctrl-C or a supervisor reaches the whole process group: the HTTP process drains its requests, then stops this
one), and exits the moment its pipe closes, which is when the HTTP process is gone, however it died.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specdec.decoder.engine import Engine
from specdec.decoder.kv_cache import KVCache
from specdec.serving.server.scheduler import EngineError, Prefix, Progress, Request, Scheduler
from specdec.serving.server.wire import Delta, EngineFacts

log = logging.getLogger("specdec.serve")


@dataclass
class Loaded:
    """What a build function returns: the warmed-up engine, its tokenizer, how the CLI names the model, and the
    device and dtype it chose."""

    engine: Engine
    tokenizer: object
    model_path: str = ""
    name: str = ""
    device: str = ""
    dtype: str = ""


class LoadError(Exception):
    """A load failure the user can fix (a missing model, a bad flag): the CLI says it in one line, status 2."""


@dataclass(eq=False)
class RemoteHandle:
    """This process's stand-in for a Handle of the HTTP process: what the Scheduler reads of a handle, and how
    much of the request's progress was sent already (the next Delta sends only what is new)."""

    key: int
    request: Request
    done: bool = False
    live: Progress | None = field(default=None, repr=False)  # the scheduler's own Progress of the request
    ids: int = 0  # output ids sent
    accepted: int = 0
    trace: int = 0
    settled: int = 0  # characters of settled text at the last event: the text before them never changes


def _since(items, start: int) -> list:
    """items[start:] of a list or a Prefix, without copying what comes before."""
    if isinstance(items, Prefix):
        return items.items[start:items.n]
    return items[start:]


class RemoteScheduler(Scheduler):
    """The Scheduler, its events sent down a pipe: one message per step, a Delta per request."""

    def __init__(self, engine: Engine, tokenizer, conn):
        super().__init__(engine, tokenizer)
        self.conn = conn
        self.send_lock = threading.Lock()  # the loop's thread and the pipe's reader both send
        self.handles: dict[int, RemoteHandle] = {}
        self.announced = False  # that the loop died

    def send(self, message) -> None:
        try:
            with self.send_lock:
                self.conn.send(message)
        except OSError:  # the HTTP process is gone: the reader sees the pipe close and ends this process
            pass

    # -- the scheduler's seams ---------------------------------------------------------------------
    def _deliver(self, up) -> None:
        row = self.rows.get(up.slot)
        if row is not None:
            row[0].live = row[1]  # its detokenizer tells how much of the text is settled
        super()._deliver(up)

    def _publish(self, events: list) -> None:
        self.send(("events", [self._encode(h, e) for h, e in events]))

    def _push(self, handle: RemoteHandle, event) -> None:
        if self.error is not None:  # the loop died: say so before its callers' errors (their status is 503, not 500)
            self._announce_death()
        self.send(("events", [self._encode(handle, event)]))

    def _announce_death(self) -> None:
        if not self.announced:
            self.announced = True
            self.send(("died", f"{type(self.error).__name__}: {self.error}"))

    def _encode(self, h: RemoteHandle, event) -> tuple:
        if isinstance(event, Exception):  # a ValueError (a 400) or an EngineError (a 500); plain, to pickle safely
            self.handles.pop(h.key, None)
            return h.key, (EngineError(str(event)) if isinstance(event, EngineError) else ValueError(str(event)))
        p: Progress = event
        final = p.finish_reason is not None
        cut = 0 if final else h.settled  # a final text may be decoded anew or cut by a stop string: sent whole
        delta = Delta(_since(p.output_ids, h.ids), _since(p.accepted, h.accepted), _since(p.trace, h.trace),
                      cut, p.text[cut:], p.verify_ct, p.drafted, p.plain_tokens, p.first_token_at, p.admitted_at,
                      p.finished_at, p.finish_reason)
        h.ids, h.accepted, h.trace = len(p.output_ids), len(p.accepted), len(p.trace)
        detok = h.live.detok if h.live is not None else None
        h.settled = len(detok.text) if detok is not None else 0
        if final:
            self.handles.pop(h.key, None)
        return h.key, delta

    def _run(self) -> None:
        super()._run()
        if self.error is not None:  # the loop died: the HTTP process exits 1, and stops this one
            self._announce_death()

    # -- the HTTP process's messages -------------------------------------------------------------------
    def receive(self, message: tuple) -> bool:
        """Act on one message; False on ("stop",)."""
        kind = message[0]
        if kind == "submit":
            _, key, request = message
            handle = RemoteHandle(key, request)
            self.handles[key] = handle
            self.enqueue(handle)
        elif kind == "cancel":
            handle = self.handles.pop(message[1], None)
            if handle is not None:
                self.cancel(handle)
        elif kind == "call":
            _, call_id, name = message
            self.send(("reply", call_id, self.state() if name == "state" else self.flush()))
        elif kind == "stop":
            return False
        return True


def serve(conn, build: Callable[[object], Loaded], options) -> None:
    """The engine process's entry point (spawned): load, say ready, then serve the pipe until told to stop."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # the HTTP process stops this one after draining its requests
    logging.basicConfig(format="%(message)s")
    loading = threading.Event()
    loading.set()
    lifeline = threading.Thread(target=_watch_while_loading, args=(conn, loading), name="specdec-lifeline",
                                daemon=True)
    lifeline.start()
    try:
        loaded = build(options)
    except LoadError as exc:
        conn.send(("load_error", True, str(exc)))
        sys.exit(2)
    except Exception as exc:  # noqa: BLE001 -- said to the HTTP process, which exits 1
        traceback.print_exc()
        conn.send(("load_error", False, f"{type(exc).__name__}: {exc}"))
        sys.exit(1)
    facts = engine_facts(loaded)
    scheduler = RemoteScheduler(loaded.engine, loaded.tokenizer, conn)
    loading.clear()  # from here the reader below watches the pipe
    lifeline.join()
    scheduler.start()
    scheduler.send(("ready", facts, loaded.tokenizer))
    try:
        while scheduler.receive(conn.recv()):
            pass
    except (EOFError, OSError):  # the HTTP process is gone (even by SIGKILL): so is its engine, at once
        os._exit(0)
    scheduler.stop()  # what still runs ends with "abort" events, sent before the pipe closes
    conn.close()
    # At once: the interpreter's own exit would first collect every object torch made (seconds on a stop).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if scheduler.error is not None else 0)


def _watch_while_loading(conn, loading: threading.Event) -> None:
    """While the model loads (seconds to minutes), end this process if the HTTP process goes away (the pipe
    closes). The HTTP process sends nothing before it reads "ready", so nothing is consumed here."""
    while loading.is_set():
        try:
            if conn.poll(0.1):  # readable: a message (only "stop" can come this early), or the pipe closed
                message = conn.recv()
                if message[0] == "stop":
                    os._exit(0)
        except (EOFError, OSError):
            os._exit(0)


def engine_facts(loaded: Loaded) -> EngineFacts:
    """What the HTTP side reads of a loaded engine (protocol.py's checks, /server_info, the CLI's first line)."""
    engine = loaded.engine
    return EngineFacts(max_len=engine.max_len, k=engine.k, block=engine.block, capacity=engine.capacity,
                       vocab_size=engine.target.config.vocab_size, speculative=engine.proposer is not None,
                       memory=memory_usage(engine), description=describe(engine), threads=torch.get_num_threads(),
                       model_path=loaded.model_path, name=loaded.name, device=loaded.device, dtype=loaded.dtype)


def memory_usage(engine: Engine) -> dict:
    """SGLang's memory_usage in GiB: the weights and KV caches of the target and its proposer, the tokens
    the KV cache holds, and the memory of the CUDA-graph pool (0 without CUDA graphs)."""
    parts = [engine.target] + (list(vars(engine.proposer).values()) if engine.proposer is not None else [])
    tensors = {id(t): t for m in parts if isinstance(m, torch.nn.Module)
               for t in itertools.chain(m.parameters(), m.buffers())}
    weight = sum(t.numel() * t.element_size() for t in tensors.values())
    caches = [engine.cache] + [c for c in parts if isinstance(c, KVCache) and c is not engine.cache]
    kv = sum(t.numel() * t.element_size() for c in caches for t in c.k + c.v)
    graph = 0
    pool = getattr(engine.graphs, "pool", None)
    if pool is not None and engine.device.type == "cuda":
        graph = sum(s["total_size"] for s in torch.cuda.memory_snapshot()
                    if tuple(s.get("segment_pool_id", ())) == tuple(pool))
    gib = 2 ** 30  # (SGLang rounds to 0.01 GiB, which shows the tiny zoo's megabytes as 0)
    return {"weight": round(weight / gib, 4), "kvcache": round(kv / gib, 4),
            "token_capacity": engine.capacity * engine.max_len, "graph": round(graph / gib, 4)}


def warm_up(engine: Engine) -> None:
    """Run a greedy and a sampled request once, so that the common step shapes are captured here, not on a
    student's first request (a step bakes in how it chooses tokens: one capture each; others come lazily).
    On a CPU the decoder runs eager: nothing to capture, and skipping it saves a fifth of a second per start."""
    if engine.device.type == "cpu":
        return
    n, p = 4, engine.policy
    if p is not None:  # adaptive k first runs each k `tries` steps per width: a request that long captures every k
        n = min(p.tries * (p.k_max + 1) * (p.k_max + 2) // 2 + 1, engine.max_len - 3 - engine.block)
    engine.generate([[0, 1, 2]], max_new_tokens=n, stop_at_eos=False)
    engine.generate([[0, 1, 2]], max_new_tokens=4, temperature=1.0, stop_at_eos=False)
    if engine.graphs.compile:  # a compile takes seconds (minutes on a cold cache): every greedy width here, not mid-load
        for width in warm_widths(engine.capacity)[1:]:
            engine.generate([[0, 1, 2]] * width, max_new_tokens=n, stop_at_eos=False)
    if engine.policy is not None:  # adaptive k: the warm-up's steps timed captures, not the traffic's steps
        engine.policy.reset_times()


def warm_widths(capacity: int) -> list[int]:
    """The step widths a server meets (Engine.width: powers of two, capped at the capacity)."""
    return sorted({min(capacity, 1 << i) for i in range(capacity.bit_length() + 1)})


def describe(engine: Engine) -> str:
    what = "plain decoding" if engine.proposer is None else f"{engine.method}, k={engine.k}" + (
        f", a tree of topk {engine.tree.topk} and {engine.tree.num_draft_tokens} draft tokens" if engine.tree else "") + (
        ", adaptive k" if engine.policy is not None else "") + (
        f", SIMULATED accept length {engine.simulate:g} (the output is not the model's)" if engine.simulate else "")
    where = torch.cuda.get_device_name() if engine.device.type == "cuda" else "CPU"
    return (f"{what}, up to {engine.capacity} running requests, context {engine.max_len}, {where}"
            + (f", compiled ({engine.graphs.scope})" if engine.graphs.compile else ""))
