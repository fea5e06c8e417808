"""Adaptive k: each step's number of drafts (0..k) chosen from the batch size and the measured acceptance.

Static k pays at batch 1, where a verify step of k + 1 tokens costs about what a plain step costs (both read
every weight once), and loses at a large batch, where the target's forward becomes compute-bound and k + 1
tokens per row cost up to k + 1 times as much. The policy keeps a running acceptance per draft position
(conditional: draft i counts when drafts 1..i-1 were kept) and picks the k with the most expected tokens per
unit of step time, k = 0 (a plain step) included, so that speculation never costs more than it brings.

The step-time model, in units of a plain memory-bound step: the target's forward over B rows of k + 1 tokens
costs max(1, B (k + 1) / knee) (it reads its weights once until about `knee` tokens, then computes), each
draft costs draft_cost x max(1, B / knee). `knee` and `draft_cost` are a device's and a proposer's numbers,
to be set from measured step times (Lab 2's costs); the defaults are rough.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec.sim import formulas


@dataclass
class AdaptiveK:
    k_max: int
    knee: float = 128.0  # tokens a target forward reads before it turns compute-bound (a GPU: 100 to 300)
    draft_cost: float = 0.1  # one draft step, in plain memory-bound target steps
    prior: float = 0.6  # acceptance assumed at each position before any is measured
    decay: float = 0.97  # the past's weight per step in the running acceptance (about 30 steps)
    probe_every: int = 32  # after this many steps at k = 0, one step at k_max measures acceptance again
    hits: list[float] = field(default_factory=list)
    tries: list[float] = field(default_factory=list)
    idle: int = 0  # steps at k = 0 since acceptance was last measured

    def __post_init__(self) -> None:
        if not (isinstance(self.k_max, int) and self.k_max >= 1):
            raise ValueError(f"k_max must be an integer >= 1, got {self.k_max!r}")
        self.hits = self.hits or [self.prior] * self.k_max
        self.tries = self.tries or [1.0] * self.k_max

    def acceptance(self) -> list[float]:
        """Running acceptance of draft i given drafts 1..i-1 were kept, i = 1..k_max."""
        return [h / t if t > 0 else self.prior for h, t in zip(self.hits, self.tries)]

    def expected_tokens(self, k: int) -> float:
        """Tokens a step of k drafts keeps per row: Lab 1's tau from the acceptance by position (1 at k = 0)."""
        return formulas.tau_from_positions(self.acceptance()[:k]) if k > 0 else 1.0

    def step_cost(self, batch: int, k: int) -> float:
        return max(1.0, batch * (k + 1) / self.knee) + k * self.draft_cost * max(1.0, batch / self.knee)

    def best(self, batch: int) -> int:
        """The k with the most expected tokens per unit of step time (the smaller k on a tie)."""
        rates = [self.expected_tokens(k) / self.step_cost(batch, k) for k in range(self.k_max + 1)]
        return max(range(self.k_max + 1), key=lambda k: (rates[k], -k))

    def choose(self, batch: int) -> int:
        """This step's k for `batch` running rows. At k = 0 nothing is measured: every probe_every steps one
        step at k_max looks again (acceptance may have risen, or the batch shrunk)."""
        k = self.best(batch)
        if k > 0:
            self.idle = 0
            return k
        self.idle += 1
        if self.idle > self.probe_every:
            self.idle = 0
            return self.k_max
        return 0

    def observe(self, accepted: list[int], proposed: list[int]) -> None:
        """One step's rows: drafts accepted and proposed each (rows without drafts are left out)."""
        pairs = [(a, p) for a, p in zip(accepted, proposed) if p > 0 and a >= 0]
        if not pairs:
            return
        self.hits = [h * self.decay for h in self.hits]
        self.tries = [t * self.decay for t in self.tries]
        for a, p in pairs:
            for i in range(min(p, a + 1)):  # draft i + 1 was judged: drafts 1..i were kept
                self.tries[i] += 1
                self.hits[i] += a > i
