"""Exercise registry: each lab's checks register here with `@exercise`."""

from __future__ import annotations

import importlib
import inspect
import os
import re
from dataclasses import dataclass
from typing import Any, Callable

EXERCISE_ID = re.compile(r"\blab(\d+)\.q(\d+)\b")


@dataclass
class CheckResult:
    """Outcome of one check: `score` is the fraction of the points earned, in [0, 1]."""

    score: float
    message: str


@dataclass
class Exercise:
    id: str  # "lab1.q3"
    points: float
    title: str
    check: Callable[[dict[str, Any]], CheckResult]  # namespace of the notebook -> result


_REGISTRY: dict[str, Exercise] = {}

# Comma-separated modules whose @exercise checks register too (the grader's test fixtures, an
# instructor's own exercises). The grading worker inherits it, so it works in `specdec grade`.
EXTRA_CHECKS_ENV = "SPECDEC_EXTRA_CHECKS"

# Set by the grading worker: it runs every check itself after the notebook, so the notebook's own
# check() calls are skipped there (no double work, no extra output).
_autograding = False


class _Skipped(CheckResult):
    """What check() returns under the autograder: shows nothing as a cell's last value."""

    def _ipython_display_(self) -> None:
        pass


class NotDefined(KeyError):
    """A name a check needs is not defined in the notebook."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"define `{self.name}`: it is not defined in the notebook (keep the stub's name)"


class StudentNamespace(dict):
    """A copy of the notebook's globals where a missing name raises NotDefined."""

    def __missing__(self, key: str) -> Any:
        raise NotDefined(key)


def set_autograding(on: bool) -> None:
    """The grading worker turns this on: check() in the notebook then returns at once."""
    global _autograding
    _autograding = on


def load_extra_checks() -> None:
    """Import the modules named in $SPECDEC_EXTRA_CHECKS so that their exercises register."""
    for name in os.environ.get(EXTRA_CHECKS_ENV, "").split(","):
        if name.strip():
            importlib.import_module(name.strip())


def exercise(id: str, points: float, title: str) -> Callable:
    """Decorator: register `fn(ns) -> CheckResult` as the check of exercise `id`."""

    def wrap(fn: Callable[[dict[str, Any]], CheckResult]) -> Callable:
        _REGISTRY[id] = Exercise(id=id, points=points, title=title, check=fn)
        return fn

    return wrap


def lab_of(exercise_id: str) -> int:
    m = EXERCISE_ID.fullmatch(exercise_id)
    if not m:
        raise ValueError(f"not an exercise id: {exercise_id!r} (expected labN.qM)")
    return int(m.group(1))


def exercises_for_lab(lab: int) -> list[Exercise]:
    """All exercises of lab N, in order q1, q2, ... (specdec.grading.labN and $SPECDEC_EXTRA_CHECKS)."""
    load_extra_checks()
    try:
        importlib.import_module(f"specdec.grading.lab{lab}")
    except ModuleNotFoundError as exc:
        if exc.name != f"specdec.grading.lab{lab}":
            raise
    found = [e for e in _REGISTRY.values() if lab_of(e.id) == lab]
    return sorted(found, key=lambda e: int(e.id.split(".q")[1]))


def get_exercise(exercise_id: str) -> Exercise:
    for e in exercises_for_lab(lab_of(exercise_id)):
        if e.id == exercise_id:
            return e
    raise KeyError(f"no exercise {exercise_id!r}")


def run_check(ex: Exercise, ns: dict[str, Any]) -> CheckResult:
    """Run one check; any exception from the student's code becomes a zero with the reason."""
    if not isinstance(ns, StudentNamespace):
        ns = StudentNamespace(ns)  # so that ns["f"] for a missing f says "define `f`"
    try:
        res = ex.check(ns)
    except NotImplementedError:
        return CheckResult(0.0, "not implemented yet (the stub still raises NotImplementedError)")
    except NotDefined as exc:
        return CheckResult(0.0, str(exc))
    except Exception as exc:  # the student's code failed inside the check
        return CheckResult(0.0, f"your code raised {type(exc).__name__}: {exc}")
    return CheckResult(min(1.0, max(0.0, float(res.score))), res.message)


def check(exercise_id: str, namespace: dict[str, Any] | None = None) -> CheckResult:
    """Instant feedback in a notebook: grade one exercise against the caller's globals."""
    if _autograding:
        return _Skipped(0.0, "skipped: the autograder runs every check after the notebook")
    if namespace is None:
        namespace = inspect.currentframe().f_back.f_globals  # the notebook's namespace
    ex = get_exercise(exercise_id)
    res = run_check(ex, namespace)
    mark = "PASS" if res.score >= 1.0 else ("PARTIAL" if res.score > 0 else "FAIL")
    print(f"{ex.id} [{mark}] {res.score * ex.points:g}/{ex.points:g}  {ex.title}: {res.message}")
    return res
