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

from specdec.decoder.params import TreeShape


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
    return TreeSlots.make(lengths, seen.shape[2], span).visible(seen)


@dataclass
class TreeSlots:
    """Where N tree nodes sit in a cache view of S slots: node i at slot lengths + i. Made once per step, so that
    a draft's mask at each depth is three kernels (`visible`): under a graph a kernel costs microseconds, whatever
    its size, and the step's kernels are its cost at the zoo's size."""

    prefix: torch.Tensor  # [B, 1, S] the committed slots (< lengths), which every node sees
    inside: torch.Tensor  # [B, 1, S] the tree's slots
    node: torch.Tensor  # [B, 1, S] the node at each slot (clamped into 0..N-1 outside the tree)

    @classmethod
    def make(cls, lengths: torch.Tensor, n: int, span: int) -> "TreeSlots":
        rel = torch.arange(span, device=lengths.device) - lengths.view(-1, 1, 1)  # [B, 1, S]: slot - lengths
        return cls(rel < 0, (rel >= 0) & (rel < n), rel.clamp(0, max(n, 1) - 1))

    def visible(self, seen: torch.Tensor) -> torch.Tensor:
        """seen [B, T, N] (which nodes each of T tokens sees) -> [B, T, S] bool: the prefix, and those nodes' slots."""
        return self.prefix | (self.inside & seen.gather(2, self.node.expand(-1, seen.shape[1], -1)))


# forward(depth, states [B, K, H], tokens [B, K], seen [B, K, F]) -> (states [B, K, H], logits [B, K, V]): the
# drafter reads the K fed nodes of depth `depth` (F = (num_steps - 1) x K fed in all, depth by depth, fed node f
# written at slot lengths + f; seen: which of the F each of them sees, its ancestors and itself, none of the
# depths not yet fed) and returns what it predicts after each
Forward = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def grow(logits: torch.Tensor, state: torch.Tensor, shape: TreeShape, forward: Forward) -> TreeDrafts:
    """EAGLE-2's draft tree: logits [B, V] and the drafter's state [B, 1, H] after the root, expanded
    (module docstring). Returns the best shape.nodes nodes, every parent before its children.
    The pool of scored nodes: depth 1's K, then K x K per depth (the K children of each of the K fed beam nodes).
    Per depth only what the next depth needs is computed (a draft step's kernels are its cost): the pool's
    parents and depths are built once, at the end."""
    B, K, D, dev = logits.shape[0], shape.topk, shape.num_steps, logits.device
    F = (D - 1) * K  # fed nodes: the beams of depths 1..D-1
    score, tok = logits.log_softmax(-1, dtype=torch.float32).topk(K, -1)  # [B, K] depth 1, the first beam
    pool_tok, pool_score, beams = [tok], [score], []
    states = state.expand(B, K, -1)
    own = torch.eye(F, dtype=torch.bool, device=dev).view(D - 1, K, F) if F else None  # [D-1, K, F]
    seen = own[0].expand(B, K, F) if F else None  # [B, K, F]: depth 1's fed nodes see themselves
    for depth in range(1, D):
        out, logits = forward(depth, states, tok, seen)
        s, t = logits.log_softmax(-1, dtype=torch.float32).topk(K, -1)  # [B, K, K]: each beam node's K best children
        cum = (score.unsqueeze(-1) + s).flatten(1)  # [B, K*K]
        pool_tok.append(t.flatten(1))
        pool_score.append(cum)
        if depth + 1 < D:  # the next beam, fed at the next depth (the deepest depth's is never fed)
            score, best = cum.topk(K, -1)
            beams.append(best)
            which = best // K  # its parents, among this depth's fed nodes
            tok = t.flatten(1).gather(1, best)
            states = out.gather(1, which.unsqueeze(-1).expand(-1, -1, out.shape[-1]))
            # the next K see what their parent saw, and themselves (one gather a depth, not a walk up the tree)
            seen = seen.gather(1, which.unsqueeze(-1).expand(-1, -1, F)) | own[depth]
    # the pool's parents: fed node f (depth g + 1, g = f // K) is pool node f at depth 1, else K + (g - 1) K^2 +
    # its beam index in its depth's K^2; every fed node's K children follow, depth by depth
    g = torch.arange(F, device=dev) // K
    first = torch.where(g > 0, K + (g - 1) * K * K, 0)  # [F] the pool index of each fed node's depth's first node
    fed = torch.cat([torch.arange(K, device=dev).expand(B, K), *beams], 1)[:, :F] + first  # [B, F] pool indices
    parent = torch.cat([torch.full_like(tok[:, :1], -1).expand(B, K), fed.repeat_interleave(K, 1)], 1)  # [B, P]
    depths = torch.cat([torch.ones(K, dtype=torch.long, device=dev), (g + 2).repeat_interleave(K)]).expand(B, -1)
    # the rerank: a child scores at most its parent, and comes after it in the pool, so a stable sort keeps
    # every chosen node's parent chosen
    scores = torch.cat(pool_score, 1)
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
