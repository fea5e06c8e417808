"""`specdec launch`: start an SGLang server (or `specdec serve`) with a checked speculative configuration,
wait until it can generate, print its URL, and stop it on Ctrl-C, SIGTERM or SIGHUP (also when started
in the background of a script, where SIGINT comes ignored).

    specdec launch --model tiny --speculative-algorithm EAGLE --num-steps 3 --topk 1 --num-draft-tokens 4
    specdec launch --model DIR --speculative-algorithm NEXTN --backend sglang --dry-run
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time

from specdec.cli.common import UsageError
from specdec.serving.ops.gpu import fa3_present
from specdec.serving.ops.launch import ALGORITHMS, ALIASES, BACKENDS, LaunchConfig, LaunchConfigError, detect_backend
from specdec.serving.ops.lifecycle import ServerError, StopSignal, launch, stop_on_signals
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
    p.add_argument("--max-total-tokens", type=int, default=None,
                   help="SGLang's KV pool in tokens (default, without --mem-fraction-static: running requests x context)")
    p.add_argument("--context-length", type=int, default=None, help="longest request, prompt + output (default: the model's)")
    p.add_argument("--no-metrics", action="store_true", help="leave out --enable-metrics")
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--load-format", default=None, help="dummy: random weights from config.json (target and draft)")
    p.add_argument("--ngram-max-depth", type=int, default=None)
    p.add_argument("--rejection-sampling", action="store_true")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="add to the server's environment (e.g. SGLANG_SIMULATE_ACC_LEN=2.5); repeat")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for /health_generate")
    p.add_argument("--log", default=None, help="server log file (default: in ~/.cache/specdec/servers)")
    p.add_argument("--dry-run", action="store_true", help="print the command line (and how memory is sized) and exit")


def config_from_args(args) -> LaunchConfig:
    """The checked configuration; zoo names become the directories each backend needs."""
    cfg = dict(model=args.model, algorithm=args.algorithm, draft=args.draft, num_steps=args.num_steps, topk=args.topk,
               num_draft_tokens=args.num_draft_tokens, backend=args.backend, host=args.host, port=args.port,
               api_key=args.api_key, max_running_requests=args.max_running_requests, tp=args.tp, dp=args.dp,
               nnodes=args.nnodes, node_rank=args.node_rank, dist_init_addr=args.dist_init_addr,
               attention_backend=args.attention_backend, cuda_graph_max_bs=args.cuda_graph_max_bs,
               disable_cuda_graph=args.disable_cuda_graph, mem_fraction_static=args.mem_fraction_static,
               max_total_tokens=args.max_total_tokens, context_length=args.context_length,
               enable_metrics=not args.no_metrics, disable_radix_cache=args.disable_radix_cache,
               load_format=args.load_format, ngram_max_depth=args.ngram_max_depth,
               rejection_sampling=args.rejection_sampling)
    backend = detect_backend() if args.backend == "auto" else args.backend
    algorithm = ALIASES.get(args.algorithm.lower(), args.algorithm.upper())
    if backend == "sglang" and args.attention_backend is None and fa3_present() is False:
        cfg["attention_backend"] = "triton"  # SGLang would pick FA3 on Hopper, and the offline pack strips it
    try:
        cfg.update(zoo_dirs(args.model, args.draft, algorithm, backend))
        return LaunchConfig(**{**cfg, "backend": backend})
    except (LaunchConfigError, ModelNotFound) as exc:
        raise UsageError(str(exc)) from None


def zoo_dirs(model: str, draft: str | None, algorithm: str, backend: str = "sglang") -> dict:
    """A zoo name becomes its parts' directories: the draft (or EAGLE head) the algorithm takes, for either
    backend, and the target's for SGLang (`specdec serve` takes the zoo name itself, tokenizer and all)."""
    parts = resolve(model)
    out = {"model": str(parts["target"]) if isinstance(parts, dict) and backend == "sglang" else model}
    part = DRAFT_PART.get(algorithm, "target")
    if draft:
        d = resolve(draft)
        out["draft"] = str(d.get(part, d["target"])) if isinstance(d, dict) else draft
    elif isinstance(parts, dict) and algorithm in DRAFT_PART:
        out["draft"] = str(parts[part])
    return out


def parse_env(items: list[str]) -> dict[str, str]:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--env takes KEY=VALUE, got {item!r}")
        env[key] = value
    return env


def why(stop: KeyboardInterrupt) -> str:
    return stop.args[0] if isinstance(stop, StopSignal) else "interrupted"


def main(args) -> int:
    env = parse_env(args.env)
    cfg = config_from_args(args)
    try:
        argv = cfg.command(args.sglang_version)
    except LaunchConfigError as exc:
        raise UsageError(str(exc)) from None
    notes = []
    if cfg.resolved_backend() == "sglang":
        pool = cfg.kv_pool_default()
        notes += [pool.describe()] if pool else []
        notes.append("in the server's environment: " + " ".join(f"{k}={v}" for k, v in cfg.environment().items())
                     + " (its decode steps' times in /server_info, which Lab 3's step costs read)")
        if cfg.attention_backend == "triton" and args.attention_backend is None:
            notes.append("sgl_kernel has no FA3 library here: --attention-backend triton")
    if args.dry_run:
        print("".join(f"# {n}\n" for n in notes) + shlex.join(argv))
        return 0
    for note in notes:
        print(f"specdec launch: {note}", flush=True)
    with stop_on_signals():  # from here on SIGTERM, SIGINT and SIGHUP stop the server, whatever was inherited
        try:
            # a progress bar on a terminal only: in a script's log it would glue itself to the serving line
            server = launch(cfg, timeout=args.timeout, env=env, log_path=args.log, version=args.sglang_version,
                            progress=sys.stderr.isatty())
        except ServerError as exc:
            print(f"specdec launch: {exc}", flush=True)
            return 1
        except KeyboardInterrupt as stop:  # launch() stopped the server before passing it on
            print(f"specdec launch: {why(stop)} while the server was starting; stopped", flush=True)
            return 0
        with server:  # stopped on any way out
            print(f"serving {cfg.algorithm} at {server.url} (pid {server.pid}, log {server.log_path}); "
                  "Ctrl-C, SIGTERM or SIGHUP stops it", flush=True)
            try:
                while server.alive():
                    time.sleep(0.5)
            except KeyboardInterrupt as stop:
                print(f"specdec launch: {why(stop)}, stopping the server (pid {server.pid})", flush=True)
                server.stop()
                if not server.stopped:
                    print(f"specdec launch: could not stop every process of the server's session {server.pid}", flush=True)
                    return 1
                print("specdec launch: stopped", flush=True)
                return 0
            print(f"specdec launch: the server exited with status {server.process.returncode}\n{server.log_tail()}")
            return 1
