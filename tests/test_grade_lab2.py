"""Lab 2 end to end through `specdec grade`: the solution scores full marks, the generated lab
zero, a planted wrong answer loses exactly its exercise's points, and labs/ agrees with solutions/.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specdec.grading import exercises_for_lab
from specdec.grading.submission import load_submission

REPO = Path(__file__).resolve().parents[1]
SOLUTION = REPO / "solutions" / "02_static_k_mtp.ipynb"
LAB = REPO / "labs" / "02_static_k_mtp.ipynb"

pytestmark = pytest.mark.skipif(not SOLUTION.exists(), reason="solutions/02_static_k_mtp.ipynb is not written yet")

BLOCK = re.compile(r"^([ \t]*)### BEGIN SOLUTION[ \t]*\n.*?^[ \t]*### END SOLUTION[ \t]*$", re.S | re.M)


def specdec(*argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SPECDEC_EXTRA_CHECKS"}
    return subprocess.run([sys.executable, "-m", "specdec", *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)


def grade(notebook: Path, tmp_path: Path) -> dict[str, Any]:
    results = tmp_path / "results.json"
    proc = specdec("grade", str(notebook), "--json", str(results))
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return json.loads(results.read_text())


def lab2_points() -> dict[str, float]:
    return {e.id: float(e.points) for e in exercises_for_lab(2)}


def plant_wrong_answer(solution: Path, out: Path, exercise: str | None = None) -> str:
    """Copy the solution with one exercise's blocks answering wrong (by default the last one:
    nothing later builds on it); return that exercise's id."""
    nb = json.loads(solution.read_text())
    sections = load_submission(solution).answer_cells()  # exercise id -> numbers of its answer cells

    def source(number: int) -> str:
        src = nb["cells"][number - 1]["source"]
        return "".join(src) if isinstance(src, list) else src

    with_blocks = [ex for ex, cells in sections.items() if any(BLOCK.search(source(n)) for n in cells)]
    target = exercise or max(with_blocks, key=lambda ex: int(ex.split(".q")[1]))
    for n in sections[target]:
        # inside a function: a wrong value; at top level: nothing (the names it defines are missing)
        wrong = BLOCK.sub(lambda m: m.group(1) + ("return 0" if m.group(1) else "pass"), source(n))
        nb["cells"][n - 1]["source"] = wrong
    out.write_text(json.dumps(nb))
    return target


@pytest.mark.slow
def test_solution_scores_full_marks(tmp_path):
    doc = grade(SOLUTION, tmp_path)
    points = lab2_points()
    assert [t["name"].split(":")[0] for t in doc["tests"]] == list(points)
    assert doc["max_score"] == sum(points.values()) == 10
    assert doc["score"] == doc["max_score"], [t for t in doc["tests"] if t["score"] < t["max_score"]]


@pytest.mark.slow
def test_generated_lab_scores_zero(tmp_path):
    assert LAB.exists(), "run `specdec labs`"
    doc = grade(LAB, tmp_path)
    assert doc["max_score"] == sum(lab2_points().values())
    assert doc["score"] == 0.0, [t for t in doc["tests"] if t["score"] > 0]


@pytest.mark.slow
@pytest.mark.parametrize("exercise", [None, "lab2.q1"], ids=["last", "first"])
def test_planted_wrong_answer_loses_exactly_its_points(tmp_path, exercise):
    """The last exercise, and the first: a wrong q1 must not cost any later exercise a point."""
    wrong = tmp_path / "02_static_k_mtp.ipynb"
    target = plant_wrong_answer(SOLUTION, wrong, exercise)
    doc = grade(wrong, tmp_path)
    points = lab2_points()
    assert doc["score"] == sum(points.values()) - points[target], doc["tests"]
    assert {t["name"].split(":")[0]: t["score"] for t in doc["tests"]}[target] == 0.0


def test_labs_agree_with_solutions():
    proc = specdec("labs", "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
