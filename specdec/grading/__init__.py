"""The autograder: exercises declared as data, a kernel per notebook, checks from outside it.

In a notebook, `check("lab1.q3")` gives instant feedback on one exercise against the objects the
notebook defined; `specdec grade` computes the grade in a process the notebook cannot reach.
"""

from specdec.grading.registry import CheckResult, check, exercises_for_lab

__all__ = ["CheckResult", "check", "exercises_for_lab"]
