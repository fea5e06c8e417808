"""Time limits that tests assert: CPU seconds, which a machine loaded by other work (or by the other
pytest-xdist workers) changes far less than the wall clock, with a wall-clock backstop several times longer for a
hang. Less, not nothing: beside four busy loops on the 2-core machine a pure-Python loop's CPU time stayed put, but
a Lab 2 check's (small torch operations) grew from 0.78 s to 1.3 s (2026-11-29): a budget leaves room for that."""

from __future__ import annotations

import gc
import resource
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

WALL_BACKSTOP = 4  # a wall-clock bound is at least this many times the CPU budget beside it
# ... and at least this many seconds: at a load average of 10 on 2 cores a process gets a fifth of a core, so
# a short budget's 4x was passed by a check that used half its CPU budget (2026-11-27's loaded run)
WALL_FLOOR_S = 60


def backstop(cpu_budget: float) -> float:
    """The wall-clock bound beside a CPU budget: a hang, not a loaded machine, passes it."""
    return max(WALL_BACKSTOP * cpu_budget, WALL_FLOOR_S)


def children_cpu_seconds() -> float:
    """CPU seconds of this process's children waited for (a notebook's kernel, and what it started)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return children.ru_utime + children.ru_stime


def cpu_seconds() -> float:
    """CPU seconds of this process (all its threads) and of its children waited for: the grader's workers and
    kernels, the servers and CLI processes a test starts (a child's time counts once it has been reaped)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime + children_cpu_seconds()


@dataclass
class Took:
    cpu: float = 0.0  # seconds of CPU time (this process and its reaped children)
    wall: float = 0.0  # seconds on the wall clock

    def within(self, cpu_budget: float) -> bool:
        """Inside the budget in CPU seconds, and not hung: under WALL_BACKSTOP x the budget on the wall clock
        (WALL_FLOOR_S at least)."""
        return self.cpu < cpu_budget and self.wall < backstop(cpu_budget)

    def __str__(self) -> str:
        return f"{self.cpu:.1f} s of CPU time, {self.wall:.1f} s on the wall clock"


@contextmanager
def timed() -> Iterator[Took]:
    """with timed() as took: ...  then took.cpu and took.wall are the block's seconds."""
    took = Took()
    # A full collection now, not inside the block: one of a test worker's heap took 0.5 to 1.5 s in a loaded run
    # (2026-11-29), as long as a short block's whole budget; after this one the next is tens of thousands of
    # allocations away.
    gc.collect()
    cpu0, wall0 = cpu_seconds(), time.monotonic()
    try:
        yield took
    finally:
        took.cpu, took.wall = cpu_seconds() - cpu0, time.monotonic() - wall0
