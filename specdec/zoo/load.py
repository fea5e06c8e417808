"""Loading the zoo's models (torch): `load_bundle`, which specdec.zoo hands out when first asked for."""

from __future__ import annotations

import torch

from specdec.decoder import bundle as core
from specdec.decoder.bundle import ModelBundle, ModelNotFound
from specdec.zoo.registry import find_zoo, known_zoos, rebuild_hint, resolve
from specdec.zoo.tokenizer import ZooTokenizer

__all__ = ["load_bundle"]


def load_bundle(spec: str, parts: tuple[str, ...] = core.PARTS, device="cpu", dtype=torch.float32,
                draft: str | None = None, eagle: str | None = None, fuse: bool = False) -> ModelBundle:
    """`--model tiny|DIR|HF_ID` loaded onto a device; `draft` (a zoo name or directory) replaces
    the draft model found beside the target, `eagle` (a directory) its EAGLE head; `fuse`: the
    inference layout (specdec.decoder.bundle.fuse_bundle)."""
    draft_dir = None
    if draft:
        d = resolve(draft)
        draft_dir = d["target"] if isinstance(d, dict) else d
    try:
        paths = resolve(spec)
        # A zoo name loads the zoo's tokenizer without transformers (ZooTokenizer says why); anything else, AutoTokenizer.
        loader = ZooTokenizer if isinstance(paths, dict) else core.load_tokenizer
        return core.load_bundle(paths, parts, device, dtype, draft=draft_dir, eagle=eagle, name=spec,
                                tokenizer_loader=loader, fuse=fuse)
    except ModelNotFound as exc:
        if find_zoo(spec) is not None and "rebuild" not in str(exc):
            raise ModelNotFound(f"{exc}; {rebuild_hint(spec)}") from None
        if find_zoo(spec) is None and "unknown model" in str(exc):
            known = ", ".join(known_zoos()) or "none"
            raise ModelNotFound(f"unknown model {spec!r}: not a zoo name (known: {known}), a directory, "
                                "or a Hugging Face id") from None
        raise
