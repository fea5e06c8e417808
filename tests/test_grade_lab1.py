"""Lab 1 end to end through `specdec grade`: the solution scores full marks, the generated lab
zero, a planted wrong answer loses exactly its exercise's points, and labs/ agrees with solutions/.

The notebooks are graded in one run (module fixture); each test reads its entry.
"""

from __future__ import annotations

import shutil

import pytest
from notebook_tools import REPO, grade_many, lab_points, plant_wrong_answer, specdec

SOLUTION = REPO / "solutions" / "01_simulated_loop.ipynb"
LAB = REPO / "labs" / "01_simulated_loop.ipynb"


def lab1_points() -> dict[str, float]:
    return lab_points(1)


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict:
    assert LAB.exists(), "run `specdec labs`"
    tmp = tmp_path_factory.mktemp("lab1")
    wrong = tmp / "01_simulated_loop.ipynb"
    target = plant_wrong_answer(SOLUTION, wrong)
    (tmp / "again").mkdir()
    again = tmp / "again" / "01_simulated_loop.ipynb"
    shutil.copy(wrong, again)
    solution, lab, planted, planted_again = grade_many([SOLUTION, LAB, wrong, again], tmp)
    return dict(solution=solution, lab=lab, planted=planted, target=target, again=planted_again)


def test_solution_scores_full_marks(graded):
    doc = graded["solution"]
    points = lab1_points()
    assert [t["name"].split(":")[0] for t in doc["tests"]] == list(points)
    assert doc["max_score"] == sum(points.values())
    assert doc["score"] == doc["max_score"], [t for t in doc["tests"] if t["score"] < t["max_score"]]
    # the demo cells were skipped and said so, and every cell that ran ran cleanly without them
    assert "Not run while grading (4 cells tagged `demo`" in doc["output"], doc["output"]
    assert "Problems while running" not in doc["output"], doc["output"]


def test_generated_lab_scores_zero(graded):
    doc = graded["lab"]
    assert doc["max_score"] == sum(lab1_points().values())
    assert doc["score"] == 0.0, [t for t in doc["tests"] if t["score"] > 0]


def test_planted_wrong_answer_loses_exactly_its_points(graded):
    doc, target = graded["planted"], graded["target"]
    points = lab1_points()
    assert doc["score"] == sum(points.values()) - points[target], doc["tests"]
    assert {t["name"].split(":")[0]: t["score"] for t in doc["tests"]}[target] == 0.0


def test_the_same_notebook_gets_the_same_grade(graded):
    """The cases are seeded by exercise and notebook: the same feedback, p-values and first failures."""
    assert graded["planted"]["tests"] == graded["again"]["tests"]
    assert graded["planted"]["score"] < graded["planted"]["max_score"]


def test_labs_agree_with_solutions():
    proc = specdec("labs", "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
