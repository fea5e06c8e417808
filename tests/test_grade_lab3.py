"""Lab 3 end to end through `specdec grade`: the solution scores full marks, the generated lab zero, a
planted wrong answer loses exactly its exercise's points (also the first one, which q2 builds on).
The notebooks start real `specdec serve` processes in their live cells, which grading skips.
They are read from the class graded once per run (tests/conftest.py's lab3_class, which
tests/test_grade_class.py reads too): its solved0 is solutions/03_sglang_live.ipynb, its untouched0
labs/03_sglang_live.ipynb, and it holds the solution with one wrong answer to each of several exercises,
the last and the first among them."""

from __future__ import annotations

import pytest
from notebook_tools import lab_points


@pytest.fixture
def graded(lab3_class) -> dict:
    """{solution, lab, last: (doc, id), first: (doc, id)}, as tests/notebook_tools.grade_lab_set gives them."""
    docs, planted = lab3_class["docs"], lab3_class["planted"]
    ids = list(lab_points(3))
    assert {ids[0], ids[-1]} <= set(planted), planted
    return dict(solution=docs["solved0"], lab=docs["untouched0"], last=(docs[planted[ids[-1]]], ids[-1]),
                first=(docs[planted[ids[0]]], ids[0]))


@pytest.mark.slow
def test_solution_scores_full_marks(graded):
    doc = graded["solution"]
    points = lab_points(3)
    assert [t["name"].split(":")[0] for t in doc["tests"]] == list(points)
    assert doc["score"] == doc["max_score"] == sum(points.values()) == 16, doc["tests"]


@pytest.mark.slow
@pytest.mark.parametrize("which", ["solution", "lab"])
def test_the_untagged_cells_run_without_the_live_ones(graded, which):
    """What the grader runs is every cell not tagged live: each ran without error (no name that only a live
    cell defines) and started no server."""
    out = graded[which]["output"]
    assert "Not run while grading" in out and "tagged `live`" in out, out
    assert "Problems while running" not in out and "started our own" not in out, out


@pytest.mark.slow
def test_generated_lab_scores_zero(graded):
    doc = graded["lab"]
    assert doc["max_score"] == 16 and doc["score"] == 0.0, [t for t in doc["tests"] if t["score"] > 0]


@pytest.mark.slow
@pytest.mark.parametrize("which", ["last", "first"])
def test_planted_wrong_answer_loses_exactly_its_points(graded, which):
    doc, target = graded[which]
    points = lab_points(3)
    assert doc["score"] == sum(points.values()) - points[target], doc["tests"]
    assert {t["name"].split(":")[0]: t["score"] for t in doc["tests"]}[target] == 0.0
