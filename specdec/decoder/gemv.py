"""One-row matmuls (batch-1 decoding) in Triton, split along the reduction: y = x W^T for x [.., K] of one row.

A batch-1 step is the weights streamed once through the GPU: its time is their bytes over the memory bandwidth, if
every projection keeps the memory busy. Compiled, `model.Linear` at one row is an inductor reduction whose tile sizes
each compile tunes for itself by timing candidates, so one weight shape gets different kernels from one compile to
the next (the 8B down projection ran 28.9 to 31.2 us a call in one compiled step, 35.1 in another). Here each program
takes `rows` outputs over one of `splits` slices of K, with a tile per weight shape measured once per GPU: the same
kernel in every layer and every compile. It writes its partial dot products [splits, N] in fp32 and the caller sums
them (compiled, inductor folds that sum into the kernel that reads y next: the residual add, the next norm); with one
split it writes y itself. In the compiled 8B step on an H200 the projections took about what inductor's did and the
step ran 64 fewer kernels (docs/results.md, "One-row projections in Triton"). Where its tile says so (`gated`), the
MLP's down projection reads [gate | up] and computes silu(gate) * up as it loads: the pointwise kernel before it goes
too, but every program computes silu over its slice of K again (N / rows programs share a slice). On an H200 the 1B's
default path was measured with it, and the 8B's ran 3.8% slower with it than without (4.41 against 4.25 ms a token,
interleaved in one call, `benchmarks/logs/gpu_fast_path_sglang.log`): only the 1B's tile takes it.

Which weight shapes take the kernel, and with which tile, is measured per GPU (`benchmarks/gpu_gemv.py`: every
candidate against inductor's reduction, on weights too many for the L2 cache) and committed in `tuned/gemv.json`; a
shape not there keeps inductor's reduction, as does every GPU not there and the CPU.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU install has no Triton: model.Linear's reduction runs instead
    triton = None

TUNED = Path(__file__).with_name("tuned") / "gemv.json"


@dataclass(frozen=True)
class Tile:
    """How one weight shape is cut: `rows` outputs a program, `splits` slices of K, `chunk` columns a load."""
    rows: int
    chunk: int
    splits: int
    warps: int = 4
    stages: int = 1
    gated: bool = False  # an MLP's down projection: take [gate | up] and compute silu(gate) * up as it loads

    def fits(self, N: int, K: int) -> bool:
        """Whether it cuts an N x K weight evenly (the kernel has no masks)."""
        return N % self.rows == 0 and K % (self.splits * self.chunk) == 0


# the tiles of this process's GPU, {(N, K): Tile}: `load` fills it before a compile (cuda_graphs.Graphs), so that
# tracing model.Linear reads a plain dict (no file, no device query inside torch.compile); empty: no kernel
TILES: dict[tuple[int, int], Tile] = {}


def tuned(gpu: str) -> dict[tuple[int, int], Tile]:
    """The committed tiles for a GPU by name ({(N, K): Tile}); none for a GPU not measured."""
    if not TUNED.exists():
        return {}
    shapes = json.loads(TUNED.read_text()).get(gpu, {})
    return {tuple(int(n) for n in key.split("x")): Tile(**tile) for key, tile in shapes.items()}


def load() -> dict[tuple[int, int], Tile]:
    """Fill TILES with this GPU's committed tiles (none without a GPU or Triton, or with SPECDEC_GEMV=off)."""
    TILES.clear()
    if triton is not None and torch.cuda.is_available() and os.environ.get("SPECDEC_GEMV", "on") != "off":
        TILES.update(tuned(torch.cuda.get_device_name()))
    return TILES


def runs_on(x: torch.Tensor) -> bool:
    """Whether the kernel can take this input: one row on a GPU, with Triton."""
    return triton is not None and x.is_cuda and x.numel() == x.shape[-1]


def tile_for(x: torch.Tensor, w: torch.Tensor) -> Tile | None:
    """The tile this one-row product runs with, or None: inductor's reduction computes it."""
    tile = TILES.get(tuple(w.shape)) if runs_on(x) and w.is_contiguous() else None
    return tile if tile is not None and tile.fits(*w.shape) else None


def partials(x: torch.Tensor, w: torch.Tensor, tile: Tile, gated: bool = False) -> torch.Tensor:
    """Partial dot products of one row: x [.., K] (one row), w [N, K] -> [splits, N] summing to x W^T: fp32, or
    for one split the product itself in x's dtype (nothing left to sum: no kernel after it). gated: x is the MLP's
    [gate | up] [.., 2K] and the input is silu(gate) * up, computed as the kernel loads it (no kernel before it)."""
    N, K = w.shape
    out = torch.empty(tile.splits, N, device=x.device, dtype=torch.float32 if tile.splits > 1 else x.dtype)
    _gemv[(N // tile.rows, tile.splits)](x.contiguous(), w, out, N, K, K // tile.splits, ROWS=tile.rows,
                                         CHUNK=tile.chunk, GATED=gated, num_warps=tile.warps, num_stages=tile.stages)
    return out


def reference_partials(x: torch.Tensor, w: torch.Tensor, tile: Tile, gated: bool = False) -> torch.Tensor:
    """What `partials` computes, written out in torch (its CPU twin): [splits, N], fp32 or (one split) x's dtype."""
    N, K = w.shape
    if gated:  # silu(gate) * up in fp32, rounded once to x's dtype (as inductor computes the pointwise product)
        gate, up = x.reshape(2, K).float()
        x = (F.silu(gate) * up).to(x.dtype)
    xs = x.reshape(tile.splits, K // tile.splits).float()  # [splits, K/splits]
    out = (w.float().view(N, tile.splits, K // tile.splits) * xs).sum(-1).T  # [splits, N]
    return out if tile.splits > 1 else out.to(x.dtype)


def record(gpu: str, shapes: dict[tuple[int, int], Tile], path: Path = TUNED) -> None:
    """Write the tiles measured best on a GPU into the tuned file (the sweep's last step): a shape measured again
    replaces its tile; other shapes and other GPUs' stay."""
    table = json.loads(path.read_text()) if path.exists() else {}
    table[gpu] = {**table.get(gpu, {}), **{f"{n}x{k}": asdict(t) for (n, k), t in shapes.items()}}
    path.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")


if triton is not None:

    @triton.jit
    def _gemv(X, W, Out, N, K, K_SPLIT, ROWS: tl.constexpr, CHUNK: tl.constexpr, GATED: tl.constexpr):
        """Program (i, j): outputs i*ROWS.. over the j-th slice of K; the tile fits the weight (no masks). GATED: X is
        [gate | up] (2K) and the input silu(gate) * up, rounded to X's dtype as the unfused product would be."""
        rn = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        start = tl.program_id(1) * K_SPLIT
        acc = tl.zeros((ROWS, CHUNK), dtype=tl.float32)  # elementwise products, summed once at the end
        for k0 in range(start, start + K_SPLIT, CHUNK):
            rk = k0 + tl.arange(0, CHUNK)
            x = tl.load(X + rk).to(tl.float32)
            if GATED:
                up = tl.load(X + K + rk).to(tl.float32)
                x = (x * tl.sigmoid(x) * up).to(X.dtype.element_ty).to(tl.float32)
            w = tl.load(W + rn[:, None] * K + rk[None, :], eviction_policy="evict_first")  # read once: keep L2 for x
            acc += w.to(tl.float32) * x[None, :]
        tl.store(Out + tl.program_id(1) * N + rn, tl.sum(acc, 1).to(Out.dtype.element_ty))
