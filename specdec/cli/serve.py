"""`specdec serve`: the Lab 2 engine behind SGLang's HTTP API (Lab 3 on a laptop)."""

from __future__ import annotations

import argparse
import gc
import signal
import sys
from dataclasses import dataclass

import torch

from specdec.cli import fast, fast_flags
from specdec.cli.common import UsageError, add_threads, threads
from specdec.decoder.engine import Engine
from specdec.decoder.methods import METHODS, SPELLINGS, method_named
from specdec.serving.server.app import ServerArgs, bind, run, warm_up, warm_widths
from specdec.serving.server.engine_process import LoadError, Loaded
from specdec.serving.server.proxy import EngineStartError, start_engine
from specdec.zoo import ModelNotFound


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
    fast_flags.add_arguments(p)
    add_threads(p)


@dataclass
class EngineOptions:
    """What the engine process needs to build its engine (plain data: it is pickled to a spawned process)."""

    args: argparse.Namespace  # the command line, less the parser's own entries
    method: str
    device: str
    dtype: str


def load_engine(o: EngineOptions) -> Loaded:
    """In the engine process: the bundle, the Engine, its warm-up. A mistake the user can fix is a LoadError."""
    args, method = o.args, o.method
    torch.set_num_threads(threads(args))
    shape, dtype = fast_flags.tree_shape(args), getattr(torch, o.dtype)
    try:
        bundle = fast.load(args, METHODS[method].parts, o.device, dtype, draft=args.draft if method == "draft" else None,
                           eagle=args.draft if method == "eagle" else None)
        engine = Engine(bundle, method, k=args.k, max_batch=args.max_running_requests, max_len=args.context_length,
                        cuda_graphs=args.cuda_graphs, compile=fast.setup_compile(args, bundle, o.device),
                        adaptive=args.adaptive_k, topk=shape.topk, simulate=args.simulate_accept_length,
                        num_draft_tokens=shape.num_draft_tokens if shape.topk > 1 else None)
    except (ModelNotFound, ValueError, UsageError) as exc:
        raise LoadError(str(exc)) from None
    fast.compiling(args, engine, lambda: warm_up(engine), len(warm_widths(engine.capacity)))
    model_path = str(bundle.paths.get("target", bundle.name))  # random weights of a named shape: no directory
    return Loaded(engine, bundle.tokenizer, model_path=model_path,
                  name=bundle.name if args.random_weights else args.model)


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
    device, dtype = fast.device_and_dtype(args)
    try:
        sock = bind(args.host, args.port)  # first: a taken port is said before the load (minutes on a GPU)
    except OSError as exc:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    # The model loads in the engine process (this one keeps the tokenizer it sends back): the HTTP event loop and
    # the engine then hold a GIL each (engine_process.py says why).
    plain = argparse.Namespace(**{k: v for k, v in vars(args).items() if not k.startswith("_")})
    try:
        engine = start_engine(load_engine, EngineOptions(plain, method, device, dtype))
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
                                 speculative_algorithm=None if method == "ar" else method,
                                 speculative_num_steps=None if method == "ar" else args.k, host=args.host, port=port,
                                 speculative_eagle_topk=None if method == "ar" else shape.topk,
                                 speculative_num_draft_tokens=None if method == "ar" else shape.num_draft_tokens,
                                 max_running_requests=args.max_running_requests, context_length=facts.max_len,
                                 api_key_set=bool(args.api_key), device=device, dtype=dtype)
        print(f"specdec serve: {facts.name}, {facts.description}, {facts.threads} CPU thread(s)", flush=True)
        # Listen before saying so: a script that connects when it reads the line then waits in the backlog until
        # uvicorn accepts, instead of being refused (uvicorn listens again with its own backlog).
        sock.listen(2048)
        print(f"specdec serve: listening on http://{args.host}:{port}", flush=True)
        status = run(engine, server_args, sock, args.api_key)
    finally:
        engine.stop()  # whatever happened (run() stops it too): the engine process never outlives this one
    # Exit sooner: the interpreter's last garbage collections walk every object torch created (about a second
    # of CPU on a stop); frozen objects are skipped, and nothing of the server needs them collected.
    gc.freeze()
    if status != 0:
        print(f"specdec serve: the engine stopped ({type(engine.error).__name__}: {engine.error}); exiting with "
              "status 1 so that a supervisor restarts the server", file=sys.stderr, flush=True)
        return 1
    print("specdec serve: stopped", file=sys.stderr, flush=True)
    return 0
