"""A preallocated KV cache with per-row lengths, provisional writes, commit and rollback.

Slot s of a row holds the key/value of the token at absolute position s. A verify step writes
its k+1 positions *provisionally* past the committed length; `commit` moves a row's length over
the accepted prefix and whatever lies beyond is simply ignored (rollback moves lengths back).
Nothing is ever copied: attention masks by position, and stale slots are overwritten later,
because every forward writes from its row's committed length upwards.

Attention reads a prefix [0, span) of the slots. The engine knows every row's length on the host
(no device sync), so it makes each step's cache view with its `span`, under CUDA graphs rounded up
to a power-of-two bucket (one capture per bucket): a step costs what its context costs, not what
the cache holds. A view without a span (the eager prefill) reads just enough slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LayerCache:
    """One layer's part of a cache view: what a decoder layer reads and writes, and nothing else (no layer
    index: a compiled layer then serves every layer, model.Block). Shapes as KVCache's."""

    k: torch.Tensor  # [B, nkv, S, D] this layer's keys
    v: torch.Tensor  # [B, nkv, S, D] its values
    slots: torch.Tensor | None = None  # a tree view's write slots [B, T] (KVCache.tree); None: the positions

    def write(self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> None:
        """Store k, v [B, nkv, T, D] at absolute positions [B, T] (a provisional write)."""
        if self.slots is not None:  # a tree view: siblings share a position, each has a slot of its own
            positions = self.slots
        B, T = positions.shape
        rows = torch.arange(B, device=positions.device).view(B, 1).expand(B, T)
        # Advanced indices around a slice put [B, T] first: the value must be [B, T, nkv, D].
        self.k[rows, :, positions] = k.transpose(1, 2)
        self.v[rows, :, positions] = v.transpose(1, 2)

    def read(self, n_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values of the first n_slots slots, [B, nkv, n_slots, D] each (views, no copy)."""
        return self.k[:, :, :n_slots], self.v[:, :, :n_slots]


class KVCache:
    def __init__(self, num_layers: int, batch: int, num_kv_heads: int, head_dim: int,
                 max_len: int, device="cpu", dtype=torch.float32) -> None:
        shape = (batch, num_kv_heads, max_len, head_dim)  # [B, nkv, S, D]
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)  # committed tokens per row
        self.max_len = max_len
        self.batch = batch
        # Slots [0, span) hold every key a step may read: chosen on the host per step (no sync), and
        # fixed for a CUDA graph (shapes frozen at capture). None: just enough, read off the positions.
        self.span: int | None = None
        # A tree view's (KVCache.tree): the slots its tokens are written at [B, T] and the slots each sees
        # [B, T, span]; None: a token is written at its position and sees the slots up to it.
        self.slots: torch.Tensor | None = None
        self.visible: torch.Tensor | None = None

    @classmethod
    def for_model(cls, model, batch: int, max_len: int) -> "KVCache":
        cfg = model.config
        p = next(model.parameters())
        n_layers = getattr(model, "num_cache_layers", cfg.num_hidden_layers)
        return cls(n_layers, batch, cfg.num_key_value_heads, cfg.head_dim, max_len, p.device, p.dtype)

    def rows(self, start: int, stop: int, span: int | None = None) -> "KVCache":
        """Rows start..stop-1 as a cache of their own that shares this one's memory (a view), whose
        attention reads the step's `span` of slots (None: just enough)."""
        view = object.__new__(KVCache)
        view.k = [t[start:stop] for t in self.k]
        view.v = [t[start:stop] for t in self.v]
        view.lengths = self.lengths[start:stop]
        view.max_len, view.batch, view.span = self.max_len, stop - start, span
        view.slots = view.visible = None
        return view

    def tree(self, slots: torch.Tensor, visible: torch.Tensor) -> "KVCache":
        """A view for a tree's tokens: written at slots [B, T] (not at their positions, which siblings share),
        each seeing the slots visible [B, T, S] says (tree.tree_mask); attention reads S slots."""
        view = self.rows(0, self.batch, visible.shape[-1])
        view.slots, view.visible = slots, visible
        return view

    def copy_rows(self, src: torch.Tensor, dst: torch.Tensor, slots: int) -> None:
        """Rows src [n] into rows dst [n]: their first `slots` keys and values in every layer, and their lengths
        (a prefill staged in spare rows, moved to the rows it was for; the indices are tensors, so a graph of it
        serves any rows)."""
        for t in self.k + self.v:
            t[dst, :, :slots] = t[src, :, :slots]
        self.lengths[dst] = self.lengths[src]

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy each row's keys and values at slots src [B, T] to slots dst [B, T] in every layer: a tree's
        accepted path into the contiguous slots after the committed prefix (the rest is left behind)."""
        B, T = src.shape
        rows = torch.arange(B, device=src.device).view(B, 1).expand(B, T)
        for t in self.k + self.v:
            t[rows, :, dst] = t[rows, :, src]  # the right side is a copy: overlapping slots are safe

    def layer(self, i: int) -> LayerCache:
        """Layer i's keys and values (and a tree view's slots): what its attention reads and writes."""
        return LayerCache(self.k[i], self.v[i], self.slots)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> None:
        """Store k, v [B, nkv, T, D] of layer `layer` at absolute positions [B, T] (a provisional write)."""
        self.layer(layer).write(k, v, positions)

    def slots_read(self, positions: torch.Tensor) -> int:
        """How many slots attention reads: the span when the host set one, else just enough (read
        from positions [B, T]: a device sync)."""
        if self.span is not None:
            return self.span
        return min(self.max_len, int(positions.max()) + 1)

    def positions(self, width: int) -> torch.Tensor:
        """Positions of the next `width` tokens of every row: [B, width]."""
        return self.lengths.unsqueeze(1) + torch.arange(width, device=self.lengths.device)

    def commit(self, n_tokens: torch.Tensor | int, check: bool = True) -> None:
        """Keep the next n_tokens [B] provisional slots of each row (the accepted prefix).
        check=False skips the overflow test (a GPU sync) for callers that sized the cache up front."""
        self.lengths += n_tokens
        if check and int(self.lengths.max()) > self.max_len:
            raise RuntimeError(f"KV cache overflow: a row needs {int(self.lengths.max())} > {self.max_len} slots")

    def rollback(self, lengths: torch.Tensor | int) -> None:
        """Forget everything past `lengths` [B]: a move of lengths, no copy."""
        new = torch.as_tensor(lengths, device=self.lengths.device).expand_as(self.lengths)
        if bool((new > self.lengths).any()) or bool((new < 0).any()):
            raise ValueError("rollback can only move lengths back")
        self.lengths.copy_(new)

    def reset(self) -> None:
        self.lengths.zero_()
