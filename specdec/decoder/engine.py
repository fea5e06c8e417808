"""The step-level engine: rows join (admit) and leave (retire) a running batch between steps.

`admit` prefills prompts into free rows, `step` advances every running row by one plain or
speculative step (step.py), a finished row frees its slot at once; `steps_ahead` runs plain decoding
with the host one step behind the device. Under CUDA graphs a greedy
admission is prefilled in staging rows past the capacity and copied into its free slots, so one
captured prefill per row count and prompt bucket serves whichever slots are free. Lab 3's server drives this
loop directly (continuous batching); generate.py's `generate` is a thin loop over it. The host
keeps one `Row` record per running row; its device side lives at a fixed slot of preallocated
tensors (step.Rows). A step runs on slots 0..width-1 and free rows ride along, so under CUDA
graphs one capture per width serves every mix of rows. Attention reads only the slots the rows
have filled: the host knows every row's length from what it was told at the step's one sync, so
it picks the span without asking the device (under graphs a power-of-two bucket, one capture per
bucket). At topk > 1 the proposer drafts a tree instead of a chain (tree.py), which step.tree_verify
verifies and commits; the tree's shape is fixed per engine, so under graphs both are captured
steps as the chain's are. Shapes: B rows, k drafts, V vocabulary.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch

from specdec.decoder.adaptive import AdaptiveK
from specdec.decoder.cuda_graphs import Graphs, graph_mode, say_eager_once
from specdec.decoder.generate import DecodeResult, generate
from specdec.decoder.kv_cache import KVCache
from specdec.decoder.methods import METHODS
from specdec.decoder.params import RowUpdate, SamplingParams, check_prompt
from specdec.decoder.proposers import (
    DraftModelProposer,
    FeatureDraftProposer,
    HeadsProposer,
    NgramProposer,
    Proposer,
)
from specdec.decoder.step import Rows, commit, plain_step, plain_step_hidden, readout, to_host, tree_verify, verify
from specdec.decoder.tree import TreeDrafts, TreeShape
from specdec.decoder.verify import sample


def make_proposer(method: str, bundle) -> Proposer | None:
    """The bundle's proposer for `method` (None for plain decoding)."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    part = METHODS[method].part  # the bundle's attribute of that name
    if part and getattr(bundle, part) is None:
        raise ValueError(f"{bundle.name} has no {METHODS[method].label} (method {method!r})")
    if method in ("mtp", "eagle"):
        return FeatureDraftProposer(getattr(bundle, part), bundle.target, method)
    if method == "heads":
        return HeadsProposer(bundle.heads, bundle.target)
    if method == "draft":
        return DraftModelProposer(bundle.draft)
    return NgramProposer() if method == "ngram" else None


@dataclass
class Row:
    """The host's record of one running row; its device side is slot `slot` of the engine's Rows."""

    slot: int
    params: SamplingParams
    committed: int  # the row's cache length, known on the host: the counts each step reports (no sync)
    emitted: int = 0  # tokens the row has emitted
    gen: torch.Generator | None = None  # the row's own random numbers, when it has a seed


class Launched(NamedTuple):
    """A step queued on the device and not yet read (Engine._launch, Engine._read)."""

    host: torch.Tensor  # its readout (step.readout): on the device, or its copy on the host (steps_ahead)
    ready: torch.cuda.Event | None  # when that copy has landed (None: nothing to wait for but the readout itself)
    width: int  # the rows it ran
    k: int  # drafts a row this step (the policy may have chosen fewer than the engine's k)
    drafting: bool  # it verified drafts (else a plain step)
    tree: TreeDrafts | None  # the tree it verified (a tree engine)
    start: float  # the policy's clock at its launch
    t0: float  # perf_counter marks: drafting began, verifying began, the launch returned
    t1: float
    t2: float


# Prompt lengths a captured prefill pads to (longer prompts prefill eagerly: their GPU work outweighs the launches)
PREFILL_BUCKETS = (16, 32, 64, 128, 256, 512)
# Rows past the capacity where a captured prefill stages up to this many prompts before copying them into their free
# slots: the capture then does not depend on which slots are free (one per row count and bucket, not per slot too)
STAGE_ROWS = 4


def consecutive(slots: list[int]) -> list[list[int]]:
    """[0, 1, 2, 5, 6, 9] -> [[0, 1, 2], [5, 6], [9]]: runs of consecutive slots, in order."""
    runs: list[list[int]] = []
    for s in slots:
        if runs and s == runs[-1][-1] + 1:
            runs[-1].append(s)
        else:
            runs.append([s])
    return runs


class Engine:
    """A target, one proposer (or none: plain decoding) and a batch of up to max_batch rows."""

    def __init__(self, bundle, method: str = "ar", k: int = 4, max_batch: int = 8, max_len: int | None = None,
                 cuda_graphs: str = "auto", compile: bool | str = False, proposer: Proposer | None = None, seed: int = 0,
                 min_span: int = 256, adaptive: AdaptiveK | bool = False, topk: int = 1,
                 num_draft_tokens: int | None = None, simulate: float | None = None):
        """compile: torch.compile under the graphs (GPU; replayed inside our own graphs): "step" the target's
        steps whole (and a tree's drafted expansion), "layers" each decoder layer and LM head of the target and the
        proposer, one compile for all layers (cuda_graphs.SCOPES); True: cuda_graphs.DEFAULT_SCOPE.
        min_span: the smallest KV bucket under graphs (buckets double from there up to max_len).
        adaptive: choose each step's k in 0..k from the batch and the measured acceptance (adaptive.py;
        True: the default AdaptiveK), else every step drafts k.
        topk, num_draft_tokens: a draft tree (tree.py; SGLang's flags, k = --num-steps); topk 1 is the chain.
        simulate: an oracle's mean accept length (tokens per verify step, 1..k+1; SGLang's SGLANG_SIMULATE_ACC_LEN):
        each row keeps floor or ceil of simulate - 1 drafts whatever the target says, then the target's own token,
        to measure what a step costs and pays at that acceptance. The output is then not the target's."""
        if not (isinstance(k, int) and k >= 1):
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if not (isinstance(min_span, int) and min_span >= 1):
            raise ValueError(f"min_span must be an integer >= 1, got {min_span!r}")
        self.bundle, self.target, self.k = bundle, bundle.target, k
        self.proposer = proposer if proposer is not None else make_proposer(method, bundle)
        self.method = method if proposer is None else proposer.name
        self.device = next(self.target.parameters()).device
        self.shape = TreeShape.make(k, topk, num_draft_tokens)
        self.tree = self.shape if topk > 1 else None  # None: the chain, as ever
        if self.tree is not None and not (self.proposer is not None and self.proposer.trees):
            what = "plain decoding drafts nothing" if self.proposer is None else f"{self.method} drafts a chain"
            raise ValueError(f"topk {topk} needs a proposer that drafts a tree (mtp, eagle, heads); {what}")
        if self.tree is not None and adaptive:
            raise ValueError(f"adaptive k chooses a chain's length: it does not combine with topk {topk}")
        if simulate is not None and (self.proposer is None or self.tree is not None or not 1 <= simulate <= k + 1):
            raise ValueError(f"a simulated accept length needs a proposer, a chain (topk 1) and a value in 1..k + 1 "
                             f"= {k + 1}, got {simulate!r}")
        self.simulate = simulate
        self.block = self.shape.slots if self.tree is not None else k + 1  # slots a step writes past the committed
        self.max_len = max_len or min(self.target.config.max_position_embeddings, 2048)
        self.min_span = min_span
        self.graph_mode = graph_mode(cuda_graphs, self.device)
        if self.graph_mode != "cuda":
            say_eager_once(self.device)
        pool = torch.cuda.graph_pool_handle() if self.graph_mode == "cuda" else None  # one pool per engine
        self.graphs = Graphs(self.graph_mode, pool, compile)
        self.prefills = Graphs(self.graph_mode, pool)  # the captured prefills (_prefill), never compiled
        # a captured prefill's staging rows (STAGE_ROWS) come after the capacity, in the cache and every per-row buffer
        stages = self.proposer is None or type(self.proposer).copy_rows is not Proposer.copy_rows
        self.stage = min(STAGE_ROWS, max_batch) if self.graph_mode is not None and stages else 0
        self.cache = KVCache.for_model(self.target, max_batch + self.stage, self.max_len)
        # a graph's shapes are fixed: read whole, the cache reads every slot (each step's view has its own span)
        self.cache.span = self.max_len if self.graph_mode is not None else None
        self.views: dict[tuple[int, int], KVCache] = {}  # under graphs: the cache's rows 0..width-1, per bucket
        self.row_views: dict[int, Rows] = {}  # the rows 0..width-1, per width
        self.no_draws: dict[tuple[int, int], torch.Tensor] = {}  # the uniforms of greedy steps: zeros, per shape
        self.readouts: dict[tuple[int, ...], list[torch.Tensor]] = {}  # steps_ahead's pinned readouts, per shape
        # called as on_tree_step(tree, emitted, accepted, running slots) after each tree step's to_host (tree_accept.py)
        self.on_tree_step: Callable | None = None
        self.eos_ids = bundle.eos_token_ids
        self.rows = Rows.empty(self.cache, self.max_len + k + 2, len(self.eos_ids))
        if self.proposer is not None:
            # compiled layers are every module's, one Regions for both; a whole-step compile is the target's, and the
            # drafter's too when it grows a tree (its expansion's many small kernels fuse: a tree's step measured
            # faster so, a chain's draft steps slower; benchmarks/logs/gpu_tree_profile.log)
            scope = self.graphs.scope if self.graphs.scope == "layers" or self.tree is not None else False
            self.proposer.setup(max_batch + self.stage, self.max_len, k,
                                Graphs(self.graph_mode, pool, scope, self.graphs.regions))
        self.capacity = max_batch
        self.live: dict[int, Row] = {}  # the running rows, by slot
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        self.sim_gen = torch.Generator(device=self.device).manual_seed(seed + 1)  # the oracle's own draws
        self.times = dict(prefill=0.0, draft=0.0, verify=0.0, host=0.0)  # filled when profiling
        self.policy = (AdaptiveK(k) if adaptive is True else adaptive or None) if self.proposer is not None else None
        if self.policy is not None and self.policy.k_max > k:
            raise ValueError(f"the policy's k_max ({self.policy.k_max}) exceeds the engine's k ({k})")

    # -- rows join and leave -------------------------------------------------------------------
    @property
    def running(self) -> list[int]:
        return sorted(self.live)

    @property
    def free_slots(self) -> list[int]:
        return [s for s in range(self.capacity) if s not in self.live]

    def check_prompt(self, prompt: list[int], params: SamplingParams) -> None:
        """A clear ValueError for what this engine cannot decode."""
        check_prompt(prompt, params, self.target.config.vocab_size, self.max_len,
                     self.block if self.proposer is not None else 1)

    @torch.no_grad()
    def admit(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[RowUpdate]:
        """Prefill prompts into the lowest free rows; each gets its first token (the pending one)."""
        params = params if isinstance(params, list) else [params] * len(prompts)
        for p, sp in zip(prompts, params):
            self.check_prompt(p, sp)
        free = self.free_slots
        if len(prompts) > len(free):
            raise ValueError(f"{len(prompts)} prompts but {len(free)} free rows")
        t0 = time.perf_counter()
        slots, updates = free[: len(prompts)], []
        # Under graphs a greedy admission replays a captured prefill: eager, its few hundred small launches kept every
        # running row waiting 3 to 15 steps (benchmarks/logs/gpu_admit_cost.log). A sampled first token, or a prompt
        # past the last bucket, prefills eagerly.
        captured = (self.stage > 0 and max(map(len, prompts)) <= PREFILL_BUCKETS[-1]
                    and not any(sp.temperature > 0 for sp in params))
        try:
            if captured:  # up to STAGE_ROWS prompts a replay, whichever slots they go to
                for i in range(0, len(prompts), self.stage):
                    j = i + self.stage
                    updates += self._staged(slots[i:j], prompts[i:j], params[i:j])
            else:
                i = 0
                for run in consecutive(slots):  # runs of consecutive slots are prefilled in one forward
                    j = i + len(run)
                    updates += self._prefill(run[0], prompts[i:j], params[i:j])
                    i = j
        except BaseException:  # all or nothing: no half-admitted row may stay behind to break the next step
            for slot in slots:
                self.retire(slot)
            raise
        self.times["prefill"] += time.perf_counter() - t0
        return updates

    def _inputs(self, prompts: list[list[int]], params: list[SamplingParams], W: int) -> list[torch.Tensor]:
        """The prefill's inputs on the device: tokens [n, W] (padded), eos ids, lengths, (temperature, top_p),
        (top_k, max_new_tokens)."""
        tokens = torch.zeros(len(prompts), W, dtype=torch.long)
        eos = torch.full((len(prompts), self.rows.eos.shape[1]), -1, dtype=torch.long)
        for b, (p, sp) in enumerate(zip(prompts, params)):
            tokens[b, :len(p)] = torch.tensor(p)
            if sp.stop_at_eos and self.eos_ids:
                eos[b, : len(self.eos_ids)] = torch.tensor(self.eos_ids)
        lens = torch.tensor([len(p) for p in prompts])
        floats = torch.tensor([[sp.temperature, sp.top_p] for sp in params])  # [n, 2]
        ints = torch.tensor([[sp.top_k, sp.max_new_tokens] for sp in params])  # [n, 2]
        return [t.to(self.device, non_blocking=True) for t in (tokens, eos, lens, floats, ints)]

    def _join(self, slots: list[int], prompts: list[list[int]], params: list[SamplingParams]) -> None:
        """The new rows' records; committed: the first token's commit (in _report) makes it the prompt's length."""
        for slot, p, sp in zip(slots, prompts, params):
            gen = torch.Generator().manual_seed(sp.seed) if sp.seed is not None else None
            self.live[slot] = Row(slot, sp, committed=len(p) - 1, gen=gen)

    def _prefill(self, start: int, prompts: list[list[int]], params: list[SamplingParams]) -> list[RowUpdate]:
        """The eager prefill of rows start.. (consecutive slots), in place."""
        n, W = len(prompts), max(len(p) for p in prompts)
        args = self._inputs(prompts, params, W)
        self._join(range(start, start + n), prompts, params)
        rows = self.rows.view(start, start + n)
        self._flags(rows)
        u = self._uniforms(start, n, 1)[:, 0]  # the first token's draws
        host = self._fill(start, rows, *args, u).tolist()
        return [self._report(start + b, [tok], -1, 0, bool(done)) for b, (tok, done) in enumerate(host)]

    def _staged(self, slots: list[int], prompts: list[list[int]], params: list[SamplingParams]) -> list[RowUpdate]:
        """A captured prefill: up to STAGE_ROWS greedy prompts, padded to a bucket (as a ragged batch's shorter rows
        are) and to a power-of-two count, prefilled into the staging rows after the capacity, then copied into their
        slots (an input: one capture per row count and bucket serves any free slots)."""
        n, cap = len(prompts), self.capacity
        N = 1 << (n - 1).bit_length()  # pad rows: one token, copied onto themselves
        W = min(self.max_len, next(b for b in PREFILL_BUCKETS if b >= max(map(len, prompts))))
        pad = SamplingParams(max_new_tokens=1, stop_at_eos=False)
        args = self._inputs(prompts + [[0]] * (N - n), params + [pad] * (N - n), W)
        self._join(slots, prompts, params)
        rows = self.rows.view(cap, cap + N)
        self._flags(rows)
        # the first token's draws, as the eager prefill takes them (runs of consecutive slots): greedy rows read none,
        # but a running row's sampling then draws what it would have
        u = torch.cat([self._uniforms(run[0], len(run), 1)[:, 0] for run in consecutive(slots)]
                      + [torch.zeros(N - n, device=self.device)])
        dst = torch.tensor(slots + list(range(cap + n, cap + N))).to(self.device, non_blocking=True)

        def fill(tokens, eos, lens, floats, ints, u_, dst_):
            out = self._fill(cap, rows, tokens, eos, lens, floats, ints, u_)
            self._copy_rows(torch.arange(cap, cap + N, device=dst_.device), dst_, W)
            return out

        host = self.prefills(f"prefill {N}", fill, *args, u, dst, span=W).tolist()
        if self.proposer is not None:  # a replay ran no Python: the proposer's host part, here
            self.proposer.admitted()
        return [self._report(slot, [tok], -1, 0, bool(done)) for slot, (tok, done) in zip(slots, host)]

    def _copy_rows(self, src: torch.Tensor, dst: torch.Tensor, slots: int) -> None:
        """Every per-row state of rows src [n] into rows dst [n]: the target's and the proposer's first `slots` cache
        slots and lengths, and the rows' tensors (a staged prefill into its free slots)."""
        self.cache.copy_rows(src, dst, slots)
        for t in self.rows.tensors():
            if t is not self.cache.lengths:  # the rows' lengths are the cache's, copied just above
                t[dst] = t[src]
        if self.proposer is not None:
            self.proposer.copy_rows(src, dst, slots)

    def _fill(self, start: int, rows: Rows, tokens, eos, lens, floats, ints, u) -> torch.Tensor:
        """The prefill's device work, without a host sync (a CUDA graph replays it): tokens [n, W] (padded) into
        rows start.., their KV and the proposer's state, the first token chosen and committed -> [n, 2] (first, done)."""
        n, W = tokens.shape
        cache = self.cache.rows(start, start + n, W)  # the prompts' slots, and nothing past them
        rows.tokens[:, :W] = tokens
        rows.eos.copy_(eos)
        rows.temperature.copy_(floats[:, 0])
        rows.top_p.copy_(floats[:, 1])
        rows.top_k.copy_(ints[:, 0])
        rows.max_new.copy_(ints[:, 1])
        rows.n_new.zero_()
        rows.done.zero_()
        cache.lengths.zero_()
        logits, hidden = self.target(tokens, torch.arange(W, device=tokens.device).expand(n, W), cache)
        # The prompt's last token plays the pending one: a plain step's commit emits the first token.
        cache.lengths.copy_(lens - 1)
        first = sample(rows.probs(logits[torch.arange(n, device=tokens.device), lens - 1].unsqueeze(1))[:, 0], u)
        commit(rows, cache, first.unsqueeze(1), torch.ones_like(lens))
        if self.proposer is not None:
            self.proposer.admit(self.rows, start, hidden)
        return torch.stack([first, rows.done.long()], 1)

    def retire(self, slot: int) -> None:
        """Free a row (finished, or cancelled by its caller): the next admit may reuse it."""
        self.live.pop(slot, None)
        self.rows.done[slot] = True

    # -- one step of every running row -----------------------------------------------------------
    @torch.no_grad()
    def step(self, profile: bool = False) -> list[RowUpdate]:
        """Advance every running row by one step; `profile` synchronises the device around each
        phase to split the time (a GPU otherwise runs ahead of the host until the step's result)."""
        if not self.live:
            return []
        return self._read(self._launch(profile))

    @torch.no_grad()
    def steps_ahead(self) -> Iterator[list[RowUpdate]]:
        """Plain decoding of the running rows to their end, the host one step behind the GPU (as SGLang's overlap
        scheduler): step N + 1 is launched before step N's readout is read, so the host's bookkeeping runs while the
        GPU computes, not between its steps. A plain step needs nothing from the host but the span: the token it reads
        is on the device, and a row that finished at step N (a stop id or its budget: done on the device) keeps nothing
        at step N + 1, which only repeats its last write. Yields each step's updates; admit nothing until it returns."""
        if self.proposer is not None:
            raise ValueError("steps_ahead is plain decoding: a speculative step's span depends on what the last kept")
        pending = self._launch(ahead=0) if self.live else None
        while pending is not None:
            # a row with budget left after the step in flight (else that step ends every row: launch no more)
            more = any(r.emitted + 1 < r.params.max_new_tokens for r in self.live.values())
            following = self._launch(ahead=1) if more else None
            yield self._read(pending)
            if not self.live:  # every row ended (a stop id) at the step just read: the one after it is left unread
                return
            pending = following if following is not None else self._launch(ahead=0)

    def _launch(self, profile: bool = False, ahead: int | None = None) -> Launched:
        """Queue one step of every running row on the device. ahead (steps_ahead): the steps launched and not yet
        read (each moves a plain row by at most one slot, which the span must cover); the readout is then copied to
        the host as the step finishes, before the next step's replay overwrites it."""
        start = self.policy.clock() if self.policy is not None else 0.0  # the step's wall time, for the policy
        width, k = self.width(), self.k
        # every position this step reads (the verify block, the proposer's own, after the steps in flight) is below need
        need = max(r.committed for r in self.live.values()) + (1 if self.proposer is None else self.block)
        need += ahead or 0
        span = self.pick_span(need)
        rows, cache = self.row_view(width), self.cache_view(width, span)
        rows.span = span
        self._flags(rows)
        sync = self.sync if profile else (lambda: None)
        t0 = time.perf_counter()
        tree = None
        if self.proposer is None:
            # greedy rows read no uniforms: None keeps them out of the step (no copy into a graph's input)
            u = self._uniforms(0, width, 1)[:, 0] if rows.sampling else None
            host = self.graphs("plain" + self._rule(rows), lambda u_: self._plain(cache, rows, u_), u,
                               state=rows.tensors(), span=span)
            t1 = t0
        elif self.tree is not None:  # drafted and verified in captured steps, as the chain; the shape is the engine's
            tree = self.proposer.propose_tree(rows, self.tree)
            sync()
            t1 = time.perf_counter()
            u = self._uniforms(0, width, k * self.tree.topk + 1) if rows.sampling else None
            host, count, hidden = self.graphs(
                "tree" + self._rule(rows), lambda *a: self._tree_verify(cache, rows, TreeDrafts(*a[:4], k), a[4]),
                *tree.tensors(), u, state=rows.tensors(), span=span, tune=False)  # N tokens a row: untuned
            self.proposer.accepted(rows, hidden, count)
        else:
            k = self.policy.choose(width) if self.policy is not None else k
            u = self._uniforms(0, width, 2 * k + 1)
            if k == 0:  # the policy skips drafting: a plain step, whose state the proposer still reads
                self.proposer.skip(rows)
                sync()
                t1 = time.perf_counter()
                host, count, hidden = self.graphs("skip" + self._rule(rows), lambda u_: self._skip(cache, rows, u_),
                                                  u[:, 0] if rows.sampling else None,
                                                  state=rows.tensors() + self.proposer.state(), span=span)
            else:
                drafts, q = self.proposer.propose(rows, k, u[:, k + 1:])  # [B, k], [B, k, V] | None
                sync()
                t1 = time.perf_counter()
                host, count, hidden = self.graphs(
                    "verify" + self._rule(rows), lambda d, q_, f, u_: self._verify(cache, rows, d, q_, u_, f), drafts,
                    q, self._forced(width), u[:, : k + 1] if rows.sampling or q is not None else None,
                    state=rows.tensors(), span=span)  # the uniforms last, as every step's
            if k == 0:
                self.proposer.kept(1)  # its tensor part ran inside the skip step (_skip)
            else:
                self.proposer.accepted(rows, hidden, count)
        sync()
        ready = None
        if ahead is not None:
            host, ready = self._copy_readout(host)
        return Launched(host, ready, width, k, self.proposer is not None and k > 0, tree, start, t0, t1,
                        time.perf_counter())

    def _read(self, step: Launched) -> list[RowUpdate]:
        """The step's one sync (its readout on the host), then every running row's update."""
        if step.ready is not None:
            step.ready.synchronize()
        k, drafting = step.k, step.drafting
        steps = to_host(step.host, k + 1 if drafting else 1)  # what the host needs
        if self.tree is not None and self.on_tree_step is not None:  # the step as the host reads it, by name
            self.on_tree_step(step.tree, [s.emitted for s in steps], [s.accepted for s in steps], list(self.live))
        updates = []
        for slot, row in list(self.live.items()):
            got = steps[slot]
            # drafts count as proposed up to the row's budget: past it they could never be emitted
            left = row.params.max_new_tokens - row.emitted
            proposed = min(k, left - 1) if drafting else 0
            accepted = min(got.accepted, proposed) if got.accepted >= 0 else -1
            updates.append(self._report(slot, got.tokens, accepted, proposed, got.done,
                                        got.drafts if drafting else None))
        if self.policy is not None:
            if drafting:
                self.policy.observe([u.accepted for u in updates], [u.proposed for u in updates])
            self.policy.timed(step.width, k, self.policy.clock() - step.start)  # the step's one sync is behind
        self.times["draft"] += step.t1 - step.t0
        self.times["verify"] += step.t2 - step.t1
        self.times["host"] += time.perf_counter() - step.t2
        return updates

    def _copy_readout(self, host: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """A launched step's readout, copied to the host as soon as the step ends, without waiting for it: into one of
        two pinned buffers per shape (one being read while the next step's is filled)."""
        if self.device.type != "cuda":
            return host.clone(), None  # the CPU has finished the step already
        key = tuple(host.shape)
        if key not in self.readouts:
            self.readouts[key] = [torch.empty(key, dtype=host.dtype, pin_memory=True) for _ in range(2)]
        bufs = self.readouts[key]
        bufs.reverse()
        bufs[0].copy_(host, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return bufs[0], ready

    def _plain(self, cache: KVCache, rows: Rows, u: torch.Tensor | None) -> torch.Tensor:
        """A plain step and its readout (accepted -1: nothing was proposed)."""
        emitted, count = plain_step(self.target, cache, rows, u)
        return readout(rows, count, torch.full_like(count, -1), emitted, emitted[:, :0])

    def _skip(self, cache: KVCache, rows: Rows, u: torch.Tensor | None):
        """A plain step in a speculative engine: its readout (accepted -1: nothing was proposed), and the count
        and hidden state the proposer reads."""
        emitted, count, hidden = plain_step_hidden(self.target, cache, rows, u)
        self.proposer.keep(rows, hidden, count)  # in the step's capture: no launches of its own between steps
        return readout(rows, count, torch.full_like(count, -1), emitted, emitted[:, :0]), count, hidden

    def _verify(self, cache: KVCache, rows: Rows, drafts: torch.Tensor, q: torch.Tensor | None,
                u: torch.Tensor | None, forced: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A verify step: its readout, and the count and hidden states the proposer learns from."""
        emitted, count, accepted, hidden = verify(self.target, cache, rows, drafts, q, u, forced)
        return readout(rows, count, accepted, emitted, drafts), count, hidden

    def _tree_verify(self, cache: KVCache, rows: Rows, tree: TreeDrafts, u: torch.Tensor | None):
        """A tree's verify step: its readout (the drafts: the tree's nodes), and the count and the hidden states
        along the accepted path that the proposer learns from."""
        emitted, count, accepted, hidden = tree_verify(self.target, cache, rows, tree, self.tree.topk, u)
        return readout(rows, count, accepted, emitted, tree.tokens), count, hidden

    def generate(self, prompts: list[list[int]], max_new_tokens: int = 64, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int = 0, stop_at_eos: bool = True,
                 profile: bool = False) -> DecodeResult:
        """A whole batch, start to finish (generate.py), every row with these sampling parameters."""
        params = SamplingParams(max_new_tokens, temperature, top_p, top_k, stop_at_eos)
        return generate(self, prompts, params, seed, profile)

    def _report(self, slot: int, tokens: list[int], accepted: int, proposed: int, done: bool,
                drafts: list[int] | None = None) -> RowUpdate:
        row = self.live[slot]
        row.emitted += len(tokens)
        row.committed += len(tokens)  # commit moved the row's cache length over what it kept
        finished = None
        if done:
            finished = "stop" if tokens and tokens[-1] in self.eos_ids and row.params.stop_at_eos else "length"
            self.retire(slot)
        return RowUpdate(slot, tokens, accepted, proposed, finished, drafts)

    def width(self) -> int:
        """Rows in this step's fixed shape: up to the highest running slot; under graphs rounded up to
        a power of two, so that a few captures serve every mix of rows."""
        top = max(self.live) + 1
        if self.graph_mode is None:
            return top
        return min(self.capacity, 1 << (top - 1).bit_length())

    def row_view(self, width: int) -> Rows:
        """The rows 0..width-1, kept per width: slicing each of the rows' tensors anew every step was about a
        third of the host's bookkeeping (benchmarks/cpu_host_step.py)."""
        if width not in self.row_views:
            self.row_views[width] = self.rows.view(0, width)
        return self.row_views[width]

    def cache_view(self, width: int, span: int) -> KVCache:
        """The target cache's rows 0..width-1 read up to span. Under graphs the few views are kept:
        slicing every layer's keys and values anew costs the host tens of microseconds a step."""
        if self.graph_mode is None:
            return self.cache.rows(0, width, span)
        if (width, span) not in self.views:
            self.views[width, span] = self.cache.rows(0, width, span)
        return self.views[width, span]

    def pick_span(self, need: int) -> int:
        """Cache slots attention reads in a step whose positions all lie below `need`: just those when
        eager; under graphs the power of two above (at least min_span, at most max_len), so that a
        few captures serve every context and a step reads at most twice what it needs."""
        if self.graph_mode is None:
            return min(need, self.max_len)
        return min(self.max_len, max(self.min_span, 1 << (need - 1).bit_length()))

    def _flags(self, rows: Rows) -> None:
        running = [r.params for r in self.live.values()]
        rows.sampling = self.rows.sampling = any(sp.temperature > 0 for sp in running)
        rows.truncating = self.rows.truncating = any(sp.top_p < 1 or sp.top_k > 0 for sp in running)

    @staticmethod
    def _rule(rows: Rows) -> str:
        """What a captured step bakes in about choosing tokens: the argmax, a draw, or a draw after top-p/top-k."""
        return "" if not rows.sampling else "/top" if rows.truncating else "/sample"

    def _uniforms(self, start: int, n: int, width: int) -> torch.Tensor:
        """Uniforms [n, width] for rows start..: zeros when every row is greedy (they are unused),
        a row's own generator when it has a seed."""
        if not self.rows.sampling:  # the same zeros every step: nothing to allocate or fill
            if (n, width) not in self.no_draws:
                self.no_draws[n, width] = torch.zeros(n, width, device=self.device)
            return self.no_draws[n, width]
        u = torch.rand(n, width, device=self.device, generator=self.gen)
        for slot, row in self.live.items():
            if row.gen is not None and start <= slot < start + n:
                u[slot - start] = torch.rand(width, generator=row.gen).to(self.device)
        return u

    def _forced(self, width: int) -> torch.Tensor | None:
        """The simulated acceptance's drafts kept per row [width]: floor(simulate - 1), or one more with probability
        its fraction (SGLang's "match-expected"), so that the mean accept length is `simulate`; None: not simulating."""
        if self.simulate is None:
            return None
        low = int(self.simulate - 1)
        u = torch.rand(width, device=self.device, generator=self.sim_gen)
        return low + (u < self.simulate - 1 - low).long()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
