"""A whole batch, start to finish: the loop over the engine's admit / step / retire that a server runs.

More prompts than rows wait for a free one, as in a server; every step is logged per prompt
(accepted drafts, drafts proposed), so that the result can say what tau the run reached.
Shapes: B prompts, steps target forwards after the prefill.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from specdec.sim.stats import AcceptanceStats


@dataclass
class DecodeResult:
    method: str
    k: int
    tokens: list[list[int]]  # generated ids per prompt (the stop id included when it ended the row)
    prompt_lengths: list[int]
    accepted: np.ndarray  # [steps, B] drafts kept, 0..k (tau = accepted + 1); -1 where a row was not running
    proposed: np.ndarray  # [steps, B] drafts that counted (k; fewer where the row's budget cut the step)
    steps: int  # target forwards after the prefill (verify steps, or plain decode steps)
    wall_s: float
    times: dict = field(default_factory=dict)  # seconds in prefill / draft / verify / host, when profiled
    cuda_graphs: bool = False
    temperature: float = 0.0
    topk: int = 1  # candidates per node (1: a chain of k drafts)
    num_draft_tokens: int | None = None  # tokens each verify read, the root included (SGLang's; k + 1 for a chain)

    @property
    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def stats(self) -> AcceptanceStats | None:
        a, ran = self.accepted, self.accepted >= 0
        if self.method == "ar" or not ran.any():
            return None
        return AcceptanceStats.from_accepted(a[ran], self.k, proposed=self.proposed[ran])

    def as_dict(self) -> dict:
        s = self.stats
        return {
            "method": self.method, "k": self.k if self.method != "ar" else 0, "batch": len(self.tokens),
            "temperature": self.temperature, "cuda_graphs": self.cuda_graphs, "topk": self.topk,
            "num_draft_tokens": self.num_draft_tokens if self.method != "ar" else 0,
            "token_ids": self.tokens, "new_tokens": self.new_tokens, "steps": self.steps,
            "tau": s.tau if s else 1.0,
            "acceptance_rate": s.acceptance_rate if s else None,
            "acceptance_by_position": [float(x) for x in s.by_position] if s else [],
            "accepted_histogram": [int(x) for x in s.histogram] if s else [],
            "tokens_per_s": self.tokens_per_s, "wall_s": self.wall_s,
            "times": {k: round(v, 6) for k, v in self.times.items()},
        }


def generate(engine, prompts: list[list[int]], params, seed: int = 0, profile: bool = False) -> DecodeResult:
    """Decode every prompt on an idle engine (engine.py's Engine), every row with the same SamplingParams;
    `profile` splits the time into phases at the cost of a device sync around each."""
    if not prompts:
        raise ValueError("no prompts")
    if engine.live:
        raise RuntimeError("generate needs an idle engine; rows are running")
    for p in prompts:
        engine.check_prompt(p, params)
    engine.gen.manual_seed(seed)
    engine.times = dict.fromkeys(engine.times, 0.0)
    B = len(prompts)
    out: list[list[int]] = [[] for _ in prompts]
    owner: dict[int, int] = {}  # slot -> prompt index
    log_acc, log_prop = [], []
    waiting = list(range(B))
    engine.sync()
    t0 = time.perf_counter()
    while waiting or engine.live:
        if waiting and engine.free_slots:
            batch = waiting[: len(engine.free_slots)]
            waiting = waiting[len(batch):]
            for i, up in zip(batch, engine.admit([prompts[i] for i in batch], params)):
                owner[up.slot] = i
                out[i] += up.tokens
            continue  # rows that finished at their first token free their slot at once
        # plain decoding with every prompt admitted runs the host one step behind the GPU (Engine.steps_ahead)
        ahead = engine.proposer is None and not waiting and not profile
        for updates in engine.steps_ahead() if ahead else [engine.step(profile)]:
            acc, prop = np.full(B, -1), np.zeros(B, dtype=np.int64)
            for up in updates:
                i = owner[up.slot]
                out[i] += up.tokens
                acc[i], prop[i] = up.accepted, up.proposed
            log_acc.append(acc)
            log_prop.append(prop)
    engine.sync()
    wall = time.perf_counter() - t0
    steps = len(log_acc)
    shape = (steps, B) if steps else (0, B)
    return DecodeResult(method=engine.method, k=engine.k, tokens=out, prompt_lengths=[len(p) for p in prompts],
                        accepted=np.array(log_acc, dtype=np.int64).reshape(shape),
                        proposed=np.array(log_prop, dtype=np.int64).reshape(shape), steps=steps, wall_s=wall,
                        times=dict(engine.times) if profile else {}, cuda_graphs=engine.graph_mode == "cuda",
                        temperature=params.temperature, topk=engine.shape.topk,
                        num_draft_tokens=engine.shape.num_draft_tokens)
