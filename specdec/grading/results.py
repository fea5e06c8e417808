"""What grading a notebook produces: per-exercise results, notebook-level problems, limits."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Limits:
    """Time limits in seconds of the kernel's CPU time (its main thread's), the kernel's memory, and the
    user it runs as.

    A machine busy with other work slows a kernel down but does not change its CPU time, so it does
    not change a grade. Code that waits (sleeps, reads a socket) uses no CPU: every limit also holds on
    the wall clock, `wall_factor` times longer."""

    cell_timeout: float = 120.0  # per cell: interrupted, then the next cell runs (Lab 2's slowest takes ~10 s)
    check_timeout: float = 60.0  # per batch of calls of one exercise: a zero for that exercise
    total_timeout: float = 1800.0  # the whole notebook: the kernel is killed
    wall_factor: float = 5.0  # each limit x this on the wall clock: a kernel given a fifth of a core still finishes
    memory_gb: float = 4.0  # the kernel's data (RLIMIT_DATA); past it allocations fail; 0: no limit
    kernel_user: str | None = None  # run kernels as this user (the grader must be root); None: the grader's


@dataclass
class ExerciseResult:
    """One exercise: points earned out of max_score, and the feedback."""

    id: str
    title: str
    score: float
    max_score: float
    output: str


@dataclass
class NotebookResult:
    """A graded notebook. `error` is set when grading itself could not run."""

    notebook: str
    tests: list[ExerciseResult] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # cell errors, timeouts, dead kernels
    execution_time: float = 0.0
    error: str | None = None  # e.g. not a notebook, no checks for its lab: the CLI exits non-zero
    skipped: list[str] = field(default_factory=list)  # cells tagged live or demo, not run while grading
    skipped_tags: list[str] = field(default_factory=list)  # the tags they carried (submission.SKIP_TAGS)

    @property
    def score(self) -> float:
        return round(sum(t.score for t in self.tests), 4)

    @property
    def max_score(self) -> float:
        return round(sum(t.max_score for t in self.tests), 4)
