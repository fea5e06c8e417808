"""`specdec serve`: the Lab 2 engine behind SGLang's HTTP API, with continuous batching.

Endpoints: /health, /health_generate, /generate, /v1/models, /v1/completions,
/v1/chat/completions, /server_info (= /get_server_info), /flush_cache, /metrics. Shapes follow
SGLang 0.5.16. Three differences a student can see: the server-wide accept length is exact (SGLang
folds it in every 40 steps, so it lags), `"return_spec_trace": true` returns each step's drafts, and
/server_info's `loop_seconds` says where the engine thread's time went (admitting, stepping, delivering).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import signal
import socket
import threading
import time
from dataclasses import asdict, dataclass

from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from specdec import __version__
from specdec.decoder.params import SamplingParams
from specdec.serving.server import protocol
from specdec.serving.server.protocol import BadRequest
from specdec.serving.server.scheduler import EngineError, Handle, Progress, Request, Scheduler
from specdec.serving.server.wire import EngineFacts

API_VERSION = "0.5.16"  # the SGLang release whose response shapes this server follows
POLL_S = 0.5  # how often a non-streaming request checks that its caller is still there


@dataclass
class ServerArgs:
    """What /server_info reports back (SGLang reports its own launch arguments the same way)."""

    model_path: str
    served_model_name: str
    speculative_algorithm: str | None
    speculative_num_steps: int | None
    host: str
    port: int
    max_running_requests: int
    context_length: int
    api_key_set: bool
    device: str
    dtype: str
    speculative_eagle_topk: int | None = None  # 1: a chain
    speculative_num_draft_tokens: int | None = None  # tokens a verify step checks, the root included
    specdec_method: str | None = None  # the course's name (mtp, eagle, ...); SGLang's name is speculative_algorithm

    def draft_tokens(self) -> int | None:
        """Tokens a verify step checks, the root included (a chain of k drafts: k + 1); None without speculation."""
        if not self.speculative_algorithm:
            return None
        return self.speculative_num_draft_tokens or (self.speculative_num_steps or 0) + 1


def error(status: int, message: str) -> JSONResponse:
    """One line of JSON, in the shape SGLang's OpenAI layer uses."""
    kind = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
            413: "RequestTooLargeError"}.get(status, "Error")
    return JSONResponse({"object": "error", "message": message, "type": kind, "code": status}, status_code=status)


def sse(obj) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()


MAX_REQUEST_BYTES = 1 << 20  # 1 MiB: far more than any prompt that fits a context; refused before it is read
OPEN_PATHS = {"/health", "/health_generate", "/metrics"}  # open under --api-key, as in SGLang 0.5.16


class BodyTooLarge(Exception):
    pass


def authorised(header: str, api_key: str) -> bool:
    """`Authorization: Bearer KEY`, the scheme in any case, the key compared in constant time."""
    scheme, _, token = header.strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())


class Gate:
    """The checks before a request reaches its handler: the API key, and the body's size (413 from
    Content-Length at once, or as soon as a chunked body passes the limit). A plain ASGI middleware,
    unlike @app.middleware("http"), which hides a client's disconnect from the handler."""

    def __init__(self, app, api_key: str | None = None, max_bytes: int = MAX_REQUEST_BYTES):
        self.app, self.api_key, self.max_bytes = app, api_key, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.lower(): v for k, v in scope["headers"]}
        if self.api_key and scope["method"] != "OPTIONS" and scope["path"] not in OPEN_PATHS:
            if not authorised(headers.get(b"authorization", b"").decode("latin-1"), self.api_key):
                message = "missing or wrong API key: send the header `Authorization: Bearer KEY`"
                return await error(401, message)(scope, receive, send)
        size = headers.get(b"content-length", b"0")
        if not size.isdigit() or int(size) > self.max_bytes:
            return await error(413, f"the request body is over {self.max_bytes} bytes")(scope, receive, send)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise BodyTooLarge(f"the request body is over {self.max_bytes} bytes")
            return message

        await self.app(scope, counted, send)


def build_app(scheduler: Scheduler, args: ServerArgs, api_key: str | None = None,
              facts: EngineFacts | None = None) -> FastAPI:
    """The app over a proxy.EngineProxy (its `engine` is EngineFacts), or over an in-process Scheduler with its
    engine's `facts` (engine_process.engine_facts): the app reads the engine only through them, so that this module
    never imports torch."""
    engine, tokenizer = facts or scheduler.engine, scheduler.tokenizer
    if not isinstance(engine, EngineFacts):
        raise TypeError("build_app over an in-process Scheduler needs facts=engine_process.engine_facts(...)")
    speculative, k = engine.proposer is not None, engine.k
    # unknown request fields, each named once; and once, a request naming another model than this one
    fields = protocol.FieldLog((args.served_model_name, args.model_path))
    app = FastAPI(title="specdec serve", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
    started = time.time()

    app.add_middleware(Gate, api_key=api_key)  # pure ASGI: a caller hanging up stays visible to the handlers

    @app.exception_handler(EngineError)
    async def engine_error(_, exc: EngineError):
        return error(500 if scheduler.alive else 503, str(exc))

    @app.exception_handler(BodyTooLarge)
    async def too_large(_, exc: BodyTooLarge):
        return error(413, str(exc))

    @app.exception_handler(BadRequest)
    async def bad_request(_, exc: BadRequest):
        return error(400, str(exc))

    async def body(request: HTTPRequest) -> dict:
        return await asyncio.to_thread(protocol.parse_json, await request.body())

    async def events(handle: Handle, request: HTTPRequest):
        """The request's progress events until it finishes; cancels it if the caller leaves."""
        first = True
        try:
            while True:
                if handle.events.empty():
                    try:
                        p = await asyncio.wait_for(handle.events.get(), POLL_S)
                    except asyncio.TimeoutError:
                        if await request.is_disconnected():
                            return
                        continue
                else:
                    p = handle.events.get_nowait()
                if not first:  # the first token goes alone: a stream of several steps always streams
                    p = handle.newest(p)
                first = False
                if isinstance(p, EngineError):
                    raise p
                if isinstance(p, Exception):
                    raise BadRequest(str(p))
                yield p
                if p.finish_reason is not None:
                    return
        finally:
            handle.cancel()

    async def final(handle: Handle, request: HTTPRequest) -> Progress | None:
        last = None
        async for p in events(handle, request):
            last = p
        return last

    async def finals(handles: list[Handle], request: HTTPRequest) -> list[Progress] | None:
        """Every request's final state; None if the caller left (then every one is cancelled)."""
        done = await asyncio.gather(*(final(h, request) for h in handles))
        if any(p is None for p in done):
            for h in handles:
                h.cancel()
            return None
        return list(done)

    async def merged(handles: list[Handle], request: HTTPRequest):
        """(index, progress) of several requests as they come (a batch, or n > 1); all end together."""
        if len(handles) == 1:
            async for p in events(handles[0], request):
                yield 0, p
            return
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(i: int, handle: Handle):
            try:
                async for p in events(handle, request):
                    await queue.put((i, p))
            except Exception as exc:  # noqa: BLE001 -- handed to the reader, who raises it
                await queue.put((i, exc))
            finally:
                await queue.put((i, None))

        tasks = [asyncio.create_task(pump(i, h)) for i, h in enumerate(handles)]
        try:
            left = len(tasks)
            while left:
                i, p = await queue.get()
                if p is None:
                    left -= 1
                elif isinstance(p, Exception):
                    raise p
                else:
                    yield i, p
        finally:
            for t in tasks:
                t.cancel()
            for h in handles:
                h.cancel()

    # -- health --------------------------------------------------------------------------------
    @app.get("/health")
    async def health():
        """200 while the engine loop runs; 503 the moment it has died (the process then exits)."""
        return Response(status_code=200) if scheduler.alive else error(503, "the engine has stopped")

    @app.get("/health_generate")
    async def health_generate(request: HTTPRequest):
        """One token through the whole path: the engine loop is alive."""
        if not scheduler.alive:
            return error(503, "the engine has stopped")
        probe = Request([0], SamplingParams(max_new_tokens=1, stop_at_eos=False), probe=True)
        if await final(scheduler.submit(probe), request) is None:
            return error(503, "the engine did not answer")
        return Response(status_code=200)

    # -- native ----------------------------------------------------------------------------------
    @app.post("/generate")
    async def generate(request: HTTPRequest):
        received = time.time()
        # tokenizing a long prompt takes a while: off the event loop, so /health and streams go on meanwhile
        job = await asyncio.to_thread(protocol.parse_generate, await body(request), tokenizer, engine, fields)
        job.received_ts = received
        handles = [scheduler.submit(r) for r in job.requests]
        if job.stream:
            async def chunks():
                async for i, p in merged(handles, request):
                    yield sse(protocol.generate_response(job, i, p, speculative, k))
                yield sse("[DONE]")

            return StreamingResponse(chunks(), media_type="text/event-stream")
        done = await finals(handles, request)
        if done is None:
            return Response(status_code=499)  # the caller left
        out = [protocol.generate_response(job, i, p, speculative, k) for i, p in enumerate(done)]
        return JSONResponse(out if job.is_batch else out[0])

    # -- OpenAI-compatible -----------------------------------------------------------------------
    async def openai(request: HTTPRequest, chat: bool):
        """One choice per Request of the job (each prompt n times), streamed as SGLang 0.5.16 streams."""
        received = time.time()
        parse = protocol.parse_chat if chat else protocol.parse_completion
        job = await asyncio.to_thread(parse, await body(request), tokenizer, engine, fields)
        job.received_ts = received
        handles = [scheduler.submit(r) for r in job.requests]
        if not job.stream:
            done = await finals(handles, request)
            if done is None:
                return Response(status_code=499)  # the caller left
            return JSONResponse(protocol.completion_response(job, done, speculative, k))

        async def chunks():
            sent: dict[int, str] = {}
            last: dict[int, Progress] = {}
            finished: list[int] = []
            async for i, p in merged(handles, request):
                text = p.text if p.finish_reason is not None else p.text.rstrip("\ufffd")  # half a character
                first, delta = i not in last, text[len(sent.get(i, "")):]
                sent[i], last[i] = text, p
                for chunk in protocol.stream_chunks(job, i, p, delta, first):
                    yield sse(chunk)
                if p.finish_reason is not None:
                    finished.append(i)
            if chat:  # SGLang closes each choice with a chunk of its own, after the text
                for i in finished:
                    yield sse(protocol.finish_chunk(job, i, last[i]))
            if last and job.include_usage:
                yield sse(protocol.usage_chunk(job, last))
            yield sse("[DONE]")

        return StreamingResponse(chunks(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: HTTPRequest):
        return await openai(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: HTTPRequest):
        return await openai(request, chat=True)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": args.served_model_name, "object": "model", "created": int(started),
                                            "owned_by": "specdec", "root": args.model_path,
                                            "max_model_len": args.context_length}]}

    # -- the server's own state ----------------------------------------------------------------
    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info():
        state = await asyncio.to_thread(scheduler.state)  # the engine process answers between steps: off the loop
        internal = {"last_gen_throughput": state["last_gen_throughput"],
                    "effective_max_running_requests_per_dp": args.max_running_requests,
                    "num_running_reqs": state["num_running_reqs"], "num_queue_reqs": state["num_queue_reqs"],
                    "step_time_dict": state["step_time_dict"]}
        internal["memory_usage"] = engine.memory
        internal["loop_seconds"] = state["loop_seconds"]  # ours, not SGLang's: the engine thread's admit/step/deliver
        internal["max_speculative_num_draft_tokens"] = args.draft_tokens()
        if "avg_spec_accept_length" in state:  # as in SGLang, absent until a verify step has been counted
            internal["avg_spec_accept_length"] = state["avg_spec_accept_length"]
        return {**asdict(args), "tokenizer_path": args.model_path, "status": "ready", "version": API_VERSION,
                "specdec_version": __version__,
                "speculative_eagle_topk": (args.speculative_eagle_topk or 1) if speculative else None,
                "speculative_num_draft_tokens": args.draft_tokens(),
                "max_total_num_tokens": engine.capacity * engine.max_len, "internal_states": [internal]}

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        if not await asyncio.to_thread(scheduler.flush):
            return PlainTextResponse("Cache not flushed: requests are running or waiting.", status_code=400)
        return PlainTextResponse("Cache flushed.\n")

    @app.get("/metrics")
    async def metrics():
        state = await asyncio.to_thread(scheduler.state)
        return PlainTextResponse(prometheus(state, args), media_type="text/plain; version=0.0.4")

    return app


def prometheus(state: dict, args: ServerArgs) -> str:
    """The sglang:* metrics a benchmark reads, in Prometheus' text format."""
    label = f'{{model_name="{args.served_model_name}"}}'
    c = state["counters"]
    rows = [("num_running_reqs", "gauge", state["num_running_reqs"]),
            ("num_queue_reqs", "gauge", state["num_queue_reqs"]),
            ("gen_throughput", "gauge", state["last_gen_throughput"]),
            ("prompt_tokens_total", "counter", c.get("prompt_tokens", 0)),
            ("generation_tokens_total", "counter", c.get("generation_tokens", 0)),
            ("num_requests_total", "counter", c.get("requests", 0))]
    if args.speculative_algorithm:
        # over the last STEP_WINDOW steps, 0 where none verified (SGLang: its last logging interval);
        # the rate is SGLang's (accept length - 1) / (num_draft_tokens - 1) with a chain of k drafts
        length, k = state.get("recent_spec_accept_length", 0.0), args.speculative_num_steps or 0
        rows += [("spec_verify_calls_total", "counter", c.get("verify_steps", 0)),
                 ("spec_accept_length", "gauge", length),
                 ("spec_accept_rate", "gauge", (length - 1) / k if length and k else 0.0),
                 ("spec_num_steps", "gauge", k),
                 ("spec_num_draft_tokens", "gauge", args.draft_tokens())]
    out = []
    for name, kind, value in rows:
        out += [f"# TYPE sglang:{name} {kind}", f"sglang:{name}{label} {float(value)}"]
    return "\n".join(out) + "\n"


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: any free one), so the real port is known before serving."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: uvicorn writes a response's head and body separately, and without it
    # the body waits for the client's delayed ACK (40 ms per response on a kept-alive connection).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    return sock


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
DRAIN_S = 10.0  # on a stop signal, in-flight requests get this long to finish


def run(scheduler: Scheduler, args: ServerArgs, sock: socket.socket, api_key: str | None = None) -> int:
    """Serve until SIGTERM, SIGINT or SIGHUP (in-flight requests drain, then 0) or until the engine loop
    dies (1, at once: a supervisor restarts the server)."""
    import uvicorn  # the server's own dependency, not the decoder's

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            """uvicorn's handlers, for SIGHUP too and whatever the inherited dispositions (a script's `&`
            ignores SIGINT), without re-raising the signal afterwards: a requested stop exits 0."""
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    app = build_app(scheduler, args, api_key)
    server = Server(uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=DRAIN_S))

    def watchdog() -> None:  # the engine died: stop serving now (its callers were already told)
        while not server.should_exit:
            if not scheduler.alive:
                server.should_exit = server.force_exit = True
                return
            time.sleep(0.2)

    scheduler.start()
    threading.Thread(target=watchdog, name="specdec-watchdog", daemon=True).start()
    try:
        server.run(sockets=[sock])
    finally:
        scheduler.stop()
        sock.close()
    return 0 if scheduler.error is None else 1
