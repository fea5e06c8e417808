"""A target with its helpers: what `--model tiny|PATH|HF_ID` names, loaded onto a device."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from specdec.checkpoint import CheckpointError, load_eagle, load_heads, load_transformer
from specdec.heads import EagleHead, MTPHeads, MTPLayer
from specdec.model import Transformer


class ModelNotFound(Exception):
    """The model argument names nothing loadable; the message says what was tried."""


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
    def eos_token_id(self) -> int | None:
        eos = self.target.config.eos_token_id
        return eos[0] if isinstance(eos, list) else eos


def resolve_paths(spec: str, draft: str | None = None) -> tuple[str, dict[str, Path]]:
    """Zoo name -> its four parts; a local directory -> target (plus siblings named draft/heads/eagle);
    otherwise a Hugging Face id, downloaded only when online."""
    from specdec.zoo.registry import ZooError, find_zoo, zoo_parts

    p = Path(spec).expanduser()
    if find_zoo(spec) is not None:
        try:
            paths = dict(zoo_parts(spec))
        except ZooError as exc:
            raise ModelNotFound(str(exc)) from None
    elif p.is_dir():
        if not (p / "config.json").is_file():
            raise ModelNotFound(f"{p} has no config.json: not a Hugging Face model directory")
        paths = {"target": p}
        for part in ("draft", "heads", "eagle"):
            if (p.parent / part / "config.json").is_file() and p.name == "target":
                paths[part] = p.parent / part
    elif "/" in spec and not spec.startswith((".", "/")) and spec.count("/") == 1:
        paths = {"target": _download(spec)}
    else:
        from specdec.zoo.registry import known_zoos

        known = ", ".join(known_zoos()) or "none"
        raise ModelNotFound(f"unknown model {spec!r}: not a zoo name (known: {known}), a directory, or a Hugging Face id")
    if draft:  # an explicit draft replaces the one found beside the target
        paths["draft"] = Path(draft) if Path(draft).is_dir() else resolve_paths(draft)[1]["target"]
    return spec, paths


def _download(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "tokenizer*"]))
    except Exception as exc:  # offline, missing repo, gated model: one clear line
        raise ModelNotFound(f"could not fetch Hugging Face model {repo_id!r}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None


def load_bundle(spec: str, parts: tuple[str, ...] = ("mtp", "heads", "eagle", "draft"), device="cpu",
                dtype=torch.float32, draft: str | None = None) -> ModelBundle:
    """Load the target and the requested helper parts; a part that is absent stays None."""
    from specdec.zoo.tokenizer import load_tokenizer

    name, paths = resolve_paths(spec, draft)
    try:
        target, mtp = load_transformer(paths["target"], dtype, device, with_mtp="mtp" in parts)
        b = ModelBundle(name=name, target=target, tokenizer=load_tokenizer(paths["target"]), mtp=mtp, paths=paths)
        if "heads" in parts and "heads" in paths:
            b.heads = load_heads(paths["heads"], dtype, device)
        if "eagle" in parts and "eagle" in paths:
            b.eagle = load_eagle(paths["eagle"], dtype, device)
        if "draft" in parts and "draft" in paths:
            b.draft, _ = load_transformer(paths["draft"], dtype, device, with_mtp=False)
    except CheckpointError as exc:
        from specdec.zoo.registry import find_zoo, rebuild_hint
        hint = f"; {rebuild_hint(name)}" if find_zoo(name) else ""
        raise ModelNotFound(f"{exc}{hint}") from None
    if b.draft is not None and b.draft.config.vocab_size != b.target.config.vocab_size:
        raise ModelNotFound(f"the draft's vocabulary ({b.draft.config.vocab_size}) differs from the target's "
                            f"({b.target.config.vocab_size}): speculative decoding needs one tokenizer")
    return b
