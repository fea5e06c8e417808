"""benchmarks/gpu_notebooks.sh, the rehearsal of every lab on the GPU node, refuses what it cannot run before it
starts anything; benchmarks/gpu_notebooks_report.py, which reads back what it ran: on an executed copy made here, it
names the failed cell and its exception, what went to stderr, the checks and the grade. (The script itself ran on an
H200: benchmarks/logs/gpu_notebooks.log.)"""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import nbformat

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPT = BENCH / "gpu_notebooks_report.py"


def test_the_rehearsal_refuses_a_wrong_lab_a_missing_out_or_pack_first(tmp_path):
    def run(*labs, out=str(tmp_path)):
        env = {k: v for k, v in os.environ.items() if k != "OUT"} | ({"OUT": out} if out else {})
        return subprocess.run(["bash", str(BENCH / "gpu_notebooks.sh"), *labs], capture_output=True, text=True,
                              env=env, timeout=60)

    bare = run()
    assert bare.returncode == 2 and "usage" in bare.stderr
    bad = run("1", "4")
    assert bad.returncode == 2 and "no lab 4 (1, 2, 3)" in bad.stderr
    no_out = run("1", out=None)
    assert no_out.returncode == 2 and "set OUT" in no_out.stderr
    if not (BENCH.parent / ".nbpack" / "nbsite.tar.xz").exists():  # a clean clone: the pack is built on demand
        no_pack = run("1")
        assert no_pack.returncode == 2 and "tools/nbpack/build.sh" in no_pack.stderr
    assert not (tmp_path / "nb").exists()  # nothing started, nothing written


def test_the_report_names_failed_cells_stderr_checks_and_grades(tmp_path):
    nb = nbformat.v4.new_notebook()
    ok = nbformat.v4.new_code_cell("print('lab2.q1 [PASS] 2/2 ...')", id="ok-cell", execution_count=1, outputs=[
        nbformat.v4.new_output("stream", name="stdout", text="lab2.q1 [PASS] 2/2 ...\ntotal: 2 / 19\n"
                               "  concurrency 1: plain step 1.48 ms, speculative step 3.96 ms: predicted 1.35x\n"
                               "these servers sent no step times (SGLang records them ...)\nan unshown line\n"),
        nbformat.v4.new_output("stream", name="stderr", text="a warning\nits last line\n")])
    bad = nbformat.v4.new_code_cell("boom()", id="bad-cell", execution_count=2, outputs=[
        nbformat.v4.new_output("error", ename="AcceleratorError", evalue="\x1b[31mCUDA error: an illegal memory access\x1b[0m\nmore",
                               traceback=[])])
    never = nbformat.v4.new_code_cell("print(1)", id="never")
    nb.cells = [ok, bad, never]
    (tmp_path / "nb").mkdir()
    nbformat.write(nb, tmp_path / "nb" / "labs_02.ipynb")
    (tmp_path / "grade_lab2.json").write_text(json.dumps([{"notebook": "x/02.ipynb", "score": 0.0, "max_score": 19.0}]))
    with tarfile.open(tmp_path / "nb.tgz", "w:gz") as tar:
        tar.add(tmp_path / "nb", "nb")
        tar.add(tmp_path / "grade_lab2.json", "grade_lab2.json")
    for src in (tmp_path, tmp_path / "nb.tgz"):
        out = subprocess.run([sys.executable, str(SCRIPT), str(src)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert "labs_02.ipynb: 2 of 3 code cells ran" in lines
        assert "  FAILED at cell 1 (bad-cell): AcceleratorError: CUDA error: an illegal memory access" in lines
        assert "  stderr, cell 0 (ok-cell): its last line" in lines
        assert "  checks printed: 1 PASS, 0 FAIL" in lines and "  total: 2 / 19" in lines
        assert "  concurrency 1: plain step 1.48 ms, speculative step 3.96 ms: predicted 1.35x" in lines  # Lab 3's
        assert "  these servers sent no step times (SGLang records them ...)" in lines  # step times, or their absence
        assert not any("unshown" in line for line in lines)
        assert "grade_lab2.json: 02.ipynb 0 / 19" in lines
    assert subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, timeout=60).returncode == 2
