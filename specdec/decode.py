"""Decode loops: plain autoregressive and static-k speculative, at batch >= 1 with ragged acceptance.

Every row keeps its own length. A speculative step: the proposer drafts k tokens per row; the
target reads [pending token, d_1..d_k] at the row's next k+1 positions in one forward (writing its
KV cache provisionally); each row accepts a prefix and gains one target token; `commit` keeps the
accepted slots and the rest are forgotten (lengths move, nothing is copied). Rows stop on EOS or
at max_new_tokens; a stopped row rides along in the fixed-shape batch without advancing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from specdec.cuda_graphs import EmulatedGraph, GraphedStep, graph_mode, say_eager_once
from specdec.kv_cache import KVCache
from specdec.proposers import Proposer, StepContext, make_proposer
from specdec.stats import AcceptanceStats
from specdec.verify_batch import greedy_accept, sample_accept, sample_tokens


@dataclass
class DecodeResult:
    method: str
    k: int
    tokens: list[list[int]]  # generated ids per row (EOS included when it stopped the row)
    prompt_lengths: list[int]
    accept_lengths: np.ndarray  # [steps, B] accepted drafts per verify step; -1 where a row had stopped
    steps: int  # forward passes of the target after the prompt (verify steps, or plain decode steps)
    wall_s: float
    times: dict = field(default_factory=dict)  # seconds in prefill / draft / verify / bookkeeping
    cuda_graphs: bool = False
    temperature: float = 0.0

    @property
    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def stats(self) -> AcceptanceStats | None:
        a = self.accept_lengths
        if self.method == "ar" or a.size == 0 or (a >= 0).sum() == 0:
            return None
        return AcceptanceStats.from_accept_lengths(a[a >= 0], self.k)

    def as_dict(self) -> dict:
        s = self.stats
        return {
            "method": self.method, "k": self.k if self.method != "ar" else 0, "batch": len(self.tokens),
            "temperature": self.temperature, "cuda_graphs": self.cuda_graphs,
            "token_ids": self.tokens, "new_tokens": self.new_tokens, "steps": self.steps,
            "tau": s.tau if s else 1.0,
            "acceptance_rate": s.acceptance_rate if s else None,
            "acceptance_by_position": [float(x) for x in s.by_position] if s else [],
            "accept_length_histogram": [int(x) for x in s.histogram] if s else [],
            "tokens_per_s": self.tokens_per_s, "wall_s": self.wall_s,
            "times": {k: round(v, 6) for k, v in self.times.items()},
        }


class Decoder:
    """Holds a bundle's models, their KV caches and captured graphs across generate calls."""

    def __init__(self, bundle, cuda_graphs: str = "auto", max_len: int | None = None):
        self.bundle = bundle
        self.target = bundle.target
        self.device = bundle.device
        self.graph_mode = graph_mode(cuda_graphs, self.device)
        self.use_graphs = self.graph_mode is not None  # fixed shapes everywhere (full-length attention)
        if self.graph_mode != "cuda":
            say_eager_once(self.device)
        self.max_len = max_len or min(self.target.config.max_position_embeddings, 2048)
        self._caches: dict[int, KVCache] = {}
        self._graphs: dict[tuple, GraphedStep | EmulatedGraph] = {}
        self._proposers: dict[str, Proposer] = {}
        self._batch = 0

    # -- helpers used by the proposers ---------------------------------------------------------
    def kv_len(self, positions: torch.Tensor) -> int:
        """Cache slots attention reads: all of them under a graph (fixed shape), else just enough."""
        if self.use_graphs:
            return self.max_len
        return min(self.max_len, int(positions.max()) + 1)

    def graphed(self, name: str, fn, args: tuple, eager: bool = False):
        """fn, or its CUDA graph for these shapes (captured on first use)."""
        if not self.use_graphs or eager:
            return fn
        key = (name, self._batch, tuple(tuple(a.shape) for a in args))
        if key not in self._graphs:
            self._graphs[key] = (GraphedStep if self.graph_mode == "cuda" else EmulatedGraph)(fn, args)
        return self._graphs[key]

    def cache(self, batch: int) -> KVCache:
        if batch not in self._caches:
            self._caches[batch] = KVCache.for_model(self.target, batch, self.max_len)
        return self._caches[batch]

    def proposer(self, method: str) -> Proposer:
        if method not in self._proposers:
            self._proposers[method] = make_proposer(method, self.bundle)
        return self._proposers[method]

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # -- the loops -----------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: list[list[int]], method: str = "ar", k: int = 4, max_new_tokens: int = 64,
                 temperature: float = 0.0, seed: int = 0, proposer: Proposer | None = None,
                 stop_at_eos: bool = True) -> DecodeResult:
        if k < 1:
            raise ValueError("k must be >= 1")
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        B, dev = len(prompts), self.device
        lens = torch.tensor([len(p) for p in prompts], device=dev)
        W = int(lens.max())
        width = 1 if method == "ar" else k + 1
        total = W + max_new_tokens + width + 1
        if total > self.max_len:
            raise ValueError(f"prompt ({W}) + max_new_tokens ({max_new_tokens}) + k needs {total} cache slots; "
                             f"this decoder has {self.max_len} (raise max_len)")
        self._batch = B
        gen = torch.Generator(device=dev).manual_seed(seed)
        eos = self.bundle.eos_token_id if stop_at_eos else None
        if method != "ar":
            proposer = proposer or self.proposer(method)
            proposer.setup(self, B, k)
        cache = self.cache(B)
        cache.reset()
        rows = torch.arange(B, device=dev)
        tokens = torch.zeros(B, self.max_len + width + 1, dtype=torch.long, device=dev)
        for b, p in enumerate(prompts):
            tokens[b, : len(p)] = torch.as_tensor(p, device=dev)
        times = dict(prefill=0.0, draft=0.0, verify=0.0, bookkeeping=0.0)

        self._sync()
        t0 = time.perf_counter()
        pos = torch.arange(W, device=dev).expand(B, W)
        logits, hidden = self.target(tokens[:, :W], pos, cache, self.kv_len(pos))  # [B, W, V], [B, W, H]
        first = sample_tokens(logits[rows, lens - 1], temperature, gen)
        tokens[rows, lens] = first
        cache.commit(lens)
        seq_len = lens + 1  # tokens known per row; the last one (pending) is not yet in the cache
        n_gen = torch.ones(B, dtype=torch.long, device=dev)
        done = n_gen >= max_new_tokens
        if eos is not None:
            done |= first == eos
        ctx = StepContext(tokens, seq_len, hidden, torch.zeros_like(lens), lens.clone(), temperature, gen)
        if method != "ar":
            proposer.prefill(ctx)
        self._sync()
        times["prefill"] = time.perf_counter() - t0

        accept_log: list[torch.Tensor] = []
        steps = 0
        offsets = torch.arange(width, device=dev)
        while not bool(done.all()):
            steps += 1
            t1 = time.perf_counter()
            if method == "ar":
                drafts = q = None
            else:
                drafts, q = proposer.propose(ctx, k)  # [B, k], [B, k, V] or None
            self._sync()
            t2 = time.perf_counter()
            pos = (seq_len - 1).unsqueeze(1) + offsets  # [B, width]: pending token, then the drafts
            pending = tokens.gather(1, pos[:, :1])
            block = pending if drafts is None else torch.cat([pending, drafts], 1)
            verify = self.graphed(f"target-{width}", self._target_step, (block, pos))
            logits, hidden = verify(block, pos)
            self._sync()
            t3 = time.perf_counter()
            if drafts is None:
                accept = torch.zeros(B, dtype=torch.long, device=dev)
                emitted = sample_tokens(logits[:, 0], temperature, gen).unsqueeze(1)  # [B, 1]
            else:
                if temperature == 0:
                    accept, nxt = greedy_accept(drafts, logits)
                else:
                    accept, nxt = sample_accept(drafts, q, logits, temperature, gen)
                emitted = torch.cat([drafts, torch.zeros_like(nxt).unsqueeze(1)], 1)  # [B, k+1]
                emitted[rows, accept] = nxt
            count = self._count(emitted, accept, n_gen, done, max_new_tokens, eos)
            accept_log.append(torch.where(done, -1, accept))
            idx = seq_len.unsqueeze(1) + offsets[: emitted.shape[1]]
            keep = offsets[: emitted.shape[1]].unsqueeze(0) < count.unsqueeze(1)
            tokens.scatter_(1, idx, torch.where(keep, emitted, tokens.gather(1, idx)))
            if eos is not None:
                done |= ((emitted == eos) & keep).any(1)
            ctx.pos0 = seq_len - 1
            ctx.n_valid = accept + 1
            ctx.hidden = hidden
            seq_len += count
            n_gen += count
            cache.commit(count)  # the accepted prefix (+1) stays; the other slots are rolled back
            done |= n_gen >= max_new_tokens
            self._sync()
            t4 = time.perf_counter()
            times["draft"] += t2 - t1
            times["verify"] += t3 - t2
            times["bookkeeping"] += t4 - t3
        wall = time.perf_counter() - t0
        out = [tokens[b, int(lens[b]): int(lens[b] + n_gen[b])].tolist() for b in range(B)]
        acc = torch.stack(accept_log).cpu().numpy() if accept_log else np.zeros((0, B), dtype=np.int64)
        return DecodeResult(method=method, k=k, tokens=out, prompt_lengths=lens.tolist(), accept_lengths=acc,
                            steps=steps, wall_s=wall, times=times, cuda_graphs=self.graph_mode == "cuda",
                            temperature=temperature)

    def _target_step(self, ids, pos):
        return self.target(ids, pos, self.cache(ids.shape[0]), self.kv_len(pos))

    @staticmethod
    def _count(emitted, accept, n_gen, done, max_new, eos):
        """Tokens each row actually keeps this step: accepted + 1, cut at EOS and at max_new_tokens."""
        count = accept + 1
        if eos is not None:
            j = torch.arange(emitted.shape[1], device=emitted.device)
            is_eos = (emitted == eos) & (j.unsqueeze(0) <= accept.unsqueeze(1))
            first_eos = torch.where(is_eos.any(1), is_eos.int().argmax(1), emitted.shape[1])
            count = torch.minimum(count, first_eos + 1)
        count = torch.minimum(count, max_new - n_gen)
        return torch.where(done, 0, count)
