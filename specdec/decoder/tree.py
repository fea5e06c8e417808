"""Tree drafts (Lab 2): several candidates per position, verified in one target forward.

A step's tree per row, laid out as specdec.sim.tree.DraftTree: n nodes below the root (the row's
pending token, not a node), parents[i] in -1..i-1 (-1: a child of the root), depth 1 for the
root's children. The drafter grows it as EAGLE-2 and SGLang do (`grow`): the topk likeliest tokens
of the root, then at each further depth the topk likeliest of the topk x topk children of the last
depth's beam, by cumulative draft log-probability; then the n = num_draft_tokens - 1 best of every
node it scored (the rerank). SGLang's convention: num_draft_tokens counts the root, so a chain of
k drafts is topk = 1, num_draft_tokens = k + 1, and that is the chain `autoregress` drafts.
The verify (step.tree_verify) prepends the root as node 0 of its block of N = n + 1 tokens.
Shapes: B rows, n nodes, N = n + 1 with the root, K topk, M fed nodes, S cache slots, V vocabulary, H hidden.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class TreeShape:
    """SGLang's three numbers: --num-steps (depth), --topk (branching), --num-draft-tokens (verify width, the
    root included)."""

    num_steps: int
    topk: int
    num_draft_tokens: int

    @classmethod
    def make(cls, num_steps: int, topk: int = 1, num_draft_tokens: int | None = None) -> "TreeShape":
        """Checked; num_draft_tokens None: every node the drafter scores at topk = 1 (the chain), else
        num_steps x topk + 1 (at most what it scores)."""
        for name, v in (("num_steps", num_steps), ("topk", topk)):
            if not (isinstance(v, int) and v >= 1):
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        most = 1 + topk + (num_steps - 1) * topk * topk  # the root and every node the drafter scores
        if num_draft_tokens is None:
            num_draft_tokens = num_steps + 1 if topk == 1 else min(most, num_steps * topk + 1)
        if not (isinstance(num_draft_tokens, int) and num_draft_tokens >= 2):
            raise ValueError(f"num_draft_tokens must be an integer >= 2, got {num_draft_tokens!r}")
        if topk == 1 and num_draft_tokens != num_steps + 1:
            raise ValueError(f"topk 1 is a chain: num_draft_tokens must be num_steps + 1 = {num_steps + 1} "
                             f"(as SGLang forces), got {num_draft_tokens}")
        if num_draft_tokens > most:
            raise ValueError(f"num_draft_tokens {num_draft_tokens} > {most}, the root and every node that topk "
                             f"{topk} over num_steps {num_steps} scores")
        return cls(num_steps, topk, num_draft_tokens)

    @property
    def nodes(self) -> int:
        """n: the drafts the target verifies, the root not counted."""
        return self.num_draft_tokens - 1

    @property
    def slots(self) -> int:
        """Cache slots a step writes past a row's committed length: the verify block, the drafter's fed nodes."""
        return max(self.num_steps + 1, self.num_draft_tokens, (self.num_steps - 1) * self.topk)


@dataclass
class TreeDrafts:
    """One tree per row (the module's docstring): what `propose_tree` hands to the verify."""

    tokens: torch.Tensor  # [B, n] the draft tokens
    parents: torch.Tensor  # [B, n] -1..i-1, -1: a child of the root
    depths: torch.Tensor  # [B, n] 1..depth
    scores: torch.Tensor  # [B, n] cumulative draft log-probability
    depth: int  # num_steps: the deepest a node can be (known on the host)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """tokens, parents, depths, scores: what a captured step returns or reads (TreeDrafts(*t, depth) again)."""
        return self.tokens, self.parents, self.depths, self.scores

    def block(self, root: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The verify block with the root as node 0: root [B] -> tokens, parents (root -1), depths (root 0), each [B, N]."""
        z = torch.zeros_like(root).unsqueeze(1)
        return (torch.cat([root.unsqueeze(1), self.tokens], 1), torch.cat([z - 1, self.parents + 1], 1),
                torch.cat([z, self.depths], 1))


def ancestors(parents: torch.Tensor) -> torch.Tensor:
    """parents [B, N] (-1: none, a parent before its child) -> [B, N, N] bool: j is i or an ancestor of i.
    By doubling: A[i, j] = "j is within s steps above i"; A squared reaches 2s steps, so log2(N) products
    cover the deepest path (a few kernels, not one pass per level: a tree's draft builds this at every depth)."""
    B, N = parents.shape
    eye = torch.eye(N, dtype=torch.bool, device=parents.device)
    up = torch.zeros(B, N, N, dtype=torch.bool, device=parents.device)  # up[i, j]: j is i's parent
    up.scatter_(2, parents.clamp(min=0).unsqueeze(-1), (parents >= 0).unsqueeze(-1))
    anc, reach = (eye | up).float(), 1  # within one step
    while reach < N - 1:
        anc, reach = (anc @ anc).clamp(max=1), 2 * reach  # within 2 x reach steps (0/1 sums: exact in fp32)
    return anc.bool()


def tree_mask(lengths: torch.Tensor, parents: torch.Tensor, span: int) -> torch.Tensor:
    """Which cache slots each of N tree nodes sees, the node i written at slot lengths + i: the committed
    prefix (slots < lengths [B]) and its ancestors and itself. parents [B, N] -> [B, N, span] bool."""
    return visible_slots(lengths, ancestors(parents), span)


def visible_slots(lengths: torch.Tensor, seen: torch.Tensor, span: int) -> torch.Tensor:
    """tree_mask from the ancestor rows: seen [B, T, N] (which of the N tree nodes, written at slots
    lengths + 0..N-1, each of T tokens sees) -> [B, T, span] bool, the committed prefix included."""
    N = seen.shape[2]
    rel = torch.arange(span, device=seen.device) - lengths.view(-1, 1, 1)  # [B, 1, S]: slot - lengths
    in_tree = (rel >= 0) & (rel < N)
    return (rel < 0) | (in_tree & seen.gather(2, rel.clamp(0, N - 1).expand(-1, seen.shape[1], -1)))


# forward(depth, states [B, K, H], tokens [B, K], seen [B, K, M]) -> (states [B, K, H], logits [B, K, V]):
# the drafter reads the last K fed nodes (depth `depth`, written at slots lengths + M - K ..; seen: which of
# the M fed nodes each of them sees, its ancestors and itself) and returns what it predicts after each
Forward = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def grow(logits: torch.Tensor, state: torch.Tensor, shape: TreeShape, forward: Forward) -> TreeDrafts:
    """EAGLE-2's draft tree: logits [B, V] and the drafter's state [B, 1, H] after the root, expanded
    (module docstring). Returns the best shape.nodes nodes, every parent before its children."""
    B, K = logits.shape[0], shape.topk
    score, tok = logits.float().log_softmax(-1).topk(K, -1)  # [B, K] depth 1, the first beam
    pool_tok, pool_score, pool_parent, pool_depth = [tok], [score], [torch.full_like(tok, -1)], [1]
    beam, states = torch.arange(K, device=tok.device).expand(B, K), state.expand(B, K, -1)
    eye = torch.eye(K, dtype=torch.bool, device=tok.device).expand(B, K, K)
    seen = eye  # [B, K, M]: which fed nodes the K fed now see (M = depth * K; depth 1's see themselves)
    for depth in range(1, shape.num_steps):
        out, logits = forward(depth, states, tok, seen)
        s, t = logits.float().log_softmax(-1).topk(K, -1)  # [B, K, K]: each beam node's K best children
        cum = (score.unsqueeze(-1) + s).flatten(1)  # [B, K*K]
        offset = sum(p.shape[1] for p in pool_tok)
        pool_tok.append(t.flatten(1))
        pool_score.append(cum)
        pool_parent.append(beam.repeat_interleave(K, 1))
        pool_depth.append(depth + 1)
        score, best = cum.topk(K, -1)  # the next beam
        which = best // K  # its parents, among this depth's fed nodes
        beam, tok = offset + best, t.flatten(1).gather(1, best)
        states = out.gather(1, which.unsqueeze(-1).expand(-1, -1, out.shape[-1]))
        # the next K see what their parent saw, and themselves (one gather a depth, not a walk up the tree)
        seen = torch.cat([seen.gather(1, which.unsqueeze(-1).expand(-1, -1, seen.shape[2])), eye], 2)
    # the rerank: a child scores at most its parent, and comes after it in the pool, so a stable sort keeps
    # every chosen node's parent chosen
    scores, parent = torch.cat(pool_score, 1), torch.cat(pool_parent, 1)
    depths = torch.cat([torch.full_like(t, d) for t, d in zip(pool_tok, pool_depth)], 1)
    keep = scores.sort(dim=1, descending=True, stable=True).indices[:, : shape.nodes].sort(1).values  # [B, n]
    index = torch.full_like(scores, -1, dtype=torch.long).scatter(
        1, keep, torch.arange(shape.nodes, device=keep.device).expand_as(keep))  # pool -> tree index
    kept_parent = parent.gather(1, keep)
    parents = torch.where(kept_parent >= 0, index.gather(1, kept_parent.clamp(min=0)), -1)
    return TreeDrafts(torch.cat(pool_tok, 1).gather(1, keep), parents, depths.gather(1, keep), scores.gather(1, keep),
                      shape.num_steps)


def path_nodes(anc: torch.Tensor, depths: torch.Tensor, last: torch.Tensor, depth: int) -> torch.Tensor:
    """The nodes from the root down to `last` [B]: path [B, depth + 1], path[:, d] the node at depth d (past
    last's depth: the root). anc [B, N, N] from `ancestors`, depths [B, N] (root 0)."""
    rows = torch.arange(anc.shape[0], device=anc.device)
    on_path = anc[rows, last]  # [B, N]
    at = on_path.unsqueeze(1) & (depths.unsqueeze(1) == torch.arange(depth + 1, device=anc.device).view(1, -1, 1))
    return at.int().argmax(-1)  # [B, depth + 1]
