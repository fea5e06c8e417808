"""Random weights in a real model's shape, as SGLang's `--load-format dummy`: measure a server or a decoder
at a model's size (Llama 3.1 8B, Llama 3.2 1B) without its checkpoint. The text such a model writes means
nothing; its speed is the real model's."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch

from specdec.decoder.bundle import ModelBundle, load_tokenizer
from specdec.decoder.checkpoint import CheckpointError, eagle_config, read_config
from specdec.decoder.draft_modules import EagleHead, MTPHeads, MTPLayer
from specdec.decoder.model import ModelConfig, Transformer
from specdec.decoder.paths import ModelNotFound, model_paths
from specdec.zoo.registry import resolve
from specdec.zoo.tokenizer import ZooTokenizer

_LLAMA = dict(rms_norm_eps=1e-5, rope_theta=500000.0, model_type="llama", num_attention_heads=32,
              num_key_value_heads=8, max_position_embeddings=131072, vocab_size=128256)
# The shapes by name (config.json's numbers of the Meta models; no end-of-sequence id: every request runs
# to its token budget, as a benchmark wants)
SHAPES = {
    "8b": dict(_LLAMA, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, tie_word_embeddings=False),
    "1b": dict(_LLAMA, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, head_dim=64,
               tie_word_embeddings=True),
}
HEADS = 8  # parallel heads of a random `heads` part: enough for any k up to 8


@contextlib.contextmanager
def building(device, dtype: torch.dtype):
    """New tensors on `device` in `dtype`: an 8B model is built where it runs, never as 32 GB of fp32 first."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(old)


def shape_config(shape: str) -> tuple[ModelConfig, Path | None, object]:
    """A shape name (8b, 1b) or a model (zoo name, directory) whose config.json gives the shape:
    (its config, its directory or None, the tokenizer that goes with it: the model's, else the zoo's)."""
    if shape.lower() in SHAPES:
        return ModelConfig(**SHAPES[shape.lower()]), None, ZooTokenizer(resolve("tiny")["target"])
    spec = resolve(shape)
    target = spec["target"] if isinstance(spec, dict) else model_paths(spec)["target"]
    try:
        cfg = ModelConfig.from_hf(read_config(target))
    except (CheckpointError, ValueError) as exc:
        raise ModelNotFound(f"--random-weights {shape}: {exc}") from None
    # a zoo's tokenizer without transformers (ZooTokenizer says why); a directory's by AutoTokenizer, if it has one
    tokenizer = ZooTokenizer(target) if isinstance(spec, dict) else load_tokenizer(target) \
        if (target / "tokenizer_config.json").is_file() else ZooTokenizer(resolve("tiny")["target"])
    return cfg, target, tokenizer


def target_bytes(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """The bytes of a target's weights in `dtype`."""
    H, I, D, V = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim, cfg.vocab_size
    layer = H * D * (2 * cfg.num_attention_heads + 2 * cfg.num_key_value_heads) + 3 * H * I + 2 * H
    params = V * H * (1 if cfg.tie_word_embeddings else 2) + cfg.num_hidden_layers * layer + H
    return params * torch.finfo(dtype).bits // 8


def free_bytes(device) -> int:
    """Memory free for new tensors on `device` (a CPU: the system's available memory)."""
    if torch.device(device).type == "cuda":
        return torch.cuda.mem_get_info(torch.device(device))[0]
    try:  # Linux: what can be allocated without swapping
        meminfo = Path("/proc/meminfo").read_text()
        return int(next(ln.split()[1] for ln in meminfo.splitlines() if ln.startswith("MemAvailable:"))) * 1024
    except (OSError, StopIteration, ValueError):
        try:  # elsewhere: the physical memory
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return 1 << 62  # unknown: let the allocation say


def random_bundle(shape: str, parts: tuple[str, ...] = ("mtp", "eagle", "heads"), device="cpu",
                  dtype=torch.float32, seed: int = 0, free: int | None = None) -> ModelBundle:
    """A target of random weights in `shape` (shape_config), with random helper parts among `parts`
    (MTP layer, EAGLE head, parallel heads; a draft model has no shape to take, so none). A target that
    would not fit in `free` bytes (default: what the device has free) is refused before any allocation."""
    if "draft" in parts:
        raise ModelNotFound("random weights come without a draft model: use --method mtp, eagle, heads, ngram or ar")
    cfg, where, tokenizer = shape_config(shape)
    need, free = target_bytes(cfg, dtype), free_bytes(device) if free is None else free
    if need > 0.8 * free:
        raise ModelNotFound(f"--random-weights {shape}: the target alone needs {need / 2**30:.1f} GiB in "
                            f"{str(dtype).removeprefix('torch.')}; {torch.device(device).type} has {free / 2**30:.1f} GiB free")
    with torch.random.fork_rng(devices=[]), building(device, dtype):
        torch.manual_seed(seed)
        b = ModelBundle(name=f"random-{shape}", target=Transformer(cfg), tokenizer=tokenizer,
                        paths={"target": where} if where is not None else {})
        if "mtp" in parts:
            b.mtp = MTPLayer(cfg)
        if "eagle" in parts:
            b.eagle = EagleHead(eagle_config(cfg))
        if "heads" in parts:
            b.heads = MTPHeads(cfg.hidden_size, HEADS)
    for part in (b.target, b.mtp, b.eagle, b.heads):
        if part is not None:
            part.to(device=device, dtype=dtype).eval()  # as a loaded model: its buffers in dtype too
    return b
