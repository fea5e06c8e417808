"""Helpers shared by the notebook and end-to-end grading tests of every lab."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
from cpu_clock import WALL_BACKSTOP, children_cpu_seconds

REPO = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^([ \t]*)### BEGIN SOLUTION[ \t]*\n.*?^[ \t]*### END SOLUTION[ \t]*$", re.S | re.M)


def execute(nb: nbformat.NotebookNode, cwd: Path, timeout: int) -> tuple[nbformat.NotebookNode, float]:
    """Run a notebook in a Jupyter kernel (as a student would); return it with outputs and the CPU seconds its
    processes used (the kernel and what it started and waited for: Lab 3's servers), which a machine loaded by
    other work does not change. `timeout` is the budget in CPU seconds the callers assert; each cell's
    wall-clock limit is WALL_BACKSTOP times that (a backstop for a hang)."""
    from nbclient import NotebookClient

    before = children_cpu_seconds()
    NotebookClient(nb, kernel_name="python3", timeout=timeout * WALL_BACKSTOP,
                   resources={"metadata": {"path": str(cwd)}}).execute()
    return nb, children_cpu_seconds() - before


def text_of(nb: nbformat.NotebookNode) -> str:
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def images_in(nb: nbformat.NotebookNode) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def shrunk(nb: nbformat.NotebookNode, sizes: dict[str, str]) -> nbformat.NotebookNode:
    """The notebook with its demonstrations made smaller: each key, a whole line of one code cell (the sizes:
    tokens, repeats, steps), replaced by its value. For a run that checks what a notebook does, not what it
    measures (the untouched lab; a lecture's or a solution's timings); a line that is missing or found twice
    fails, so that the notebook and the test cannot drift apart silently.
    SPECDEC_FULL_NOTEBOOKS=1 in the environment keeps every size (the lines are still checked): `make test-full`."""
    full = os.environ.get("SPECDEC_FULL_NOTEBOOKS") == "1"
    for old, new in sizes.items():
        hits = [c for c in nb.cells if c.cell_type == "code" and old in c.source.splitlines()]
        assert len(hits) == 1, f"{len(hits)} cells have the line {old!r}"
        if not full:
            hits[0].source = "\n".join(new if line == old else line for line in hits[0].source.splitlines())
    return nb


def untouched_lab(solution: Path) -> nbformat.NotebookNode:
    """The student notebook, as `specdec labs` generates it from the solution."""
    from specdec.grading.labgen import lab_text

    return nbformat.reads(lab_text(solution), as_version=4)


def assert_committed_clean(path: Path) -> None:
    # every cell has its id as committed (nbformat 4.5: a missing id warns today and is to become an error)
    assert all("id" in cell for cell in json.loads(path.read_text())["cells"]), f"{path.name}: a cell without an id"
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:60]


def exercise_cells(solution: Path, lab: int) -> list[str]:
    """Exercise ids in order, checking the convention: a BEGIN/END block, then a check() cell, and
    the id named in the markdown before it."""
    cells = nbformat.read(solution, as_version=4).cells
    found = []
    for i, cell in enumerate(cells):
        if cell.cell_type == "code" and "### BEGIN SOLUTION" in cell.source:
            assert cell.source.count("### BEGIN SOLUTION") == cell.source.count("### END SOLUTION")
            nxt = cells[i + 1]
            m = re.fullmatch(rf'check\("(lab{lab}\.q\d+)"\)', nxt.source.strip())
            assert nxt.cell_type == "code" and m, f"cell {i + 1} should be check(...)"
            found.append(m.group(1))
            markdown = "".join(c.source for c in cells[:i] if c.cell_type == "markdown")
            assert m.group(1) in markdown
    return found


def assert_ids_only_in_check_cells(solution: Path, lab: int, exercises: list[str]) -> None:
    """Exercise ids appear in code only in the check cells (the grader splits answers at them)."""
    cells = nbformat.read(solution, as_version=4).cells
    in_code = [c.source for c in cells if c.cell_type == "code" and re.search(rf"lab{lab}\.q\d", c.source)]
    assert len(in_code) == len(exercises)


def assert_lecture_without_exercises(lecture: Path, canned: tuple[str, ...] = ()) -> None:
    """A lecture holds no exercise and no canned result ("typical", "you should see", ...)."""
    nb = nbformat.read(lecture, as_version=4)
    source = "".join(c.source for c in nb.cells)
    assert "### BEGIN SOLUTION" not in source and "check(" not in source
    prose = "".join(c.source for c in nb.cells if c.cell_type == "markdown").lower()
    for word in ("typical", "expected speedup", "you should see", *canned):
        assert word not in prose


def specdec(*argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SPECDEC_EXTRA_CHECKS"}
    return subprocess.run([sys.executable, "-m", "specdec", *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)


def grade(notebook: Path, tmp_path: Path) -> dict[str, Any]:
    return grade_many([notebook], tmp_path)[0]


def grade_many(notebooks: list[Path], tmp_path: Path, jobs: int = 2, *options: str) -> list[dict[str, Any]]:
    """Grade notebooks in one `specdec grade` run (`jobs` at once): their results.json entries, in order."""
    results = tmp_path / "results.json"
    proc = specdec("grade", *map(str, notebooks), "--json", str(results), "-j", str(jobs), *options)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    doc = json.loads(results.read_text())
    return [doc] if len(notebooks) == 1 else doc


def lab_points(lab: int) -> dict[str, float]:
    from specdec.grading import exercises_for_lab

    return {e.id: float(e.points) for e in exercises_for_lab(lab)}


def plant_wrong_answer(solution: Path, out: Path, exercise: str | None = None) -> str:
    """Copy the solution with one exercise's blocks answering wrong (by default the last one:
    nothing later builds on it); return that exercise's id."""
    from specdec.grading.submission import load_submission

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


def assert_check_contract(exercise_id: str, name: str) -> None:
    """Every exercise's check: a missing name, a stub and a non-function each score zero, clearly."""
    from specdec.grading.registry import get_exercise, run_check

    ex = get_exercise(exercise_id)
    res = run_check(ex, {})
    assert res.score == 0.0 and f"define `{name}" in res.message

    def stub(*args):
        raise NotImplementedError()

    res = run_check(ex, {name: stub})
    assert res.score == 0.0 and "not implemented" in res.message
    res = run_check(ex, {name: 42})
    assert res.score == 0.0 and "should be a function" in res.message


def grade_lab_set(solution: Path, lab: Path, first: str, tmp_path: Path) -> dict[str, Any]:
    """The solution, the generated lab, and the solution with a wrong last exercise and a wrong `first`
    one, graded in one `specdec grade` run: {solution, lab, last: (doc, id), first: (doc, id)}."""
    assert lab.exists(), "run `specdec labs`"
    planted, targets = [], {}
    for which, exercise in (("last", None), ("first", first)):
        (tmp_path / which).mkdir()
        planted.append(tmp_path / which / solution.name)
        targets[which] = plant_wrong_answer(solution, planted[-1], exercise)
    sol, lab_doc, last, first_doc = grade_many([solution, lab, *planted], tmp_path)
    return dict(solution=sol, lab=lab_doc, last=(last, targets["last"]), first=(first_doc, targets["first"]))


def solve_one(solution: Path, lab: Path, out: Path, exercise: str) -> None:
    """The generated lab with one exercise answered as the solution answers it."""
    from specdec.grading.submission import load_submission

    sol, nb = json.loads(solution.read_text()), json.loads(lab.read_text())
    for n in load_submission(solution).answer_cells()[exercise]:
        nb["cells"][n - 1]["source"] = sol["cells"][n - 1]["source"]
    out.write_text(json.dumps(nb))


def code_cell(source: str) -> dict:
    return {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": source}


BROKEN = {  # a name -> what a student did to the notebook (applied to a copy of the solution)
    "raises_in_imports": lambda cells: cells[1].__setitem__("source", "1 / 0\n" + "".join(cells[1]["source"])),
    "exits_in_a_cell": lambda cells: cells.insert(2, code_cell("import sys\nsys.exit(3)")),
    "kills_its_kernel": lambda cells: cells.insert(2, code_cell("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")),
    "runs_out_of_memory": lambda cells: cells.insert(2, code_cell("hog = []\nwhile True:\n    hog.append(bytes(1 << 30))")),
    "syntax_error": lambda cells: cells[-1].__setitem__("source", "def f(:\n    pass"),
}
LOOPS = {"loops_in_a_cell": lambda cells: cells.insert(2, code_cell("while True:\n    pass"))}


def a_class(solution: Path, lab: Path, root: Path, loops: bool = False,
            planted: dict[str, str] | None = None) -> dict[str, float | None]:
    """Thirty-odd Lab notebooks as a class hands them in, one folder per student: solutions (some with one
    wrong answer), untouched labs, labs with one exercise done, and broken files. Student -> the total
    expected (None: the file cannot be graded; -1: broken, any score). `planted`, if given, receives
    exercise id -> the student whose solution answers (only) that exercise wrong."""
    from specdec.grading.submission import load_submission

    ids = list(load_submission(solution).answer_cells())
    points = lab_points(int(ids[0].split(".")[0].removeprefix("lab")))
    full = sum(points.values())
    expected: dict[str, float | None] = {}

    def folder(name: str) -> Path:
        (root / name).mkdir(parents=True)
        return root / name / solution.name

    for i in range(10):
        if i < 5:
            folder(f"solved{i}").write_text(solution.read_text())
            expected[f"solved{i}"] = full
        else:
            wrong = plant_wrong_answer(solution, folder(f"solved{i}"), ids[i % len(ids)])
            expected[f"solved{i}"] = full - points[wrong]
            if planted is not None:
                planted[wrong] = f"solved{i}"
    for i in range(10):
        if i < 5:
            folder(f"untouched{i}").write_text(lab.read_text())
            expected[f"untouched{i}"] = 0.0
        else:
            solve_one(solution, lab, folder(f"one_done{i}"), ids[i % len(ids)])
            expected[f"one_done{i}"] = points[ids[i % len(ids)]]
    for name, text in (("not_json", "{not json"), ("not_a_notebook", "[1, 2, 3]"), ("empty_file", "")):
        folder(name).write_text(text)
        expected[name] = None
    folder("no_cells").write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    expected["no_cells"] = 0.0
    for name, damage in {**BROKEN, **(LOOPS if loops else {})}.items():
        nb = json.loads(solution.read_text())
        damage(nb["cells"])
        folder(name).write_text(json.dumps(nb))
        expected[name] = -1
    return expected
