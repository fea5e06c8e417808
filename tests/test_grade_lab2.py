"""Lab 2 end to end through `specdec grade`: the solution scores full marks, the generated lab
zero, a planted wrong answer loses exactly its exercise's points (that labs/ agrees with solutions/:
tests/test_grade_lab1.py).

Grading skips the cells tagged `demo` (the decoding runs and timings, about a minute of CPU): the four
notebooks are graded in one run, two at a time (module fixture), and each test reads its entry.
"""

from __future__ import annotations

import pytest
from notebook_tools import REPO, grade_lab_set, lab_points

SOLUTION = REPO / "solutions" / "02_static_k_mtp.ipynb"
LAB = REPO / "labs" / "02_static_k_mtp.ipynb"


def lab2_points() -> dict[str, float]:
    return lab_points(2)


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict:
    return grade_lab_set(SOLUTION, LAB, "lab2.q1", tmp_path_factory.mktemp("lab2"))


@pytest.mark.slow
def test_solution_scores_full_marks(graded):
    doc = graded["solution"]
    points = lab2_points()
    assert [t["name"].split(":")[0] for t in doc["tests"]] == list(points)
    assert doc["max_score"] == sum(points.values()) == 19
    assert doc["score"] == doc["max_score"], [t for t in doc["tests"] if t["score"] < t["max_score"]]
    # the demo cells were skipped and said so, and every cell that ran ran cleanly without them
    assert "Not run while grading (9 cells tagged `demo`" in doc["output"], doc["output"]
    assert "Problems while running" not in doc["output"], doc["output"]


@pytest.mark.slow
def test_generated_lab_scores_zero(graded):
    doc = graded["lab"]
    assert doc["max_score"] == sum(lab2_points().values())
    assert doc["score"] == 0.0, [t for t in doc["tests"] if t["score"] > 0]


@pytest.mark.slow
@pytest.mark.parametrize("which", ["last", "first"])
def test_planted_wrong_answer_loses_exactly_its_points(graded, which):
    """The last exercise, and the first: a wrong q1 must not cost any later exercise a point."""
    doc, target = graded[which]
    points = lab2_points()
    lost = [(t["name"], t["score"], t["output"][:300]) for t in doc["tests"] if t["score"] < t["max_score"]]
    assert doc["score"] == sum(points.values()) - points[target], (lost, doc["output"][-2000:])
    assert {t["name"].split(":")[0]: t["score"] for t in doc["tests"]}[target] == 0.0
