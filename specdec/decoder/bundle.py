"""A target with its helpers (MTP layer, heads, EAGLE head, draft), loaded onto a device.

The core loads local Hugging Face directories and hub ids; zoo names (`tiny`) are resolved to
directories by specdec.zoo, above this layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from specdec.decoder.checkpoint import (
    CheckpointError,
    load_eagle,
    load_heads,
    load_transformer,
)
from specdec.decoder.draft_modules import EagleHead, MTPHeads, MTPLayer
from specdec.decoder.methods import PARTS
from specdec.decoder.model import Transformer, fuse_projections
from specdec.decoder.paths import ModelNotFound, model_paths  # noqa: F401  (here too: where a student looks)


@dataclass
class ModelBundle:
    name: str
    target: Transformer
    tokenizer: object
    mtp: MTPLayer | None = None
    heads: MTPHeads | None = None
    eagle: EagleHead | None = None
    draft: Transformer | None = None
    paths: dict[str, Path] = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return next(self.target.parameters()).device

    @property
    def eos_token_ids(self) -> list[int]:
        """Every id that ends a sequence (config.json may give one id or a list)."""
        eos = self.target.config.eos_token_id
        return [] if eos is None else [int(e) for e in (eos if isinstance(eos, list) else [eos])]


def fuse_bundle(bundle: ModelBundle) -> ModelBundle:
    """Pack q/k/v and gate/up into single matmuls in every part that has layers (target, draft, MTP layer,
    EAGLE head): exact (each output is the same dot product), fewer kernel launches; for inference only,
    since a fused part is neither trained nor saved in the Hugging Face layout."""
    for part in (bundle.target, bundle.draft, bundle.mtp, bundle.eagle):
        if part is not None:
            fuse_projections(part)
    return bundle


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer  # heavy: imported when a model is loaded

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def load_bundle(spec: str | Path | dict[str, Path], parts: tuple[str, ...] = PARTS, device="cpu",
                dtype=torch.float32, draft: str | Path | None = None, eagle: str | Path | None = None,
                name: str | None = None, tokenizer_loader=load_tokenizer, fuse: bool = False) -> ModelBundle:
    """Load the target and the requested helper parts; a part that is absent stays None.
    `spec`: a directory, a hub id, or {part: directory} (what specdec.zoo resolves a name to);
    `draft` and `eagle` replace the draft model and EAGLE head found beside the target;
    `tokenizer_loader(target directory)` loads the tokenizer (the zoo passes its own, lighter one);
    `fuse`: the inference layout (fuse_bundle), what `specdec decode` and `specdec serve` load."""
    paths = dict(spec) if isinstance(spec, dict) else model_paths(spec, draft)
    if isinstance(spec, dict) and draft:
        paths["draft"] = model_paths(draft)["target"]
    if eagle:
        if not (Path(eagle) / "config.json").is_file():
            raise ModelNotFound(f"{eagle}: no config.json, not an EAGLE head directory")
        paths["eagle"] = Path(eagle)
    try:
        target, mtp = load_transformer(paths["target"], dtype, device, with_mtp="mtp" in parts)
        b = ModelBundle(name=name or str(spec if not isinstance(spec, dict) else paths["target"]), target=target,
                        tokenizer=tokenizer_loader(paths["target"]), mtp=mtp, paths=paths)
        if "heads" in parts and "heads" in paths:
            b.heads = load_heads(paths["heads"], dtype, device)
        if "eagle" in parts and "eagle" in paths:
            b.eagle = load_eagle(paths["eagle"], dtype, device)
        if "draft" in parts and "draft" in paths:
            b.draft, _ = load_transformer(paths["draft"], dtype, device, with_mtp=False)
    except CheckpointError as exc:
        raise ModelNotFound(str(exc)) from None
    if b.draft is not None and b.draft.config.vocab_size != b.target.config.vocab_size:
        raise ModelNotFound(f"the draft's vocabulary ({b.draft.config.vocab_size}) differs from the target's "
                            f"({b.target.config.vocab_size}): speculative decoding needs one tokenizer")
    return fuse_bundle(b) if fuse else b
