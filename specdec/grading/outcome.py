"""Turn what a grading worker left behind into a NotebookResult: scores, and a reason for each zero."""

from __future__ import annotations

import signal
from typing import Any

from specdec.grading.registry import exercises_for_lab
from specdec.grading.results import ExerciseResult, Limits, NotebookResult, WorkerRun
from specdec.grading.submission import Submission


def exit_description(run: WorkerRun) -> str:
    """`was killed by SIGKILL`, `exited with status 3`."""
    rc = run.returncode
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with status {rc}" if rc else "exited before it was done"


class Outcome:
    """One worker's results file read against the submission it ran."""

    def __init__(self, sub: Submission, run: WorkerRun, limits: Limits):
        self.sub, self.run, self.limits = sub, run, limits
        self.data: dict[str, Any] = run.data or {}
        self.phase = self.data.get("phase", "starting")
        self.cells = {c.number: c for c in sub.cells}

    def label(self, number: int) -> str:
        cell = self.cells.get(number)
        return cell.label() if cell else f"cell {number}"

    def finished(self) -> bool:
        return not self.run.timed_out and self.phase == "done" and self.run.returncode == 0

    def where(self) -> str:
        """Where the worker was when it stopped."""
        if self.phase == "starting":
            return "while loading the checks"
        if self.phase == "cells" and self.data.get("cell") is not None:
            return f"in {self.label(self.data['cell'])}"
        if self.phase == "checks" and self.data.get("check"):
            return f"while checking {self.data['check']}"
        return "after the checks"

    def cause(self) -> str:
        if self.run.timed_out:
            return f"the notebook ran past the total time limit of {self.limits.total_timeout:g}s"
        return f"the notebook's process {exit_description(self.run)}"

    def stop_message(self) -> str | None:
        """Why the worker stopped early (with its last output if it died), or None."""
        if self.finished():
            return None
        msg = f"{self.cause()}: it was stopped {self.where()}" if self.run.timed_out else f"{self.cause()} {self.where()}"
        tail = self.run.output_tail.strip()
        if tail and not self.run.timed_out:
            msg += f"; its last output:\n{tail[-600:]}"
        return msg

    def ungraded(self, ex_id: str) -> str:
        """The reason an exercise of the plan got no result."""
        if self.phase == "checks" and self.data.get("check") == ex_id:
            return f"not graded: {self.cause()} while this exercise was being checked"
        if self.phase == "checks":
            return f"not graded: {self.cause()} before this exercise was checked"
        if self.phase == "cells":
            return f"not graded: {self.cause()} {self.where()}, before any check ran"
        return f"not graded: {self.cause()} {self.where()}"


def plan_in_parent(labs: list[int], errors: list[str]) -> list[dict[str, Any]]:
    """The exercises to zero when the worker died before listing them (imports the checks here)."""
    try:

        return [{"id": e.id, "points": e.points, "title": e.title} for lab in labs for e in exercises_for_lab(lab)]
    except Exception as exc:
        errors.append(f"could not load the checks: {type(exc).__name__}: {exc}")
        return []


def assemble(sub: Submission, run: WorkerRun, limits: Limits, seconds: float) -> NotebookResult:
    """Scores for every exercise of the notebook's labs, graded or not, and the notebook's problems."""
    out = Outcome(sub, run, limits)
    errors = list(out.data.get("plan_errors", []))  # grading itself could not run
    stop = out.stop_message()
    if out.phase == "starting":
        errors.append(f"grading could not start: {stop}")
        plan = plan_in_parent(sub.labs, errors)
    else:
        plan = out.data.get("plan", [])
    if out.data.get("worker_error"):
        errors.append(f"the grading worker failed: {out.data['worker_error']}")

    by_cell: dict[int, list[str]] = {}
    for p in out.data.get("cell_problems", []):
        by_cell.setdefault(p["cell"], []).append(p["message"])
    problems = [f"{out.label(n)}: {m}" for n, ms in by_cell.items() for m in ms]
    if stop and out.phase != "starting":
        problems.append(stop[0].upper() + stop[1:])

    graded = {t["id"]: t for t in out.data.get("tests", [])}
    sections = sub.answer_cells()
    tests = []
    for item in plan:
        ex_id, points = item["id"], float(item["points"])
        if ex_id in graded:
            fraction = min(1.0, max(0.0, float(graded[ex_id]["score"])))
            feedback = str(graded[ex_id]["message"])
        else:
            fraction, feedback = 0.0, out.ungraded(ex_id)
        related = [f"{out.label(n)}: {m}" for n in sections.get(ex_id, []) for m in by_cell.get(n, [])]
        if fraction < 1.0 and related:  # the likely cause, from the cells of its answer
            feedback += "\n" + "\n".join(related)
        tests.append(ExerciseResult(ex_id, str(item.get("title", "")), round(fraction * points, 4), points, feedback))
    return NotebookResult(str(sub.path), tests, problems, round(seconds, 2), "; ".join(errors) or None)
