"""`specdec launch`: start an SGLang server (or `specdec serve`) with a checked speculative configuration,
wait until it can generate, print its URL, and stop it on Ctrl-C.

    specdec launch --model tiny --speculative-algorithm EAGLE --num-steps 3 --topk 1 --num-draft-tokens 4
    specdec launch --model DIR --speculative-algorithm NEXTN --backend sglang --dry-run
"""

from __future__ import annotations

import argparse
import shlex
import time

from specdec.cli.common import UsageError
from specdec.serving.launch import ALGORITHMS, ALIASES, BACKENDS, LaunchConfig, LaunchConfigError, detect_backend
from specdec.serving.lifecycle import ServerError, launch
from specdec.zoo import ModelNotFound, resolve

DRAFT_PART = {"EAGLE": "eagle", "EAGLE3": "eagle", "STANDALONE": "draft"}  # the zoo part each draft-taking algorithm uses


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny", help="zoo name, model directory or hub id")
    p.add_argument("--speculative-algorithm", "--algorithm", dest="algorithm", default="none",
                   help=f"{', '.join(ALGORITHMS)} (or mtp, eagle, draft, ngram, heads)")
    p.add_argument("--draft", "--speculative-draft-model-path", dest="draft", default=None,
                   help="draft directory (EAGLE, EAGLE3, STANDALONE); with a zoo model, the zoo's part by default")
    p.add_argument("--num-steps", "--speculative-num-steps", dest="num_steps", type=int, default=None)
    p.add_argument("--topk", "--speculative-eagle-topk", dest="topk", type=int, default=None)
    p.add_argument("--num-draft-tokens", "--speculative-num-draft-tokens", dest="num_draft_tokens", type=int, default=None)
    p.add_argument("--backend", choices=BACKENDS, default="auto", help="auto: SGLang where it and a GPU are present")
    p.add_argument("--sglang-version", default=None, help="spell flags for this SGLang version (default: the installed one)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=None, help="default: a free port")
    p.add_argument("--api-key", default=None)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--dist-init-addr", default=None)
    p.add_argument("--attention-backend", default=None)
    p.add_argument("--cuda-graph-max-bs", type=int, default=None)
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--no-metrics", action="store_true", help="leave out --enable-metrics")
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--load-format", default=None, help="dummy: random weights from config.json (target and draft)")
    p.add_argument("--ngram-max-depth", type=int, default=None)
    p.add_argument("--rejection-sampling", action="store_true")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="add to the server's environment (e.g. SGLANG_SIMULATE_ACC_LEN=2.5); repeat")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for /health_generate")
    p.add_argument("--log", default=None, help="server log file (default: in ~/.cache/specdec/servers)")
    p.add_argument("--dry-run", action="store_true", help="print the command line and exit")


def config_from_args(args) -> LaunchConfig:
    """The checked configuration; zoo names become directories for SGLang (specdec serve takes them as they are)."""
    cfg = dict(model=args.model, algorithm=args.algorithm, draft=args.draft, num_steps=args.num_steps, topk=args.topk,
               num_draft_tokens=args.num_draft_tokens, backend=args.backend, host=args.host, port=args.port,
               api_key=args.api_key, max_running_requests=args.max_running_requests, tp=args.tp, dp=args.dp,
               nnodes=args.nnodes, node_rank=args.node_rank, dist_init_addr=args.dist_init_addr,
               attention_backend=args.attention_backend, cuda_graph_max_bs=args.cuda_graph_max_bs,
               disable_cuda_graph=args.disable_cuda_graph, mem_fraction_static=args.mem_fraction_static,
               enable_metrics=not args.no_metrics, disable_radix_cache=args.disable_radix_cache,
               load_format=args.load_format, ngram_max_depth=args.ngram_max_depth,
               rejection_sampling=args.rejection_sampling)
    backend = detect_backend() if args.backend == "auto" else args.backend
    algorithm = ALIASES.get(args.algorithm.lower(), args.algorithm.upper())
    try:
        if backend == "sglang":
            cfg.update(zoo_dirs(args.model, args.draft, algorithm))
        elif algorithm in DRAFT_PART and not args.draft:
            cfg["draft"] = args.model  # specdec serve takes the draft part from --model itself
        return LaunchConfig(**{**cfg, "backend": backend})
    except (LaunchConfigError, ModelNotFound) as exc:
        raise UsageError(str(exc)) from None


def zoo_dirs(model: str, draft: str | None, algorithm: str) -> dict:
    """SGLang needs directories: a zoo name becomes its target's (and the algorithm's draft part's)."""
    parts = resolve(model)
    out = {"model": str(parts["target"]) if isinstance(parts, dict) else model}
    if draft:
        d = resolve(draft)
        out["draft"] = str(d.get(DRAFT_PART.get(algorithm, "target"), d["target"])) if isinstance(d, dict) else draft
    elif isinstance(parts, dict) and algorithm in DRAFT_PART:
        out["draft"] = str(parts[DRAFT_PART[algorithm]])
    return out


def main(args) -> int:
    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--env takes KEY=VALUE, got {item!r}")
        env[key] = value
    cfg = config_from_args(args)
    if args.dry_run:
        try:
            print(shlex.join(cfg.command(args.sglang_version)))
        except LaunchConfigError as exc:
            raise UsageError(str(exc)) from None
        return 0
    try:
        server = launch(cfg, timeout=args.timeout, env=env, log_path=args.log, version=args.sglang_version)
    except LaunchConfigError as exc:
        raise UsageError(str(exc)) from None
    except ServerError as exc:
        print(f"specdec launch: {exc}")
        return 1
    with server:
        print(f"serving {cfg.algorithm} at {server.url} (pid {server.pid}, log {server.log_path}); Ctrl-C stops it", flush=True)
        try:
            while server.alive():
                time.sleep(0.5)
        except KeyboardInterrupt:
            print("stopping", flush=True)
            return 0
        print(f"specdec launch: the server exited with status {server.process.returncode}\n{server.log_tail()}")
        return 1
