"""Lab 3 end to end through `specdec grade`: the solution scores full marks, the generated lab zero, a
planted wrong answer loses exactly its exercise's points (also the first one, which q2 builds on).
The notebooks start real `specdec serve` processes inside the grading kernel; graded in one run."""

from __future__ import annotations

import pytest
from notebook_tools import REPO, grade_lab_set, lab_points

SOLUTION = REPO / "solutions" / "03_sglang_live.ipynb"
LAB = REPO / "labs" / "03_sglang_live.ipynb"


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict:
    return grade_lab_set(SOLUTION, LAB, "lab3.q1", tmp_path_factory.mktemp("lab3"))


@pytest.mark.slow
def test_solution_scores_full_marks(graded):
    doc = graded["solution"]
    points = lab_points(3)
    assert [t["name"].split(":")[0] for t in doc["tests"]] == list(points)
    assert doc["score"] == doc["max_score"] == sum(points.values()) == 7, doc["tests"]


@pytest.mark.slow
def test_generated_lab_scores_zero(graded):
    doc = graded["lab"]
    assert doc["max_score"] == 7 and doc["score"] == 0.0, [t for t in doc["tests"] if t["score"] > 0]


@pytest.mark.slow
@pytest.mark.parametrize("which", ["last", "first"])
def test_planted_wrong_answer_loses_exactly_its_points(graded, which):
    doc, target = graded[which]
    points = lab_points(3)
    assert doc["score"] == sum(points.values()) - points[target], doc["tests"]
    assert {t["name"].split(":")[0]: t["score"] for t in doc["tests"]}[target] == 0.0
