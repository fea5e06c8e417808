"""The decoder's plain data, without torch: what a request asks (SamplingParams) and the rule its prompt must meet
(check_prompt), what a step did to a row (RowUpdate), a draft tree's shape (TreeShape) and what --compile compiles
(SCOPES). Apart from the modules that run a model so that `specdec serve`'s HTTP process and the command line
check requests and flags without importing torch; engine.py, tree.py and cuda_graphs.py re-export them."""

from __future__ import annotations

import numbers
from dataclasses import dataclass


@dataclass
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = no limit
    stop_at_eos: bool = True
    seed: int | None = None  # a row of its own random numbers: the same output whatever else runs

    def check(self) -> None:
        if not (isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1):
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not (isinstance(self.top_k, int) and 0 <= self.top_k < 2**31):
            raise ValueError(f"top_k must be an integer in [0, 2**31), got {self.top_k!r}")
        if self.seed is not None and not (isinstance(self.seed, int) and 0 <= self.seed < 2**64):
            raise ValueError(f"seed must be an integer in [0, 2**64), got {self.seed!r}")


def check_prompt(prompt: list[int], params: SamplingParams, vocab: int, max_len: int, reserve: int) -> None:
    """Engine.check_prompt's rule from plain numbers (a server's HTTP process checks with them, without the model):
    `reserve` cache slots past the output (a step's block under speculation, else 1)."""
    if len(prompt) == 0:
        raise ValueError("every prompt needs at least one token")
    # numbers.Integral: Python's ints and numpy's (numpy registers them), without importing numpy here
    if any(not isinstance(t, numbers.Integral) or not 0 <= t < vocab for t in prompt):
        raise ValueError(f"token ids must be integers in 0..{vocab - 1}")
    params.check()
    need = len(prompt) + params.max_new_tokens + reserve
    if need > max_len:
        raise ValueError(f"prompt ({len(prompt)}) + max_new_tokens ({params.max_new_tokens}) + k needs {need} "
                         f"cache slots; this engine has {max_len}")


@dataclass
class RowUpdate:
    """What the admission or one step did to one row."""

    slot: int
    tokens: list[int]  # kept this step
    accepted: int  # drafts accepted (-1: the prefill, or a plain step)
    proposed: int  # drafts that counted: k, fewer where the row's budget ended the step (0: plain)
    finished: str | None = None  # "stop" (a stop id), "length" (its budget), or None
    drafts: list[int] | None = None  # what the proposer guessed this step (None: prefill or plain)


@dataclass(frozen=True)
class TreeShape:
    """SGLang's three numbers: --num-steps (depth), --topk (branching), --num-draft-tokens (verify width, the
    root included)."""

    num_steps: int
    topk: int
    num_draft_tokens: int

    @classmethod
    def make(cls, num_steps: int, topk: int = 1, num_draft_tokens: int | None = None) -> "TreeShape":
        """Checked; num_draft_tokens None: every node the drafter scores at topk = 1 (the chain), else
        num_steps x topk + 1 (at most what it scores)."""
        for name, v in (("num_steps", num_steps), ("topk", topk)):
            if not (isinstance(v, int) and v >= 1):
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        most = 1 + topk + (num_steps - 1) * topk * topk  # the root and every node the drafter scores
        if num_draft_tokens is None:
            num_draft_tokens = num_steps + 1 if topk == 1 else min(most, num_steps * topk + 1)
        if not (isinstance(num_draft_tokens, int) and num_draft_tokens >= 2):
            raise ValueError(f"num_draft_tokens must be an integer >= 2, got {num_draft_tokens!r}")
        if topk == 1 and num_draft_tokens != num_steps + 1:
            raise ValueError(f"topk 1 is a chain: num_draft_tokens must be num_steps + 1 = {num_steps + 1} "
                             f"(as SGLang forces), got {num_draft_tokens}")
        if num_draft_tokens > most:
            raise ValueError(f"num_draft_tokens {num_draft_tokens} > {most}, the root and every node that topk "
                             f"{topk} over num_steps {num_steps} scores")
        return cls(num_steps, topk, num_draft_tokens)

    @property
    def nodes(self) -> int:
        """n: the drafts the target verifies, the root not counted."""
        return self.num_draft_tokens - 1

    @property
    def slots(self) -> int:
        """Cache slots a step writes past a row's committed length: the verify block, the drafter's fed nodes."""
        return max(self.num_steps + 1, self.num_draft_tokens, (self.num_steps - 1) * self.topk)


# What --compile compiles (Engine(compile=...)): "step", each captured step whole (every layer inlined, one trace
# per capture: the fastest step measured so far, minutes to compile an 8B model); "layers", each decoder layer and
# the LM head as compile regions (regions.py: one trace per shape serves every layer), the rest of the step eager
# inside our graph. True means DEFAULT_SCOPE: "step", `specdec decode`'s default (one batch width; its 8B step 0.3 to
# 11% faster than by layers on H200s, benchmarks/logs/gpu_fast_path.log); `specdec serve` defaults to "layers", which
# compiles its every batch width in a minute where "step" took many (cli/serve.py).
SCOPES = ("step", "layers")
DEFAULT_SCOPE = "step"
