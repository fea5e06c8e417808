"""What `specdec decode` and `specdec serve` share to run the fast model: the inference layout (q/k/v and
gate/up fused) by default, the step compiled by torch.compile where a persistent cache makes it cheap
(on a GPU: the first start compiles for a minute or two, later starts read the cache), and random weights
in a model's shape to measure it without its checkpoint. Their flags are fast_flags.py's (no torch)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from specdec.cli.common import UsageError
from specdec.cli.fast_flags import tree_shape
from specdec.decoder import compile_cache
from specdec.decoder.bundle import fuse_bundle
from specdec.decoder.cuda_graphs import use_cache
from specdec.zoo import load_bundle
from specdec.zoo.dummy import random_bundle


def device_and_dtype(args: argparse.Namespace) -> tuple[str, str]:
    """--device (default: cuda if a CUDA device is visible, else cpu) and --dtype's name (default: bfloat16 on CUDA,
    float32 on the CPU)."""
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError("--device cuda but no CUDA device is visible; use --device cpu")
    return device, args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")


def load(args: argparse.Namespace, parts: tuple[str, ...], device: str, dtype: torch.dtype,
         draft: str | None = None, eagle: str | None = None):
    """The bundle a verb decodes with: args.model loaded onto the device (or random weights in a shape),
    fused unless --no-fuse."""
    shape = args.random_weights or (args.model if args.load_format == "dummy" else None)
    if shape is None:
        return load_bundle(args.model, parts, device=device, dtype=dtype, draft=draft, eagle=eagle,
                           fuse=not args.no_fuse)
    b = random_bundle(shape, parts, device, dtype)
    return b if args.no_fuse else fuse_bundle(b)


def cache_dir(args: argparse.Namespace) -> Path | None:
    """The compile cache's root folder, or None for --compile-cache none."""
    if args.compile_cache is not None and args.compile_cache.lower() == "none":
        return None
    return Path(args.compile_cache) if args.compile_cache else compile_cache.cache_root()


def compile_choice(mode: str, device_type: str, cuda_graphs: str, cached: bool) -> bool:
    """--compile: auto compiles only on CUDA, under CUDA graphs, where the compile cache already holds this
    model's kernels (`cached`: an earlier `--compile on` start wrote them). A first compile costs minutes (on an
    H200, 2026-11-27: 82 s for an 8B-shaped `specdec decode`, 223 s for a zoo server capturing every batch
    width) and a start from the cache still 27 to 30 s, so a plain start does not pay it unasked (issue 21's
    log: benchmarks/logs/gpu_fast_path_sglang.log). on needs CUDA graphs: the compiled step is replayed in them."""
    graphs = device_type == "cuda" and cuda_graphs != "off"
    if mode == "on" and not graphs:
        where = "CUDA graphs (--cuda-graphs off was given)" if device_type == "cuda" else "a CUDA device"
        raise UsageError(f"--compile on needs {where}: the compiled step runs inside a CUDA graph; "
                         f"this run is on {'the CPU' if device_type != 'cuda' else 'CUDA without graphs'}")
    return mode == "on" or (mode == "auto" and graphs and cached)


def drafter_key(args: argparse.Namespace) -> str:
    """What a whole-step compile compiles beside the target's steps: a tree's drafter (Engine compiles its
    captures under "step"), named by method and shape; "" for a chain or the layers scope."""
    tree = tree_shape(args)
    if tree.topk <= 1 or args.compile_scope != "step":
        return ""
    method = getattr(args, "method", None) or getattr(args, "speculative_algorithm", "")
    return f"{method}-tree{tree.num_steps}x{tree.topk}x{tree.num_draft_tokens}"


def engine_rows(args: argparse.Namespace) -> int | None:
    """The running rows the engine is built with: `serve`'s --max-running-requests, `decode`'s --batch."""
    return getattr(args, "max_running_requests", None) or getattr(args, "batch", None)


def setup_compile(args: argparse.Namespace, bundle, device: str) -> str | bool:
    """Decide --compile for this run: its --compile-scope ("step" or "layers", what Engine(compile=) takes), or False.
    When compiling with a cache, point torch's caches at this model's (and scope's) folder."""
    root, folder = cache_dir(args), None
    if root is not None and torch.device(device).type == "cuda":
        b = bundle.target
        shape = {f: getattr(b.config, f) for f in compile_cache.SHAPE_FIELDS}
        gpu = torch.cuda.get_device_name(torch.device(device))
        folder = root / compile_cache.cache_key(shape, str(next(b.parameters()).dtype).removeprefix("torch."), gpu,
                                                torch.__version__, args.compile_scope, drafter_key(args),
                                                engine_rows(args))
    warm = folder is not None and folder.is_dir() and any(folder.iterdir())
    on = compile_choice(args.compile, torch.device(device).type, args.cuda_graphs, warm)
    if on and folder is not None:
        args.compile_dir = use_cache(folder)
    return args.compile_scope if on else False


def compiling(args: argparse.Namespace, engine, warm, widths: int = 1) -> None:
    """Run `warm()` (the captures of `widths` batch widths), saying first that it compiles, and how long it took."""
    if not engine.graphs.compile:
        warm()
        return
    where = getattr(args, "compile_dir", None)
    # first starts measured on an H200 for an 8B shape: 72 s whole, 19 s by layers (benchmarks/logs/gpu_fast_path.log)
    # a tree's drafter, compiled whole too: 244 and 277 s for one batch width while every capture was tuned
    # (benchmarks/logs/gpu_tree_sweep_compiled.log); its several-token captures untuned, a zoo tree server's 7 widths
    # took 226 s (benchmarks/logs/gpu_tree_sweep_step.log); an 8B server's 5 widths whole: not done in 470 s on an H100
    # (benchmarks/logs/gpu_serve_8b_scopes.log), by layers 39 to 83 s on H200s (benchmarks/logs/gpu_compile_start.log)
    whole = engine.graphs.scope == "step"
    what, first = (("decoder layers and LM head", "~20-90 s") if not whole
                   else ("decode step", "up to ~1-2 min a batch width") if getattr(engine, "tree", None) is None
                   else ("decode step and the tree's drafter", "~0.5-1 min a batch width"))
    if whole and widths > 1:
        first += f", {widths} widths here: --compile-scope layers compiles once for all"
    print(f"specdec: compiling the {what} (first start on this GPU: {first}; later starts read the cache"
          + (f" in {where})" if where else "; no cache: --compile-cache none)"), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    warm()
    print(f"specdec: compiled in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
