"""Hugging Face format on disk: config.json + model.safetensors, read and written for our modules.

Layouts (what SGLang and transformers expect):
  target  `model.*`, `lm_head.weight`; its MTP layer under `model.mtp_layers.0.*` (MiMo)
  EAGLE   `fc.*`, `layers.0.*` with no `model.` prefix and no embedding / LM head (LlamaForCausalLMEagle)
  heads   `heads.{i}.weight|bias` (parallel MTP heads; specdec's own format)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specdec.decoder.draft_modules import EagleHead, MTPHeads, MTPLayer
from specdec.decoder.model import ModelConfig, Transformer

MTP_PREFIX = "model.mtp_layers.0."


class CheckpointError(Exception):
    """A missing or unreadable checkpoint file; the message names the file and the fix."""


def read_config(path: Path) -> dict[str, Any]:
    f = Path(path) / "config.json"
    if not f.is_file():
        raise CheckpointError(f"missing {f}")
    try:
        return json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"corrupted {f}: {exc}") from None


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a directory (one file or an index of shards)."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else ["model.safetensors"]
    out: dict[str, torch.Tensor] = {}
    for name in files:
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"missing {f}")
        try:
            with safe_open(str(f), framework="pt") as sf:
                for k in sf.keys():
                    out[k] = sf.get_tensor(k)
        except Exception as exc:  # safetensors raises several types for a damaged file
            raise CheckpointError(f"corrupted {f}: {exc}") from None
    return out


def _load_into(module: torch.nn.Module, sd: dict[str, torch.Tensor], what: str) -> None:
    own = module.state_dict()
    missing = [k for k in own if k not in sd]
    if missing:
        raise CheckpointError(f"{what}: missing tensors {missing[:4]}{' ...' if len(missing) > 4 else ''}")
    for k, v in own.items():
        if sd[k].shape != v.shape:
            raise CheckpointError(f"{what}: {k} has shape {tuple(sd[k].shape)}, expected {tuple(v.shape)}")
    module.load_state_dict({k: sd[k] for k in own}, strict=True)


def load_transformer(path, dtype=torch.float32, device="cpu", with_mtp: bool = True):
    """Load a Llama/Qwen2 directory -> (Transformer, MTPLayer or None)."""
    path = Path(path)
    cfg = ModelConfig.from_hf(read_config(path))
    sd = read_tensors(path)
    body = {k[len("model."):]: v for k, v in sd.items() if k.startswith("model.") and not k.startswith("model.mtp_layers.")}
    if "lm_head.weight" in sd:
        body["lm_head.weight"] = sd["lm_head.weight"]
    elif cfg.tie_word_embeddings and "embed_tokens.weight" in body:
        body["lm_head.weight"] = body["embed_tokens.weight"]
    else:  # an untied head must be in the file: the embedding is not a stand-in for it
        raise CheckpointError(f"{path}: missing tensor lm_head.weight (config.json says tie_word_embeddings "
                              f"is {cfg.tie_word_embeddings})")
    model = Transformer(cfg)
    _load_into(model, body, str(path))
    model.to(device=device, dtype=dtype).eval()
    mtp = None
    mtp_sd = {k[len(MTP_PREFIX):]: v for k, v in sd.items() if k.startswith(MTP_PREFIX)}
    if with_mtp and mtp_sd:
        mtp = MTPLayer(cfg)
        _load_into(mtp, _mtp_from_hf(mtp_sd), f"{path} (MTP layer)")
        mtp.to(device=device, dtype=dtype).eval()
    return model, mtp


_MTP_OWN = ("token_layernorm", "hidden_layernorm", "input_proj", "final_layernorm")


def _mtp_from_hf(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {(k if k.split(".")[0] in _MTP_OWN else "block." + k): v for k, v in sd.items()}


def _mtp_to_hf(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {MTP_PREFIX + (k[len("block."):] if k.startswith("block.") else k): v for k, v in sd.items()}


def _contiguous(sd: dict[str, torch.Tensor], dtype) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", dtype).contiguous() for k, v in sd.items()}


def save_transformer(path, model: Transformer, mtp: MTPLayer | None = None, dtype=torch.bfloat16,
                     architectures: list[str] | None = None, extra_config: dict | None = None) -> None:
    """Write config.json + model.safetensors; with an MTP layer, in the MiMo layout."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = model.config.to_hf()
    sd = {"model." + k: v for k, v in model.state_dict().items() if not k.startswith("lm_head.")}
    if not model.config.tie_word_embeddings:
        sd["lm_head.weight"] = model.lm_head.weight
    if mtp is not None:
        sd.update(_mtp_to_hf(mtp.state_dict()))
        cfg["num_nextn_predict_layers"] = 1
    cfg["architectures"] = architectures or (["MiMoForCausalLM"] if mtp is not None else
                                             ["Qwen2ForCausalLM" if cfg["model_type"] == "qwen2" else "LlamaForCausalLM"])
    cfg["torch_dtype"] = cfg["dtype"] = str(dtype).removeprefix("torch.")
    cfg.update(extra_config or {})
    save_file(_contiguous(sd, dtype), str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def eagle_config(target_cfg: ModelConfig, intermediate_size: int | None = None) -> ModelConfig:
    """The EAGLE head's Llama config: the target's width, one layer."""
    return ModelConfig(
        vocab_size=target_cfg.vocab_size, hidden_size=target_cfg.hidden_size,
        intermediate_size=intermediate_size or target_cfg.intermediate_size, num_hidden_layers=1,
        num_attention_heads=target_cfg.num_attention_heads, num_key_value_heads=target_cfg.num_key_value_heads,
        head_dim=target_cfg.head_dim, rms_norm_eps=target_cfg.rms_norm_eps, rope_theta=target_cfg.rope_theta,
        max_position_embeddings=target_cfg.max_position_embeddings, attention_bias=False,
        tie_word_embeddings=False, model_type="llama", bos_token_id=target_cfg.bos_token_id,
        eos_token_id=target_cfg.eos_token_id, pad_token_id=target_cfg.pad_token_id)


def save_eagle(path, head: EagleHead, dtype=torch.bfloat16) -> None:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    sd = {("layers.0." + k[len("block."):] if k.startswith("block.") else k): v for k, v in head.state_dict().items()}
    cfg = head.config.to_hf()
    cfg["architectures"] = ["LlamaForCausalLMEagle"]
    cfg["torch_dtype"] = cfg["dtype"] = str(dtype).removeprefix("torch.")
    save_file(_contiguous(sd, dtype), str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def load_eagle(path, dtype=torch.float32, device="cpu") -> EagleHead:
    path = Path(path)
    raw = read_config(path)
    if "LlamaForCausalLMEagle" not in raw.get("architectures", []):
        raise CheckpointError(f"{path}/config.json: not an EAGLE head (architectures {raw.get('architectures')})")
    head = EagleHead(ModelConfig.from_hf(raw))
    sd = {("block." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v for k, v in read_tensors(path).items()}
    _load_into(head, sd, str(path))
    return head.to(device=device, dtype=dtype).eval()


def save_heads(path, heads: MTPHeads, extra_config: dict | None = None, dtype=torch.bfloat16) -> None:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["SpecdecMTPHeads"], "model_type": "specdec_mtp_heads",
           "hidden_size": heads.hidden_size, "num_heads": heads.num_heads, "inner_size": heads.inner_size,
           "torch_dtype": str(dtype).removeprefix("torch."), **(extra_config or {})}
    save_file(_contiguous(heads.state_dict(), dtype), str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def load_heads(path, dtype=torch.float32, device="cpu") -> MTPHeads:
    path = Path(path)
    raw = read_config(path)
    if raw.get("model_type") != "specdec_mtp_heads":
        raise CheckpointError(f"{path}/config.json: not specdec MTP heads (model_type {raw.get('model_type')!r})")
    heads = MTPHeads(raw["hidden_size"], raw["num_heads"], raw.get("inner_size"))
    _load_into(heads, read_tensors(path), str(path))
    return heads.to(device=device, dtype=dtype).eval()
