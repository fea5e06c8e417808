"""Tree speculation, simulated: several candidates per position, one target pass over every node.

A draft tree hangs below the last committed token (the root, not a node). Node i has a parent
parents[i] < i (-1: a child of the root) and accept[i] = P(node i is accepted | its parent was).
Siblings are exclusive: under greedy verification at most one child equals the target's argmax,
so the accepts of one node's children sum to at most 1. The accepted path is unique; the step emits
it and one token of the target's own, so tau = accepted + 1 as for a chain.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from specdec.sim import formulas

SUM_ATOL = 1e-9  # sibling accepts may sum past 1 by this much (rounding)


@dataclass(frozen=True)
class DraftTree:
    """A draft tree as parent indices and per-node acceptance (see the module's docstring)."""

    parents: tuple[int, ...]
    accept: tuple[float, ...]

    def __post_init__(self) -> None:
        parents, accept = tuple(int(x) for x in self.parents), tuple(float(x) for x in self.accept)
        object.__setattr__(self, "parents", parents)
        object.__setattr__(self, "accept", accept)
        if not parents or len(parents) != len(accept):
            raise ValueError(f"need one parent and one accept per node, got {len(parents)} and {len(accept)}")
        if any(not -1 <= p < i for i, p in enumerate(parents)):
            raise ValueError(f"parents[i] must be in -1..i-1 (a parent comes before its children), got {parents}")
        a = formulas._check_alpha(accept)
        sums = np.zeros(len(parents) + 1)
        np.add.at(sums, np.array(parents) + 1, a)
        if np.any(sums > 1 + SUM_ATOL):
            raise ValueError(f"the accepts of one node's children sum past 1 ({sums.max():.4f}): siblings are exclusive")

    @classmethod
    def chain(cls, alphas: ArrayLike) -> "DraftTree":
        """k drafts in a row: alphas[i] = P(draft i + 1 accepted | the drafts before it were)."""
        a = np.ravel(alphas)
        return cls(tuple(range(-1, len(a) - 1)), tuple(a))

    @classmethod
    def full(cls, widths: ArrayLike, rank_accept: ArrayLike) -> "DraftTree":
        """Every node at depth d has widths[d] children; the child of rank r is accepted w.p. rank_accept[r]."""
        ranks = np.ravel(rank_accept)
        if max(widths) > len(ranks):
            raise ValueError(f"widths {list(widths)} need rank_accept for {max(widths)} ranks, got {len(ranks)}")
        parents, accept, level = [], [], [-1]
        for w in widths:
            nxt = []
            for parent in level:
                for r in range(int(w)):
                    nxt.append(len(parents))
                    parents.append(parent)
                    accept.append(ranks[r])
            level = nxt
        return cls(tuple(parents), tuple(accept))

    @classmethod
    def best(cls, nodes: int, rank_accept: ArrayLike, max_depth: int | None = None) -> "DraftTree":
        """The `nodes` nodes most likely to be accepted (EAGLE-2's rerank, SpecInfer/Sequoia's optimal tree):
        best first from the root, each node's children ranked 0, 1, ... with rank_accept."""
        ranks = [float(x) for x in np.ravel(rank_accept)]
        heap = [(-ranks[r], r, -1, 1, ranks[r]) for r in range(len(ranks))]  # (-reach, tie, parent, depth, accept)
        heapq.heapify(heap)
        parents, accept, tie = [], [], len(ranks)
        while heap and len(parents) < nodes:
            neg_reach, _, parent, depth, a = heapq.heappop(heap)
            me = len(parents)
            parents.append(parent)
            accept.append(a)
            if max_depth is None or depth < max_depth:
                for r, ar in enumerate(ranks):
                    heapq.heappush(heap, (neg_reach * ar, tie, me, depth + 1, ar))
                    tie += 1
        return cls(tuple(parents), tuple(accept))

    @property
    def size(self) -> int:
        """Nodes the target verifies (besides the root's position)."""
        return len(self.parents)

    def depths(self) -> np.ndarray:
        """Depth of every node: 1 for the root's children."""
        d = np.zeros(self.size, dtype=np.int64)
        for i, p in enumerate(self.parents):
            d[i] = 1 if p < 0 else d[p] + 1
        return d

    @property
    def depth(self) -> int:
        """The longest path: the draft forward passes that build the tree (one per depth) and the most accepted."""
        return int(self.depths().max())

    def reach(self) -> np.ndarray:
        """P(node i accepted) = the product of accept along the path from the root to i."""
        r = np.zeros(self.size)
        for i, (p, a) in enumerate(zip(self.parents, self.accept)):
            r[i] = a * (1.0 if p < 0 else r[p])
        return r

    def expected_accepted(self) -> float:
        """Expected accepted drafts per step: each node counts once, with the chance that it is accepted."""
        return float(self.reach().sum())

    def tau(self) -> float:
        """Expected tokens per verify step: accepted drafts + 1."""
        return self.expected_accepted() + 1.0

    def path_to(self, node: int) -> list[int]:
        """The nodes from the root's child down to `node` (none for -1, the root)."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def simulate(self, steps: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Monte Carlo of greedy verification: (accepted drafts (steps,), the last accepted node, -1 for none).
        At each node one uniform picks the child whose slice of [0, 1) it falls in (children in order, each
        slice as wide as its accept), or none."""
        n = self.size
        children = [[] for _ in range(n + 1)]  # row 0: the root's children, row i + 1: node i's
        for i, p in enumerate(self.parents):
            children[p + 1].append(i)
        width = max(len(c) for c in children)
        child = np.full((n + 1, width + 1), -1)  # the last column: no child accepted
        cum = np.full((n + 1, width), np.inf)
        for row, kids in enumerate(children):
            child[row, : len(kids)] = kids
            cum[row, : len(kids)] = np.cumsum([self.accept[i] for i in kids])
        row, accepted = np.zeros(steps, dtype=np.int64), np.zeros(steps, dtype=np.int64)
        alive = np.ones(steps, dtype=bool)
        for _ in range(self.depth):
            u = rng.random(steps)
            picked = child[row, (cum[row] <= u[:, None]).sum(1)]  # the first slice whose end is past u
            alive &= picked >= 0
            accepted += alive
            row = np.where(alive, picked + 1, row)
        return accepted, row - 1


def tree_speedup(tree: DraftTree, c: float, v: float) -> float:
    """Speedup over plain decoding: a draft pass costs c target steps (one per depth) and the verify 1 + v per
    node (v: the cost of one more verified position). formulas.speedup_from_costs with t_plain = 1."""
    return float(formulas.speedup_from_costs(tree.tau(), 1.0, c, 1.0 + v * tree.size, tree.depth))


def tree_pays(tree: DraftTree, chain_alpha: float, c: float, v: float) -> tuple[bool, float, float, int]:
    """Does the tree beat the best chain (drafts accepted w.p. chain_alpha, any k <= the tree's size) at these
    costs? Returns (pays, tree's speedup, best chain's speedup, its k)."""
    ks = range(1, tree.size + 1)
    chains = [tree_speedup(DraftTree.chain(np.full(k, chain_alpha)), c, v) for k in ks]
    best = int(np.argmax(chains))
    mine = tree_speedup(tree, c, v)
    return mine > chains[best], mine, chains[best], best + 1
