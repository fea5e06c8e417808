"""Continuous batching: one thread owns the engine and runs its loop; requests join and leave the
running batch between steps, as in SGLang and vLLM.

HTTP handlers never touch the model. They `submit` a Request and read its Handle's events; the
loop admits waiting requests into free rows (up to the engine's max_batch), steps every running
row, hands each request the tokens its row kept, and retires a row the moment its request ends
(EOS, its budget, a stop string, or the caller leaving).

`specdec serve` runs this loop in a process of its own (engine_process.py, beside proxy.py on the HTTP side);
tests and notebooks run it in-process, as a thread. The seams `enqueue`, `_push` and `_publish` are where the
engine process hands its events to the pipe instead of to asyncio queues.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from specdec.decoder.params import RowUpdate, SamplingParams
from specdec.serving.server.detokenize import Detokenizer

log = logging.getLogger("specdec.serve")
STEP_WINDOW = 40  # steps in a "recent" gauge (SGLang's default --decode-log-interval)


@dataclass
class Request:
    prompt_ids: list[int]
    params: SamplingParams
    stop: tuple[str, ...] = ()  # stop strings: the output ends before the first one
    trace: bool = False  # keep each step's drafts and accepted count (the notebook colours them)
    stream: bool = True  # send progress after every step (else only the final state)
    rid: str = ""
    arrived: float = field(default_factory=time.monotonic)
    probe: bool = False  # a /health_generate probe: kept out of the counters, as SGLang keeps its probes


@dataclass
class Progress:
    """What a request has so far; the scheduler sends a copy after each step that touched it."""

    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    verify_ct: int = 0  # verify steps of this request
    accepted: list[int] = field(default_factory=list)  # accepted drafts at each verify step
    drafted: int = 0  # drafts proposed over the verify steps (k each, unless the engine's k is adaptive)
    plain_tokens: int = 0  # tokens of steps without drafts after the first token (adaptive k chose k = 0)
    trace: list[dict] = field(default_factory=list)
    finish_reason: dict | None = None  # {"type": "length"|"stop"|"abort", ...} when done
    first_token_at: float | None = None
    finished_at: float | None = None
    admitted_at: float | None = None  # when it left the queue for a row (meta_info's queue_time)
    detok: Detokenizer | None = field(default=None, repr=False, compare=False)  # the text, step by step


class Prefix(Sequence):
    """The first n items of a list that only grows: what a streamed event carries instead of a copy of the
    whole list (O(1) a step, not O(n)); read as a list by whoever needs one (a JSON response)."""

    __slots__ = ("items", "n")

    def __init__(self, items: list) -> None:
        self.items, self.n = items, len(items)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.items[: self.n][i]
        if not -self.n <= i < self.n:
            raise IndexError("Prefix index out of range")
        return self.items[i % self.n]

    def __iter__(self):
        return iter(self.items[: self.n])

    def __eq__(self, other) -> bool:
        return isinstance(other, (list, Prefix)) and list(self) == list(other)

    def __repr__(self) -> str:
        return repr(list(self))


class EngineError(RuntimeError):
    """The engine failed while serving a request (HTTP 500); other requests go on."""


class Handle:
    """The caller's side of one request: events arrive in order on an asyncio queue."""

    def __init__(self, request: Request, scheduler: "Scheduler", loop: asyncio.AbstractEventLoop):
        self.request, self.scheduler, self.loop = request, scheduler, loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.done = False

    def push(self, event) -> None:  # from the scheduler's thread
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)

    def newest(self, event):
        """`event`, or the newest state queued after it: a caller that fell behind the engine skips the states in
        between. Each holds the whole output so far, so nothing is lost, and a busy server writes fewer, larger
        chunks (SGLang's tokenizer manager drains a request's queued outputs and sends the last). Stops at the
        final state or an error, which are never skipped."""
        while isinstance(event, Progress) and event.finish_reason is None and not self.events.empty():
            event = self.events.get_nowait()
        return event

    def cancel(self) -> None:
        """The caller left: free the row (or drop the waiting request)."""
        if not self.done:
            self.scheduler.cancel(self)


def _put_all(events: list[tuple[Handle, object]]) -> None:
    """On the event loop's thread: one step's events, each onto its caller's queue, in order."""
    for handle, event in events:
        handle.events.put_nowait(event)


class Scheduler:
    """engine: the decoder's Engine (specdec.decoder.engine), driven from this object's thread only. Not imported
    here: the HTTP process of `specdec serve` imports this module (Request, Progress, Handle) without torch."""

    def __init__(self, engine, tokenizer):
        self.engine, self.tokenizer = engine, tokenizer
        self.waiting: collections.deque[Handle] = collections.deque()
        self.rows: dict[int, tuple[Handle, Progress]] = {}  # engine slot -> request
        self.cancelled: set[int] = set()  # id(handle)
        self.cv = threading.Condition()
        self.stopping = False
        self.ids = itertools.count()
        self.counters = collections.Counter()  # monotonic: prompt/generation tokens, verify steps, requests
        self.since_flush = collections.Counter()  # verify steps and their tokens, for the average accept length
        self.recent: collections.deque = collections.deque(maxlen=STEP_WINDOW)  # (s, tokens, verify steps, their tokens)
        self.step_times: dict[int, collections.deque] = {}  # running rows -> recent step seconds
        # where the engine thread's time goes: admitting (prefills), stepping, delivering (detokenize, events)
        self.loop_seconds: collections.Counter = collections.Counter()
        self.error: BaseException | None = None  # set if the engine loop died
        self.admitting: list[Handle] = []
        # one step's events and generated tokens, handed over once per step (not once per row: at 64 rows the
        # wake-ups of the event loop and the lock, 64 each per step, cost the GPU's idle time)
        self.outbox: list[tuple[Handle, object]] = []
        self.generated = 0
        self.thread = threading.Thread(target=self._run, name="specdec-engine", daemon=True)

    # -- the caller's side (any thread) ----------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with self.cv:
            self.stopping = True
            self.cv.notify()
        self.thread.join(timeout=30)

    def submit(self, request: Request) -> Handle:
        """Queue a request (already checked against the engine); its events arrive on the handle."""
        handle = Handle(request, self, asyncio.get_running_loop())
        request.rid = request.rid or f"{next(self.ids):x}"
        self.enqueue(handle)
        return handle

    def enqueue(self, handle) -> None:
        """Queue a handle made by the caller (submit's, or the engine process's stand-in for a remote one)."""
        with self.cv:
            if self.error is not None:  # the engine is gone: say so now rather than queue forever
                handle.done = True
                self._push(handle, EngineError("the engine has stopped; the server is exiting"))
                return
            self.waiting.append(handle)
            self.cv.notify()

    def cancel(self, handle: Handle) -> None:
        with self.cv:
            self.cancelled.add(id(handle))
            self.cv.notify()

    @property
    def busy(self) -> bool:
        with self.cv:
            return bool(self.waiting or self.rows)

    def flush(self) -> bool:
        """Reset the server-wide acceptance average (SGLang's /flush_cache); refused while busy."""
        with self.cv:
            if self.waiting or self.rows:
                return False
            self.since_flush.clear()
            self.recent.clear()
            return True

    def state(self) -> dict:
        """The numbers /server_info and /metrics report."""
        with self.cv:
            recent = list(self.recent)
            out = {"num_running_reqs": len(self.rows), "num_queue_reqs": len(self.waiting),
                   "counters": dict(self.counters),
                   "step_time_dict": {b: list(t) for b, t in sorted(self.step_times.items())},
                   "loop_seconds": dict(self.loop_seconds)}
            seconds = sum(r[0] for r in recent)
            out["last_gen_throughput"] = sum(r[1] for r in recent) / seconds if seconds > 0 else 0.0
            if self.since_flush["verify_steps"]:
                out["avg_spec_accept_length"] = self.since_flush["verify_tokens"] / self.since_flush["verify_steps"]
            verify = sum(r[2] for r in recent)
            if verify:
                out["recent_spec_accept_length"] = sum(r[3] for r in recent) / verify
            return out

    # -- the loop (the engine's thread) ------------------------------------------------------------
    @property
    def alive(self) -> bool:
        """The engine loop runs (or has not been started yet) and has not died: what /health reports."""
        return self.error is None and (self.thread.is_alive() or not self.thread.ident)

    def _run(self) -> None:
        """The engine thread: the loop, and if it ever dies, every caller told at once (no one waits forever)."""
        try:
            self._loop()
        except BaseException as exc:  # a bug in the loop itself: /health turns 503 and the server exits
            log.exception("the engine loop died")
            with self.cv:
                self.error = exc
                handles = list(self.waiting) + self.admitting + [h for h, _ in self.rows.values()]
                self.waiting.clear()
                self.rows.clear()
            for h in handles:
                h.done = True
                self._push(h, EngineError(f"the engine stopped: {type(exc).__name__}: {exc}"))

    def _loop(self) -> None:
        while True:
            with self.cv:
                while not (self.stopping or self.waiting or self.rows or self.cancelled):
                    self.cv.wait()
                if self.stopping:
                    break
                self._drop_cancelled()
                free = len(self.engine.free_slots)
                admits = [self.waiting.popleft() for _ in range(min(free, len(self.waiting)))]
            if admits:
                t0 = time.perf_counter()
                self.admitting = admits  # neither waiting nor running while they are prefilled
                self._admit(admits)
                self.admitting = []
                self.loop_seconds["admit"] += time.perf_counter() - t0
            if self.engine.running:
                try:
                    t0 = time.perf_counter()
                    updates = self.engine.step()
                    t1 = time.perf_counter()
                    self._record(updates, t1 - t0)
                    try:
                        for up in updates:
                            self._deliver(up)
                    finally:
                        self._flush()
                        self.loop_seconds["step"] += t1 - t0
                        self.loop_seconds["deliver"] += time.perf_counter() - t1
                except Exception as exc:  # one step failed: its rows fail with a 500, the engine goes on
                    log.exception("a decode step failed; its requests are ended")
                    self._fail_running(EngineError(f"a decode step failed: {type(exc).__name__}: {exc}"))
        for handle, progress in list(self.rows.values()):  # shutting down: end what is running
            self._finish(handle, progress, {"type": "abort", "message": "the server is shutting down"})
        self._flush()

    def _flush(self) -> None:
        """Hand the step's events to the callers' event loops, one call per loop, and count its tokens."""
        events, self.outbox = self.outbox, []
        if self.generated:
            with self.cv:
                self.counters["generation_tokens"] += self.generated
            self.generated = 0
        if events:
            self._publish(events)

    def _publish(self, events: list[tuple[Handle, object]]) -> None:
        """One step's events to their callers: here, onto asyncio queues (the engine process sends them instead)."""
        loops: dict[int, tuple] = {}  # id(loop) -> (loop, its events)
        for handle, event in events:
            loops.setdefault(id(handle.loop), (handle.loop, []))[1].append((handle, event))
        for loop, batch in loops.values():
            loop.call_soon_threadsafe(_put_all, batch)

    def _push(self, handle: Handle, event) -> None:
        """An event outside a step's batch (an error): to its caller at once."""
        handle.push(event)

    def _drop_cancelled(self) -> None:
        if not self.cancelled:
            return
        self.waiting = collections.deque(h for h in self.waiting if id(h) not in self.cancelled)
        for slot, (handle, progress) in list(self.rows.items()):
            if id(handle) in self.cancelled:
                self.engine.retire(slot)
                del self.rows[slot]
                handle.done = True
        self.cancelled.clear()

    def _fail_running(self, error: Exception) -> None:
        """End every running row with `error` (its caller gets a 500) and free the rows."""
        with self.cv:
            rows, self.rows = list(self.rows.items()), {}
        for slot, (handle, _) in rows:
            self.engine.retire(slot)
            handle.done = True
            self._push(handle, error)

    def _admit(self, handles: list[Handle]) -> None:
        try:  # all or nothing: engine.admit leaves no row behind when it raises
            updates = self.engine.admit([h.request.prompt_ids for h in handles], [h.request.params for h in handles])
        except Exception as exc:
            if len(handles) > 1:  # admit them one by one, so only the request at fault fails
                for h in handles:
                    self._admit([h])
                return
            if not isinstance(exc, ValueError):
                log.exception("admitting a request failed")
            handles[0].done = True
            self._push(handles[0], exc if isinstance(exc, ValueError) else EngineError(f"{type(exc).__name__}: {exc}"))
            return
        with self.cv:
            for h, up in zip(handles, updates):
                self.rows[up.slot] = (h, Progress(admitted_at=time.monotonic()))
                if not h.request.probe:
                    self.counters["requests"] += 1
                    self.counters["prompt_tokens"] += len(h.request.prompt_ids)
        try:
            for up in updates:
                self._deliver(up)
        finally:
            self._flush()

    def _record(self, updates: list[RowUpdate], seconds: float) -> None:
        tokens = sum(len(u.tokens) for u in updates)
        verify = [u for u in updates if u.accepted >= 0]
        with self.cv:
            self.recent.append((seconds, tokens, len(verify), sum(len(u.tokens) for u in verify)))
            self.step_times.setdefault(len(updates), collections.deque(maxlen=100)).append(seconds)
            self.counters["verify_steps"] += len(verify)
            self.since_flush["verify_steps"] += len(verify)
            self.since_flush["verify_tokens"] += sum(len(u.tokens) for u in verify)

    def _deliver(self, up: RowUpdate) -> None:
        if up.slot not in self.rows:
            return
        handle, p = self.rows[up.slot]
        now = time.monotonic()
        p.first_token_at = p.first_token_at or now
        if up.accepted < 0 and p.output_ids:  # a step without drafts (not the prefill's first token)
            p.plain_tokens += len(up.tokens)
        p.output_ids += up.tokens
        if not handle.request.probe:
            self.generated += len(up.tokens)
        if up.accepted >= 0:  # a verify step: it kept its accepted drafts and one token of the target's
            p.verify_ct += 1
            p.drafted += len(up.drafts)
            p.accepted.append(len(up.tokens) - 1)
            if handle.request.trace:
                p.trace.append({"drafts": up.drafts, "accepted": len(up.tokens) - 1, "tokens": up.tokens})
        finish = None
        if handle.request.stream or handle.request.stop:  # the text is needed now: decode only what is new
            p.detok = p.detok or Detokenizer(self.tokenizer)
            p.detok.update(p.output_ids)
            p.text = p.detok.shown
            finish = self._stop_string(handle.request, p) if handle.request.stop else None
        if finish is None and up.finished:
            finish = ({"type": "stop", "matched": p.output_ids[-1]} if up.finished == "stop" else
                      {"type": "length", "length": handle.request.params.max_new_tokens})
        if finish is not None:
            self.engine.retire(up.slot)  # already free when the engine finished it; a stop string ends it here
            with self.cv:
                del self.rows[up.slot]
            self._finish(handle, p, finish)
        elif handle.request.stream:
            self.outbox.append((handle, _snapshot(p)))

    def _stop_string(self, request: Request, p: Progress) -> dict | None:
        """The first stop string in the text ends the request there (the string itself is cut). Searched in
        the settled and the pending text, as in the whole output decoded; each step only the new part."""
        hit = p.detok.find(request.stop)
        if hit is None:
            return None
        at, s = hit
        p.text = (p.detok.text + p.detok.pending)[:at]
        return {"type": "stop", "matched": s}

    def _finish(self, handle: Handle, p: Progress, reason: dict) -> None:
        if reason["type"] != "stop" or isinstance(reason.get("matched"), int):  # a stop string already cut the text
            p.text = self.tokenizer.decode(p.output_ids, skip_special_tokens=True)  # SGLang's default
        p.finish_reason, p.finished_at = reason, time.monotonic()
        p.detok = None
        handle.done = True
        self.outbox.append((handle, p))  # the row is gone: nothing changes it any more


def _snapshot(p: Progress) -> Progress:
    """What a streamed event carries: the lists as they are now, without copying them (they only grow)."""
    s = Progress.__new__(Progress)  # a shallow copy (dataclasses.replace re-runs __init__: a tenth of the loop's time at 64 rows)
    s.__dict__.update(p.__dict__, output_ids=Prefix(p.output_ids), accepted=Prefix(p.accepted), trace=Prefix(p.trace),
                      detok=None)
    return s
