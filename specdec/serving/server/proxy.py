"""The HTTP process's side of the engine process: EngineProxy has the Scheduler's interface that app.py uses
(submit, cancel, state, flush, alive, busy, start, stop, error, engine, tokenizer), and rebuilds each request's
Progress from the Deltas the engine process sends, so that app.py and protocol.py work as with a Scheduler.

One thread here reads the pipe and hands each step's events to the event loop in one call, as the in-process
Scheduler does; it holds the GIL only to unpickle a step's message and apply its deltas.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import itertools
import multiprocessing
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from specdec.serving.server.scheduler import EngineError, Handle, Progress, Request, _put_all, _snapshot
from specdec.serving.server.wire import Delta, EngineFacts

CALL_TIMEOUT_S = 30.0  # state() and flush() wait this long for the engine process's answer
STOP_TIMEOUT_S = 30.0  # then the engine process is killed


@dataclass(frozen=True)
class EntryPoint:
    """A function named by its module, imported where it is called: in the engine process. The spawn pickles the
    process's target and arguments, and pickle checks a function by importing its module, here; the engine's
    entry point and builder import torch, so they go as names instead (two strings) and this process never
    imports them."""

    module: str
    name: str

    def __call__(self, *args):
        return getattr(importlib.import_module(self.module), self.name)(*args)


ENGINE_MAIN = EntryPoint("specdec.serving.server.engine_process", "serve")


class EngineStartError(RuntimeError):
    """The engine process could not load. `usage`: the user's to fix (a missing model...): status 2."""

    def __init__(self, message: str, usage: bool):
        super().__init__(message)
        self.usage = usage


class EngineProxy:
    def __init__(self, process: multiprocessing.process.BaseProcess, conn, facts: EngineFacts, tokenizer):
        self.process, self.conn = process, conn
        self.engine, self.tokenizer = facts, tokenizer
        self.handles: dict[int, tuple[Handle, Progress]] = {}  # key -> the caller's handle, its rebuilt progress
        self.keys, self.ids, self.call_ids = itertools.count(), itertools.count(), itertools.count()
        self.calls: dict[int, concurrent.futures.Future] = {}
        self.send_lock = threading.Lock()
        self.error: BaseException | None = None  # set when the engine process died
        self.stopping = False
        self.thread = threading.Thread(target=self._listen, name="specdec-engine-pipe", daemon=True)

    # -- the Scheduler's interface -------------------------------------------------------------------
    def start(self) -> None:
        if not self.thread.ident:
            self.thread.start()

    def submit(self, request: Request) -> Handle:
        handle = Handle(request, self, asyncio.get_running_loop())
        request.rid = request.rid or f"{next(self.ids):x}"
        if self.error is not None:  # the engine is gone: say so now rather than queue forever
            handle.done = True
            handle.push(EngineError("the engine has stopped; the server is exiting"))
            return handle
        handle.key = next(self.keys)
        self.handles[handle.key] = (handle, Progress())
        if self.error is not None and self.handles.pop(handle.key, None) is not None:  # it died meanwhile
            handle.done = True
            handle.push(self.error)
            return handle
        self._send(("submit", handle.key, request))
        return handle

    def cancel(self, handle: Handle) -> None:
        if self.handles.pop(getattr(handle, "key", -1), None) is not None:
            self._send(("cancel", handle.key))

    def state(self) -> dict:
        return self._call("state")

    def flush(self) -> bool:
        return self._call("flush")

    @property
    def busy(self) -> bool:
        if self.error is not None:
            return False
        s = self.state()
        return bool(s["num_running_reqs"] or s["num_queue_reqs"])

    @property
    def alive(self) -> bool:
        """The engine process runs and its loop has not died: what /health reports. The pipe's reader is the one
        judge: the pipe closes the moment the process dies, and only stop() makes that expected."""
        return self.error is None

    def stop(self) -> None:
        """Stop the engine process (what runs ends with "abort"), killing it if it does not stop in time."""
        if not self.stopping:
            self.stopping = True
            self._send(("stop",))
        self.process.join(STOP_TIMEOUT_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        if self.thread.ident:
            self.thread.join(5)
        self.conn.close()

    # -- the pipe ----------------------------------------------------------------------------------
    def _send(self, message) -> None:
        try:
            with self.send_lock:
                self.conn.send(message)
        except OSError:  # the engine process is gone: the reader has seen it, or soon will
            pass

    def _call(self, name: str):
        if self.error is not None:
            raise EngineError("the engine has stopped; the server is exiting")
        future: concurrent.futures.Future = concurrent.futures.Future()
        call_id = next(self.call_ids)
        self.calls[call_id] = future
        self._send(("call", call_id, name))
        try:
            return future.result(CALL_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            raise EngineError(f"the engine did not answer {name}() in {CALL_TIMEOUT_S:g} s") from None
        finally:
            self.calls.pop(call_id, None)

    def _listen(self) -> None:
        """The reader thread: each step's events to their callers; when the pipe closes, everyone told."""
        try:
            while True:
                message = self.conn.recv()
                kind = message[0]
                if kind == "events":
                    self._dispatch(message[1])
                elif kind == "reply":
                    future = self.calls.get(message[1])
                    if future is not None:
                        future.set_result(message[2])
                elif kind == "died":
                    self._fail(EngineError(f"the engine stopped: {message[1]}"))
        except (EOFError, OSError):
            pass
        if not self.stopping:  # it died unasked: a crash, a kill, the OOM killer
            self.process.join(1)
            self._fail(EngineError(f"the engine process exited (status {self.process.exitcode})"))

    def _fail(self, error: EngineError) -> None:
        if self.error is None:
            self.error = error
        handles, self.handles = list(self.handles.values()), {}
        for handle, _ in handles:
            handle.done = True
            handle.push(error)
        for future in list(self.calls.values()):
            future.set_exception(error)

    def _dispatch(self, events: list[tuple[int, object]]) -> None:
        """Apply one step's deltas; hand the events to each event loop in one call (as Scheduler._publish)."""
        loops: dict[int, tuple] = {}
        for key, event in events:
            entry = self.handles.get(key)
            if entry is None:  # cancelled since: the engine had not heard yet
                continue
            handle, p = entry
            if isinstance(event, Delta):
                apply(p, event)
                if p.finish_reason is None:
                    event = _snapshot(p)
                else:
                    event = p
                    handle.done = True
                    self.handles.pop(key, None)
            else:  # an error ends the request
                handle.done = True
                self.handles.pop(key, None)
            loops.setdefault(id(handle.loop), (handle.loop, []))[1].append((handle, event))
        for loop, batch in loops.values():
            loop.call_soon_threadsafe(_put_all, batch)


def apply(p: Progress, d: Delta) -> None:
    """A request's Progress brought up to date by the engine process's Delta."""
    p.output_ids += d.ids
    p.accepted += d.accepted
    p.trace += d.trace
    p.text = p.text[:d.cut] + d.tail if d.cut else d.tail
    p.verify_ct, p.drafted, p.plain_tokens = d.verify_ct, d.drafted, d.plain_tokens
    p.first_token_at, p.admitted_at, p.finished_at = d.first_token_at, d.admitted_at, d.finished_at
    p.finish_reason = d.finish_reason


def start_engine(build: Callable[[object], object], options, timeout: float | None = None) -> EngineProxy:
    """Spawn the engine process, which runs build(options) -> engine_process.Loaded (both picklable: an EntryPoint
    or a module-level function, and plain data), and wait until it says it is ready. Raises EngineStartError if it
    cannot load; on any exit from here without a proxy (Ctrl-C while loading), the engine process is killed."""
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked CUDA context, no inherited threads
    conn, child_conn = ctx.Pipe(duplex=True)
    process = ctx.Process(target=ENGINE_MAIN, args=(child_conn, build, options), name="specdec-engine", daemon=True)
    process.start()
    child_conn.close()  # only the engine process holds its end: when this process dies, the pipe closes there
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while not conn.poll(0.1):
            if not process.is_alive():
                raise EngineStartError(f"the engine process exited while loading (status {process.exitcode})", False)
            if deadline is not None and time.monotonic() > deadline:
                raise EngineStartError(f"the engine process did not load in {timeout:g} s", False)
        message = conn.recv()
        if message[0] == "load_error":
            raise EngineStartError(message[2], usage=message[1])
        _, facts, tokenizer = message
    except BaseException as exc:
        process.kill()
        process.join(5)
        conn.close()
        if isinstance(exc, EOFError):
            raise EngineStartError(f"the engine process exited while loading (status {process.exitcode})",
                                   False) from None
        raise
    return EngineProxy(process, conn, facts, tokenizer)
