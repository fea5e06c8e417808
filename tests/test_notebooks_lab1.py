"""Lab 1's notebooks: committed clean, run without errors, the solution earns full marks and the
untouched lab (solution blocks replaced by stubs, as the lab generator does) runs to the end with zero."""

import re
from pathlib import Path

import nbformat
import pytest
from notebook_tools import assert_committed_clean, exercise_cells, text_of
from notebook_tools import execute as run_notebook
from notebook_tools import untouched_lab as lab_of

ROOT = Path(__file__).resolve().parents[1]
LECTURE = ROOT / "notebooks" / "01_simulated_loop.ipynb"
SOLUTION = ROOT / "solutions" / "01_simulated_loop.ipynb"
BUDGET_S = 120  # the course's limit per Lab 1 notebook on 2 CPU cores


def execute(nb, cwd):
    return run_notebook(nb, cwd, timeout=BUDGET_S)


def untouched_lab():
    return lab_of(SOLUTION)


@pytest.mark.parametrize("path", [LECTURE, SOLUTION], ids=["lecture", "solution"])
def test_committed_without_outputs(path):
    assert_committed_clean(path)


def test_exercise_cells_follow_the_convention():
    assert exercise_cells(SOLUTION, 1) == [f"lab1.q{i}" for i in range(1, 8)]


@pytest.mark.slow
def test_lecture_runs(tmp_path):
    nb, seconds = execute(nbformat.read(LECTURE, as_version=4), tmp_path)
    assert seconds < BUDGET_S
    assert "p-value" in text_of(nb)


@pytest.mark.slow
def test_solution_runs_with_full_marks(tmp_path):
    nb, seconds = execute(nbformat.read(SOLUTION, as_version=4), tmp_path)
    assert seconds < BUDGET_S
    out = text_of(nb)
    for i in range(1, 8):
        assert re.search(rf"lab1\.q{i} \[PASS\]", out), f"lab1.q{i} did not pass:\n{out}"
    assert "total: 9 / 9" in out


@pytest.mark.slow
def test_untouched_lab_runs_to_the_end_with_zero(tmp_path):
    lab = untouched_lab()
    assert "### BEGIN SOLUTION" not in "".join(c.source for c in lab.cells)
    nb, _ = execute(lab, tmp_path)  # raises CellExecutionError if a cell depends on a stub
    out = text_of(nb)
    for i in range(1, 8):
        assert re.search(rf"lab1\.q{i} \[FAIL\] 0/\d+ .*not implemented", out), f"lab1.q{i}:\n{out}"
    assert "total: 0 / 9" in out
