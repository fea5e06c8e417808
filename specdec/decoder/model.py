"""A Llama/Qwen2-style decoder in plain PyTorch with a static KV cache and explicit positions.

Parameter names follow Hugging Face (`embed_tokens`, `layers.N.self_attn.q_proj`, ...) so that a
checkpoint loads by stripping the `model.` prefix. Shapes: B batch, T new tokens, S cache slots,
H hidden, nh query heads, nkv key/value heads, D head dim, V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from specdec.decoder import decode_attention as kernel
from specdec.decoder import gemv
from specdec.decoder.kv_cache import LayerCache
from specdec.decoder.regions import region


@dataclass
class ModelConfig:
    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 640
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # None, or {"rope_type": "llama3", ...}
    max_position_embeddings: int = 2048
    attention_bias: bool = False  # Qwen2 has biases on q, k, v
    tie_word_embeddings: bool = False
    model_type: str = "llama"
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # other config.json keys, written back on save

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim % 2:  # rotary embeddings rotate pairs of dimensions
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> "ModelConfig":
        """Read a Hugging Face config.json dict (Llama or Qwen2, transformers 4 or 5 style)."""
        model_type = cfg.get("model_type", "llama")
        if model_type not in ("llama", "qwen2", "mistral"):
            raise ValueError(f"unsupported model_type {model_type!r}: specdec loads llama, qwen2 and mistral")
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "llama3"):
            raise ValueError(f"unsupported rope type {rope_type!r} (supported: default, llama3)")
        known = {f for f in cls.__dataclass_fields__ if f != "extra"}
        kw = {k: cfg[k] for k in known if k in cfg and cfg[k] is not None}
        kw["rope_theta"] = float(theta)
        kw["rope_scaling"] = dict(rope) if rope_type == "llama3" else None
        kw["model_type"] = model_type
        kw["attention_bias"] = bool(cfg.get("attention_bias", model_type == "qwen2"))
        if cfg.get("mlp_bias"):
            raise ValueError("mlp_bias=True is not supported")
        extra = {k: v for k, v in cfg.items() if k not in known}
        return cls(**kw, extra=extra)

    def to_hf(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k not in ("extra", "rope_scaling")}
        d.update(self.extra)
        d["rope_theta"] = self.rope_theta
        if self.rope_scaling:
            d["rope_scaling"] = self.rope_scaling
        return d


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)  # one fused kernel on a GPU


class Linear(nn.Linear):
    """nn.Linear, with one fast path: under torch.compile a single row (batch-1 decoding) is computed as
    a plain multiply-and-sum, which inductor turns into one kernel that streams the weight at nearly the
    full memory bandwidth; cuBLAS's one-row kernels leave more of it unused (docs/results.md, the section
    "Where a batch-1 step's time goes"). On a GPU with tuned tiles (KERNEL_GEMV), gemv.py's kernel instead."""

    def forward(self, x: torch.Tensor, gated: bool = False) -> torch.Tensor:
        """gated: x is the MLP's [gate | up] [.., 2 x in_features] and the input is silu(gate) * up (SwiGLU), which
        gemv.py's kernel computes as it loads x where the weight's tile is gated (one kernel fewer a layer), and a
        pointwise product before the projection elsewhere."""
        one_row = torch.compiler.is_compiling() and x.numel() == x.shape[-1]
        tile = gemv.tile_for(x, self.weight) if one_row and KERNEL_GEMV else None
        if gated and (tile is None or not tile.gated):  # silu(gate) * up first: a pointwise kernel of its own
            gate, up = x.chunk(2, dim=-1)
            x, gated = F.silu(gate) * up, False
        if tile is not None and tile.splits == 1 and self.bias is None:  # the kernel wrote the product, x's dtype
            return gemv.partials(x, self.weight, tile, gated).view(*x.shape[:-1], -1)
        if tile is not None:  # split along K: [splits, N] -> [N], a sum inductor folds into the kernel that reads y
            y = gemv.partials(x, self.weight, tile, gated).float().sum(0)
        else:
            if not one_row:
                return super().forward(x)
            y = (x.reshape(1, -1).float() * self.weight.float()).sum(-1)  # [N]: one dot product per output
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype).view(*x.shape[:-1], -1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v over the slots the mask allows: q [B, h, Tq, D], k, v [B, h, S, D],
    mask [B, 1, Tq, S] bool -> [B, h, Tq, D]. Written out (scores, mask, softmax, weighted sum): at a
    decode step's few query rows it is also faster on a GPU than the fused SDPA kernel (docs/results.md, the
    section "Where a batch-1 step's time goes"). The reference, and the CPU twin, of decode_attention.py's
    Triton kernel, which a GPU runs in its place at small batches."""
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # [B, h, Tq, S]
    scores = scores.masked_fill(~mask, float("-inf"))  # slot 0 is always visible: no row is all -inf
    return scores.float().softmax(-1).to(q.dtype) @ v


# On a GPU whose tiles are tuned (gemv.py, tuned/gemv.json): compiled one-row projections of the tuned weight shapes
# run as gemv.py's Triton kernel, split along K, instead of inductor's reduction. False: the reduction everywhere.
KERNEL_GEMV = True

DECODE_ROWS = 64  # query rows (query heads per key/value head x new tokens) up to which `attention` runs
# On a GPU decode attention runs as decode_attention.py's Triton kernel (the same computation in two kernels
# instead of three, reading only the slots some row sees); False: as written, as on the CPU.
KERNEL_ATTENTION = True
# On a GPU, with the kernel on: rope and the cache write folded into it too (decode_attention.rope_append_attention),
# for a chain's step, in place of three small kernels: 8B-shaped step under CUDA graphs 5.64 -> 5.04 ms, compiled
# unchanged (inductor fuses those three itself); docs/results.md, "Rope in the attention kernel". On the CPU it
# changes nothing.
ROPE_IN_KERNEL = True


# On a GPU, with the folded kernel: the step's cos/sin computed once and handed to every layer as they are. Compiled
# whole, the 8B step runs kernels named for rope's ops 32 times a step each (triton_poi_fused__to_copy_cat_cos_mul_sin_
# ..., benchmarks/results/gpu_gemv/kernels.json): inductor inlines a few-op pointwise input into each of its consumers, and
# realizes it anew for each Triton kernel that reads it. Measured only together with Engine.steps_ahead (the 8B default
# path 4.36-4.43 -> 4.23 ms a token, benchmarks/logs/gpu_fast_path_sglang.log); alone: gpu_profile's "..., rope once".
ROPE_ONCE = True


@torch.library.custom_op("specdec::computed_once", mutates_args=())
def computed_once(x: torch.Tensor) -> torch.Tensor:
    """x, copied, through an op torch.compile cannot see into: what it reads is computed once, before it."""
    return x.clone()


@computed_once.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies [D/2], with Llama 3's long-context rescaling when configured."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    rs = cfg.rope_scaling
    if rs:  # llama3: stretch the low frequencies, keep the high ones, blend in between
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - lo) / (hi - lo)
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        mid = (wavelen <= old / lo) & (wavelen >= old / hi)
        inv = torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    return inv


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.nh, self.nkv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        b = cfg.attention_bias
        self.q_proj = Linear(cfg.hidden_size, self.nh * self.d, bias=b)
        self.k_proj = Linear(cfg.hidden_size, self.nkv * self.d, bias=b)
        self.v_proj = Linear(cfg.hidden_size, self.nkv * self.d, bias=b)
        self.o_proj = Linear(self.nh * self.d, cfg.hidden_size, bias=False)

    def fuse(self) -> None:
        """Inference only: one matmul for q, k and v instead of three (fewer kernel launches)."""
        w = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
        b = torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias]) if self.q_proj.bias is not None else None
        self.qkv_proj = Linear(w.shape[1], w.shape[0], bias=b is not None, device=w.device, dtype=w.dtype)
        self.qkv_proj.weight.data.copy_(w)
        if b is not None:
            self.qkv_proj.bias.data.copy_(b)
        del self.q_proj, self.k_proj, self.v_proj

    def forward(self, x, cos, sin, cache: LayerCache | None = None, positions=None, mask=None):
        """x [B, T, H] at positions [B, T] -> [B, T, H]; with a cache (this layer's), the T keys and values are
        written into it and attention reads its first S slots as mask [B, 1, g*T, S] allows."""
        B, T, _ = x.shape
        if hasattr(self, "qkv_proj"):
            qkv = self.qkv_proj(x).view(B, T, self.nh + 2 * self.nkv, self.d)
            qk, v = qkv.split([self.nh + self.nkv, self.nkv], dim=2)
        else:
            qk = torch.cat([self.q_proj(x).view(B, T, self.nh, self.d), self.k_proj(x).view(B, T, self.nkv, self.d)], 2)
            v = self.v_proj(x).view(B, T, self.nkv, self.d)
        g = self.nh // self.nkv
        # rope, the cache write and attention in one pass over the cache (qk: [B, T, heads, D]), for a chain's step
        # over the static cache only: a tree view (slots) and the training's cache-like DepthKV (appends, with
        # autograd) keep the written-out steps
        if (ROPE_IN_KERNEL and KERNEL_ATTENTION and isinstance(cache, LayerCache) and cache.slots is None
                and g * T <= DECODE_ROWS and kernel.fits(qk)):
            y = kernel.rope_append_attention(qk, v, cos, sin, positions, cache.k, cache.v, mask.shape[-1], self.nh)
            return self.o_proj(y.reshape(B, self.nh, T, self.d).transpose(1, 2).reshape(B, T, self.nh * self.d))
        qk = qk.transpose(1, 2)  # [B, nh + nkv, T, D]: rotate q and k together
        qk = qk * cos + rotate_half(qk) * sin
        q, k = qk.split([self.nh, self.nkv], dim=1)  # [B, nh, T, D], [B, nkv, T, D]
        v = v.transpose(1, 2)
        if cache is None:  # training / full recompute: plain causal attention
            if g > 1:
                k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            cache.write(k, v, positions)
            K, V = cache.read(mask.shape[-1])  # [B, nkv, S, D]: the slots this step reads (KVCache.slots_read)
            # Grouped-query attention without copying the cache: fold each group's query heads
            # into the query-length axis, so one key/value head serves g*T query rows.
            qg = q.reshape(B, self.nkv, g * T, self.d)
            if g * T > DECODE_ROWS:  # a prefill: the fused kernel, which never holds the [g*T, S] scores
                y = F.scaled_dot_product_attention(qg, K, V, attn_mask=mask)
            elif KERNEL_ATTENTION and isinstance(cache, LayerCache) and kernel.fits(qg):
                # a decode or verify step on a GPU: the Triton kernel. Not for the training's DepthKV: the kernel has
                # no backward, and a chain unrolled over a short window (g*T rows within DECODE_ROWS) would reach it
                y = kernel.decode_attention(qg, K, V, mask)
            else:  # the same step written out: the CPU's, and the kernel's reference
                y = attention(qg, K, V, mask)
            y = y.reshape(B, self.nh, T, self.d)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.nh * self.d))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def fuse(self) -> None:
        """Inference only: gate and up projections as one matmul."""
        w = torch.cat([self.gate_proj.weight, self.up_proj.weight])
        self.gate_up_proj = Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=w.dtype)
        self.gate_up_proj.weight.data.copy_(w)
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "gate_up_proj"):  # down_proj applies silu(gate) * up to [gate | up] itself (Linear's gated)
            return self.down_proj(self.gate_up_proj(x), gated=True)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """One decoder layer. `input_norm=False` drops the first norm (EAGLE's layer 0). Its forward is a compile
    region (regions.py): it is given its own layer's cache (no layer index), so one compiled code serves every layer."""

    def __init__(self, cfg: ModelConfig, input_norm: bool = True) -> None:
        super().__init__()
        if input_norm:
            self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    @region
    def forward(self, x, cos, sin, cache: LayerCache | None = None, positions=None, mask=None):
        h = self.input_layernorm(x) if hasattr(self, "input_layernorm") else x
        x = x + self.self_attn(h, cos, sin, cache, positions, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Rotary(nn.Module):
    """cos/sin for explicit positions [B, T] -> [B, 1, T, D], computed in fp32."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype):
        freqs = positions.float().unsqueeze(-1) * self.inv_freq  # [B, T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1).unsqueeze(1)  # [B, 1, T, D]
        return emb.cos().to(dtype), emb.sin().to(dtype)


def attention_mask(positions: torch.Tensor, kv_len: int, group: int = 1,
                   visible: torch.Tensor | None = None) -> torch.Tensor:
    """Query at position p sees cache slots 0..p: [B, 1, group*T, S] bool, repeated for the `group`
    query heads that share a key/value head. Slots are absolute positions, so stale entries past a
    row's committed length are never seen (rollback costs nothing). A tree's tokens see what
    visible [B, T, S] says instead (KVCache.tree)."""
    B, T = positions.shape
    slots = torch.arange(kv_len, device=positions.device)
    mask = slots.view(1, 1, kv_len) <= positions.unsqueeze(-1) if visible is None else visible  # [B, T, S]
    return mask.unsqueeze(1).expand(B, group, T, kv_len).reshape(B, 1, group * T, kv_len)


def init_weights(module: nn.Module, std: float = 0.02, generator: torch.Generator | None = None) -> None:
    """GPT-style init: small normal weights, zero biases (norm weights stay at one); drawn from `generator`, else
    from torch's global random state."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=std, generator=generator)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)


class Transformer(nn.Module):
    """Decoder-only LM. forward(ids [B,T], positions [B,T], cache) -> (logits [B,T,V], hidden [B,T,H]).

    With a cache, the keys and values of the T positions are written into it (provisionally: the
    caller commits) and attention reads the cache's slots 0..position.

    `hidden` is the final-normed state fed to the LM head: what EAGLE heads, MTP layers and
    parallel heads read.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = Rotary(cfg)
        init_weights(self)

    def forward(self, input_ids, positions=None, cache=None, return_logits: bool = True):
        B, T = input_ids.shape
        if positions is None:
            positions = torch.arange(T, device=input_ids.device).expand(B, T)
        x = self.embed_tokens(input_ids)  # [B, T, H]
        cos, sin = self.rotary(positions, x.dtype)
        if ROPE_ONCE and ROPE_IN_KERNEL and cache is not None and x.is_cuda:  # the folded kernel's cos/sin (ROPE_ONCE)
            cos, sin = computed_once(cos), computed_once(sin)
        mask = None
        if cache is not None:  # built once, shared by every layer
            group = self.config.num_attention_heads // self.config.num_key_value_heads
            mask = attention_mask(positions, cache.slots_read(positions), group, cache.visible)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache.layer(i) if cache is not None else None, positions, mask)
        if not return_logits:
            return None, self.norm(x)
        return self.head(x)

    @region
    def head(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The final norm and the LM head: x [B, T, H] -> (logits [B, T, V], hidden [B, T, H]). A compile region."""
        hidden = self.norm(x)
        return self.lm_head(hidden), hidden

    @region
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head alone, hidden [B, T, H] -> logits [B, T, V]: how a draft module's states are read (a region)."""
        return self.lm_head(hidden)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def fuse_projections(module: nn.Module) -> nn.Module:
    """Pack q/k/v and gate/up weights of every layer (inference on a GPU; not saved, not trained)."""
    for m in list(module.modules()):
        if isinstance(m, (Attention, MLP)) and not (hasattr(m, "qkv_proj") or hasattr(m, "gate_up_proj")):
            m.fuse()
    return module
