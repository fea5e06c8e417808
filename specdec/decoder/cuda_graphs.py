"""CUDA graphs for the fixed-shape steps: capture once per shape, replay with static input buffers.

A decode step launches hundreds of small kernels; at batch 1 the GPU waits on the CPU to launch
them. A graph records the launches once and replays them with one call. Inputs must live in the
same buffers at every replay, so each call copies its arguments into the captured ones first.
Graphs belong to the object whose tensors they captured (the engine, each proposer): a `Graphs`
per owner, so that two owners never replay each other's captures.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from pathlib import Path
from typing import Callable

import torch
from torch.overrides import TorchFunctionMode

from specdec.decoder import compile_cache, gemv
from specdec.decoder.params import DEFAULT_SCOPE, SCOPES
from specdec.decoder.regions import Regions

# What inductor is told when it compiles a step (docs/results.md, the section "Where a batch-1 step's time goes"):
# - tune each reduction's tile sizes by coordinate descent. The one-row matmuls of model.Linear are such
#   reductions; untuned, an 8B step took 6.1 ms instead of 4.8. It costs about a minute per 8B capture.
# - keep SiLU(gate) * up in a buffer of its own. Otherwise inductor folds it into the down projection's
#   reduction, which then recomputes it for every output row: 58 M sigmoids a layer on the 8B shape.
#   A lower threshold of operations for such a broadcast input realizes it (8B step 5.35 -> 4.63 ms).
# - give every intermediate a buffer of its own instead of writing it over a dead input, so that alike layers may
#   compile to the same kernels: the 8B step took 4.49 ms instead of 4.87 in one call (docs/results.md, the
#   section "Stable kernel choices: no in-place buffers", says how much of that two compiles differ anyway).
INDUCTOR_OPTIONS = {"coordinate_descent_tuning": True, "realize_opcount_threshold": 8, "inplace_buffers": False}


def compile_scope(compile: bool | str) -> str | None:
    """Engine(compile=...) -> None (not compiled), "step" or "layers"; True is DEFAULT_SCOPE."""
    if compile is False or compile is None:
        return None
    scope = DEFAULT_SCOPE if compile is True else compile
    if scope not in SCOPES:
        raise ValueError(f"compile must be a bool or one of {', '.join(SCOPES)}, got {compile!r}")
    return scope


def use_cache(directory: Path) -> Path:
    """Point inductor's on-disk caches (FX graphs, Triton kernels, autotuning) at `directory`, created if
    need be (compile_cache.py names it), with the tile sizes pinned for this GPU kind written into it
    (compile_cache.pinned_tuned). Call it before the first compile of the process."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(directory)
    torch._inductor.config.fx_graph_cache = True
    torch._inductor.config.autotune_local_cache = True
    keep_tuned_configs()
    if torch.cuda.is_available():  # the tile sizes pinned for this GPU kind, where some are committed
        compile_cache.install_tuned(directory, compile_cache.pinned_tuned(*gpu_kind()))
    return directory


def gpu_kind() -> tuple[str, str, str]:
    """(GPU, torch, Triton): what a compiled kernel's source depends on besides the model, and so which pinned tile
    sizes fit it (compile_cache.tuned_name); "cpu" and "none" where there is no GPU or no Triton."""
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", torch.__version__, triton_version


def keep_tuned_configs() -> bool:
    """Let a kernel loaded from inductor's cache keep the tile sizes an earlier start tuned for it.

    pytorch/pytorch#172819 (torch 2.11 has it; the CPU venv's 2.13 has it fixed): a kernel with one heuristic
    config, reloaded from the FX graph cache by the static CUDA launcher (`CachingAutotuner.recheck_autotune_cache`),
    never reads the autotune cache, so `run()` tunes it by coordinate descent again at every start: on an 8B server's
    engine about 60 of a warm start's 70 to 80 tuning runs, 4 to 5 s of a 13-s compile (docs/results.md, "Where a
    compiled server's second start goes").
    Wrapped here: after torch's own recheck, a one-config kernel whose cached best was found by coordinate descent
    takes that config (marked, or compiled if it differs), as torch's recheck does for several configs. Where torch
    already did so this changes nothing. Returns whether the wrapper is in place."""
    # imported here, not at the top: 1 s on a CPU, and only a compiled start needs it
    heuristics = importlib.import_module("torch._inductor.runtime.triton_heuristics")
    autotuner = getattr(heuristics, "CachingAutotuner", None)
    recheck = getattr(autotuner, "recheck_autotune_cache", None)
    if recheck is None or not hasattr(heuristics, "check_autotune_cache"):
        return False  # another torch: leave it alone
    if getattr(recheck, "keeps_tuned", False):
        return True

    def rechecked(self, reload_kernel_from_src):
        configs = [r.config for r in self.compile_results]
        recheck(self, reload_kernel_from_src)
        if len(configs) != 1 or not self.inductor_meta.get("coordinate_descent_tuning"):
            return  # several configs: torch's own recheck picked the best
        if getattr(self.compile_results[0].config, "found_by_coordesc", False):
            return  # torch's recheck did it
        cached, _, info = heuristics.check_autotune_cache(configs, self.filename, self.inductor_meta)
        best = cached[0]
        if info.get("autotune_cache_state") != "hit" or not getattr(best, "found_by_coordesc", False):
            return  # never tuned: run() tunes it and saves the result
        hashable = heuristics.triton_config_to_hashable
        if hashable(best) == hashable(configs[0]):
            self.compile_results[0].config.found_by_coordesc = True
        else:  # the tuner moved off the heuristic config: compile the one it found (the kernel's source on demand)
            if self.fn.fn is None:
                self.fn = reload_kernel_from_src().fn
            self.compile_results = [self._precompile_config(best)]

    rechecked.keeps_tuned = True
    autotuner.recheck_autotune_cache = rechecked
    return True


class GraphedStep:
    """fn(*tensors) captured on the current CUDA stream; call it like fn.

    The warm-up runs and the replay use the caller's first arguments, so any side effect (a KV
    cache write) is the same one the call would have made anyway.
    """

    def __init__(self, fn: Callable, example_args: tuple[torch.Tensor, ...], state: tuple[torch.Tensor, ...] = (),
                 pool=None, warmup: int = 2):
        """`state`: tensors fn updates in place, restored after the warm-up runs."""
        self.static_in = tuple(a.clone() for a in example_args)
        saved = [t.clone() for t in state]  # tensors fn updates in place: the warm-up must not count
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():  # warm up: lazy inits, autotuning
            for _ in range(warmup):
                fn(*self.static_in)
        torch.cuda.current_stream().wait_stream(side)
        for t, v in zip(state, saved):
            t.copy_(v)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool), torch.no_grad():
            self.static_out = fn(*self.static_in)

    def __call__(self, *args: torch.Tensor):
        for dst, src in zip(self.static_in, args):
            if dst.data_ptr() != src.data_ptr():
                dst.copy_(src)
        self.graph.replay()
        return self.static_out


# Tensor operations that make the host wait for the device (a value, or a shape read off the data): a CUDA
# graph cannot capture them, so its CPU twin refuses them too
HOST_SYNCS = frozenset({"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "argwhere",
                        "masked_select", "unique", "unique_consecutive", "numpy", "cpu"})


class NoHostSync(TorchFunctionMode):
    """Raises on a host sync inside a captured function (HOST_SYNCS, a boolean-mask index, a one-argument
    `where`, repeat_interleave by a tensor of counts): the CPU twin finds what a CUDA capture would refuse."""

    allowed = 0  # > 0 inside allow_host_sync: a test's own probe, not the step's

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if not NoHostSync.allowed and (name in HOST_SYNCS or (name == "where" and len(args) + len(kwargs) == 1)
                or (name in ("__getitem__", "__setitem__") and _bool_index(args[1]))
                or (name == "repeat_interleave" and len(args) > 1 and isinstance(args[1], torch.Tensor))):
            raise RuntimeError(f"a captured step syncs the host: Tensor.{name} (a CUDA graph cannot capture it)")
        return func(*args, **kwargs)


@contextlib.contextmanager
def allow_host_sync():
    """Lets a test's probe read values inside an emulated capture (a real capture would still refuse it)."""
    NoHostSync.allowed += 1
    try:
        yield
    finally:
        NoHostSync.allowed -= 1


def _bool_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


class EmulatedGraph:
    """The CPU twin of GraphedStep, for tests: the same static-buffer contract (inputs copied into
    fixed tensors, outputs written into the same tensors at every replay), without CUDA; and, as a
    capture does, it refuses a host sync inside fn (NoHostSync)."""

    def __init__(self, fn: Callable, example_args: tuple[torch.Tensor, ...], state: tuple[torch.Tensor, ...] = (),
                 pool=None):
        self.fn = fn
        self.static_in = tuple(a.clone() for a in example_args)
        saved = [t.clone() for t in state]
        with torch.no_grad(), NoHostSync():
            self.static_out = _clone(fn(*self.static_in))
        for t, v in zip(state, saved):
            t.copy_(v)

    def __call__(self, *args: torch.Tensor):
        for dst, src in zip(self.static_in, args):
            if dst.data_ptr() != src.data_ptr():
                dst.copy_(src)
        with torch.no_grad(), NoHostSync():
            _copy_into(self.static_out, self.fn(*self.static_in))
        return self.static_out


def _clone(x):
    if x is None:
        return None
    return tuple(_clone(t) for t in x) if isinstance(x, tuple) else x.clone()


def _copy_into(dst, src) -> None:
    if dst is None:
        return
    if isinstance(dst, tuple):
        for d, s in zip(dst, src):
            _copy_into(d, s)
    else:
        dst.copy_(src)


def graph_mode(mode: str, device: torch.device) -> str | None:
    """auto: CUDA graphs where CUDA runs the model; on: required; off: eager;
    emulate: the CPU twin (tests). Returns "cuda", "emulate" or None."""
    if mode not in ("auto", "on", "off", "emulate"):
        raise ValueError(f"--cuda-graphs must be auto, on or off, not {mode!r}")
    cuda = torch.device(device).type == "cuda"
    if mode == "on" and not cuda:
        raise ValueError("--cuda-graphs on needs a CUDA device; this run is on the CPU")
    if mode == "emulate":
        return "emulate"
    return "cuda" if cuda and mode != "off" else None


_said_eager = False


def say_eager_once(device) -> None:
    """On a CPU the decoder runs eager; say so once per process (and why: a GPU machine may build a model on its CPU,
    as Lab 2's memory-bound demo does)."""
    global _said_eager
    if not _said_eager and torch.device(device).type != "cuda":
        why = "the model is on the CPU" if torch.cuda.is_available() else "no CUDA device"
        print(f"specdec: {why}, so no CUDA graphs: the decoder runs eager", file=sys.stderr)
        _said_eager = True


class Graphs:
    """The captured steps of one owner, by name, KV span and argument shapes (so, per batch size and
    per bucket of context), captured lazily: only the shapes a run meets, all in the owner's pool.

    mode None runs fn eagerly; "cuda" captures a CUDA graph on first use; "emulate" the CPU twin.
    Arguments that are None stay out of the graph (its key records where they were). `span` is the
    number of cache slots fn's attention reads (KVCache.span): a graph bakes it in, so it is part
    of the key, with the number of rows in `state` (a greedy plain step may have no tensor argument).
    Keys: (name, span, rows, argument shapes).

    compile (compile_scope): "step" compiles each capture's fn whole; "layers" runs fn with `regions` active,
    so that its decoder layers and LM heads run compiled (one Regions shared by an engine's Graphs).
    """

    def __init__(self, mode: str | None, pool=None, compile: bool | str = False, regions: Regions | None = None):
        self.mode, self.pool = mode, pool
        self.scope = compile_scope(compile)
        self.compile = self.scope is not None
        self.regions = (regions or Regions()) if self.scope == "layers" else None
        if self.compile:  # the one-row projections' tuned tiles, read while tracing model.Linear
            gemv.load()
        self.captured: dict[tuple, GraphedStep | EmulatedGraph] = {}
        if self.scope == "step":  # a compile per capture; past dynamo's default of 8 per function the rest would run unfused
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)

    def __call__(self, name: str, fn: Callable, *args, state: tuple[torch.Tensor, ...] = (), span: int | None = None,
                 tune: bool = True):
        """tune=False: a capture compiled whole ("step") has inductor's kernels left untuned (INDUCTOR_OPTIONS tunes
        them), for a step that reads several tokens a row (a tree's): its projections are cuBLAS matmuls, and tuning
        the rest cost most of its compile for a step within a few percent (docs/results.md, "What tuning a tree's
        captures cost"; regions.tunes says the same of a region)."""
        if self.mode is None:
            return fn(*args)
        tensors = tuple(a for a in args if a is not None)
        key = (name, span, len(state[0]) if state else None, tuple(None if a is None else tuple(a.shape) for a in args))
        if key not in self.captured:
            def on_tensors(*ts):
                it = iter(ts)
                return fn(*(None if a is None else next(it) for a in args))

            run = on_tensors
            if self.scope == "step":
                run = torch.compile(on_tensors, dynamic=False)
            elif self.scope == "layers":
                run = self.regions.around(on_tensors)
            kind = GraphedStep if self.mode == "cuda" else EmulatedGraph
            # the first calls (the warm-up) compile, whole or by region, so inductor's options apply there;
            # torch._inductor is imported on first use, so runs without compile never pay its second of import
            options = dict(INDUCTOR_OPTIONS, coordinate_descent_tuning=tune)
            with torch._inductor.config.patch(options) if self.compile else contextlib.nullcontext():
                self.captured[key] = kind(run, tensors, state=state, pool=self.pool)
        return self.captured[key](*tensors)
