"""Lab 1's verification rules, batched in torch: what the decoder samples and accepts (Lab 2).

specdec.sim.verify is the numpy reference these are tested against. Each row has its own
temperature (0 = greedy), top-p and top-k. Randomness comes in as uniform numbers u in [0, 1)
drawn by the caller: a row's tokens then depend only on its own draws, and a step can run inside
a CUDA graph. Greedy is the temperature-0 case of the same rules: p is one-hot on the argmax,
a draft is accepted when it is that token, and sampling a one-hot distribution returns it.
Shapes: B rows, T positions, k drafts, V vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """logits.argmax(-1), the first of equal maxima. Compiled, in two passes over the vocabulary: each slice of 256
    logits' maximum, in parallel, then the best slice: inductor computes one argmax over 128k logits in one program
    (16 us of the 1B's compiled step on an H200, benchmarks/results/gpu_profile/stable_repeat_1b/kernels.json; the
    two passes were not timed apart from the rest of that session's changes)."""
    V = logits.shape[-1]
    width = 256
    while V % width:  # the widest slice (a power of two) that cuts V evenly
        width //= 2
    if width == 1 or not torch.compiler.is_compiling():
        return logits.argmax(-1)
    # [..., V/width]: each slice's first maximum (reshape: unflatten's super() call breaks dynamo's trace)
    best, at = logits.reshape(*logits.shape[:-1], V // width, width).max(-1)
    slice_ = best.argmax(-1, keepdim=True)  # the first slice holding the maximum
    return (slice_ * width + at.gather(-1, slice_)).squeeze(-1)


def truncate(probs: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Keep each row's top_k most likely tokens (0 = all) and the smallest set whose mass reaches
    top_p; renormalise. probs [B, T, V], top_p [B], top_k [B] -> [B, T, V]."""
    sorted_p, order = probs.sort(-1, descending=True)
    mass_before = sorted_p.cumsum(-1) - sorted_p  # mass of the tokens more likely than this one
    rank = torch.arange(probs.shape[-1], device=probs.device)
    keep = (mass_before < top_p.view(-1, 1, 1)) | (top_p.view(-1, 1, 1) >= 1)  # float sums may pass 1
    keep &= (top_k.view(-1, 1, 1) <= 0) | (rank < top_k.view(-1, 1, 1))
    kept = torch.zeros_like(probs).scatter(-1, order, sorted_p * keep)
    return kept / kept.sum(-1, keepdim=True)


def token_probs(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor | None = None,
                top_k: torch.Tensor | None = None) -> torch.Tensor:
    """The distribution each row samples from: logits [B, T, V], temperature [B] -> probs [B, T, V].
    A greedy row (temperature 0) gets a one-hot distribution on its argmax."""
    greedy = (temperature == 0).view(-1, 1, 1)
    t = torch.where(temperature == 0, 1.0, temperature).view(-1, 1, 1)
    probs = (logits.float() / t).softmax(-1)
    if top_p is not None:
        probs = truncate(probs, top_p, top_k)
    one_hot = F.one_hot(logits.argmax(-1), logits.shape[-1]).to(probs.dtype)
    return torch.where(greedy, one_hot, probs)


def sample(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token from each distribution probs [..., V] given u [...] in [0, 1): the inverse CDF,
    as Lab 1's sample_categorical. Zero-probability tokens are never chosen."""
    cdf = probs.cumsum(-1)
    idx = (cdf <= u.unsqueeze(-1) * cdf[..., -1:]).sum(-1)
    return idx.clamp(max=probs.shape[-1] - 1)


def accept(drafts: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor, u: torch.Tensor):
    """Speculative sampling of one block per row, all rows at once.

    drafts [B, k]; q [B, k, V] the distributions they were drawn from (None: deterministic drafts,
    q one-hot on each); p [B, k+1, V] the target's distributions at the block's positions;
    u [B, k+1] uniforms. Accept d_j while u_j q(d_j) < p(d_j); after the first rejection sample the
    normalised residual max(0, p - q) there; after k acceptances, a bonus token from p_k.
    Returns accepted [B] and next_token [B].
    """
    B, k = drafts.shape
    p_draft = p[:, :k].gather(-1, drafts.unsqueeze(-1)).squeeze(-1)  # [B, k]
    q_draft = torch.ones_like(p_draft) if q is None else q.gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
    agree = (u[:, :k] * q_draft < p_draft).int()  # u < p/q, without dividing by q
    accepted = agree.cumprod(1).sum(1)  # the leading run of acceptances
    rows = torch.arange(B, device=drafts.device)
    p_next = p[rows, accepted]  # [B, V]: the target at the first rejected (or the bonus) position
    j = accepted.clamp(max=k - 1)
    q_next = F.one_hot(drafts[rows, j], p.shape[-1]).to(p.dtype) if q is None else q[rows, j].to(p.dtype)
    residual = (p_next - q_next).clamp_min(0.0)
    dist = torch.where((accepted < k).unsqueeze(1), residual, p_next)
    # p == q leaves no residual, but then nothing is ever rejected: p is as good as anything there
    dist = torch.where(dist.sum(-1, keepdim=True) > 0, dist, p_next)
    return accepted, sample(dist, u[:, k])


def greedy_accept(drafts: torch.Tensor, target_logits: torch.Tensor):
    """Greedy verification, the temperature-0 case of `accept` (p one-hot on the argmax): drafts [B, k],
    target_logits [B, k+1, V] -> accepted [B] (leading drafts equal to the argmax), next_token [B]
    (the argmax after them). Read straight off the argmax: no distributions over the vocabulary."""
    B, k = drafts.shape
    best = argmax(target_logits)  # [B, k+1]
    accepted = (drafts == best[:, :k]).int().cumprod(1).sum(1)
    return accepted, best.gather(1, accepted.unsqueeze(1)).squeeze(1)


def candidates_accept(r: torch.Tensor, q: torch.Tensor | None, candidates: torch.Tensor, valid: torch.Tensor,
                      u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Several candidates for one position (SpecInfer's rule, Lab 1's multi_draft_verify_batch): candidate i is
    accepted while u_i q_i(x_i) < r(x_i), r starting at the target p; after each rejection r becomes the
    normalised residual max(0, r - q_i). r [B, V]; q [B, m, V] each candidate's draft distribution, or None:
    deterministic candidates (q_i one-hot on x_i: x_i accepted w.p. r(x_i), then r without x_i, SGLang's
    target-only tree sampling); candidates [B, m]; valid [B, m] (False: no candidate there); u [B, m].
    Returns index [B] of the accepted candidate (-1: none) and r [B, V], to sample where index is -1."""
    index = torch.full_like(candidates[:, 0], -1)
    for i in range(candidates.shape[1]):
        x = candidates[:, i : i + 1]
        q_i = F.one_hot(x[:, 0], r.shape[-1]).to(r.dtype) if q is None else q[:, i].to(r.dtype)
        open_ = (index < 0) & valid[:, i]
        ok = open_ & (u[:, i] * q_i.gather(1, x)[:, 0] < r.gather(1, x)[:, 0])
        index = torch.where(ok, i, index)
        residual = (r - q_i).clamp_min(0.0)
        mass = residual.sum(-1, keepdim=True)
        residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), r)  # no mass: never sampled (Lab 1)
        r = torch.where((open_ & ~ok).unsqueeze(1), residual, r)
    return index, r


def tree_greedy_accept(tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, depth: int,
                       target_logits: torch.Tensor, anc: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy verification of a tree: from the root, step to the child equal to the target's argmax at its parent,
    while there is one (siblings differ, so at most one is). tokens, parents, depths [B, N] with the root as node 0
    (parent -1, depth 0); target_logits [B, N, V]; anc [B, N, N] (tree.ancestors), when the caller has it. Returns
    accepted [B] (the last accepted node's depth), last [B] (that node) and next_token [B] (the target's argmax there)."""
    best = argmax(target_logits)  # [B, N]
    up = parents.clamp(min=0)
    agrees = (tokens == best.gather(1, up)) | (parents < 0)  # the root is always "accepted"
    if anc is not None:  # a node is on the walk when it and every ancestor agree: read off the ancestor rows at once
        on = (agrees.unsqueeze(1) | ~anc).all(-1)
    else:
        on = agrees
        for _ in range(depth):  # the same, one level per pass
            on = agrees & on.gather(1, up)
    last = torch.where(on, depths, -1).argmax(1)
    return depths.gather(1, last.unsqueeze(1))[:, 0], last, best.gather(1, last.unsqueeze(1))[:, 0]


def tree_accept(tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, depth: int, topk: int,
                p: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Speculative sampling of a tree of deterministic drafts, level by level: at the current node its children
    (up to topk) are the candidates of `candidates_accept` against the target p there; an accepted child becomes
    the current node, else the token is drawn from what r became (p itself at a node without children: the
    bonus). tokens, parents, depths [B, N] as for tree_greedy_accept; p [B, N, V]; u [B, depth * topk + 1].
    Returns accepted [B], last [B] and next_token [B]."""
    B, N = tokens.shape
    rows, ids = torch.arange(B, device=tokens.device), torch.arange(N, device=tokens.device)
    is_child = parents.unsqueeze(1) == ids.view(1, N, 1)  # [B, N, N]: [b, parent, child]
    kids = torch.where(is_child, ids, N).sort(-1).values[..., :topk]  # [B, N, topk], N: none
    node, moving, dist = torch.zeros_like(tokens[:, 0]), torch.ones_like(tokens[:, 0], dtype=torch.bool), p[:, 0]
    for level in range(depth):
        cand = kids[rows, node]  # [B, topk]
        valid = (cand < N) & moving.unsqueeze(1)
        index, r = candidates_accept(p[rows, node], None, tokens.gather(1, cand.clamp(max=N - 1)), valid,
                                     u[:, level * topk:(level + 1) * topk])
        dist = torch.where(moving.unsqueeze(1), r, dist)  # p at the node after its rejected children
        moving &= index >= 0
        node = torch.where(moving, cand.gather(1, index.clamp(min=0).unsqueeze(1))[:, 0], node)
    dist = torch.where(moving.unsqueeze(1), p[rows, node], dist)  # a leaf at full depth: the bonus
    return depths.gather(1, node.unsqueeze(1))[:, 0], node, sample(dist, u[:, -1])
