"""`specdec serve`: the Lab 2 engine behind SGLang's HTTP API (Lab 3 on a laptop).

This module runs in the HTTP process and imports no torch (a start would pay its import twice); the engine
process builds the engine with serve_engine.py and reports what it chose (EngineFacts)."""

from __future__ import annotations

import argparse
import gc
import signal
import sys

from specdec.cli import fast_flags
from specdec.cli.common import UsageError, add_threads
from specdec.decoder.methods import SPELLINGS, method_named
from specdec.serving.server.app import ServerArgs, bind, run
from specdec.serving.server.proxy import EngineStartError, EntryPoint, start_engine

# What the engine process builds its engine with (serve_engine.py imports torch: named, never imported here).
LOAD_ENGINE = EntryPoint("specdec.cli.serve_engine", "load_engine")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "--model-path", dest="model", default="tiny",
                   help="zoo name, local Hugging Face directory, or hub id (online)")
    algorithms = sorted(set(SPELLINGS) - {"ar", "plain"})  # SGLang's names, and the course's for the proposers
    p.add_argument("--speculative-algorithm", default="none", type=str.lower, choices=algorithms,
                   help="none, mtp (NEXTN: the target's MTP layer), eagle, draft (STANDALONE), ngram, heads")
    p.add_argument("--k", "--speculative-num-steps", dest="k", type=int, default=4, help="drafts per step (a tree's depth)")
    fast_flags.add_tree_arguments(p)
    p.add_argument("--draft", "--speculative-draft-model-path", dest="draft", default=None,
                   help="the draft model (draft) or EAGLE head directory (eagle), when the model has none beside it")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=30000, help="port (0: any free port; default 30000, as SGLang)")
    p.add_argument("--max-running-requests", type=int, default=8, help="rows of the running batch; more wait")
    p.add_argument("--context-length", type=int, default=None, help="prompt + output tokens per request")
    p.add_argument("--api-key", default=None, help="then every endpoint but /health, /health_generate, /metrics (open, as in SGLang) needs "
                   "`Authorization: Bearer KEY`")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="default: float32 on CPU, bfloat16 on CUDA")
    p.add_argument("--cuda-graphs", default="auto", choices=["auto", "on", "off"])
    # a server captures every batch width before it listens: compiled whole ("step"), an 8B-shaped server of 16 rows
    # had not compiled its 5 widths after 470 s (benchmarks/logs/gpu_serve_8b_scopes.log); by layers it compiled in
    # 39 to 83 s and served 0.95x to 1.06x SGLang's tokens/s (benchmarks/logs/gpu_serve_8b_two.log)
    fast_flags.add_arguments(p, scope="layers")
    add_threads(p)


def main(args: argparse.Namespace) -> int:
    # Started from a script (`&`, nohup) SIGINT or SIGHUP may arrive ignored: while loading, each signal stops
    # the process (and so its engine process, whose pipe then closes); once serving, run() drains and exits 0.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    method = method_named(args.speculative_algorithm).name
    for flag, value in (("--k", args.k), ("--max-running-requests", args.max_running_requests)):
        if value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    if not 0 <= args.port < 65536:
        raise UsageError(f"--port must be in 0..65535, got {args.port}")
    shape = fast_flags.tree_shape(args)
    try:
        sock = bind(args.host, args.port)  # first: a taken port is said before the load (minutes on a GPU)
    except OSError as exc:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    # The model loads in the engine process (this one keeps the tokenizer it sends back): the HTTP event loop and
    # the engine then hold a GIL each (engine_process.py says why). It gets the command line as plain data (pickled),
    # less the parser's own entries, and decides --device and --dtype (their defaults need torch).
    plain = argparse.Namespace(**{k: v for k, v in vars(args).items() if not k.startswith("_")})
    try:
        engine = start_engine(LOAD_ENGINE, plain)
    except EngineStartError as exc:
        sock.close()
        if exc.usage:
            raise UsageError(str(exc)) from None
        print(f"specdec serve: the engine failed to start: {exc}", file=sys.stderr, flush=True)
        return 1
    try:
        facts = engine.engine
        port = sock.getsockname()[1]
        server_args = ServerArgs(model_path=facts.model_path, served_model_name=args.served_model_name or args.model,
                                 speculative_algorithm=method_named(method).reported, specdec_method=method,
                                 speculative_num_steps=None if method == "ar" else args.k, host=args.host, port=port,
                                 speculative_eagle_topk=None if method == "ar" else shape.topk,
                                 speculative_num_draft_tokens=None if method == "ar" else shape.num_draft_tokens,
                                 max_running_requests=args.max_running_requests, context_length=facts.max_len,
                                 api_key_set=bool(args.api_key), device=facts.device, dtype=facts.dtype)
        print(f"specdec serve: {facts.name}, {facts.description}, {facts.threads} CPU thread(s)", flush=True)
        # Listen before saying so: a script that connects when it reads the line then waits in the backlog until
        # uvicorn accepts, instead of being refused (uvicorn listens again with its own backlog).
        sock.listen(2048)
        print(f"specdec serve: listening on http://{args.host}:{port}", flush=True)
        status = run(engine, server_args, sock, args.api_key)
    finally:
        engine.stop()  # whatever happened (run() stops it too): the engine process never outlives this one
    # Exit sooner: the interpreter's last garbage collections walk every object fastapi and pydantic created (a stop
    # took 0.34 s instead of 0.24 on a CPU); frozen objects are skipped, and nothing of the server needs them collected.
    gc.freeze()
    if status != 0:
        print(f"specdec serve: the engine stopped ({type(engine.error).__name__}: {engine.error}); exiting with "
              "status 1 so that a supervisor restarts the server", file=sys.stderr, flush=True)
        return 1
    print("specdec serve: stopped", file=sys.stderr, flush=True)
    return 0
