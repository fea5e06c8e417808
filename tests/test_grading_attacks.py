"""The grade cannot be fooled from the notebook, a crash costs only what it touches, a mistake costs once.

Lab 1's real notebooks with cells from tests/fixtures/attacks.py added, graded in one run of
`specdec grade` (module fixture, as a course would grade a class); each test reads its entry. The
attacks and the crashes go into the notebooks' exercise cells only (exercises_only): the cells that
only demonstrate cost seconds of CPU time in each kernel, again in each fresh one after a crash.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import nbformat
import pytest
from notebook_tools import REPO, lab_points, specdec

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
import attacks  # noqa: E402

LAB = REPO / "labs" / "01_simulated_loop.ipynb"
SOLUTION = REPO / "solutions" / "01_simulated_loop.ipynb"
CELL_S, WALL_FACTOR = 5, 2  # the batch's --cell-timeout (CPU seconds) and --wall-factor
LAB1 = {f"lab1.q{i}": p for i, p in enumerate([1, 1, 3, 1, 1, 1, 1, 2, 2, 3, 2, 2], 1)}


def with_cells(src: Path, out: Path, cells: dict[int, str]) -> Path:
    """A copy of a notebook with code cells inserted before the given 0-based positions (-1: at the end)."""
    nb = nbformat.read(src, as_version=4)
    for at, source in sorted(cells.items(), key=lambda kv: -kv[0] if kv[0] >= 0 else -1 << 30):
        nb.cells.insert(len(nb.cells) if at < 0 else at, nbformat.v4.new_code_cell(source))
    nbformat.write(nb, out)
    return out


def exercises_only(src: Path, out: Path) -> Path:
    """A copy of a notebook with only what grading needs of it: its first code cell (the imports), the cells that
    define functions (the answers) and the check cells; its markdown, and no cell that only demonstrates."""
    nb = nbformat.read(src, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    nb.cells = [c for c in nb.cells if c.cell_type == "markdown" or c is first
                or re.search(r"^def |^check\(", c.source, re.M)]
    nbformat.write(nb, out)
    return out


def position(notebook: Path, head: str) -> int:
    """The 0-based position of the notebook's first cell whose source starts with `head`."""
    return next(i for i, c in enumerate(nbformat.read(notebook, as_version=4).cells) if c.source.startswith(head))


def with_wrong_answers(src: Path, out: Path) -> Path:
    nb = nbformat.read(src, as_version=4)
    for cell in nb.cells:
        for head, wrong in attacks.WRONG.items():
            if cell.cell_type == "code" and cell.source.startswith(head):
                cell.source = wrong
    nbformat.write(nb, out)
    return out


def scores(entry: dict) -> dict[str, float]:
    return {t["name"].split(":")[0]: t["score"] for t in entry["tests"]}


def feedback(entry: dict, ex_id: str) -> str:
    return next(t["output"] for t in entry["tests"] if t["name"].startswith(ex_id + ":"))


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("attacks")
    lab, solution = exercises_only(LAB, tmp / "lab.ipynb"), exercises_only(SOLUTION, tmp / "solution.ipynb")
    # every crash class in a notebook whose answers are all right: in the middle (after q3's check, after q5's, before
    # q6's answer) and at the end. The loop that swallows the time limit waits out the wall clock twice (about 20 s):
    # in a notebook of its own, graded first, while the batch's other workers grade the rest
    paths = {"swallowed_timeouts": with_cells(solution, tmp / "swallowed_timeouts.ipynb", {
        position(solution, "def best_k("): attacks.SWALLOW_TIMEOUTS}),
        "crashes": with_cells(solution, tmp / "crashes.ipynb", {
            position(solution, 'check("lab1.q3")') + 1: attacks.SIGKILL,
            position(solution, 'check("lab1.q5")') + 1: attacks.RUNAWAY_MEMORY, -1: attacks.SEGFAULT + "\n"})}
    paths |= {name: with_cells(lab, tmp / f"{name}.ipynb", {-1: cell}) for name, cell in attacks.ATTACKS.items()}
    paths["wrong_q1_q2_q5"] = with_wrong_answers(SOLUTION, tmp / "wrong_q1_q2_q5.ipynb")
    lab2 = [nbformat.v4.new_code_cell("from specdec.grading import check"),
            nbformat.v4.new_code_cell(attacks.REPLACE_CHECKS), nbformat.v4.new_code_cell('check("lab2.q1")')]
    nbformat.write(nbformat.v4.new_notebook(cells=lab2), tmp / "lab2_replace_checks.ipynb")
    paths["lab2_replace_checks"] = tmp / "lab2_replace_checks.ipynb"
    results, table = tmp / "r.json", tmp / "r.csv"
    # limits that the CPU time of Lab 1's cells fits in with room to spare (its slowest graded cell takes about 2 s,
    # several times that on the wall clock of a loaded machine), and that stop the sleeping loop of SWALLOW_TIMEOUTS,
    # which only the wall clock catches, in seconds: it runs twice (again in a fresh kernel), and nothing else waits
    proc = specdec("grade", *map(str, paths.values()), "--json", str(results), "--csv", str(table), "-j", "4",
                   "--cell-timeout", str(CELL_S), "--wall-factor", str(WALL_FACTOR))
    assert proc.returncode == 0, proc.stderr + proc.stdout
    entries = {Path(e["notebook"]).stem: e for e in json.loads(results.read_text())}
    return dict(entries=entries, csv=table.read_text(), out=proc.stdout)


@pytest.mark.parametrize("name", [n for n in attacks.ATTACKS])
def test_an_attack_from_the_notebook_scores_nothing(graded, name):
    entry = graded["entries"][name]
    assert set(scores(entry).values()) == {0.0}, entry
    assert entry["max_score"] == 20.0


@pytest.mark.parametrize("name, words", [
    ("replace_checks", ["imports the grader's internals"]),
    ("replace_run_check", ["imports the grader's internals", "patches specdec (registry.run_check)", "gc.get_objects"]),
    ("results_file", ["uses ctypes", "reads /proc", "the kernel exited with status 0"]),
    ("patch_reference", ["patches specdec (verify.residual_distribution, formulas.acceptance_alpha"]),
    ("read_frames", ["sys._getframe"]),
    ("tamper_harness", ["imports the grader's internals", "patches specdec (registry.run_check, exercise.grade"]),
    ("forge_replies", ["reads /proc"]),
])
def test_the_report_names_the_attempt(graded, name, words):
    output = graded["entries"][name]["output"]
    for w in words:
        assert w in output, output
    assert "no effect on the grade" in output


def test_forged_replies_are_read_as_answers_of_the_student_and_judged(graded):
    """A reply forged ahead of time is no more than an answer: here, one to none of the cases."""
    assert "the kernel answered 0 of the 10 calls" in feedback(graded["entries"]["forge_replies"], "lab1.q1")


def test_the_grader_writes_its_results_after_the_kernel_is_gone(graded):
    """The results_file attack wrote full marks into --json and --csv, then left: both were rewritten."""
    assert graded["entries"]["results_file"]["score"] == 0.0
    assert "me,20,20" not in graded["csv"] and len(graded["csv"].splitlines()) == 1 + len(graded["entries"])


def test_replacing_lab2_checks_scores_nothing(graded):
    entry = graded["entries"]["lab2_replace_checks"]
    assert entry["score"] == 0.0 and entry["max_score"] == sum(lab_points(2).values()) == 19


@pytest.mark.parametrize("name, words, fresh", [
    ("crashes", ["killed by SIGKILL", "MemoryError", "memory limit is 4 GiB", "killed by SIGSEGV"], 3),
    ("swallowed_timeouts",
     [f"did not stop at the time limit of {CELL_S}s of CPU time, {CELL_S * WALL_FACTOR}s on the wall clock"], 1)])
def test_every_crash_class_costs_only_its_own_cell(graded, name, words, fresh):
    """SIGKILL mid-run, a runaway allocation and a segfault at the end in one notebook; a loop that swallows the time
    limit in another. Each notebook's answers are all right, and all score."""
    entry = graded["entries"][name]
    assert scores(entry) == LAB1, entry
    output = entry["output"]
    for w in words:
        assert w in output, output
    assert output.count("a fresh kernel ran the cells before it again") == fresh, output


def test_each_mistake_costs_once(graded):
    """Wrong residual (q1), inverted acceptance (q2) and wrong tau (q5): q3 and q6, which call them, keep
    full marks, and say that the reference stood in."""
    entry = graded["entries"]["wrong_q1_q2_q5"]
    got = scores(entry)
    assert got["lab1.q1"] == 0.0 and got["lab1.q2"] < 1.0 and got["lab1.q5"] < 1.0
    assert got["lab1.q3"] == 3.0 and got["lab1.q6"] == 1.0 and got["lab1.q4"] == 1.0 and got["lab1.q7"] == 1.0
    assert "reference `accept_draft` (lab1.q2) and `residual` (lab1.q1) in place of yours" in feedback(entry, "lab1.q3")
    assert "reference `tokens_per_step` (lab1.q5) in place of yours" in feedback(entry, "lab1.q6")
