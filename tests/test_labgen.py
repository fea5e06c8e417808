"""`specdec labs`: labs/ generated from solutions/, and `--check` for drift."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import nbformat
import pytest

from specdec.cli import main as specdec
from specdec.grading.labgen import CODE, MARKDOWN, strip_blocks

SOLUTION_CODE = '''import math

def speedup(alpha, k, c):
    """Expected wall-time improvement."""
    ### BEGIN SOLUTION
    tokens = (1 - alpha ** (k + 1)) / (1 - alpha)
    return tokens / (k * c + 1)
    ### END SOLUTION

class Verifier:
    def accept(self, p, q):
        if q == 0:
            return True
        ### BEGIN SOLUTION
        return min(1.0, p / q)
        ### END SOLUTION'''

LAB_CODE = '''import math

def speedup(alpha, k, c):
    """Expected wall-time improvement."""
    raise NotImplementedError()

class Verifier:
    def accept(self, p, q):
        if q == 0:
            return True
        raise NotImplementedError()'''

SOLUTION_MD = "## Question\nWhy?\n\n<!-- BEGIN SOLUTION -->\nBecause **p = q**.\n\nTwo paragraphs.\n<!-- END SOLUTION -->\nNext."


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = specdec(list(argv))
    return status, out.getvalue(), err.getvalue()


def solution_notebook(path: Path, cells: list | None = None) -> Path:
    nb = nbformat.v4.new_notebook(cells=cells or [
        nbformat.v4.new_markdown_cell(SOLUTION_MD),
        nbformat.v4.new_code_cell(SOLUTION_CODE, execution_count=4,
                                  outputs=[nbformat.v4.new_output("stream", text="4.2\n")],
                                  metadata={"tags": ["exercise"], "execution": {"iopub.execute_input": "2025"}}),
        nbformat.v4.new_code_cell('check("lab1.q1")', execution_count=5,
                                  outputs=[nbformat.v4.new_output("execute_result", {"text/plain": "1"}, execution_count=5)]),
    ])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["specdec"] = {"lab": 1}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


@pytest.fixture
def course(tmp_path: Path) -> Path:
    solution_notebook(tmp_path / "solutions" / "01_loop.ipynb")
    return tmp_path


def generate(course: Path, *extra: str) -> tuple[int, str, str]:
    return run("labs", "--solutions", str(course / "solutions"), "--labs", str(course / "labs"), *extra)


def test_code_blocks_become_stubs_at_the_marker_indentation():
    assert strip_blocks(SOLUTION_CODE, CODE) == LAB_CODE


def test_a_block_at_the_end_keeps_no_trailing_newline_and_top_level_works():
    assert strip_blocks("### BEGIN SOLUTION\nx = 1\n### END SOLUTION\n", CODE) == "raise NotImplementedError()\n"
    assert strip_blocks("a = 1\n  ### BEGIN SOLUTION  \n### END SOLUTION", CODE) == "a = 1\n  raise NotImplementedError()"


def test_markdown_blocks_become_an_answer_placeholder():
    assert strip_blocks(SOLUTION_MD, MARKDOWN) == "## Question\nWhy?\n\n*Your answer here.*\nNext."


@pytest.mark.parametrize("source, words", [
    ("### BEGIN SOLUTION\nx = 1", ["line 1", "without a `### END SOLUTION`"]),
    ("x = 1\n### END SOLUTION", ["line 2", "without a `### BEGIN SOLUTION`"]),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", ["line 2", "inside the block opened on line 1"]),
    ("# BEGIN SOLUTION\nsecret = 42\n# END SOLUTION", ["line 1", "malformed marker"]),
])
def test_bad_markers_are_errors(source, words):
    with pytest.raises(ValueError) as info:
        strip_blocks(source, CODE)
    for w in words:
        assert w in str(info.value)


def test_generated_lab_is_stripped_and_keeps_the_rest(course):
    status, out, err = generate(course)
    assert status == 0, err
    assert "wrote" in out and "01_loop.ipynb" in out
    lab = json.loads((course / "labs" / "01_loop.ipynb").read_text())
    sol = json.loads((course / "solutions" / "01_loop.ipynb").read_text())
    md, code, chk = lab["cells"]
    assert "".join(md["source"]) == "## Question\nWhy?\n\n*Your answer here.*\nNext."
    assert "".join(code["source"]) == LAB_CODE
    for cell in (code, chk):
        assert cell["outputs"] == [] and cell["execution_count"] is None
    assert code["metadata"] == {"tags": ["exercise"]}  # run timings dropped, tags kept
    assert lab["metadata"] == sol["metadata"]
    assert [c["id"] for c in lab["cells"]] == [c["id"] for c in sol["cells"]]
    assert "SOLUTION" not in (course / "labs" / "01_loop.ipynb").read_text()
    nbformat.validate(nbformat.reads((course / "labs" / "01_loop.ipynb").read_text(), as_version=4))


def test_output_is_deterministic(course):
    generate(course)
    first = (course / "labs" / "01_loop.ipynb").read_bytes()
    (course / "labs" / "01_loop.ipynb").unlink()
    generate(course)
    assert (course / "labs" / "01_loop.ipynb").read_bytes() == first
    status, out, _ = generate(course)
    assert status == 0 and "wrote" not in out  # nothing to do the second time


def test_cells_without_ids_get_stable_ones(tmp_path):
    path = solution_notebook(tmp_path / "solutions" / "02_x.ipynb")
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        del cell["id"]
    path.write_text(json.dumps(nb))
    generate(tmp_path)
    lab = json.loads((tmp_path / "labs" / "02_x.ipynb").read_text())
    assert [c["id"] for c in lab["cells"]] == ["cell-1", "cell-2", "cell-3"]


def test_check_passes_when_in_sync_and_lists_drift(course):
    generate(course)
    status, out, _ = generate(course, "--check")
    assert status == 0 and "agrees" in out

    sol = course / "solutions" / "01_loop.ipynb"
    sol.write_text(sol.read_text().replace("p / q", "p / q + 0"))  # inside a block: the lab is the same
    assert generate(course, "--check")[0] == 0

    sol.write_text(sol.read_text().replace("wall-time", "wall time"))  # outside: the lab changes
    solution_notebook(course / "solutions" / "02_more.ipynb")  # a new solution, no lab yet
    (course / "labs" / "03_orphan.ipynb").write_text("{}")  # a lab with no solution
    status, out, _ = generate(course, "--check")
    assert status == 1
    assert "01_loop.ipynb: differs" in out
    assert "02_more.ipynb: missing" in out
    assert "03_orphan.ipynb: has no solution notebook" in out
    assert not (course / "labs" / "02_more.ipynb").exists()  # --check writes nothing


def test_unmatched_marker_names_the_notebook_and_cell(course):
    solution_notebook(course / "solutions" / "02_bad.ipynb", cells=[
        nbformat.v4.new_markdown_cell("# Lab"),
        nbformat.v4.new_code_cell("def f():\n    ### BEGIN SOLUTION\n    return 1\n"),
    ])
    status, out, err = generate(course)
    assert status == 2
    assert err.count("\n") == 1
    assert "02_bad.ipynb, cell 2 (code): line 2: `### BEGIN SOLUTION` without a `### END SOLUTION`" in err
    assert not (course / "labs").exists()  # nothing written when any notebook is bad


def test_unmatched_markdown_marker_is_an_error(course):
    solution_notebook(course / "solutions" / "02_bad.ipynb", cells=[
        nbformat.v4.new_markdown_cell("Answer:\n<!-- END SOLUTION -->"),
    ])
    status, _, err = generate(course)
    assert status == 2 and "02_bad.ipynb, cell 1 (markdown): line 2" in err


def test_malformed_notebook_and_missing_folder_are_one_line_errors(tmp_path):
    (tmp_path / "solutions").mkdir()
    (tmp_path / "solutions" / "01_x.ipynb").write_text("{oops")
    status, _, err = generate(tmp_path)
    assert status == 2 and err.count("\n") == 1 and "01_x.ipynb: cannot read it as a notebook" in err
    status, _, err = run("labs", "--solutions", str(tmp_path / "nope"))
    assert status == 2 and "no such folder" in err
