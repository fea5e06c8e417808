"""What `specdec decode` and `specdec serve` share to run the fast model: the inference layout (q/k/v and
gate/up fused) by default, `--no-fuse` to load the checkpoint's own layout."""

from __future__ import annotations

import argparse

import torch

from specdec.zoo import load_bundle


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-fuse", action="store_true",
                   help="keep q/k/v and gate/up as separate matmuls (default: fused, exact and faster)")


def load(args: argparse.Namespace, parts: tuple[str, ...], device: str, dtype: torch.dtype,
         draft: str | None = None, eagle: str | None = None):
    """The bundle a verb decodes with: args.model loaded onto the device, fused unless --no-fuse."""
    return load_bundle(args.model, parts, device=device, dtype=dtype, draft=draft, eagle=eagle,
                       fuse=not args.no_fuse)
