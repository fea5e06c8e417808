"""Grading a class of Lab 3: thirty-odd notebooks (solutions, labs, broken files) in one `specdec grade
--batch -j 2`, each Lab 3 notebook in seconds (its live cells are skipped), every failure in its own row.
benchmarks/grade_class.py times the same class with an endless loop added, on default limits."""

from __future__ import annotations

import json

import pytest
from conftest import CLASS_CPU_S, NOTEBOOK_CPU_S
from cpu_clock import backstop


@pytest.fixture
def graded(lab3_class) -> dict:
    """The class, graded once per run (tests/conftest.py): tests/test_grade_lab3.py reads the same run."""
    return lab3_class


def test_the_class_is_graded_and_the_batch_exits_zero(graded):
    assert graded["proc"].returncode == 0, graded["proc"].stderr[-2000:]
    assert set(graded["rows"]) == set(graded["expected"]) and len(graded["rows"]) >= 29


def test_each_notebook_gets_its_own_score(graded):
    for student, want in graded["expected"].items():
        row = graded["rows"][student]
        if want is None:  # not a notebook: a row that says so
            assert row["status"] == "failed" and row["error"] and row["total"] == "0.00", row
        else:
            assert row["status"] == "graded" and row["error"] == "", row
            if want >= 0:
                assert float(row["total"]) == want, (student, row)


def test_live_cells_are_skipped_and_named(graded):
    out = graded["docs"]["solved0"]["output"]
    assert "Not run while grading" in out and "tagged `live`" in out, out


def test_a_lab3_notebook_grades_in_seconds(graded):
    """In CPU seconds, which a loaded machine does not change: the class's, and each notebook's (graded under a
    total limit of NOTEBOOK_CPU_S: one that ran past it says so); on the wall clock, backstops 4x as long."""
    times = {s: d["execution_time"] for s, d in graded["docs"].items() if graded["expected"][s] is not None}
    print(f"{len(graded['rows'])} notebooks in {graded['took']} with -j 2; slowest: "
          f"{max(times.values()):.1f} s on the wall clock ({max(times, key=times.get)})")
    assert graded["took"].within(CLASS_CPU_S), graded["took"]
    for student, doc in graded["docs"].items():
        if graded["expected"][student] is not None:
            assert "total time limit" not in json.dumps(doc), (student, doc)
    assert max(times.values()) < backstop(NOTEBOOK_CPU_S), times
