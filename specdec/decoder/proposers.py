"""Proposers: each one guesses the next k tokens of every row; the target then verifies them.

The interface, in the order the engine calls it:
  setup(capacity, max_len, k, graphs)      allocate per-row state once (caches, buffers)
  admit(rows, start, hidden)               the target just read the prompts of rows start..;
                                           hidden [n, W, H] its states over them
  copy_rows(src, dst, slots)               copy rows src [n] of every per-row state into rows dst
                                           (caches: their first `slots` slots); a staged prefill
  propose(rows, k, u) -> drafts, q         drafts [B, k]; q [B, k, V] they were drawn from, or
                                           None when every row is greedy or the proposer is
                                           deterministic; u [B, k] uniforms for sampled rows
  propose_tree(rows, shape) -> TreeDrafts  instead of propose at topk > 1 (tree.py): mtp, eagle, heads
  accepted(rows, hidden, count)            the target verified: count [B] tokens were kept,
                                           hidden [B, k+1, H] its states at the block's positions
  skip(rows)                               instead of propose, in a step without drafts (the engine's
                                           adaptive k chose 0): keep the proposer's own state in step;
                                           accepted follows with hidden [B, 1, H]
A step may ask for fewer drafts than setup's k (adaptive k), never more.
A proposer's own KV cache commits in step with the target's, so its `lengths` mean the same, and
its attention reads the step's span (rows.span, with the span in its graphs' keys) like the target's.
Shapes: B rows, k drafts, V vocabulary, H hidden, W prompt width.
"""

from __future__ import annotations

import numpy as np
import torch

from specdec.decoder.cuda_graphs import Graphs
from specdec.decoder.kv_cache import KVCache
from specdec.decoder.step import Rows
from specdec.decoder.tree import TreeDrafts, TreeShape, TreeSlots, grow
from specdec.decoder.verify import sample


def choose(logits: torch.Tensor, rows: Rows, u: torch.Tensor):
    """A draft token per row from draft logits [B, V]: the argmax when every row is greedy, else a
    draw from the row's own distribution (u [B]), returned with that distribution q [B, V]."""
    if not rows.sampling:
        return logits.argmax(-1), None
    q = rows.probs(logits.unsqueeze(1))[:, 0]
    return sample(q, u), q


def autoregress(logits: torch.Tensor, k: int, rows: Rows, u: torch.Tensor, step):
    """k drafts, one at a time: choose from logits [B, V], then `step(i, draft)` gives the next
    logits. Returns drafts [B, k] and their distributions [B, k, V] (None when greedy)."""
    drafts, qs = [], []
    for i in range(k):
        d, q = choose(logits, rows, u[:, i])
        drafts.append(d)
        qs.append(q)
        if i + 1 < k:
            logits = step(i, d)
    return torch.stack(drafts, 1), None if qs[0] is None else torch.stack(qs, 1)


def last_valid(hidden: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """hidden [B, W, H] at each row's position count - 1 -> [B, H] (a row with count 0: position 0)."""
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    return hidden[rows, (count - 1).clamp(min=0)]


class Proposer:
    name = "proposer"

    def setup(self, capacity: int, max_len: int, k: int, graphs: Graphs) -> None:
        self.graphs = graphs

    def admit(self, rows: Rows, start: int, hidden: torch.Tensor) -> None:
        """Read the prefill: hidden [n, W, H] of rows start.. (device work only: a CUDA graph may replay it)."""

    def admitted(self) -> None:
        """The host's part of an admission, after each admit (a replayed admit runs no Python)."""

    def copy_rows(self, src: torch.Tensor, dst: torch.Tensor, slots: int) -> None:
        """Rows src [n] of the per-row state admit wrote into rows dst [n] (device work only). A proposer without
        it (a wrapper that forwards admit only, say) has its prompts prefilled in place instead, eagerly."""
        raise NotImplementedError

    def propose(self, rows: Rows, k: int, u: torch.Tensor):
        raise NotImplementedError

    trees = False  # drafts a distribution per depth, so can grow a tree (propose_tree)

    def propose_tree(self, rows: Rows, shape: TreeShape) -> TreeDrafts:
        """A tree of drafts per row (tree.py), deterministic: the verify treats them as one-hot."""
        raise NotImplementedError(f"{self.name} drafts a chain only")

    def grown(self, shape: TreeShape, span: int | None, fn, *args: torch.Tensor) -> TreeDrafts:
        """fn(*args) -> TreeDrafts (tree.grow's static-shape expansion and rerank) through the proposer's graphs:
        one capture per tree shape, batch width and span, as the chain's draft steps."""
        name = f"tree {shape.num_steps}/{shape.topk}/{shape.num_draft_tokens}"
        # K tokens a row at each depth: untuned (Graphs' tune)
        return TreeDrafts(*self.graphs(name, lambda *a: fn(*a).tensors(), *args, span=span, tune=False),
                          shape.num_steps)

    def accepted(self, rows: Rows, hidden: torch.Tensor, count: torch.Tensor) -> None:
        """Learn from a step: the target's hidden states [B, W, H] and the tokens each row kept [B]."""
        self.keep(rows, hidden, count)
        self.kept(hidden.shape[1])

    def keep(self, rows: Rows, hidden: torch.Tensor, count: torch.Tensor) -> None:
        """accepted's tensor part: writes into the proposer's own buffers and reads nothing back, so a plain step
        of a speculative engine captures it in its own graph (a plain step then costs a plain step)."""

    def kept(self, width: int) -> None:
        """accepted's host part, after keep: bookkeeping in Python numbers."""

    def state(self) -> tuple[torch.Tensor, ...]:
        """The buffers keep updates in place: restored after a capture's warm-up runs."""
        return ()

    def skip(self, rows: Rows) -> None:
        pass


class FeatureDraftProposer(Proposer):
    """The MTP layer (SGLang's NEXTN) or the EAGLE head: one layer fed (hidden state, next token),
    applied k times.

    Each step first *extends* the layer's own KV cache over the positions the target just
    committed, reading the target's hidden states (what the layer was trained on); its output at
    the last of them gives the first draft. Drafts 2..k feed the layer its own output state and its
    own proposed token, as SGLang's NEXTN and EAGLE workers do.

    A step without drafts (adaptive k chose k = 0) only appends the target's state to the fresh ones:
    the layer reads them all at the next drafting step, or when LAG x (k + 1) of them have piled up (one
    wider forward now and then instead of one per step: a plain step of a speculative engine costs a plain step).
    """

    trees = True
    LAG = 3  # fresh states held: up to LAG x (k + 1), read in one forward

    def __init__(self, module, target, name: str) -> None:
        self.module, self.target, self.name = module, target, name

    def setup(self, capacity, max_len, k, graphs):
        self.graphs, self.block = graphs, k + 1
        self.width = self.LAG * (k + 1)  # the widest extend: the fresh states of steps without drafts
        # the widest extend writes up to `width` slots past the layer's committed length (garbage past the fresh)
        self.cache = KVCache.for_model(self.module, capacity, max_len + self.width)
        H, p = self.target.config.hidden_size, next(self.module.parameters())
        # target states not yet read, and one column more where a step's unkept columns are dropped
        self.fresh = torch.zeros(capacity, self.width + 1, H, device=p.device, dtype=p.dtype)
        self.fresh_count = torch.zeros(capacity, dtype=torch.long, device=p.device)
        self.pending = 0  # the most fresh states a row may hold (known on the host: no sync)
        self.columns = torch.arange(self.width + 1, device=p.device)  # kept: one allocation less per step

    def _state(self, cache, hidden, ids, pos):
        return self.module(hidden, ids, pos, self.target.embed_tokens, cache)  # [B, T, H]

    def _step(self, cache, hidden, ids, pos):
        g = self._state(cache, hidden, ids, pos)
        return g, self.target.logits(g)

    def _extend(self, cache, fresh, ids, pos, count, predict: bool):
        """The layer over the fresh states, writing its cache; predict: its output state [B, 1, H] and logits
        [B, V] at the last fresh one (the vocabulary's projection at that position only)."""
        g = self._state(cache, fresh, ids, pos)
        if not predict:
            return g
        g = last_valid(g, count).unsqueeze(1)
        return g, self.target.logits(g)[:, 0]

    def admit(self, rows, start, hidden):
        n, W, _ = hidden.shape
        cache = self.cache.rows(start, start + n, W)  # the prompt's slots (a span: no host sync)
        cache.lengths.zero_()
        lengths = rows.lengths[start:start + n]  # the prompts' lengths (the target committed them)
        if W > 1:  # every prompt position but the last: (h_t, x_t+1), all known
            pos = torch.arange(W - 1, device=hidden.device).expand(n, W - 1)
            self._step(cache, hidden[:, :-1], rows.tokens[start:start + n, 1:W], pos)
        cache.commit(lengths - 1, check=False)
        self.fresh[start:start + n, 0] = last_valid(hidden, lengths)
        self.fresh_count[start:start + n] = 1
        self.admitted()  # run eagerly (a wrapper that forwards admit only keeps this); a replay runs it from the engine

    def admitted(self):
        self.pending = max(self.pending, 1)  # each new row holds one fresh state

    def copy_rows(self, src, dst, slots):
        self.cache.copy_rows(src, dst, slots)
        self.fresh[dst] = self.fresh[src]
        self.fresh_count[dst] = self.fresh_count[src]

    def extend(self, rows, predict: bool = True):
        """Read the target's fresh states into the layer's cache; -> (cache, the output state [B, 1, H] and
        logits [B, V] at the last of them: what it predicts after the pending token, draft 1). predict=False
        only writes the cache (the vocabulary's projection is 1 GB of an 8B step's 16) and returns None."""
        B = rows.tokens.shape[0]
        W = self.block if self.pending <= self.block else self.width  # two shapes: two captures
        cache, fresh, count = self.cache.rows(0, B, rows.span), self.fresh[:B, :W], self.fresh_count[:B]
        pos = cache.positions(W)  # [B, W]: where the fresh states sit
        ids = rows.tokens.gather(1, (pos + 1).clamp(max=rows.tokens.shape[1] - 1))  # x_t+1 after each
        out = self.graphs("extend" if predict else "extend/state",  # W >= 2 tokens a row: untuned (Graphs' tune)
                          lambda *a: self._extend(cache, *a, predict), fresh, ids, pos, count, span=rows.span,
                          tune=False)
        cache.commit(count, check=False)
        count.zero_()
        self.pending = 0
        return (cache, *out) if predict else None

    def skip(self, rows):
        if self.pending + 1 > self.width:  # no room for this step's state: read the fresh ones now
            self.extend(rows, predict=False)

    def propose(self, rows, k, u):
        cache, g, logits = self.extend(rows)
        p = rows.lengths.unsqueeze(1)  # the pending token's position: draft 2 is computed there

        def step(i, d):  # the layer reads its own output state and its own proposal
            nonlocal g
            g, out = self.graphs("draft", lambda *a: self._step(cache, *a), g, d.unsqueeze(1), p + i, span=rows.span)
            return out[:, 0]

        return autoregress(logits, k, rows, u, step)

    def propose_tree(self, rows, shape):
        cache, g, logits = self.extend(rows)
        L, K = rows.lengths, shape.topk
        F = (shape.num_steps - 1) * K  # the fed nodes, at slots L + 0..F-1

        def tree(logits_, g_):  # inside the capture: what reads L is replayed with it
            place = TreeSlots.make(L, F, rows.span or cache.max_len)
            slots = L.unsqueeze(1) + torch.arange(F, device=L.device)  # [B, F]
            pos = L.unsqueeze(1) + torch.arange(shape.num_steps, device=L.device)  # [B, D]: depth d's at L + d - 1

            def forward(depth, states, tokens, seen):
                view = cache.tree(slots[:, (depth - 1) * K: depth * K], place.visible(seen))
                return self._step(view, states, tokens, pos[:, depth - 1: depth].expand(-1, K))

            return grow(logits_, g_, shape, forward)

        return self.grown(shape, rows.span, tree, logits, g)

    def keep(self, rows, hidden, count):
        """Append the step's kept states [B, W, H] (W = its k + 1) after the fresh ones not yet read."""
        B, W, H = hidden.shape
        n, j = self.fresh_count[:B], self.columns[:W]
        idx = torch.where(j < count.unsqueeze(1), n.unsqueeze(1) + j, self.width)  # unkept: the last column
        self.fresh[:B].scatter_(1, idx.unsqueeze(-1).expand(B, W, H), hidden)
        n += count

    def kept(self, width):
        self.pending += width

    def state(self):
        return self.fresh, self.fresh_count


class HeadsProposer(Proposer):
    """Parallel MTP heads: one forward over the last committed hidden state gives all k drafts."""

    name = "heads"

    def __init__(self, heads, target) -> None:
        self.heads, self.target = heads, target

    def setup(self, capacity, max_len, k, graphs):
        if k > self.heads.num_heads:
            raise ValueError(f"k={k} but the model has only {self.heads.num_heads} parallel heads")
        self.graphs = graphs
        p = next(self.heads.parameters())
        self.last = torch.zeros(capacity, self.heads.hidden_size, device=p.device, dtype=p.dtype)

    def admit(self, rows, start, hidden):
        n = hidden.shape[0]
        self.last[start:start + n] = last_valid(hidden, rows.lengths[start:start + n])

    def copy_rows(self, src, dst, slots):
        self.last[dst] = self.last[src]

    def _logits(self, rows, k):
        h = self.last[: rows.tokens.shape[0]]
        return self.graphs("heads", lambda x: self.target.logits(self.heads(x)), h)[:, :k]  # [B, k, V]

    def propose(self, rows, k, u):
        logits = self._logits(rows, k)
        drafts, qs = zip(*(choose(logits[:, i], rows, u[:, i]) for i in range(k)))
        return torch.stack(drafts, 1), None if qs[0] is None else torch.stack(qs, 1)

    trees = True

    def propose_tree(self, rows, shape):
        """Medusa's tree: head d's distribution serves every node at depth d + 1, whatever its parent."""

        def tree(h):  # h [B, H]: the heads, then the expansion, in one capture
            logits = self.target.logits(self.heads(h))[:, : shape.num_steps]  # [B, num_steps, V]

            def forward(depth, states, tokens, seen):
                return states, logits[:, depth].unsqueeze(1).expand(-1, tokens.shape[1], -1)

            return grow(logits[:, 0], h.unsqueeze(1), shape, forward)

        return self.grown(shape, rows.span, tree, self.last[: rows.tokens.shape[0]])

    def keep(self, rows, hidden, count):
        self.last[: hidden.shape[0]].copy_(last_valid(hidden, count))

    def state(self):
        return (self.last,)


class DraftModelProposer(Proposer):
    """A separate small LM with its own KV cache, run k times autoregressively.

    Its cache holds every committed position but the last, which each step rewrites together with
    the pending token: when all k drafts were accepted, the k-th was never fed to the draft.
    A fixed width of 2 keeps the step graphable.
    """

    name = "draft"

    def __init__(self, draft) -> None:
        self.draft = draft

    def setup(self, capacity, max_len, k, graphs):
        self.graphs = graphs
        self.cache = KVCache.for_model(self.draft, capacity, max_len)

    def admit(self, rows, start, hidden):
        n, W, _ = hidden.shape
        cache = self.cache.rows(start, start + n, W)  # the prompt's slots (a span: no host sync)
        cache.lengths.zero_()
        self.draft(rows.tokens[start:start + n, :W], torch.arange(W, device=hidden.device).expand(n, W), cache)
        cache.commit(rows.lengths[start:start + n] - 1, check=False)

    def copy_rows(self, src, dst, slots):
        self.cache.copy_rows(src, dst, slots)

    def two(self, rows):
        """Rewrite the last committed position and read the pending token; -> (forward, positions, logits [B, V])."""
        cache = self.cache.rows(0, rows.tokens.shape[0], rows.span)
        forward = lambda ids, pos: self.draft(ids, pos, cache)[0]  # noqa: E731
        p = cache.positions(2)  # [B, 2]: the last committed position and the pending token's
        return forward, p, self.graphs("two", forward, rows.tokens.gather(1, p), p, span=rows.span)[:, -1]

    def skip(self, rows):
        self.two(rows)  # the cache then holds every committed position but the last, as after a verify step

    def propose(self, rows, k, u):
        forward, p, logits = self.two(rows)

        def step(i, d):  # feed draft i + 1 at the position after the pending token + i
            return self.graphs("one", forward, d.unsqueeze(1), p[:, 1:] + i + 1, span=rows.span)[:, 0]

        return autoregress(logits, k, rows, u, step)

    def keep(self, rows, hidden, count):
        self.cache.rows(0, count.shape[0]).commit(count, check=False)

    def state(self):
        return (self.cache.lengths,)


def ngram_lookup(history: np.ndarray, k: int, max_n: int = 3, min_n: int = 1) -> np.ndarray:
    """Prompt lookup: find the latest earlier occurrence of the last n tokens (longest n first) and
    propose the k tokens that followed it; with no match, repeat the last token."""
    L = len(history)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        pattern = history[L - n:]
        windows = np.lib.stride_tricks.sliding_window_view(history[:L - 1], n)  # starts 0..L-1-n
        hits = np.flatnonzero((windows == pattern).all(1))
        if len(hits):
            start = hits[-1] + n
            follow = history[start:start + k]
            if len(follow) < k:  # ran into the present: continue the copy cyclically
                follow = np.resize(history[start:], k)
            return follow
    return np.full(k, history[-1])


class NgramProposer(Proposer):
    """n-gram prompt lookup over each row's own tokens: no model at all (runs on the host)."""

    name = "ngram"

    def __init__(self, max_n: int = 3, min_n: int = 1):
        self.max_n, self.min_n = max_n, min_n

    def copy_rows(self, src, dst, slots):
        pass  # it reads the rows' tokens, which the engine copies

    def propose(self, rows, k, u):
        toks, ends = rows.tokens.cpu().numpy(), (rows.lengths + 1).tolist()  # history up to the pending token
        out = np.stack([ngram_lookup(toks[b, :n], k, self.max_n, self.min_n) for b, n in enumerate(ends)])
        return torch.as_tensor(out, device=rows.tokens.device), None


class OracleProposer(Proposer):
    """For systems measurements only: proposes the target's own next tokens (from a plain run done
    first), each replaced by a wrong token with probability 1 - alpha. It separates what
    speculation costs from how good a draft is."""

    name = "oracle"

    def __init__(self, reference: torch.Tensor, alpha: float, vocab_size: int, seed: int = 0):
        if not 0 <= alpha <= 1:
            raise ValueError("oracle alpha must be in [0, 1]")
        self.reference, self.alpha, self.vocab_size, self.seed = reference, alpha, vocab_size, seed

    @classmethod
    def from_continuations(cls, prompts: list[list[int]], continuations: list[list[int]], alpha: float,
                           vocab_size: int, seed: int = 0, length: int = 4096) -> "OracleProposer":
        """The reference [B, S] by absolute position, from the prompts and a plain run's tokens."""
        ref = torch.zeros(len(prompts), length, dtype=torch.long)
        for b, (p, c) in enumerate(zip(prompts, continuations)):
            seq = (list(p) + list(c))[:length]
            ref[b, : len(seq)] = torch.tensor(seq)
        return cls(ref, alpha, vocab_size, seed)

    def setup(self, capacity, max_len, k, graphs):
        if self.reference.shape[0] > capacity:
            raise ValueError(f"the oracle's reference has {self.reference.shape[0]} rows, more than the "
                             f"engine's {capacity}")
        self.graphs, self.gen = graphs, None
        padded = torch.zeros(capacity, self.reference.shape[1], dtype=torch.long)  # free rows ride along
        padded[: self.reference.shape[0]] = self.reference
        self.reference = padded

    def copy_rows(self, src, dst, slots):
        pass  # its reference is by slot, set up front

    def propose(self, rows, k, u):
        B, dev = rows.tokens.shape[0], rows.tokens.device
        if self.gen is None:  # on the rows' device, seeded once
            self.reference = self.reference.to(dev)
            self.gen = torch.Generator(device=dev).manual_seed(self.seed)
        idx = rows.lengths.unsqueeze(1) + 1 + torch.arange(k, device=dev)  # the tokens after the pending one
        right = self.reference[:B].gather(1, idx.clamp(max=self.reference.shape[1] - 1))
        coin = torch.rand(right.shape, device=dev, generator=self.gen)
        shift = torch.randint(1, self.vocab_size, right.shape, device=dev, generator=self.gen)
        return torch.where(coin < self.alpha, right, (right + shift) % self.vocab_size), None  # wrong != right
