"""Where a decode step sits on a CPU, and speculation on a target too big for the CPU's caches.

A decode step reads every weight once. The tiny zoo's 20 MB target fits in a laptop CPU's last-level
cache; a target of a few hundred MB does not, so each of its steps streams the weights from memory.
`oracle_run` decodes a target plainly and with the oracle proposer, measures the step costs with the
engine's own phase timer, and sets the measured speedup beside Lab 1's prediction from those costs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from specdec.decoder.bundle import ModelBundle
from specdec.decoder.engine import Engine
from specdec.decoder.generate import DecodeResult
from specdec.decoder.model import ModelConfig, Transformer
from specdec.decoder.proposers import OracleProposer
from specdec.sim.formulas import expected_tokens_per_step, speedup_from_costs
from specdec.sim.stats import AcceptanceStats

# Llama-shaped, 107 M parameters (428 MB in fp32), many times a laptop's last-level cache; the small vocabulary
# keeps most bytes in the layers' matrices, which every step reads in full. Measured: docs/results.md, the section
# "CPU: the oracle on a target too big for the caches".
MEMORY_BOUND = dict(vocab_size=8192, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                    num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=2048)


def cache_sizes(cpu: int = 0) -> dict[str, int]:
    """This CPU's data caches in bytes, as Linux reports them for one core ({} where it does not)."""
    sizes, units = {}, {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    for d in sorted(Path(f"/sys/devices/system/cpu/cpu{cpu}/cache").glob("index*")):
        try:
            level, kind, size = ((d / f).read_text().strip() for f in ("level", "type", "size"))
        except OSError:
            continue
        if kind != "Instruction":
            sizes[f"L{level}"] = int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
    return sizes


def random_target(shape: dict, seed: int = 0) -> Transformer:
    """A Transformer of this shape (ModelConfig fields) with seeded random weights, fp32, in eval mode."""
    torch.manual_seed(seed)
    return Transformer(ModelConfig(**shape)).eval()


def step_weights(model: Transformer) -> list[torch.Tensor]:
    """The weights one decode step reads in full: all but the embedding, of which it reads one row per token
    (unless the embedding is also the LM head)."""
    return [p for p in model.parameters() if p is not model.embed_tokens.weight or p is model.lm_head.weight]


def weight_bytes(model: Transformer) -> int:
    return sum(p.numel() * p.element_size() for p in step_weights(model))


def read_floor(model: Transformer, repeats: int = 5) -> float:
    """Seconds to stream a step's weights once (a sum over each, the fastest of `repeats` passes): the least a
    step whose weights are not in cache can take on this core."""
    weights, best = step_weights(model), float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for w in weights:
            w.sum()
        best = min(best, time.perf_counter() - t0)
    return best


@dataclass
class StepCosts:
    """Seconds per step, from the engine's phase timer. As in the Lab 2 notebook, a step's bookkeeping (reading
    its result back) is left out: Lab 1's formula knows only drafts and target forwards."""

    plain: float  # one plain step: a target forward of 1 position
    verify: float  # one verify step: a target forward of k + 1 positions, acceptance and commit
    draft: float  # one drafted token: the proposer's time per step / k

    @classmethod
    def measured(cls, plain: list[DecodeResult], spec: list[DecodeResult]) -> StepCosts:
        """From profiled runs (Engine.generate(profile=True)); a plain step's forward is timed as 'verify'."""
        def per_step(runs, phase):
            return sum(r.times[phase] for r in runs) / sum(r.steps for r in runs)

        return cls(per_step(plain, "verify"), per_step(spec, "verify"), per_step(spec, "draft") / spec[0].k)


def predicted_speedup(costs: StepCosts, alpha: float, k: int, tau: float | None = None) -> float:
    """Lab 1's speedup from measured costs; tau from the i.i.d. formula unless given."""
    tau = expected_tokens_per_step(alpha, k) if tau is None else tau
    return speedup_from_costs(tau, costs.plain, costs.draft, costs.verify, k)


@dataclass
class OracleRun:
    """Plain decoding against the oracle proposer on one target: measured beside predicted."""

    name: str
    weight_mb: float  # weights a step reads
    floor: float  # seconds to stream them once on this core (read_floor)
    caches: dict[str, int]
    alpha: float
    k: int
    new_tokens: int
    repeats: int
    threads: int
    costs: StepCosts
    tau_formula: float
    tau_measured: float  # tokens per verify step this run got, pooled over the repeats
    tau_stderr: float
    predicted: float  # from the measured costs and the formula's tau
    predicted_measured_tau: float  # the same with the tau this run got: what is left is not sampling noise
    measured: float  # plain seconds / oracle seconds, whole generate calls, summed over the repeats
    measured_each: list[float]
    identical: bool  # every oracle output equals plain decoding, token for token
    seconds: float
    load_average: tuple[float, float, float] = field(default_factory=os.getloadavg)

    @property
    def verify_gflops(self) -> float:
        """The verify step's matrix arithmetic (2 flops per weight per position) per second."""
        return 2 * self.weight_mb / 4 * (self.k + 1) / self.costs.verify / 1e3

    def lines(self) -> list[str]:
        c, mb = self.costs, self.weight_mb
        l3 = self.caches.get("L3") or max(self.caches.values(), default=0)
        sizes = ", ".join(f"{n} {b / 2**20:g} MiB" for n, b in self.caches.items() if n != "L1")
        where = f"{mb * 1e6 / l3:.1f}x this CPU's last-level cache" if l3 else "cache sizes unknown"
        return [
            f"target: {self.name}: {mb:.0f} MB of weights read per step, {where} ({sizes}); streaming them once "
            f"takes {self.floor * 1e3:.1f} ms here ({mb / 1e3 / self.floor:.0f} GB/s)",
            f"step costs measured: plain {c.plain * 1e3:.1f} ms ({c.plain / self.floor:.1f}x that floor), verify of "
            f"k + 1 = {self.k + 1} positions {c.verify * 1e3:.1f} ms = {c.verify / c.plain:.2f} plain steps (its matrix "
            f"products do {self.k + 1}x the arithmetic, here at {self.verify_gflops:.0f} GFLOP/s), oracle draft "
            f"{c.draft * 1e3:.2f} ms",
            f"oracle at alpha {self.alpha}, k {self.k}, greedy, {self.new_tokens} new tokens x {self.repeats} runs: "
            f"tau {self.tau_measured:.2f} +- {self.tau_stderr:.2f} (Lab 1: {self.tau_formula:.2f}); speedup measured "
            f"{self.measured:.2f}x, predicted {self.predicted:.2f}x by Lab 1's speedup_from_costs from these costs "
            f"(measured / predicted {self.measured / self.predicted:.2f}; {self.predicted_measured_tau:.2f}x at the "
            f"run's own tau); same tokens as plain: {'yes' if self.identical else 'NO'}",
        ]

    def as_dict(self) -> dict:
        return {**asdict(self), "verify_gflops": self.verify_gflops,
                "measured_over_predicted": self.measured / self.predicted}


def oracle_run(target: Transformer, name: str, alpha: float = 0.8, k: int = 4, new_tokens: int = 128,
               repeats: int = 3, prompt_tokens: int = 8, seed: int = 0,
               progress: Callable[[str], None] | None = None) -> OracleRun:
    """Decode one random prompt plainly and with the oracle at (alpha, k), `repeats` runs each, interleaved;
    greedy, batch 1, on the target's device with torch's current thread count."""
    t0, say = time.perf_counter(), progress or (lambda _: None)
    bundle = ModelBundle(name=name, target=target, tokenizer=None)
    vocab = target.config.vocab_size
    prompt = [torch.randint(0, vocab, (prompt_tokens,), generator=torch.Generator().manual_seed(seed)).tolist()]
    kw = dict(max_batch=1, max_len=prompt_tokens + new_tokens + k + 2, cuda_graphs="off")
    run = dict(max_new_tokens=new_tokens, stop_at_eos=False, profile=True)  # profile: the phase split (no syncs on a CPU)
    say("warm-up")
    plain_engine = Engine(bundle, "ar", **kw)
    plain_engine.generate(prompt, max_new_tokens=4, stop_at_eos=False)  # first calls pay one-off costs
    plain = [plain_engine.generate(prompt, **run)]  # also the oracle's reference
    oracle = OracleProposer.from_continuations(prompt, plain[0].tokens, alpha, vocab, seed=seed, length=kw["max_len"] + k)
    spec_engine = Engine(bundle, k=k, proposer=oracle, **kw)
    spec_engine.generate(prompt, max_new_tokens=4, stop_at_eos=False)
    spec = []
    for i in range(repeats):  # interleaved, so that a slower moment of the machine hits both
        if i:
            say(f"plain {i + 1}/{repeats}")
            plain.append(plain_engine.generate(prompt, **run))
        say(f"oracle {i + 1}/{repeats}")
        spec.append(spec_engine.generate(prompt, **run))
    say("streaming floor")
    floor = read_floor(target)
    costs = StepCosts.measured(plain, spec)
    stats = AcceptanceStats.from_accepted(np.concatenate([r.accepted[:, 0] for r in spec]), k,
                                                proposed=np.concatenate([r.proposed[:, 0] for r in spec]))
    return OracleRun(
        name=name, weight_mb=weight_bytes(target) / 1e6, floor=floor, caches=cache_sizes(), alpha=alpha, k=k,
        new_tokens=new_tokens, repeats=repeats, threads=torch.get_num_threads(), costs=costs,
        tau_formula=expected_tokens_per_step(alpha, k), tau_measured=stats.tau, tau_stderr=stats.tau_stderr,
        predicted=predicted_speedup(costs, alpha, k), predicted_measured_tau=predicted_speedup(costs, alpha, k, stats.tau),
        measured=sum(r.wall_s for r in plain) / sum(r.wall_s for r in spec),
        measured_each=[p.wall_s / s.wall_s for p, s in zip(plain, spec)],
        identical=all(r.tokens == plain[0].tokens for r in plain + spec), seconds=time.perf_counter() - t0)


def memory_bound_run(shape: dict = MEMORY_BOUND, seed: int = 0, progress: Callable[[str], None] | None = None,
                     **kw) -> OracleRun:
    """oracle_run on a random-weight target of `shape` (no files): by default too big for a CPU's caches."""
    t0 = time.perf_counter()
    (progress or (lambda _: None))("building the target")
    target = random_target(shape, seed)
    c = target.config
    name = (f"random weights, Llama-shaped (hidden {c.hidden_size}, {c.num_hidden_layers} layers, "
            f"vocabulary {c.vocab_size})")
    run = oracle_run(target, name, seed=seed, progress=progress, **kw)
    run.seconds = time.perf_counter() - t0  # the build counted too
    return run
