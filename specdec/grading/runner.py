"""Grade one notebook: its cells in a kernel of its own, then every exercise checked from here.

The exercises, the reference, the cases, the expected values and the scores stay in this process;
the kernel (kernel.py) only runs cells and answers calls. When a cell kills the kernel (a crash,
a signal, memory) or will not stop at its time limit, a fresh kernel runs the cells before it
again and the notebook goes on after it: only the exercises that depend on that cell are lost.
"""

from __future__ import annotations

import hashlib
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

from specdec.grading.calls import describe, wrapper_note
from specdec.grading.registry import CheckResult, exercises_for_lab
from specdec.grading.results import ExerciseResult, Limits, NotebookResult
from specdec.grading.secret import grading_secret
from specdec.grading.session import Budget, Kernel, KernelCaller, KernelGone, OutOfTime, end_strays, stop_all
from specdec.grading.submission import SKIP_TAGS, Cell, Submission, SubmissionError, load_submission
from specdec.grading.tampering import calls_reference, reaches_into_grader

MAX_DEATHS = 12  # kernels a notebook's code may kill before no further cell runs (the grader's kills do not count; a
# cell or check that kills its kernel kills it twice: it runs again once in a fresh kernel, in case it was not to blame)
RERUN = "a fresh kernel ran the cells before it again and went on after it"

__all__ = ["end_strays", "grade_notebook", "grade_submission", "read", "stop_all"]


class GaveUp(Exception):
    """No kernel to grade with: it could not start, or the notebook killed too many."""


def plan_of(labs: list[int], errors: list[str]) -> list[Any]:
    """Every exercise of the labs, imported here before any of the student's code runs."""
    plan = []
    for lab in labs:
        try:
            found = exercises_for_lab(lab)
        except Exception as exc:
            errors.append(f"could not load the checks of lab {lab}: {type(exc).__name__}: {exc}")
            continue
        if not found:
            errors.append(f"lab {lab} has no checks (no exercises declared for lab{lab}.qM)")
        plan.extend(found)
    return plan


def student_key(sub: Submission) -> str:
    """What makes the cases differ between notebooks (and not between runs of one)."""
    return hashlib.sha256("\0".join(c.source for c in sub.code_cells).encode("utf-8")).hexdigest()


class NotebookRun:
    """One notebook's kernels: the cells (replayed into a fresh kernel after a crash), then the calls."""

    def __init__(self, sub: Submission, limits: Limits, home: str):
        self.sub, self.limits, self.home = sub, limits, home
        self.budget = Budget(limits.total_timeout, limits.wall_factor)
        self.kernel: Kernel | None = None
        self.kept: list[Cell] = []  # cells that ran without killing the kernel: a fresh one runs them again
        self.problems: dict[int, list[str]] = {}
        self.deaths = 0
        self.where = "while starting the kernel"  # for a message about the total time limit

    def problem(self, cell: Cell, message: str) -> None:
        self.problems.setdefault(cell.number, []).append(message)

    def died(self, cell: Cell, why: str) -> None:
        self.problem(cell, f"{why}; {RERUN}")
        self.deaths += 1

    def spawn(self) -> Kernel:
        """A kernel process, starting; ready() waits for it."""
        try:
            return Kernel(str(self.sub.path.resolve().parent), self.home, int(self.limits.memory_gb * 2**30), self.budget,
                          self.limits.kernel_user)
        except OSError as exc:
            raise GaveUp(f"the kernel could not start: {exc}") from None

    def start(self, spawned: Kernel | None = None) -> Kernel:
        """A fresh kernel that has run the kept cells (one that kills it now is dropped as well)."""
        while True:
            try:
                kernel = (spawned or self.spawn()).ready()
                spawned = None
            except KernelGone as exc:
                raise GaveUp(f"the kernel could not start: it {exc}") from None
            for cell in list(self.kept):
                try:
                    kernel.run_cell(cell.source, self.limits.cell_timeout)
                except KernelGone as exc:  # it did not do that the first time
                    self.kept.remove(cell)
                    self.died(cell, f"when run again, the kernel {exc}")
                    break
            else:
                return kernel

    def run_cells(self, spawned: Kernel) -> None:
        self.kernel = self.start(spawned)
        for cell in self.sub.graded_cells:
            if self.deaths >= MAX_DEATHS:  # enough: the exercises are checked with the cells that ran
                self.problem(cell, f"not run: the notebook's code had killed its kernel {self.deaths} times, so "
                                   "grading ran no further cells and checked the answers with the cells before")
                break
            if self.kernel is None:
                self.kernel = self.start()
            self.where = f"in {cell.label()}"
            try:
                problem = self.kernel.run_cell(cell.source, self.limits.cell_timeout)
            except KernelGone as exc:
                self.kernel = None
                problem = self.again(cell, exc)
                if problem is False:
                    continue
            if problem and problem["kind"] == "memory":  # the kernel is full: start afresh without it
                self.kernel.kill()  # the grader's own kill: not a death of the notebook's making
                self.kernel = None
                self.problem(cell, f"{problem['message']} (the kernel's memory limit is {self.limits.memory_gb:g} GiB); "
                                   f"{RERUN}")
                continue
            if problem:
                self.problem(cell, problem["message"])
            self.kept.append(cell)

    def again(self, cell: Cell, exc: KernelGone) -> dict | None | Literal[False]:
        """The kernel died while `cell` ran. Was it the cell? A fresh kernel (the kept cells run again) runs
        it once more: a cell that runs there was not to blame (a thread or a timer an earlier cell started
        may have killed the kernel), and is kept. Its problem (None if none), or False if it killed again."""
        self.deaths += 1
        if self.deaths >= MAX_DEATHS:
            self.problem(cell, f"the kernel {exc}; {RERUN}")
            return False
        self.kernel = self.start()
        try:
            problem = self.kernel.run_cell(cell.source, self.limits.cell_timeout)
        except KernelGone:
            self.kernel = None
            self.died(cell, f"the kernel {exc} (and again when this cell ran in a fresh kernel)")
            return False
        first = str(exc).splitlines()[0]
        self.problem(cell, f"the kernel {first} while this cell ran, but in a fresh kernel it ran without harm, so "
                           "it was kept (did something an earlier cell started, a thread or a timer, kill the kernel?)")
        return problem

    def check(self, ex: Any, seed: int) -> CheckResult:
        if self.kernel is None:
            self.kernel = self.start()
        res = ex.grade(KernelCaller(self.kernel, self.limits.check_timeout), seed)
        if not self.kernel.alive and self.deaths + 1 < MAX_DEATHS:  # the function, or a stray thread? once more
            self.deaths += 1
            self.kernel = self.start()
            again = ex.grade(KernelCaller(self.kernel, self.limits.check_timeout), seed)
            if self.kernel.alive:
                res = CheckResult(again.score, again.message + " [the kernel died during a first check of this "
                                  "exercise; this is the check in a fresh kernel]")
        if res.score > 0 and (how := calls_reference([c.source for c in self.sub.code_cells], ex.reads, ex.references())):
            res = CheckResult(0.0, wrapper_note(ex.reads, how))
        if not self.kernel.alive:  # the student's function killed it: the next check needs a fresh one
            self.kernel = None
            self.deaths += 1
        return res

    def close(self) -> None:
        if self.kernel is not None:
            self.kernel.kill()


def read(path: str | Path, labs: list[int] | None = None) -> Submission | NotebookResult:
    """The submission to grade, or the result of a file that cannot be graded (never raises)."""
    try:
        sub = load_submission(path, labs)
    except SubmissionError as exc:
        return NotebookResult(str(path), error=str(exc))
    if not sub.labs:
        return NotebookResult(str(path), error=f"{path}: cannot tell which lab this notebook is "
                              "(no exercise id labN.qM in it): pass --lab N")
    return sub


def grade_notebook(path: str | Path, limits: Limits | None = None, labs: list[int] | None = None) -> NotebookResult:
    """Grade one notebook; `labs` overrides the labs found in it. Never raises for bad input."""
    sub = read(path, labs)
    return sub if isinstance(sub, NotebookResult) else grade_submission(sub, limits or Limits())


def grade_submission(sub: Submission, limits: Limits) -> NotebookResult:
    """Run and check a notebook already read (a class is read before any kernel could change a file)."""
    start = time.monotonic()
    errors: list[str] = []
    key = student_key(sub)
    graded: dict[str, CheckResult] = {}
    ungraded: dict[str, str] = {}  # why an exercise has no result
    stop = None
    plan: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="specdec-grade-", ignore_cleanup_errors=True) as home:
        run = NotebookRun(sub, limits, home)
        checking = None
        try:
            # read (and wiped from this process's environment) before any kernel starts: without it, anyone
            # can compute the cases of a notebook
            secret = grading_secret()
            # the kernel boots while the checks (and all they import) load, before any of the notebook runs
            run.kernel = spawned = run.spawn()
            plan = plan_of(sub.labs, errors)
            if plan:
                run.run_cells(spawned)
                for ex in plan:
                    checking, run.where = ex.id, f"while checking {ex.id}"
                    graded[ex.id] = run.check(ex, seed_of(ex.id, key, secret))
        except OutOfTime:
            cause = f"the notebook ran past the total time limit of {limits.total_timeout:g}s of CPU time"
            stop = f"{cause[0].upper()}{cause[1:]}: it was stopped {run.where}"
            for ex in plan:
                if checking is None:
                    ungraded[ex.id] = f"not graded: {cause} {run.where}, before any check ran"
                elif ex.id == checking:
                    ungraded[ex.id] = f"not graded: {cause} while this exercise was being checked"
                else:
                    ungraded[ex.id] = f"not graded: {cause} before this exercise was checked"
        except GaveUp as exc:
            plan = plan or plan_of(sub.labs, errors)
            ungraded = {ex.id: f"not graded: {exc}" for ex in plan}
            if not run.kept and not run.problems:
                errors.append(f"grading could not start: {exc}")
        except Exception as exc:  # a bug the notebook found in the grader: it stays in this notebook's row
            ungraded = {ex.id: f"not graded: the grader failed ({describe(exc)})" for ex in plan if ex.id not in graded}
            errors.append(f"grading failed {run.where}: {describe(exc)}")
        finally:
            run.close()
    return assemble(sub, plan, graded, ungraded, run.problems, stop, errors, time.monotonic() - start)


def seed_of(exercise_id: str, key: str, secret: str) -> int:
    """The cases' seed: one per exercise and notebook, so that a notebook always gets the same grade."""
    digest = hashlib.sha256("\0".join((secret, exercise_id, key)).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little")


def assemble(sub: Submission, plan: list[Any], graded: dict[str, CheckResult], ungraded: dict[str, str],
             cell_problems: dict[int, list[str]], stop: str | None, errors: list[str], seconds: float) -> NotebookResult:
    """Scores for every exercise of the notebook's labs, graded or not, and the notebook's problems."""
    cells = {c.number: c for c in sub.cells}

    def label(n: int) -> str:
        return cells[n].label() if n in cells else f"cell {n}"

    problems = [f"{label(n)}: {m}" for n, ms in sorted(cell_problems.items()) for m in ms]
    problems += [f"{c.label()}: {why}" for c in sub.code_cells if (why := reaches_into_grader(c.source))]
    if stop:
        problems.append(stop)
    sections = sub.answer_cells()
    tests = []
    for ex in plan:
        res = graded.get(ex.id) or CheckResult(0.0, ungraded.get(ex.id, "not graded"))
        fraction, feedback = min(1.0, max(0.0, float(res.score))), str(res.message)
        related = [f"{label(n)}: {m}" for n in sections.get(ex.id, []) for m in cell_problems.get(n, [])]
        if fraction < 1.0 and related:  # the likely cause, from the cells of its answer
            feedback += "\n" + "\n".join(related)
        tests.append(ExerciseResult(ex.id, ex.title, round(fraction * ex.points, 4), float(ex.points), feedback))
    return NotebookResult(str(sub.path), tests, problems, round(seconds, 2), "; ".join(errors) or None,
                          skipped=[c.label() for c in sub.skipped_cells],
                          skipped_tags=sorted({t for c in sub.skipped_cells for t in c.tags if t in SKIP_TAGS}))
