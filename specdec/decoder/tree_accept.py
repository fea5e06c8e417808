"""Per-depth acceptance of draft trees, measured on the decoder, in the form Lab 1's DraftTree reads.

Lab 1 predicts a tree's accept length from one number per node: accept = P(the node is accepted | its parent
was). Measured, that number is a table over depth d, the number of siblings w (the parent's children) and the
sibling rank r (rank 0: the drafter's likeliest child): offered[d - 1, w - 1, r] counts the steps where the path
down to depth d - 1 was accepted and its node there had w children; hits[d - 1, w - 1, r] those where the target's
token at depth d was the child of rank r. The number of siblings matters: EAGLE-2's rerank keeps a second child
only where the drafter hesitates, and there its first guess is weaker than at an average node (pooled over w, the
ranks' acceptances can sum past 1). A chain is the tree with one child per node (w = 1, rank 0).
`TreeRecorder` reads the table from an Engine's tree steps; `DepthAcceptance.from_chain` from a chain's accepted
counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specdec.sim.tree import DraftTree


@dataclass
class DepthAcceptance:
    """hits and offered [D, W, R]: depth 1..D, siblings 1..W, sibling rank 0..R-1 (the module's docstring)."""

    hits: np.ndarray
    offered: np.ndarray

    @property
    def accept(self) -> np.ndarray:
        """[D, W, R] P(the rank-r child of w at depth d is the target's token | the path to its parent was
        accepted); 0 where no step offered one."""
        return np.divide(self.hits, self.offered, out=np.zeros(self.hits.shape), where=self.offered > 0)

    @property
    def by_rank(self) -> np.ndarray:
        """[D, R] pooled over the number of siblings: P(the rank-r child is the target's token | it was offered)."""
        return np.divide(self.hits.sum(1), self.offered.sum(1), out=np.zeros(self.hits.shape[::2]),
                         where=self.offered.sum(1) > 0)

    def tree(self, parents: np.ndarray, widths: np.ndarray, ranks: np.ndarray, depths: np.ndarray) -> DraftTree:
        """Lab 1's DraftTree of this shape (parents -1..i-1; each node's siblings, sibling rank and depth 1..D),
        each node's accept read from the table."""
        return DraftTree(tuple(parents), tuple(self.accept[np.asarray(depths) - 1, np.asarray(widths) - 1,
                                                           np.asarray(ranks)]))

    @classmethod
    def from_chain(cls, accepted: np.ndarray, k: int) -> "DepthAcceptance":
        """A chain of k drafts per step: accepted [steps] (0..k) -> the table with one sibling of rank 0."""
        a = np.asarray(accepted)
        d = np.arange(1, k + 1)[:, None]
        return cls((a >= d).sum(1).astype(float).reshape(k, 1, 1), (a >= d - 1).sum(1).astype(float).reshape(k, 1, 1))

    def chain(self) -> DraftTree:
        """Lab 1's chain of this table's depth, fed its rank-0 acceptance with no siblings."""
        return DraftTree.chain(self.accept[:, 0, 0])


def siblings(parents: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each node's number of siblings (its parent's children, itself included) and its rank among them by
    draft score (0: the likeliest)."""
    widths, ranks = np.zeros(len(parents), dtype=np.int64), np.zeros(len(parents), dtype=np.int64)
    for p in np.unique(parents):
        kids = np.flatnonzero(parents == p)
        widths[kids] = len(kids)
        ranks[kids[np.argsort(-scores[kids], kind="stable")]] = np.arange(len(kids))
    return widths, ranks


@dataclass
class TreeStep:
    """One row's tree step: its shape (parents, siblings, sibling ranks, depths [n]) and its accepted path."""

    parents: np.ndarray
    widths: np.ndarray
    ranks: np.ndarray
    depths: np.ndarray
    path: list[int]  # the accepted nodes, depth 1, 2, ...
    missed: bool  # the walk stopped at a node whose children all missed (not at a leaf)


@dataclass
class TreeRecorder:
    """Records an Engine's tree steps (topk > 1, greedy) through its `on_tree_step` hook: every running row's tree,
    the target's token at each depth of the accepted path, and so the table of per-depth acceptance."""

    steps: list[TreeStep] = field(default_factory=list)

    def attach(self, engine) -> "TreeRecorder":
        engine.on_tree_step = self
        return self

    def __call__(self, tree, emitted, accepted, slots: list[int]) -> None:
        """tree: the step's TreeDrafts; emitted [B][D + 1] the accepted path's tokens then the target's own;
        accepted [B] (each row's RowStep, as to_host reads them); slots: the running rows."""
        tokens, parents, depths = (x.cpu().numpy() for x in (tree.tokens, tree.parents, tree.depths))
        scores, emitted, accepted = tree.scores.float().cpu().numpy(), np.asarray(emitted), np.asarray(accepted)
        for b in slots:
            widths, ranks = siblings(parents[b], scores[b])
            path, missed = [], False
            for d in range(1, tree.depth + 1):  # the greedy walk: the child equal to the target's token at depth d
                kids = np.flatnonzero(parents[b] == (path[-1] if path else -1))
                match = kids[tokens[b, kids] == emitted[b, d - 1]]
                if len(match) == 0:
                    missed = len(kids) > 0
                    break
                path.append(int(match[0]))
            if len(path) != accepted[b]:
                raise AssertionError(f"the walk kept {len(path)} drafts, the verify {accepted[b]}")
            self.steps.append(TreeStep(parents[b].copy(), widths, ranks, depths[b].copy(), path, missed))

    def table(self) -> DepthAcceptance:
        """Counts over every recorded step: at each depth the walk reached, every child there was offered."""
        D = max(int(s.depths.max()) for s in self.steps)
        W = max(int(s.widths.max()) for s in self.steps)
        hits, offered = np.zeros((D, W, W)), np.zeros((D, W, W))
        for s in self.steps:
            parents = ([-1] + s.path)[: len(s.path) + s.missed]  # the nodes whose children the target saw
            for d, parent in enumerate(parents, start=1):
                kids = s.parents == parent
                offered[d - 1, kids.sum() - 1, s.ranks[kids]] += 1
                if d <= len(s.path):
                    node = s.path[d - 1]
                    hits[d - 1, s.widths[node] - 1, s.ranks[node]] += 1
        return DepthAcceptance(hits, offered)

    def measured_by_depth(self) -> np.ndarray:
        """[D] the share of recorded steps that accepted at least d drafts, d = 1..D."""
        D = max(int(s.depths.max()) for s in self.steps)
        return (np.array([len(s.path) for s in self.steps])[:, None] >= np.arange(1, D + 1)).mean(0)

    def predicted_by_depth(self, table: DepthAcceptance | None = None) -> np.ndarray:
        """[D] Lab 1's P(at least d drafts accepted) on each recorded step's own tree, fed the table (this
        recording's by default), averaged over the steps: the sum of the reach of the nodes at depth d."""
        table = table if table is not None else self.table()
        D = max(int(s.depths.max()) for s in self.steps)
        out = np.zeros(D)
        for s in self.steps:
            np.add.at(out, s.depths - 1, table.tree(s.parents, s.widths, s.ranks, s.depths).reach())
        return out / len(self.steps)

    def measured_tau(self) -> float:
        """Mean accepted + 1 over the recorded steps."""
        return float(self.measured_by_depth().sum()) + 1.0

    def predicted_tau(self, table: DepthAcceptance | None = None) -> float:
        """Lab 1's formula on each recorded step's own tree, fed the table (this recording's by default), averaged."""
        return float(self.predicted_by_depth(table).sum()) + 1.0
