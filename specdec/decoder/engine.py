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

from specdec.decoder.cuda_graphs import EmulatedGraph, GraphedStep, graph_mode, say_eager_once
from specdec.decoder.kv_cache import KVCache
from specdec.decoder.proposers import Proposer, StepContext, make_proposer
from specdec.decoder.verify import greedy_accept, sample_accept, sample_tokens
from specdec.sim.stats import AcceptanceStats


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


@dataclass
class DecodeState:
    """Per-row state of a batch, kept in fixed tensors so that graphed steps can update it in place."""

    tokens: torch.Tensor  # [B, S] prompt + generated tokens; the pending one at seq_len - 1
    seq_len: torch.Tensor  # [B] tokens known per row
    n_gen: torch.Tensor  # [B] tokens generated per row
    done: torch.Tensor  # [B] row has stopped
    pos0: torch.Tensor  # [B] position of the last target forward's first token
    n_valid: torch.Tensor  # [B] how many of those positions were committed
    max_new: torch.Tensor  # [] max_new_tokens
    eos: torch.Tensor  # [] EOS id, -1 for none

    @classmethod
    def empty(cls, batch: int, length: int, device) -> "DecodeState":
        z = lambda: torch.zeros(batch, dtype=torch.long, device=device)  # noqa: E731
        return cls(torch.zeros(batch, length, dtype=torch.long, device=device), z(), z(),
                   torch.zeros(batch, dtype=torch.bool, device=device), z(), z(),
                   torch.zeros((), dtype=torch.long, device=device), torch.zeros((), dtype=torch.long, device=device))

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return tuple(self.__dict__.values())


class Decoder:
    """Holds a bundle's models, their KV caches, decode state and captured graphs across calls."""

    def __init__(self, bundle, cuda_graphs: str = "auto", max_len: int | None = None, compile: bool = False):
        """compile: fuse the target's step with torch.compile (GPU; inside our own graphs)."""
        self.bundle = bundle
        self.compile = compile
        self.target = bundle.target
        self.device = bundle.device
        self.graph_mode = graph_mode(cuda_graphs, self.device)
        self.use_graphs = self.graph_mode is not None  # fixed shapes everywhere (full-length attention)
        if self.graph_mode != "cuda":
            say_eager_once(self.device)
        self.max_len = max_len or min(self.target.config.max_position_embeddings, 2048)
        self._caches: dict[int, KVCache] = {}
        self._states: dict[int, DecodeState] = {}
        self._graphs: dict[tuple, GraphedStep | EmulatedGraph] = {}
        self._proposers: dict[str, Proposer] = {}
        self._batch = 0

    # -- helpers used by the proposers ---------------------------------------------------------
    def kv_len(self, positions: torch.Tensor) -> int:
        """Cache slots attention reads: all of them under a graph (fixed shape), else just enough."""
        if self.use_graphs:
            return self.max_len
        return min(self.max_len, int(positions.max()) + 1)

    def graphed(self, name: str, fn, args: tuple, eager: bool = False, state: tuple = ()):
        """fn, or its CUDA graph for these shapes (captured on first use). `state`: tensors fn
        updates in place (restored after the capture's warm-up runs)."""
        if not self.use_graphs or eager:
            return fn
        key = (name, self._batch, tuple(tuple(a.shape) for a in args))
        if key not in self._graphs:
            if self.compile and name.startswith("verify"):
                # Fused kernels (fewer, bigger launches); our graph then replays them. The cache
                # tensors are written in place, so torch.compile's own graphs are not used.
                fn = torch.compile(fn, dynamic=False)
            kind = GraphedStep if self.graph_mode == "cuda" else EmulatedGraph
            self._graphs[key] = kind(fn, args, state=state)
        return self._graphs[key]

    def cache(self, batch: int) -> KVCache:
        if batch not in self._caches:
            self._caches[batch] = KVCache.for_model(self.target, batch, self.max_len)
        return self._caches[batch]

    def state(self, batch: int) -> DecodeState:
        if batch not in self._states:
            self._states[batch] = DecodeState.empty(batch, self.max_len + 2, self.device)
        return self._states[batch]

    def proposer(self, method: str) -> Proposer:
        if method not in self._proposers:
            self._proposers[method] = make_proposer(method, self.bundle)
        return self._proposers[method]

    # -- the loops -----------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: list[list[int]], method: str = "ar", k: int = 4, max_new_tokens: int = 64,
                 temperature: float = 0.0, seed: int = 0, proposer: Proposer | None = None,
                 stop_at_eos: bool = True, profile: bool = True) -> DecodeResult:
        """Decode every prompt; `profile` synchronises the GPU around each phase to split the time."""
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
        if W + max_new_tokens + width > self.max_len:
            raise ValueError(f"prompt ({W}) + max_new_tokens ({max_new_tokens}) + k needs {W + max_new_tokens + width} "
                             f"cache slots; this decoder has {self.max_len} (raise max_len)")
        self._batch = B
        gen = torch.Generator(device=dev).manual_seed(seed)
        eos = (self.bundle.eos_token_ids or [None])[0] if stop_at_eos else None
        if method != "ar":
            proposer = proposer or self.proposer(method)
            proposer.setup(self, B, k)
        cache, st = self.cache(B), self.state(B)
        cache.reset()
        st.tokens.zero_()
        for b, p in enumerate(prompts):
            st.tokens[b, : len(p)] = torch.as_tensor(p, device=dev)
        st.max_new.fill_(max_new_tokens)
        st.eos.fill_(-1 if eos is None else eos)
        rows = torch.arange(B, device=dev)
        sync = self._sync if profile else (lambda: None)
        times = dict(prefill=0.0, draft=0.0, verify=0.0, bookkeeping=0.0)

        self._sync()
        t0 = time.perf_counter()
        pos = torch.arange(W, device=dev).expand(B, W)
        logits, hidden = self.target(st.tokens[:, :W], pos, cache, self.kv_len(pos))  # [B, W, V], [B, W, H]
        first = sample_tokens(logits[rows, lens - 1], temperature, gen)
        st.tokens[rows, lens] = first
        cache.commit(lens)
        st.seq_len.copy_(lens + 1)  # the last token (pending) is not yet in the cache
        st.n_gen.fill_(1)
        st.done.copy_((st.n_gen >= st.max_new) | (first == st.eos))
        st.pos0.zero_()
        st.n_valid.copy_(lens)
        ctx = StepContext(st.tokens, st.seq_len, hidden, st.pos0, st.n_valid, temperature, gen)
        if method != "ar":
            proposer.prefill(ctx)
        sync()
        times["prefill"] = time.perf_counter() - t0

        offsets = torch.arange(width, device=dev)
        verify_fn = self._verify_greedy if temperature == 0 else self._verify
        advance = self.graphed(f"advance-{width}", self._advance,
                               (torch.zeros(B, width, dtype=torch.long, device=dev), torch.zeros(B, dtype=torch.long, device=dev)),
                               state=st.tensors() + (cache.lengths,))
        accept_log: list[torch.Tensor] = []
        steps = 0
        while not bool(st.done.all()):
            steps += 1
            t1 = time.perf_counter()
            drafts, q = proposer.propose(ctx, k) if method != "ar" else (None, None)  # [B, k], [B, k, V] | None
            sync()
            t2 = time.perf_counter()
            pos = (st.seq_len - 1).unsqueeze(1) + offsets  # [B, width]: the pending token, then the drafts
            pending = st.tokens.gather(1, pos[:, :1])
            block = pending if drafts is None else torch.cat([pending, drafts], 1)
            out = self.graphed(f"verify-{width}-{temperature == 0}", verify_fn, (block, pos))(block, pos)
            hidden = out[1]
            if temperature == 0:
                accept, emitted = out[2], out[3]
            else:
                accept, emitted = self._accept_sampled(block, q, out[0], temperature, gen)
            sync()
            t3 = time.perf_counter()
            was_done = st.done.clone()
            count = advance(emitted, accept)  # keep the accepted prefix + 1, cut at EOS / max_new_tokens
            # tau counts tokens emitted per step: a step cut short at the end counts what it kept
            accept_log.append(torch.where(was_done, -1, torch.minimum(accept, count - 1)))
            ctx.hidden = hidden
            sync()
            t4 = time.perf_counter()
            times["draft"] += t2 - t1
            times["verify"] += t3 - t2
            times["bookkeeping"] += t4 - t3
        self._sync()
        wall = time.perf_counter() - t0
        lens_l, n_l = lens.tolist(), st.n_gen.tolist()
        out_tokens = [st.tokens[b, lens_l[b]: lens_l[b] + n_l[b]].tolist() for b in range(B)]
        acc = torch.stack(accept_log).cpu().numpy() if accept_log else np.zeros((0, B), dtype=np.int64)
        return DecodeResult(method=method, k=k, tokens=out_tokens, prompt_lengths=lens_l, accept_lengths=acc,
                            steps=steps, wall_s=wall, times=times if profile else {}, cuda_graphs=self.graph_mode == "cuda",
                            temperature=temperature)

    # -- the pieces of a step (each one graphable) ---------------------------------------------
    def _verify(self, block, pos):
        """The target reads the block at its positions: provisional KV writes, logits, hidden."""
        return self.target(block, pos, self.cache(block.shape[0]), self.kv_len(pos))

    def _verify_greedy(self, block, pos):
        """Verify and accept greedily in one graph: emitted [B, width] holds the accepted drafts and
        then the target's own token (correction or bonus) at index accept."""
        logits, hidden = self._verify(block, pos)
        if block.shape[1] == 1:
            return logits, hidden, torch.zeros_like(block[:, 0]), logits[:, 0].argmax(-1, keepdim=True)
        drafts = block[:, 1:]
        accept, nxt = greedy_accept(drafts, logits)
        emitted = torch.cat([drafts, nxt.unsqueeze(1)], 1).scatter(1, accept.unsqueeze(1), nxt.unsqueeze(1))
        return logits, hidden, accept, emitted

    @staticmethod
    def _accept_sampled(block, q, logits, temperature, gen):
        if block.shape[1] == 1:
            nxt = sample_tokens(logits[:, 0], temperature, gen)
            return torch.zeros_like(nxt), nxt.unsqueeze(1)
        drafts = block[:, 1:]
        accept, nxt = sample_accept(drafts, q, logits, temperature, gen)
        emitted = torch.cat([drafts, nxt.unsqueeze(1)], 1).scatter(1, accept.unsqueeze(1), nxt.unsqueeze(1))
        return accept, emitted

    def _advance(self, emitted, accept):
        """Bookkeeping, in place: each running row keeps accepted + 1 tokens (fewer at EOS or
        max_new_tokens), its KV cache commits them and the rest are rolled back by not counting."""
        st, cache = self.state(emitted.shape[0]), self.cache(emitted.shape[0])
        W = emitted.shape[1]
        j = torch.arange(W, device=emitted.device).unsqueeze(0)
        valid = j <= accept.unsqueeze(1)
        is_eos = (emitted == st.eos) & valid
        first_eos = torch.where(is_eos.any(1), is_eos.int().argmax(1), W)
        count = torch.minimum(torch.minimum(accept + 1, first_eos + 1), st.max_new - st.n_gen)
        count = torch.where(st.done, 0, count)
        keep = j < count.unsqueeze(1)
        idx = st.seq_len.unsqueeze(1) + j
        st.tokens.scatter_(1, idx, torch.where(keep, emitted, st.tokens.gather(1, idx)))
        st.done |= (is_eos & keep).any(1)
        st.pos0.copy_(st.seq_len - 1)
        st.n_valid.copy_(accept + 1)
        st.seq_len += count
        st.n_gen += count
        cache.commit(count, check=False)  # sized up front; the accepted prefix stays, the rest is rolled back
        st.done |= st.n_gen >= st.max_new
        return count

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
