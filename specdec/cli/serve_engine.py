"""`specdec serve`'s engine side: how the spawned engine process builds its engine (torch). serve.py, in the HTTP
process, names load_engine to it (proxy.EntryPoint) and never imports this module."""

from __future__ import annotations

import argparse

import torch

from specdec.cli import fast, fast_flags
from specdec.cli.common import UsageError, threads
from specdec.decoder.engine import Engine
from specdec.decoder.methods import METHODS, method_named
from specdec.serving.server.engine_process import LoadError, Loaded, warm_up, warm_widths
from specdec.zoo import ModelNotFound


def load_engine(args: argparse.Namespace) -> Loaded:
    """In the engine process: the device and dtype, the bundle, the Engine, its warm-up. A mistake the user can fix
    (a missing model, --device cuda without one) is a LoadError: the CLI says it in one line, status 2."""
    method = method_named(args.speculative_algorithm).name
    torch.set_num_threads(threads(args))
    shape = fast_flags.tree_shape(args)
    try:
        device, dtype = fast.device_and_dtype(args)
        bundle = fast.load(args, METHODS[method].parts, device, getattr(torch, dtype),
                           draft=args.draft if method == "draft" else None,
                           eagle=args.draft if method == "eagle" else None)
        engine = Engine(bundle, method, k=args.k, max_batch=args.max_running_requests, max_len=args.context_length,
                        cuda_graphs=args.cuda_graphs, compile=fast.setup_compile(args, bundle, device),
                        adaptive=args.adaptive_k, topk=shape.topk, simulate=args.simulate_accept_length,
                        num_draft_tokens=shape.num_draft_tokens if shape.topk > 1 else None)
    except (ModelNotFound, ValueError, UsageError) as exc:
        raise LoadError(str(exc)) from None
    fast.compiling(args, engine, lambda: warm_up(engine), len(warm_widths(engine.capacity)))
    model_path = str(bundle.paths.get("target", bundle.name))  # random weights of a named shape: no directory
    return Loaded(engine, bundle.tokenizer, model_path=model_path,
                  name=bundle.name if args.random_weights else args.model, device=device, dtype=dtype)
