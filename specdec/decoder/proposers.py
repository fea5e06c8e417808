"""Proposers: each one guesses the next k tokens of every row; the target then verifies them.

One small interface: `prefill(ctx)` after the target has read the prompt, and `propose(ctx, k)`
before each verify step, which returns drafts [B, k] and, for sampling, the distributions q
[B, k, V] they were drawn from (None for a deterministic proposer). The `StepContext` carries
what the last target forward produced. Shapes: B rows, k drafts, V vocabulary, H hidden, W width.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specdec.decoder.kv_cache import KVCache


@dataclass
class StepContext:
    """The decoder's state as a proposer sees it.

    tokens [B, S] all tokens so far (prompt, generated, and the pending token at seq_len - 1);
    hidden [B, W, H] the target's hidden states from its last forward, at positions pos0 + 0..W-1;
    n_valid [B] how many of those W positions were committed (prefill: the prompt length;
    verify: accepted drafts + 1). The last valid hidden state predicted the pending token.
    """

    tokens: torch.Tensor
    seq_len: torch.Tensor
    hidden: torch.Tensor
    pos0: torch.Tensor
    n_valid: torch.Tensor
    temperature: float = 0.0
    generator: torch.Generator | None = None


def choose(logits: torch.Tensor, ctx: StepContext):
    """Draft token from draft logits [B, V]: argmax at T = 0, else a sample with its q [B, V]."""
    if ctx.temperature == 0:
        return logits.argmax(-1), None
    q = (logits.float() / ctx.temperature).softmax(-1)
    return torch.multinomial(q, 1, generator=ctx.generator).squeeze(1), q


def autoregress(logits: torch.Tensor, k: int, ctx: StepContext, step):
    """k drafts, one at a time: choose from logits [B, V], then `step(i, draft)` gives the next logits.
    Returns drafts [B, k] and their distributions [B, k, V] (None when greedy)."""
    drafts, qs = [], []
    for i in range(k):
        d, q = choose(logits, ctx)
        drafts.append(d)
        qs.append(q)
        if i + 1 < k:
            logits = step(i, d)
    return torch.stack(drafts, 1), None if qs[0] is None else torch.stack(qs, dim=1)


class CachedProposer:
    """A proposer with its own KV cache: one per batch size, kept, because captured graphs point
    at the cache tensors of the batch size they were captured for."""

    def cache_for(self, model, decoder, batch: int) -> KVCache:
        caches = self.__dict__.setdefault("_caches", {})
        key = (batch, decoder.max_len)
        if key not in caches:
            caches[key] = KVCache.for_model(model, batch, decoder.max_len)
        cache = caches[key]
        cache.reset()
        return cache


class Proposer:
    name = "proposer"

    def setup(self, decoder, batch: int, k: int) -> None:
        """Allocate state for a generate call (caches, graphs)."""

    def prefill(self, ctx: StepContext) -> None:
        """The target has read the prompt; ctx.hidden covers the prompt positions."""

    def propose(self, ctx: StepContext, k: int):
        raise NotImplementedError


class FeatureDraftProposer(CachedProposer, Proposer):
    """MTP layer or EAGLE head: a one-layer draft fed (hidden state, next token), applied k times.

    Each step first *extends* the draft's own KV cache over the positions the target just
    verified, using the target's hidden states (what the draft was trained on), then reads the
    output at the last committed position; the remaining k-1 steps feed the draft its own output
    state and proposed token, as SGLang's NEXTN and EAGLE workers do.
    """

    def __init__(self, module, target, name: str) -> None:
        self.module, self.target, self.name = module, target, name

    def setup(self, decoder, batch, k):
        self.decoder = decoder
        self.cache = self.cache_for(self.module, decoder, batch)

    def _step(self, hidden, ids, pos):
        g = self.module(hidden, ids, pos, self.target.embed_tokens, self.cache, self.decoder.kv_len(pos))
        return g, self.target.lm_head(g)

    def propose(self, ctx, k):
        B, W, _ = ctx.hidden.shape
        pos = ctx.pos0.unsqueeze(1) + torch.arange(W, device=ctx.pos0.device)  # [B, W]
        nxt = (pos + 1).clamp(max=ctx.tokens.shape[1] - 1)
        ids = ctx.tokens.gather(1, nxt)  # token after each position: x_{t+1}
        step = self.decoder.graphed(f"{self.name}-extend", self._step, (ctx.hidden, ids, pos), eager=W != k + 1)
        g, logits = step(ctx.hidden, ids, pos)
        rows = torch.arange(B, device=pos.device)
        last = ctx.n_valid - 1
        g, logits = g[rows, last].unsqueeze(1), logits[rows, last]  # [B, 1, H], [B, V]
        p = ctx.seq_len.unsqueeze(1) - 1  # position of the pending token, where the next draft step runs

        def step(i, d):  # the draft reads its own output state and its own proposal
            nonlocal g
            single = self.decoder.graphed(f"{self.name}-step", self._step, (g, d.unsqueeze(1), p + i))
            g, out = single(g, d.unsqueeze(1), p + i)
            return out[:, 0]

        return autoregress(logits, k, ctx, step)


class MTPLayerProposer(FeatureDraftProposer):
    def __init__(self, bundle):
        if bundle.mtp is None:
            raise ValueError(f"{bundle.name} has no MTP layer (model.mtp_layers.0.*)")
        super().__init__(bundle.mtp, bundle.target, "mtp")


class EagleProposer(FeatureDraftProposer):
    def __init__(self, bundle):
        if bundle.eagle is None:
            raise ValueError(f"{bundle.name} has no EAGLE head")
        super().__init__(bundle.eagle, bundle.target, "eagle")


class HeadsProposer(Proposer):
    """Parallel MTP heads: one forward over the last committed hidden state gives all k drafts."""

    name = "heads"

    def __init__(self, bundle):
        if bundle.heads is None:
            raise ValueError(f"{bundle.name} has no parallel MTP heads")
        self.heads, self.target = bundle.heads, bundle.target

    def setup(self, decoder, batch, k):
        if k > self.heads.num_heads:
            raise ValueError(f"k={k} but the model has only {self.heads.num_heads} parallel heads")
        self.decoder = decoder

    def _logits(self, h):
        return self.target.lm_head(self.heads(h))  # [B, k_heads, V]

    def propose(self, ctx, k):
        rows = torch.arange(ctx.hidden.shape[0], device=ctx.hidden.device)
        h = ctx.hidden[rows, ctx.n_valid - 1]  # [B, H]
        logits = self.decoder.graphed("heads", self._logits, (h,))(h)[:, :k]
        drafts, qs = zip(*(choose(logits[:, i], ctx) for i in range(k)))
        return torch.stack(drafts, 1), None if qs[0] is None else torch.stack(qs, dim=1)


class DraftModelProposer(CachedProposer, Proposer):
    """A separate small LM with its own KV cache, run k times autoregressively."""

    name = "draft"

    def __init__(self, bundle):
        if bundle.draft is None:
            raise ValueError(f"{bundle.name} has no draft model")
        self.draft = bundle.draft

    def setup(self, decoder, batch, k):
        self.decoder = decoder
        self.cache = self.cache_for(self.draft, decoder, batch)

    def _forward(self, ids, pos):
        return self.draft(ids, pos, self.cache, self.decoder.kv_len(pos))[0]

    def prefill(self, ctx):
        W = ctx.hidden.shape[1]
        pos = torch.arange(W, device=ctx.tokens.device).expand(ctx.tokens.shape[0], W)
        self._forward(ctx.tokens[:, :W], pos)

    def propose(self, ctx, k):
        # Feed the last two known tokens: the one before the pending token fills the slot the draft
        # skipped when all k drafts were accepted (its k-th draft was never fed); otherwise it
        # rewrites that slot with the same values. A fixed width of 2 keeps the step graphable.
        p = ctx.seq_len.unsqueeze(1) - 2 + torch.arange(2, device=ctx.seq_len.device)  # [B, 2]
        ids = ctx.tokens.gather(1, p)
        logits = self.decoder.graphed("draft-2", self._forward, (ids, p))(ids, p)[:, -1]

        def step(i, d):  # feed draft i at the position after the last one
            pos = p[:, 1:] + i + 1
            return self.decoder.graphed("draft-1", self._forward, (d.unsqueeze(1), pos))(d.unsqueeze(1), pos)[:, 0]

        return autoregress(logits, k, ctx, step)


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
    """n-gram prompt lookup over each row's own tokens: no model at all."""

    name = "ngram"

    def __init__(self, bundle=None, max_n: int = 3, min_n: int = 1):
        self.max_n, self.min_n = max_n, min_n

    def propose(self, ctx, k):
        toks, lens = ctx.tokens.cpu().numpy(), ctx.seq_len.cpu().tolist()
        out = np.stack([ngram_lookup(toks[b, :n], k, self.max_n, self.min_n) for b, n in enumerate(lens)])
        return torch.as_tensor(out, device=ctx.tokens.device), None


class OracleProposer(Proposer):
    """For systems measurements only: proposes the target's own next tokens (from a plain run done
    first), each replaced by a wrong token with probability 1 - alpha. It separates what
    speculation costs from how good a draft is."""

    name = "oracle"

    def __init__(self, reference: torch.Tensor, alpha: float, vocab_size: int, seed: int = 0):
        if not 0 <= alpha <= 1:
            raise ValueError("oracle alpha must be in [0, 1]")
        self.reference, self.alpha, self.vocab_size = reference, alpha, vocab_size
        self.seed = seed

    @classmethod
    def from_continuations(cls, prompts: list[list[int]], continuations: list[list[int]], alpha: float,
                           vocab_size: int, seed: int = 0, length: int = 4096) -> "OracleProposer":
        """Build the reference [B, S] by absolute position from prompts and a plain run's tokens."""
        ref = torch.zeros(len(prompts), length, dtype=torch.long)
        for b, (p, c) in enumerate(zip(prompts, continuations)):
            seq = (list(p) + list(c))[:length]
            ref[b, : len(seq)] = torch.tensor(seq)
        return cls(ref, alpha, vocab_size, seed)

    def setup(self, decoder, batch, k):
        if self.reference.shape[0] != batch:
            raise ValueError("the oracle's reference has a different batch size")
        self.reference = self.reference.to(decoder.device)
        self.gen = torch.Generator(device=decoder.device).manual_seed(self.seed)

    def propose(self, ctx, k):
        idx = (ctx.seq_len.unsqueeze(1) + torch.arange(k, device=ctx.seq_len.device)).clamp(max=self.reference.shape[1] - 1)
        right = self.reference.gather(1, idx)
        u = torch.rand(right.shape, device=right.device, generator=self.gen)
        shift = torch.randint(1, self.vocab_size, right.shape, device=right.device, generator=self.gen)
        wrong = (right + shift) % self.vocab_size  # never equal to the right token
        return torch.where(u < self.alpha, right, wrong), None


PROPOSERS = {"mtp": MTPLayerProposer, "heads": HeadsProposer, "draft": DraftModelProposer,
             "eagle": EagleProposer, "ngram": NgramProposer}


def make_proposer(method: str, bundle) -> Proposer:
    if method not in PROPOSERS:
        raise ValueError(f"unknown method {method!r}; choose from ar, {', '.join(PROPOSERS)}")
    return PROPOSERS[method](bundle)
