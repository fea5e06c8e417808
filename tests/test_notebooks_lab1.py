"""Lab 1's notebooks: committed clean, run without errors, the solution earns full marks and the
untouched lab (solution blocks replaced by stubs, as the lab generator does) runs to the end with zero."""

import re
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
LECTURE = ROOT / "notebooks" / "01_simulated_loop.ipynb"
SOLUTION = ROOT / "solutions" / "01_simulated_loop.ipynb"
BUDGET_S = 120  # the course's limit per Lab 1 notebook on 2 CPU cores


def execute(nb: nbformat.NotebookNode, cwd: Path) -> tuple[nbformat.NotebookNode, float]:
    from nbclient import NotebookClient

    start = time.perf_counter()
    NotebookClient(nb, kernel_name="python3", timeout=120, resources={"metadata": {"path": str(cwd)}}).execute()
    return nb, time.perf_counter() - start


def text_of(nb: nbformat.NotebookNode) -> str:
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def untouched_lab() -> nbformat.NotebookNode:
    """The student notebook, as `specdec labs` generates it from the solution."""
    from specdec.grading.labgen import lab_text

    return nbformat.reads(lab_text(SOLUTION), as_version=4)


@pytest.mark.parametrize("path", [LECTURE, SOLUTION], ids=["lecture", "solution"])
def test_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:60]


def test_exercise_cells_follow_the_convention():
    nb = nbformat.read(SOLUTION, as_version=4)
    cells = nb.cells
    found = []
    for i, cell in enumerate(cells):
        if cell.cell_type == "code" and "### BEGIN SOLUTION" in cell.source:
            assert cell.source.count("### BEGIN SOLUTION") == cell.source.count("### END SOLUTION")
            nxt = cells[i + 1]
            m = re.fullmatch(r'check\("(lab1\.q\d+)"\)', nxt.source.strip())
            assert nxt.cell_type == "code" and m, f"cell {i + 1} should be check(...)"
            found.append(m.group(1))
            markdown = "".join(c.source for c in cells[:i] if c.cell_type == "markdown")
            assert m.group(1) in markdown
    assert found == [f"lab1.q{i}" for i in range(1, 8)]


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
