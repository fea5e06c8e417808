"""Verification of a block of k drafts for a batch of rows, in torch (Lab 2).

The Lab 1 rules (specdec.sim.verify), batched: row b proposed draft [b, :k]; the target scored the
k+1 positions (pending token, d_1..d_k) and its logits [b, j] predict the token after position j.
Each row accepts a prefix of its drafts (ragged across rows) and gets one more token from the
target: a correction after a rejection, or the bonus token when all k were accepted.
"""

from __future__ import annotations

import torch


def greedy_accept(draft: torch.Tensor, target_logits: torch.Tensor):
    """draft [B, k], target_logits [B, k+1, V] -> accept_length [B], next_token [B]."""
    t = target_logits.argmax(-1)  # [B, k+1]
    match = (draft == t[:, :-1]).int()
    accept_length = match.cumprod(1).sum(1)  # leading matches
    next_token = t.gather(1, accept_length.unsqueeze(1)).squeeze(1)
    return accept_length, next_token


def sample_accept(draft: torch.Tensor, q_probs: torch.Tensor | None, target_logits: torch.Tensor,
                  temperature: float, generator: torch.Generator | None = None):
    """Speculative sampling: accept d_j with prob min(1, p(d_j)/q(d_j)), left to right; after the
    first rejection sample the normalised residual max(0, p - q); after k acceptances a bonus from p.

    q_probs [B, k, V] are the distributions the drafts were sampled from; None means the proposer
    is deterministic (n-gram, oracle, greedy drafts): q is one-hot on the draft token.
    """
    B, k = draft.shape
    p = (target_logits.float() / temperature).softmax(-1)  # [B, k+1, V]
    p_draft = p[:, :k].gather(-1, draft.unsqueeze(-1)).squeeze(-1)  # [B, k]
    q_draft = torch.ones_like(p_draft) if q_probs is None else q_probs.gather(-1, draft.unsqueeze(-1)).squeeze(-1)
    u = torch.rand(B, k, device=draft.device, generator=generator)
    accepted = (u * q_draft < p_draft).int()  # u < p/q, without dividing by q
    accept_length = accepted.cumprod(1).sum(1)
    rows = torch.arange(B, device=draft.device)
    p_next = p[rows, accept_length]  # [B, V]: target row of the first rejected (or the bonus) position
    j = accept_length.clamp(max=k - 1)
    if q_probs is None:
        q_next = torch.nn.functional.one_hot(draft[rows, j], p.shape[-1]).to(p.dtype)
    else:
        q_next = q_probs[rows, j].float()
    residual = (p_next - q_next).clamp_min(0.0)
    dist = torch.where((accept_length < k).unsqueeze(1), residual, p_next)
    mass = dist.sum(-1, keepdim=True)
    dist = torch.where(mass > 0, dist / mass.clamp_min(1e-30), p_next)  # p == q: never rejected, p is fine
    next_token = torch.multinomial(dist, 1, generator=generator).squeeze(1)
    return accept_length, next_token


def sample_tokens(logits: torch.Tensor, temperature: float, generator: torch.Generator | None = None):
    """Plain decoding's choice: argmax at temperature 0, else a sample from softmax(logits / T)."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = (logits.float() / temperature).softmax(-1)
    return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator).view(probs.shape[:-1])
