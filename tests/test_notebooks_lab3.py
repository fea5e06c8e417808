"""Lab 3's notebooks: committed clean, run on a CPU against `specdec serve` within the course's budget,
leave no server behind; the solution earns full marks and the untouched lab runs to the end with zero."""

import os
import re
import sys
from pathlib import Path

import nbformat
import pytest
from notebook_tools import (
    assert_committed_clean,
    assert_ids_only_in_check_cells,
    assert_lecture_without_exercises,
    exercise_cells,
    images_in,
    text_of,
)
from notebook_tools import execute as run_notebook
from notebook_tools import untouched_lab as lab_of

ROOT = Path(__file__).resolve().parents[1]
LECTURE = ROOT / "notebooks" / "03_sglang_live.ipynb"
SOLUTION = ROOT / "solutions" / "03_sglang_live.ipynb"
BUDGET_S = 240  # the course's limit per Lab 3 notebook on 2 CPU cores
EXERCISES = [f"lab3.q{i}" for i in range(1, 8)]


def servers_running() -> list[int]:
    """Live `specdec serve` processes of this checkout's Python (from /proc): a notebook must leave none.
    (Servers of another checkout's tests, running at the same time, are not the notebook's.)"""
    ours = os.fsencode(sys.executable)
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().split(b"\0")
                state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if cmd[0] == ours and b"specdec" in cmd and b"serve" in cmd and state != "Z":
                out.append(int(d.name))
    return out


def execute(nb, cwd):
    before = set(servers_running())
    nb, seconds = run_notebook(nb, cwd, timeout=BUDGET_S)
    assert set(servers_running()) - before == set(), "the notebook left a server running"
    return nb, seconds



@pytest.mark.parametrize("path", [LECTURE, SOLUTION], ids=["lecture", "solution"])
def test_committed_without_outputs(path):
    assert_committed_clean(path)


def test_exercise_cells_follow_the_convention():
    assert exercise_cells(SOLUTION, 3) == EXERCISES
    assert_ids_only_in_check_cells(SOLUTION, 3, EXERCISES)


def test_lecture_has_no_exercises_and_no_canned_numbers():
    assert_lecture_without_exercises(LECTURE, canned=("x 1.3",))


@pytest.mark.slow
def test_lecture_runs(tmp_path, inline_plots):
    nb, seconds = execute(nbformat.read(LECTURE, as_version=4), tmp_path)
    assert seconds < BUDGET_S
    out = text_of(nb)
    assert "No GPU with SGLang here" in out  # CI: it says which server it started
    tau = re.search(r"\(completion_tokens - 1\) / spec_verify_ct = \((\d+) - 1\) / (\d+) = (\S+)", out)
    assert tau and abs((int(tau.group(1)) - 1) / int(tau.group(2)) - float(tau.group(3))) < 1e-3
    assert re.search(r"\d+ verify steps for 48 tokens", out)  # the coloured trace
    assert "crossover" in out and "measured:" in out and "predicted from step costs:" in out
    assert "refused" in out and "servers still running: none" in out
    assert images_in(nb) >= 3  # histogram and acceptance, ITL, throughput vs concurrency


@pytest.mark.slow
def test_solution_runs_with_full_marks(tmp_path, inline_plots):
    nb, seconds = execute(nbformat.read(SOLUTION, as_version=4), tmp_path)
    assert seconds < BUDGET_S
    out = text_of(nb)
    for ex in EXERCISES:
        assert re.search(rf"{re.escape(ex)} \[PASS\]", out), f"{ex} did not pass:\n{out}"
    assert "total: 7 / 7" in out and "servers still running: none" in out
    assert images_in(nb) >= 1


@pytest.mark.slow
def test_untouched_lab_runs_to_the_end_with_zero(tmp_path):
    lab = lab_of(SOLUTION)
    assert "### BEGIN SOLUTION" not in "".join(c.source for c in lab.cells)
    nb, seconds = execute(lab, tmp_path)
    assert seconds < BUDGET_S
    out = text_of(nb)
    for ex in EXERCISES:
        assert re.search(rf"{re.escape(ex)} \[FAIL\] 0/\d+ .*not implemented", out), f"{ex}:\n{out}"
    assert "total: 0 / 7" in out and "not written yet" in out and "servers still running: none" in out
