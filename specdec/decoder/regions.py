"""Regional compilation: a decoder layer compiled once, the same compiled code run by every layer.

torch.compile of a whole decode step traces all N layers inlined, once per captured shape (each batch width
and KV bucket): minutes of warm-up on an 8B model (issue 21). Here the repeated parts are the compile
regions instead: a method marked `@region` (model.Block.forward, the LM head) runs, while a `Regions` is
active, through one torch.compile of that method, shared by every module that has it. Dynamo keeps what
it traced with the method's code, and lifts a module's parameters to inputs of the traced graph (the
default `inline_inbuilt_nn_modules`), so layer 7 runs what layer 0 traced: one trace per shape, not N.
The code between regions (embedding, rotary, mask, sampling) runs eager, captured in our CUDA graph
with the regions' kernels. Outside an active `Regions` a region is the method as written (the eager
prefill, training, a whole-step compile that traces through it).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import torch

_active: "Regions | None" = None  # the Regions whose compiled methods the regions run now


def region(method: Callable) -> Callable:
    """Marks a method as a compile region: compiled (Regions) while a Regions is active, else as written."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        if _active is None or torch.compiler.is_compiling():  # eager, or already inside a trace: as written
            return method(self, *args, **kwargs)
        # a trace compiled here tunes its kernels only where it reads one token (see tunes); torch._inductor is
        # imported on first use, here where something compiles
        with torch._inductor.config.patch(coordinate_descent_tuning=tunes(args[0])):
            return _active.compiled(method)(self, *args, **kwargs)

    return run


def tunes(x: torch.Tensor) -> bool:
    """Whether a region's trace for input x [B, T, H] has inductor tune its kernels by coordinate descent: only for
    one token (B x T = 1). There model.Linear's projections are reductions inductor writes, and tuning them is
    most of the compiled step's gain (docs/results.md, "Where a batch-1 step's time goes"). At more tokens they
    are cuBLAS matmuls, and the tuning, which every start repeats even from a warm compile cache, bought nothing
    measurable (an 8B step at 16 rows, 6.36 ms tuned, 6.39-6.41 not) for about 8 s of each 8B server start
    (docs/results.md, "Where a compiled server's second start goes")."""
    return x.shape[:-1].numel() == 1


class Regions:
    """One torch.compile per region method (made on first use, shared by every module and shape that reaches
    it), and `active()`, the context in which the regions run compiled. Each new shape is one more trace of
    a region, kept beside the others (dynamo's recompile limit is raised to hold them)."""

    def __init__(self) -> None:
        self.fns: dict[Callable, Callable] = {}
        # a trace per shape of each region: widths x KV buckets x block lengths x modules (a server of 64 rows:
        # a few hundred of Block.forward); past dynamo's default of 8 per function the rest would run uncompiled
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 1024)
        torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit,
                                                               4096)

    def compiled(self, method: Callable) -> Callable:
        if method not in self.fns:
            self.fns[method] = torch.compile(method, dynamic=False)
        return self.fns[method]

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        global _active
        outer, _active = _active, self
        try:
            yield
        finally:
            _active = outer

    def around(self, fn: Callable) -> Callable:
        """fn with its regions compiled: what a captured step runs (the capture, and each emulated replay)."""

        @functools.wraps(fn)
        def run(*args):
            with self.active():
                return fn(*args)

        return run
