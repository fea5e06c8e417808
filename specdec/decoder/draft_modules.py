"""The draft modules that ride on a target: the MTP layer, the EAGLE head and parallel MTP heads.

All three read the target's final-normed hidden state h_t (what its LM head reads) and reuse the
target's embedding and LM head, as SGLang does. Shapes: B batch, T positions, H hidden.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from specdec.decoder.model import (
    Block,
    ModelConfig,
    RMSNorm,
    Rotary,
    attention_mask,
    init_weights,
)


class FeatureDraft(nn.Module):
    """A one-layer draft over (token embedding, hidden state) pairs with its own KV cache.

    At position t it reads h_t and the token x_{t+1} and predicts x_{t+2}; it returns its own
    output state, which the next draft step reads in place of h. Subclasses say how the two
    inputs are combined and what comes out.
    """

    num_cache_layers = 1

    def combine(self, emb: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, hidden, input_ids, positions, embed: nn.Embedding, cache=None):
        """hidden [B,T,H] at positions t, input_ids [B,T] = x_{t+1} -> output state [B,T,H]."""
        x = self.combine(embed(input_ids), hidden, positions)
        cos, sin = self.rotary(positions, x.dtype)
        cfg = self.config
        group = cfg.num_attention_heads // cfg.num_key_value_heads
        mask = (attention_mask(positions, cache.slots_read(positions), group, cache.visible)
                if cache is not None else None)
        x = self.block(x, cos, sin, cache.layer(0) if cache is not None else None, positions, mask)
        return self.finish(x)


class MTPLayer(FeatureDraft):
    """MiMo's MTP layer (SGLang `MiMoMTP`, served as NEXTN): weights under `model.mtp_layers.0.*`.

    input_proj [2H -> H, no bias] over [hidden_layernorm(h_t) ; token_layernorm(emb(x_{t+1}))],
    one Qwen2 decoder layer, final_layernorm. The token input is zeroed at position 0, as in SGLang.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.token_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_proj = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.block = Block(cfg)
        self.final_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg)
        init_weights(self)

    def combine(self, emb, hidden, positions):
        emb = emb.masked_fill((positions == 0).unsqueeze(-1), 0.0)
        return self.input_proj(torch.cat((self.hidden_layernorm(hidden), self.token_layernorm(emb)), dim=-1))

    def finish(self, x):
        return self.final_layernorm(x)


class EagleHead(FeatureDraft):
    """EAGLE-1 draft (SGLang `LlamaForCausalLMEagle`): fc [2H -> H, bias] over [emb(x_{t+1}) ; h_t],
    one Llama decoder layer without its input norm, no final norm; it regresses h_{t+1}."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=True)
        self.block = Block(cfg, input_norm=False)
        self.rotary = Rotary(cfg)
        init_weights(self)

    def combine(self, emb, hidden, positions):
        return self.fc(torch.cat((emb, hidden), dim=-1))

    def finish(self, x):
        return x


class MTPHeads(nn.Module):
    """k parallel (Medusa-style) heads: head i maps h_t to a state whose logits, through the
    target's LM head, predict x_{t+1+i}, i = 1..k. One forward gives all k proposals."""

    def __init__(self, hidden_size: int, num_heads: int, inner_size: int | None = None) -> None:
        super().__init__()
        self.hidden_size, self.num_heads = hidden_size, num_heads
        self.inner_size = inner_size or hidden_size
        self.heads = nn.ModuleList(
            nn.ModuleDict({"up": nn.Linear(hidden_size, self.inner_size), "down": nn.Linear(self.inner_size, hidden_size)})
            for _ in range(num_heads))
        for h in self.heads:
            nn.init.normal_(h["up"].weight, std=0.02)
            nn.init.zeros_(h["up"].bias)
            nn.init.zeros_(h["down"].weight)  # start as the identity: head i first guesses x_{t+1}
            nn.init.zeros_(h["down"].bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> states [..., k, H] (a residual SiLU MLP per head)."""
        return torch.stack([hidden + h["down"](F.silu(h["up"](hidden))) for h in self.heads], dim=-2)


# --- how they are trained: self-distillation against the target's distributions ---------------------


def soft_ce(logits: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of logits [..., V] against the teacher's distributions p [..., V], averaged over positions.

    The label is the target's whole distribution, not its argmax: a draft is accepted for agreeing with
    the target, and the soft label also says how sure the target was (self-distillation)."""
    return -(p * logits.float().log_softmax(-1)).sum(-1).mean()


def chained_soft_ce(depth_logits: Sequence[torch.Tensor], teacher: torch.Tensor,
                    weights: Sequence[float]) -> torch.Tensor:
    """The loss of a drafter chained over D = len(weights) draft steps, step d's soft_ce weighted by weights[d - 1].

    depth_logits[d - 1] [B, T, V] holds step d at every position p: the chain anchored at p - d + 1, which
    predicts the same token as teacher[:, p] [B, T, V]. A position p < d - 1 has no anchor at step d (the
    chain would start before the text), so it is left out. The weights are used as given: any averaging
    over depths (DeepSeek-V3's lambda / D) is in them."""
    if len(depth_logits) != len(weights):
        raise ValueError(f"{len(depth_logits)} depths of logits but {len(weights)} weights")
    # step d (0-based here) starts at position d: the first anchor is position 0
    return torch.stack([w * soft_ce(logits[:, d:], teacher[:, d:])
                        for d, (logits, w) in enumerate(zip(depth_logits, weights))]).sum()
