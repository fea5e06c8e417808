"""The autograder: exercises, their checks, and the notebook runner.

In a notebook, `check("lab1.q3")` grades one exercise against the objects the notebook defined.
"""

from specdec.grading.registry import CheckResult, Exercise, check, exercise, exercises_for_lab

__all__ = ["CheckResult", "Exercise", "check", "exercise", "exercises_for_lab"]
