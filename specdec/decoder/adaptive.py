"""Adaptive k: each step's number of drafts (0..k_max) chosen from what the engine has measured.

Static k pays at batch 1, where a verify step of k + 1 tokens costs about what a plain step costs (both read
every weight once), and loses at a large batch, where the target's forward turns compute-bound, or on a model so
small that the host's work per draft outweighs the forward. Where the line falls depends on the device, the model,
the proposer and the batch, so the policy measures instead of modelling:

- the acceptance of each draft position (conditional: draft i counts when drafts 1..i-1 were kept), running;
- the wall time of a step, per (width bucket, k): the engine waits for the device once a step anyway (to_host),
  so each step's time is known without an extra sync.

Each step it takes the k with the most expected tokens per second, tau(k) / time(bucket, k), with tau from
Lab 1's tau_from_positions (1 at k = 0, a plain step): so it drafts nothing where plain steps are faster. Before
the measurements decide, each k runs `tries` steps at a new bucket (the first is a shape's first run, a capture
under CUDA graphs: not timed); afterwards one step in `retry_every` runs the k measured longest ago, so that a
k that lost once is looked at again when the context or the acceptance has moved.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from specdec.sim import formulas


@dataclass
class AdaptiveK:
    k_max: int
    prior: float = 0.6  # acceptance assumed at each position before any is measured
    decay: float = 0.97  # the past's weight per step in the running acceptance (about 30 steps)
    tries: int = 3  # steps of each k per width bucket before the times decide (the first is not timed)
    retry_every: int = 50  # then one step in this many at a bucket re-measures its stalest k
    time_decay: float = 0.8  # the past's weight in a running step time (about 5 steps)
    hits: list[float] = field(default_factory=list)
    judged: list[float] = field(default_factory=list)
    seconds: dict[tuple[int, int], float] = field(default_factory=dict)  # (bucket, k) -> running step time
    runs: dict[tuple[int, int], int] = field(default_factory=dict)  # (bucket, k) -> steps run
    last: dict[tuple[int, int], int] = field(default_factory=dict)  # (bucket, k) -> the bucket's step it last ran
    steps: dict[int, int] = field(default_factory=dict)  # bucket -> steps chosen there
    clock: Callable[[], float] = field(default=time.perf_counter, repr=False)  # the engine times steps by it (tests: a fake)

    def __post_init__(self) -> None:
        if not (isinstance(self.k_max, int) and self.k_max >= 1):
            raise ValueError(f"k_max must be an integer >= 1, got {self.k_max!r}")
        if not (isinstance(self.tries, int) and self.tries >= 2):
            raise ValueError(f"tries must be an integer >= 2 (the first step of a k is not timed), got {self.tries!r}")
        self.hits = self.hits or [self.prior] * self.k_max
        self.judged = self.judged or [1.0] * self.k_max

    @staticmethod
    def bucket(width: int) -> int:
        """Widths share their step times by power of two (the engine's widths under CUDA graphs)."""
        return 1 << (max(1, width) - 1).bit_length()

    def acceptance(self) -> list[float]:
        """Running acceptance of draft i given drafts 1..i-1 were kept, i = 1..k_max."""
        return [h / t if t > 0 else self.prior for h, t in zip(self.hits, self.judged)]

    def expected_tokens(self, k: int) -> float:
        """Tokens a step of k drafts keeps per row: Lab 1's tau from the acceptance by position (1 at k = 0)."""
        return formulas.tau_from_positions(self.acceptance()[:k]) if k > 0 else 1.0

    def rate(self, width: int, k: int) -> float | None:
        """Expected tokens per second per row of a step of k drafts at this width; None until timed."""
        t = self.seconds.get((self.bucket(width), k))
        return None if t is None else self.expected_tokens(k) / t

    def best(self, width: int) -> int:
        """The timed k with the most expected tokens per second (the smaller k on a tie; 0 if none is timed)."""
        rates = {k: r for k in range(self.k_max + 1) if (r := self.rate(width, k)) is not None}
        return max(rates, key=lambda k: (rates[k], -k)) if rates else 0

    def choose(self, width: int) -> int:
        """This step's k for a step `width` rows wide: an unmeasured k first, now and then the stalest, else the best."""
        b = self.bucket(width)
        n = self.steps[b] = self.steps.get(b, 0) + 1
        ks = range(self.k_max + 1)
        if fresh := [k for k in ks if self.runs.get((b, k), 0) < self.tries]:
            k = fresh[0]
        elif n % self.retry_every == 0:
            k = min(ks, key=lambda k: self.last[b, k])
        else:
            k = self.best(width)
        self.last[b, k] = n
        return k

    def timed(self, width: int, k: int, seconds: float) -> None:
        """A step's wall time. A shape's first step (a capture, a compile) is left out, and a step is counted at
        most twice the running time: one slow step (a new KV bucket's capture, a pause) is news, not the rule."""
        key = (self.bucket(width), k)
        runs = self.runs[key] = self.runs.get(key, 0) + 1
        if runs == 1:
            return
        old = self.seconds.get(key)
        self.seconds[key] = seconds if old is None else \
            self.time_decay * old + (1 - self.time_decay) * min(seconds, 2 * old)

    def observe(self, accepted: list[int], proposed: list[int]) -> None:
        """One step's rows: drafts accepted and proposed each (rows without drafts are left out)."""
        pairs = [(a, p) for a, p in zip(accepted, proposed) if p > 0 and a >= 0]
        if not pairs:
            return
        self.hits = [h * self.decay for h in self.hits]
        self.judged = [t * self.decay for t in self.judged]
        for a, p in pairs:
            for i in range(min(p, a + 1)):  # draft i + 1 was judged: drafts 1..i were kept
                self.judged[i] += 1
                self.hits[i] += a > i

    def reset_times(self) -> None:
        """Forget the step times (a server's warm-up ran shapes and captures that say nothing of its traffic)."""
        for table in (self.seconds, self.runs, self.last, self.steps):
            table.clear()
