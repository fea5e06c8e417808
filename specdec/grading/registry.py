"""Which exercises exist (each lab's EXERCISES, in specdec/grading/labN.py), and check() for notebooks.

This module stays light (no numpy): the grading command imports it; the declarations, with the
numpy and torch they need, are imported when a lab's exercises are first asked for.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
from dataclasses import dataclass
from typing import Any, Protocol

EXERCISE_ID = re.compile(r"\blab(\d+)\.q(\d+)\b")

# Comma-separated modules whose EXERCISES count too (the grader's test fixtures, an instructor's
# own exercises). The grading process reads it, so it works in `specdec grade`.
EXTRA_CHECKS_ENV = "SPECDEC_EXTRA_CHECKS"


@dataclass
class CheckResult:
    """Outcome of one check: `score` is the fraction of the points earned, in [0, 1]."""

    score: float
    message: str


class Declared(Protocol):
    """What the registry needs of an exercise (specdec.grading.exercise.Exercise)."""

    id: str
    points: float
    title: str

    def check(self, ns: dict[str, Any], seed: int | None = None) -> CheckResult: ...


_REGISTRY: dict[str, Declared] = {}

# Set in the student's kernel while it is graded: the grader checks every exercise itself, from
# outside, so the notebook's own check() calls return at once there (no double work, no output).
_autograding = False


class Printed(CheckResult):
    """What check() returns: it printed its line already, so as a cell's last value it shows nothing more."""

    def _ipython_display_(self) -> None:
        pass


def set_autograding(on: bool) -> None:
    global _autograding
    _autograding = on


def load(module: str) -> None:
    """Import a module of declarations and register its EXERCISES."""
    for ex in getattr(importlib.import_module(module), "EXERCISES", ()):
        _REGISTRY[ex.id] = ex


def lab_of(exercise_id: str) -> int:
    m = EXERCISE_ID.fullmatch(exercise_id)
    if not m:
        raise ValueError(f"not an exercise id: {exercise_id!r} (expected labN.qM)")
    return int(m.group(1))


def exercises_for_lab(lab: int) -> list[Declared]:
    """All exercises of lab N, in order q1, q2, ... (specdec.grading.labN and $SPECDEC_EXTRA_CHECKS)."""
    for name in os.environ.get(EXTRA_CHECKS_ENV, "").split(","):
        if name.strip():
            load(name.strip())
    try:
        load(f"specdec.grading.lab{lab}")
    except ModuleNotFoundError as exc:
        if exc.name != f"specdec.grading.lab{lab}":
            raise
    found = [e for e in _REGISTRY.values() if lab_of(e.id) == lab]
    return sorted(found, key=lambda e: int(e.id.split(".q")[1]))


def get_exercise(exercise_id: str) -> Declared:
    for e in exercises_for_lab(lab_of(exercise_id)):
        if e.id == exercise_id:
            return e
    raise KeyError(f"no exercise {exercise_id!r}")


def run_check(ex: Declared, ns: dict[str, Any], seed: int | None = None) -> CheckResult:
    """Check one exercise against a namespace in this process (random cases unless seeded)."""
    return ex.check(ns, seed)


def check(exercise_id: str, namespace: dict[str, Any] | None = None) -> CheckResult:
    """Instant feedback in a notebook: check one exercise against the caller's globals.

    Feedback only: the grade is computed by `specdec grade`, outside the notebook's process."""
    if _autograding:
        return Printed(0.0, "skipped: the autograder checks every exercise itself")
    if namespace is None:
        namespace = inspect.currentframe().f_back.f_globals  # the notebook's namespace
    ex = get_exercise(exercise_id)
    res = run_check(ex, namespace)
    mark = "PASS" if res.score >= 1.0 else ("PARTIAL" if res.score > 0 else "FAIL")
    print(f"{ex.id} [{mark}] {res.score * ex.points:g}/{ex.points:g}  {ex.title}: {res.message}")
    return Printed(res.score, res.message)
