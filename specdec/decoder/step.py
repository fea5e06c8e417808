"""One decoding step for a batch of rows: plain, or verify-and-commit of k drafts.

Follow one token: the engine admits a prompt into a free row (engine.py: the target reads it and
samples the first token, the *pending* one); a speculative step has the proposer guess k tokens
(proposers.py), then `verify` here feeds [pending, d1..dk] to the target in one forward that
writes their keys and values provisionally (model.py, kv_cache.py), `accept` keeps the leading
drafts the target agrees with plus one token of its own (verify.py), and `commit` moves the row's
cache length over what was kept: the rest of the block is rolled back by not counting it.
Shapes: B rows, k drafts, S token slots, E stop ids, V vocabulary, H hidden.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import NamedTuple

import torch

from specdec.decoder.kv_cache import KVCache
from specdec.decoder.tree import TreeDrafts, ancestors, path_nodes, visible_slots
from specdec.decoder.verify import accept, argmax, greedy_accept, sample, token_probs, tree_accept, tree_greedy_accept


@dataclass
class Rows:
    """The per-row state of a batch, in fixed tensors that a step updates in place.

    `lengths` is the target KV cache's own tensor of committed lengths (the same tensor, not a
    copy); a row's pending token, emitted but not yet in the cache, is tokens[b, lengths[b]].
    Finished and free rows have done = True and ride along in the fixed shape without advancing.
    """

    tokens: torch.Tensor  # [B, S] prompt and generated tokens
    lengths: torch.Tensor  # [B] committed positions = the target cache's lengths
    n_new: torch.Tensor  # [B] tokens generated so far
    max_new: torch.Tensor  # [B] the row's budget of new tokens
    done: torch.Tensor  # [B] bool
    temperature: torch.Tensor  # [B] 0 = greedy
    top_p: torch.Tensor  # [B] 1 = no limit
    top_k: torch.Tensor  # [B] 0 = no limit
    eos: torch.Tensor  # [B, E] ids that end the row, -1 for none
    sampling: bool = False  # some row has temperature > 0 (decided on the host: no sync)
    truncating: bool = False  # some row has top_p < 1 or top_k > 0
    span: int | None = None  # cache slots attention reads this step, every cache alike (KVCache.span)

    @classmethod
    def empty(cls, cache: KVCache, slots: int, n_eos: int) -> "Rows":
        B, dev = cache.batch, cache.lengths.device
        z = lambda dtype=torch.long: torch.zeros(B, dtype=dtype, device=dev)  # noqa: E731
        return cls(torch.zeros(B, slots, dtype=torch.long, device=dev), cache.lengths, z(), z(),
                   torch.ones(B, dtype=torch.bool, device=dev), z(torch.float32), torch.ones(B, device=dev), z(),
                   torch.full((B, max(1, n_eos)), -1, dtype=torch.long, device=dev))

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return tuple(getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), torch.Tensor))

    def view(self, start: int, stop: int) -> "Rows":
        """Rows start..stop-1, sharing memory with these."""
        return Rows(*(t[start:stop] for t in self.tensors()), sampling=self.sampling, truncating=self.truncating,
                    span=self.span)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """What each row samples from at each position: logits [B, T, V] -> probs [B, T, V]."""
        if self.truncating:
            return token_probs(logits, self.temperature, self.top_p, self.top_k)
        return token_probs(logits, self.temperature)


def commit(rows: Rows, cache: KVCache, emitted: torch.Tensor, n_emitted: torch.Tensor) -> torch.Tensor:
    """Keep each running row's first n_emitted [B] tokens of emitted [B, W] (fewer at a stop id or
    at its budget): write them after the pending token and move the cache length over the slots
    they follow. Returns count [B], the tokens kept (0 for a finished or free row)."""
    W = emitted.shape[1]
    j = torch.arange(W, device=emitted.device)
    is_stop = (emitted.unsqueeze(-1) == rows.eos.unsqueeze(1)).any(-1) & (j < n_emitted.unsqueeze(1))  # [B, W]
    first_stop = torch.where(is_stop.any(1), is_stop.int().argmax(1), W)
    count = torch.minimum(torch.minimum(n_emitted, first_stop + 1), rows.max_new - rows.n_new)
    count = torch.where(rows.done, 0, count)
    keep = j < count.unsqueeze(1)
    idx = (rows.lengths + 1).unsqueeze(1) + j  # [B, W]: the slots after the pending token
    rows.tokens.scatter_(1, idx, torch.where(keep, emitted, rows.tokens.gather(1, idx)))
    cache.commit(count, check=False)  # the pending token and the accepted drafts; sized up front
    rows.n_new += count
    rows.done |= (is_stop & keep).any(1) | (rows.n_new >= rows.max_new)
    return count


def readout(rows: Rows, count: torch.Tensor, accepted: torch.Tensor, emitted: torch.Tensor,
            drafts: torch.Tensor) -> torch.Tensor:
    """What the host learns from a step, packed in one tensor [B, 3 + W + k]: count, accepted, done, the
    emitted [B, W] and the drafts [B, k]. Built inside the step (and its CUDA graph), so that the step's
    one sync is one copy; `to_host` unpacks it, by name."""
    return torch.cat([count.unsqueeze(1), accepted.unsqueeze(1), rows.done.long().unsqueeze(1), emitted, drafts], 1)


class RowStep(NamedTuple):
    """One row's step, as the host reads it."""

    count: int  # tokens kept: the first `count` of `emitted` (0 for a finished or free row)
    accepted: int  # drafts the target agreed with, 0..k (tau = accepted + 1); -1 when nothing was proposed
    done: bool  # the row finished (a stop id, or its budget)
    emitted: list[int]  # [W]: the accepted drafts, then the target's own token
    drafts: list[int]  # [k]: what the proposer guessed (empty for a plain step)

    @property
    def tokens(self) -> list[int]:
        """The tokens this step added to the row."""
        return self.emitted[: self.count]


def to_host(packed: torch.Tensor, width: int) -> list[RowStep]:
    """The step's one sync: readout's tensor [B, 3 + W + k] copied to the host, one RowStep per row."""
    return [RowStep(r[0], r[1], bool(r[2]), r[3 : 3 + width], r[3 + width :]) for r in packed.tolist()]


def plain_step(target, cache: KVCache, rows: Rows, u: torch.Tensor | None):
    """Plain decoding: the target reads each row's pending token and samples the next, u [B]
    (None when every row is greedy). Returns emitted [B, 1] and count [B]."""
    emitted, count, _ = plain_step_hidden(target, cache, rows, u)
    return emitted, count


def plain_step_hidden(target, cache: KVCache, rows: Rows, u: torch.Tensor | None):
    """plain_step, also returning the target's hidden state [B, 1, H] at the pending token: what a proposer
    reads after a step in which it proposed nothing (the engine's adaptive k chose k = 0)."""
    pos = rows.lengths.unsqueeze(1)  # [B, 1]: the pending token's position
    logits, hidden = target(rows.tokens.gather(1, pos), pos, cache)  # writes its key and value
    if rows.sampling:
        emitted = sample(rows.probs(logits)[:, 0], u).unsqueeze(1)
    else:  # every row greedy: the argmax, which is what sampling its one-hot distribution returns
        emitted = argmax(logits)
    return emitted, commit(rows, cache, emitted, torch.ones_like(rows.n_new)), hidden


def verify(target, cache: KVCache, rows: Rows, drafts: torch.Tensor, q: torch.Tensor | None,
           u: torch.Tensor | None, forced: torch.Tensor | None = None):
    """Verify drafts [B, k] (drawn from q [B, k, V], or deterministic: None) in one target forward
    over [pending, d1..dk] at each row's next k+1 positions, then commit; u [B, k+1] (None when every
    row is greedy and q is None). forced [B]: an oracle's number of drafts to keep, whatever the target says
    (the engine's simulated acceptance; then the output is not the target's), None: the target decides.
    Returns emitted [B, k+1], count [B], accepted [B] and the target's hidden [B, k+1, H]."""
    k = drafts.shape[1]
    pos = cache.positions(k + 1)  # [B, k+1]
    block = torch.cat([rows.tokens.gather(1, pos[:, :1]), drafts], 1)
    logits, hidden = target(block, pos, cache)  # provisional writes: lengths do not move
    if forced is not None:  # the forced drafts, then the target's own token after them: what it reads is kept
        accepted = forced.clamp(max=k)
        after = logits.gather(1, accepted.view(-1, 1, 1).expand(-1, 1, logits.shape[-1]))  # [B, 1, V]
        next_token = sample(rows.probs(after)[:, 0], u[:, k]) if rows.sampling else argmax(after[:, 0])
    elif rows.sampling or q is not None:
        accepted, next_token = accept(drafts, q, rows.probs(logits), u)
    else:  # every row greedy and the drafts deterministic: the same rule read off the argmax
        accepted, next_token = greedy_accept(drafts, logits)
    # the accepted drafts, then the target's own token (a correction, or the bonus after k)
    emitted = torch.cat([drafts, next_token.unsqueeze(1)], 1).scatter(1, accepted.unsqueeze(1),
                                                                      next_token.unsqueeze(1))
    return emitted, commit(rows, cache, emitted, accepted + 1), accepted, hidden


def tree_verify(target, cache: KVCache, rows: Rows, tree: TreeDrafts, topk: int, u: torch.Tensor | None):
    """Verify a tree of drafts (tree.py) in one target forward, then commit its accepted path.

    The block is [pending, tree.tokens], N tokens: node i is written provisionally at slot lengths + i, at
    position lengths + its depth, and sees the committed prefix, its ancestors and itself (tree_mask). The
    walk from the root keeps a path (tree_greedy_accept, or tree_accept when a row samples: u
    [B, depth * topk + 1]); its keys and values move to slots lengths .. lengths + accepted (KVCache.move),
    where a chain would have written them, and commit keeps them as for a chain.
    Returns emitted [B, depth+1], count [B], accepted [B] and the target's hidden along the path [B, depth+1, H]."""
    L, D = rows.lengths, tree.depth
    tokens, parents, depths = tree.block(rows.tokens.gather(1, L.unsqueeze(1))[:, 0])  # [B, N]
    B, N = tokens.shape
    slots = L.unsqueeze(1) + torch.arange(N, device=L.device)  # [B, N]
    span = cache.span if cache.span is not None else int(slots.max()) + 1
    anc = ancestors(parents)  # [B, N, N]: the tree mask's, the walk's and the path's
    logits, hidden = target(tokens, L.unsqueeze(1) + depths, cache.tree(slots, visible_slots(L, anc, span)))
    if rows.sampling:
        accepted, last, next_token = tree_accept(tokens, parents, depths, D, topk, rows.probs(logits), u)
    else:
        accepted, last, next_token = tree_greedy_accept(tokens, parents, depths, D, logits, anc)
    path = path_nodes(anc, depths, last, D)  # [B, D+1]: the root, then the accepted nodes
    cache.move(slots.gather(1, path), L.unsqueeze(1) + torch.arange(D + 1, device=L.device))
    emitted = torch.cat([tokens.gather(1, path[:, 1:]), next_token.unsqueeze(1)], 1).scatter(
        1, accepted.unsqueeze(1), next_token.unsqueeze(1))
    H = hidden.shape[-1]
    return (emitted, commit(rows, cache, emitted, accepted + 1), accepted,
            hidden.gather(1, path.unsqueeze(-1).expand(B, D + 1, H)))
