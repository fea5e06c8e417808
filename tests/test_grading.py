"""The grader on its own: a pretend lab 99 (tests/fixtures/gradelab.py) and notebooks built here.

Most cases are graded in one batch (`specdec grade -j 4`, module fixture); each test then reads
its notebook's entry of the JSON list.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from cpu_clock import backstop, timed

from specdec.cli import main as specdec
from specdec.grading import registry, runner, session
from specdec.grading.results import Limits

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parents[1]

ADD = "def add(a, b):\n    ### BEGIN SOLUTION\n    return a + b\n    ### END SOLUTION"
MEAN = "def mean(xs):\n    ### BEGIN SOLUTION\n    return sum(xs) / len(xs)\n    ### END SOLUTION"
REVERSE = "def reverse(s):\n    ### BEGIN SOLUTION\n    return s[::-1]\n    ### END SOLUTION"
POINTS = {"lab99.q1": 2.0, "lab99.q2": 3.0, "lab99.q3": 1.0}
SWALLOW_TIMEOUTS = "import time\nwhile True:\n    try:\n        time.sleep(10)\n    except BaseException:\n        pass"
KILL = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"
SEGFAULT = "import ctypes\nctypes.string_at(0)\n"
C_EXIT = "import ctypes\nctypes.CDLL(None)._exit(0)\n"
RUNAWAY = "hog = []\nwhile True:\n    hog.append(bytes(1 << 30))  # calloc: fast, and no page is touched\n"


def fixture_env() -> dict[str, str]:
    """What makes the worker register lab 99 (documented in tests/fixtures/gradelab.py)."""
    path = os.pathsep.join(p for p in (str(FIXTURES), os.environ.get("PYTHONPATH", "")) if p)
    return {"SPECDEC_EXTRA_CHECKS": "gradelab", "PYTHONPATH": path}


@pytest.fixture(scope="module", autouse=True)
def lab99():
    with pytest.MonkeyPatch.context() as mp:
        for k, v in fixture_env().items():
            mp.setenv(k, v)
        mp.syspath_prepend(str(FIXTURES))
        yield


def write_notebook(path: Path, q1: str = ADD, q2: str = MEAN, q3: str | None = REVERSE,
                   extra: list[str] = ()) -> Path:
    """A lab 99 notebook: a title, the import, each answer cell followed by its check cell."""
    cells = [nbformat.v4.new_markdown_cell("# Lab 99\nA pretend lab for the grader's tests."),
             nbformat.v4.new_code_cell("from specdec.grading import check")]
    for n, answer in ((1, q1), (2, q2), (3, q3)):
        if answer is not None:  # None: the student deleted the exercise's cells
            cells += [nbformat.v4.new_code_cell(answer), nbformat.v4.new_code_cell(f'check("lab99.q{n}")')]
    cells += [nbformat.v4.new_code_cell(src) for src in extra]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    return path


def run_cli(*argv: str) -> tuple[int, str, str]:
    """`specdec ARGV` in this process: (status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = specdec(list(argv))
        except SystemExit as exc:  # argparse
            status = int(exc.code or 0)
    return status, out.getvalue(), err.getvalue()


def run_specdec(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """`specdec ARGV` in a process of its own, as a user or Gradescope runs it."""
    env = {**os.environ, **fixture_env()}
    return subprocess.run([sys.executable, "-m", "specdec", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def exercises_of(entry: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"].split(":")[0]: t for t in entry["tests"]}


def scores(entry: dict[str, Any]) -> dict[str, float]:
    return {k: t["score"] for k, t in exercises_of(entry).items()}


def full_but(**zero: str) -> dict[str, float]:
    """Expected scores: every exercise full, except those given (q2="..."), which get zero."""
    return {k: 0.0 if k.split(".")[1] in zero else v for k, v in POINTS.items()}


# name -> notebook arguments. Each breaks one exercise (or none) in one way.
CASES: dict[str, dict[str, Any]] = {
    "correct": dict(extra=['assert check("lab99.q1").message.startswith("skipped"), "check() ran during grading"']),
    "wrong_q2": dict(q2="def mean(xs):\n    return sum(xs)"),
    "exception": dict(q1="1 / 0\n" + ADD),
    "cell_loop": dict(q2="while True:\n    pass\n" + MEAN),
    "check_loop": dict(q2="def mean(xs):\n    while True:\n        pass"),
    "sys_exit": dict(q1="import sys\nsys.exit(1)\n" + ADD),
    "raise_systemexit": dict(q3="def reverse(s):\n    raise SystemExit(2)"),
    "exit_builtin": dict(extra=["exit()", "quit()"]),
    "os_exit_cell": dict(q2="import os\nos._exit(1)\n" + MEAN),
    "os_exit_check": dict(q1="def add(a, b):\n    import os\n    os._exit(0)"),
    "kill_in_check": dict(q3="def reverse(s):\n    import os, signal\n    os.kill(os.getpid(), signal.SIGKILL)"),
    "kill_in_cell": dict(extra=[KILL]),
    # crash classes: the kernel dies (or is killed) while cells run; a fresh one replays the cells before
    "kill_mid_run": dict(q2=KILL + MEAN),
    "segfault_in_cell": dict(extra=[SEGFAULT]),
    "c_exit_in_cell": dict(q3=C_EXIT + REVERSE),
    "swallow_in_cell": dict(extra=[SWALLOW_TIMEOUTS]),
    "runaway_memory": dict(extra=[RUNAWAY]),
    # ... or while a check calls the student's function: that exercise only
    "segfault_in_check": dict(q3="def reverse(s):\n    import ctypes\n    ctypes.string_at(0)"),
    "c_exit_in_check": dict(q1="def add(a, b):\n    import ctypes\n    ctypes.CDLL(None)._exit(0)"),
    "not_data": dict(q2="class Mean(float):\n    pass\ndef mean(xs):\n    return Mean(sum(xs) / len(xs))"),
    "generator": dict(q2="def mean(xs):\n    yield sum(xs) / len(xs)"),
    "missing": dict(q2="def average(xs):\n    return sum(xs) / len(xs)"),
    "wrong_type": dict(q2="def mean(xs):\n    return str(sum(xs) / len(xs))"),
    "not_callable": dict(q1="add = 3"),
    "deleted": dict(q3=None),
    "noisy": dict(q2="print('x' * 20_000_000)\nfor i in range(200_000):\n    print(i)\n"
                     "def mean(xs):\n    print('y' * 1_000_000)\n    return sum(xs) / len(xs)"),
    "forged": dict(q1='print(\'{"phase": "done", "tests": [{"id": "lab99.q1", "score": 1.0}]}\')',
                   extra=["import sys\nsys.stdout.write('lab99.q1 [PASS] 2/2')"]),
    "syntax_error": dict(q3="def reverse(s:\n    return s[::-1]"),
    "input": dict(q3="name = input('your name? ')\n" + REVERSE),
    "closed_stdout": dict(q1="import sys\nsys.stdout.close()\nsys.stderr = None\n" + ADD, extra=["print('still here')"]),
}


# Cases that wait instead of computing: only the wall-clock backstop stops them, cell_timeout x wall_factor, twice (the
# cell runs again in a fresh kernel); they are graded beside the batch with --wall-factor 1. The batch's loops compute:
# they must reach their CPU limit before the wall clock stops them, also on a machine at a load average of 8 where the
# batch's own four kernels share two cores with ten other processes (a kernel then gets a sixth of a core or less:
# the default factor of 5 let the wall clock win there), hence --wall-factor 20; quiet, the CPU limit ends them in 2 s.
BATCH_WALL_FACTOR = 20
ON_THE_WALL = ("swallow_in_cell",)


@pytest.fixture(scope="module")
def batch(tmp_path_factory) -> dict[str, Any]:
    """Grade every case (and the generated stub) at once; keep status, output, JSON and CSV."""
    root = tmp_path_factory.mktemp("batch")
    paths = [write_notebook(root / f"{name}.ipynb", **kw) for name, kw in CASES.items() if name not in ON_THE_WALL]
    # a student's background process, which must not outlive grading
    pidfile = root / "child.pid"
    paths.append(write_notebook(root / "background.ipynb", extra=[
        f"import subprocess\np = subprocess.Popen(['sleep', '300'])\nopen({str(pidfile)!r}, 'w').write(str(p.pid))"]))
    # the stub, generated from a solution notebook as labs/ is
    (root / "solutions").mkdir()
    write_notebook(root / "solutions" / "99_pretend.ipynb")
    status, _, err = run_cli("labs", "--solutions", str(root / "solutions"), "--labs", str(root / "labs"))
    assert status == 0, err
    paths.append(root / "labs" / "99_pretend.ipynb")

    # beside the batch, in a process of its own: the notebooks that only the wall clock stops, under wall-clock limits
    waiting = [str(write_notebook(root / f"{name}.ipynb", **CASES[name])) for name in ON_THE_WALL]
    beside = subprocess.Popen([sys.executable, "-m", "specdec", "grade", *waiting, "--json", str(root / "waiting.json"),
                               "--cell-timeout", "2", "--check-timeout", "2", "--timeout", "60", "--wall-factor", "1"],
                              cwd=REPO, env={**os.environ, **fixture_env()}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    with timed() as took:
        status, out, err = run_cli("grade", *map(str, paths), "--json", str(root / "r.json"), "--csv", str(root / "r.csv"),
                                   "--cell-timeout", "2", "--check-timeout", "2", "--timeout", "60", "-j", "4",
                                   "--wall-factor", str(BATCH_WALL_FACTOR))
    entries = json.loads((root / "r.json").read_text())
    by_name = {Path(e["notebook"]).stem: e for e in entries}
    beside_out, beside_err = beside.communicate(timeout=120)
    assert beside.returncode == 0, beside_err + beside_out
    waited = json.loads((root / "waiting.json").read_text())
    by_name.update(zip(ON_THE_WALL, waited if len(waiting) > 1 else [waited]))  # a list in input order, or one entry
    return dict(status=status, out=out, err=err, took=took, entries=entries, by_name=by_name,
                csv=(root / "r.csv").read_text(), paths=paths, pidfile=pidfile)


def test_batch_grades_every_notebook_and_exits_zero(batch):
    assert batch["status"] == 0, batch["err"]
    assert len(batch["entries"]) == len(batch["paths"])
    assert [e["notebook"] for e in batch["entries"]] == [str(p) for p in batch["paths"]]  # input order
    # a progress line per notebook
    progress = [ln for ln in batch["err"].splitlines() if ln.startswith("[")]
    assert len(progress) == len(batch["paths"])
    assert batch["took"].within(60), batch["took"]  # CPU seconds (and 4x on the wall clock: a backstop)


def test_solution_scores_full_marks_and_check_calls_are_skipped(batch):
    entry = batch["by_name"]["correct"]
    assert scores(entry) == POINTS
    assert entry["score"] == entry["max_score"] == 6.0
    assert entry["output"] == ""  # no cell failed, the assert on check()'s result included


def test_untouched_stub_scores_zero(batch):
    entry = batch["by_name"]["99_pretend"]
    assert entry["score"] == 0.0 and entry["max_score"] == 6.0
    for t in entry["tests"]:
        assert "not implemented" in t["output"]


def test_planted_wrong_answer_scores_the_other_exercises(batch):
    entry = batch["by_name"]["wrong_q2"]
    assert entry["score"] == POINTS["lab99.q1"] + POINTS["lab99.q3"]
    assert "expected" in exercises_of(entry)["lab99.q2"]["output"]


@pytest.mark.parametrize("case, zero, words", [
    ("exception", "q1", ["define `add`", "ZeroDivisionError", "cell 3"]),
    ("cell_loop", "q2", ["define `mean`", "timed out after 2s"]),
    ("check_loop", "q2", ["timed out", "2s"]),
    ("sys_exit", "q1", ["define `add`", "sys.exit()"]),
    ("raise_systemexit", "q3", ["SystemExit"]),
    ("os_exit_cell", "q2", ["define `mean`", "os._exit()"]),
    ("os_exit_check", "q1", ["os._exit()"]),
    ("kill_in_check", "q3", ["SIGKILL", "while this exercise was being checked"]),
    ("missing", "q2", ["define `mean`"]),
    ("wrong_type", "q2", ["must return a float, got str"]),
    ("not_callable", "q1", ["TypeError", "not callable"]),
    ("deleted", "q3", ["define `reverse`"]),
    ("forged", "q1", ["define `add`"]),
    ("syntax_error", "q3", ["SyntaxError", "define `reverse`"]),
    ("input", "q3", ["EOFError", "define `reverse`"]),
])
def test_a_broken_exercise_gets_zero_with_its_reason_and_the_rest_are_graded(batch, case, zero, words):
    entry = batch["by_name"][case]
    assert scores(entry) == full_but(**{zero: ""}), entry
    assert entry["max_score"] == 6.0  # a deleted or broken exercise still counts
    feedback = exercises_of(entry)[f"lab99.{zero}"]["output"]
    for w in words:
        assert w in feedback, feedback


@pytest.mark.parametrize("case, words", [
    ("exception", ["cell 3 (1 / 0): line 1: ZeroDivisionError"]),
    ("cell_loop", ["cell 5 (while True:): timed out after 2s of CPU time at line 1"]),
    ("sys_exit", ["called sys.exit()"]),
    ("os_exit_cell", ["called os._exit()"]),
    ("exit_builtin", ["called exit()"]),
    ("syntax_error", ["SyntaxError"]),
])
def test_cell_problems_are_reported_at_notebook_level(batch, case, words):
    output = batch["by_name"][case]["output"]
    for w in words:
        assert w in output, output
    assert case in batch["out"]  # the summary names the notebook


def test_exit_is_ignored_and_everything_graded(batch):
    entry = batch["by_name"]["exit_builtin"]
    assert scores(entry) == POINTS
    assert entry["output"].count("called exit()") == 2  # quit() is exit()


def test_a_kernel_killed_in_the_last_cell_loses_nothing(batch):
    """The cells before it run again in a fresh kernel: every exercise is still checked."""
    entry = batch["by_name"]["kill_in_cell"]
    assert scores(entry) == POINTS
    assert "cell 9 (import os, signal): the kernel was killed by SIGKILL" in entry["output"]
    assert "a fresh kernel ran the cells before it again" in entry["output"]


@pytest.mark.parametrize("case, zero, words", [
    ("kill_mid_run", "q2", ["killed by SIGKILL", "define `mean`"]),  # its answer cell died: mean is undefined
    ("c_exit_in_cell", "q3", ["exited with status 0", "define `reverse`"]),
    ("segfault_in_check", "q3", ["SIGSEGV", "while this exercise was being checked"]),
    ("c_exit_in_check", "q1", ["exited with status 0", "while this exercise was being checked"]),
    ("not_data", "q2", ["Mean object", "not data"]),
    ("generator", "q2", ["generator object", "not data"]),
])
def test_a_crash_costs_only_the_exercises_it_touches(batch, case, zero, words):
    entry = batch["by_name"][case]
    assert scores(entry) == full_but(**{zero: ""}), entry
    feedback = exercises_of(entry)[f"lab99.{zero}"]["output"]
    for w in words:
        assert w in feedback, feedback


@pytest.mark.parametrize("case, words", [
    ("segfault_in_cell", ["cell 9 (import ctypes): the kernel was killed by SIGSEGV"]),
    ("swallow_in_cell", ["cell 9 (import time): the kernel did not stop at the time limit of 2s", "it was killed"]),
    ("runaway_memory", ["cell 9 (hog = []): line 3: MemoryError", "memory limit is 4 GiB"]),
])
def test_a_cell_that_kills_or_hangs_the_kernel_is_skipped_and_the_rest_graded(batch, case, words):
    entry = batch["by_name"][case]
    assert scores(entry) == POINTS, entry
    for w in words + ["a fresh kernel ran the cells before it again and went on after it"]:
        assert w in entry["output"], entry["output"]


def test_closing_stdout_breaks_nothing(batch):
    entry = batch["by_name"]["closed_stdout"]
    assert scores(entry) == POINTS and entry["output"] == ""


def test_megabytes_of_output_are_not_kept(batch):
    entry = batch["by_name"]["noisy"]
    assert scores(entry) == POINTS  # printing is not wrong; it must just not break anything
    assert len(json.dumps(entry)) < 5_000


def test_student_processes_do_not_outlive_grading(batch):
    pid = int(batch["pidfile"].read_text())
    assert scores(batch["by_name"]["background"]) == POINTS
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return  # gone
    assert state == "Z", f"the student's child {pid} is still running (state {state})"


def test_csv_has_a_row_per_notebook(batch):
    rows = list(csv.reader(io.StringIO(batch["csv"])))
    assert rows[0] == ["notebook", "status", "total", "max_score", "lab99.q1", "lab99.q2", "lab99.q3", "error"]
    assert len(rows) == 1 + len(batch["paths"])
    by_name = {Path(r[0]).stem: r for r in rows[1:]}
    assert by_name["correct"][1:] == ["graded", "6.00", "6.00", "2.00", "3.00", "1.00", ""]
    assert by_name["wrong_q2"][1:] == ["graded", "3.00", "6.00", "2.00", "0.00", "1.00", ""]


def test_summary_lists_points_and_feedback(batch):
    out = batch["out"]
    assert "lab99.q2" in out and "3/3" in out and "define `mean`" in out
    assert "total" in out and "6/6" in out


def test_single_notebook_json_is_gradescope_results(tmp_path):
    nb = write_notebook(tmp_path / "one.ipynb", q2="def mean(xs):\n    return 0.0")
    results = tmp_path / "results.json"
    with timed() as took:
        proc = run_specdec("grade", str(nb), "--json", str(results))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(results.read_text())
    assert isinstance(doc, dict)
    assert set(doc) == {"score", "max_score", "execution_time", "output", "tests"}
    assert doc["score"] == 3.0 and doc["max_score"] == 6.0
    assert doc["score"] == sum(t["score"] for t in doc["tests"])
    # the worker starts fast: the whole command (grader and kernel) in CPU seconds; execution_time, on the
    # wall clock, is only a backstop (a loaded machine stretches it)
    assert took.cpu < 10 and doc["execution_time"] < backstop(10), (took, doc["execution_time"])
    for t in doc["tests"]:
        assert set(t) == {"name", "score", "max_score", "output"}
        assert isinstance(t["name"], str) and isinstance(t["output"], str)
        assert isinstance(t["score"], float) and isinstance(t["max_score"], float)
    assert [t["name"] for t in doc["tests"]] == ["lab99.q1: add two numbers", "lab99.q2: mean of a list",
                                                 "lab99.q3: reverse a string"]
    assert "6" in proc.stdout and "lab99.q2" in proc.stdout


def test_zero_score_exits_zero(tmp_path):
    nb = write_notebook(tmp_path / "zero.ipynb", q1="pass", q2="pass", q3="pass")
    proc = run_specdec("grade", str(nb))
    assert proc.returncode == 0, proc.stderr
    assert "0/6" in proc.stdout


def test_missing_file_is_a_one_line_error(tmp_path):
    proc = run_specdec("grade", str(tmp_path / "nope.ipynb"), "--json", str(tmp_path / "r.json"))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "nope.ipynb: no such file" in proc.stderr
    assert not (tmp_path / "r.json").exists()


def test_unreadable_notebook_fails_but_the_others_are_graded(tmp_path):
    bad = tmp_path / "bad.ipynb"
    bad.write_text("{not json")
    good = write_notebook(tmp_path / "good.ipynb")
    status, out, err = run_cli("grade", str(bad), str(good), "--json", str(tmp_path / "r.json"),
                               "--csv", str(tmp_path / "r.csv"))
    assert status == 0, err  # grading worked: the bad file's failure is in its row
    errors = [ln for ln in err.splitlines() if "error" in ln]
    assert len(errors) == 1 and "bad.ipynb: not a notebook: invalid JSON" in errors[0]
    entries = json.loads((tmp_path / "r.json").read_text())
    assert [e["score"] for e in entries] == [0.0, 6.0]
    assert "Grading failed" in entries[0]["output"]
    rows = list(csv.DictReader(io.StringIO((tmp_path / "r.csv").read_text())))
    assert [(r["status"], r["total"]) for r in rows] == [("failed", "0.00"), ("graded", "6.00")]
    assert rows[0]["error"].startswith("not a notebook: invalid JSON") and rows[1]["error"] == ""
    status, _, err = run_cli("grade", str(bad), str(bad))  # nothing could be graded
    assert status == 1


def test_batch_grades_a_folder_of_submissions_into_one_csv(tmp_path):
    """`specdec grade --batch DIR --csv OUT`: every notebook under DIR (one folder per student or not),
    Jupyter's checkpoints and executed copies left out."""
    class_dir = tmp_path / "submissions"
    for student, kw in (("alice", {}), ("bob", {"q2": "def mean(xs):\n    return 0.0"})):
        (class_dir / student / ".ipynb_checkpoints").mkdir(parents=True)
        write_notebook(class_dir / student / "lab99.ipynb", **kw)
        write_notebook(class_dir / student / ".ipynb_checkpoints" / "lab99-checkpoint.ipynb")
        write_notebook(class_dir / student / "lab99.executed.ipynb")
    status, _, err = run_cli("grade", "--batch", str(class_dir), "--csv", str(tmp_path / "class.csv"), "-j", "2")
    assert status == 0, err
    rows = list(csv.reader(io.StringIO((tmp_path / "class.csv").read_text())))
    assert rows[0] == ["notebook", "status", "total", "max_score", "lab99.q1", "lab99.q2", "lab99.q3", "error"]
    assert [(Path(r[0]).parent.name, r[2]) for r in rows[1:]] == [("alice", "6.00"), ("bob", "3.00")]
    status, _, err = run_cli("grade", "--batch", str(tmp_path / "nowhere"))
    assert status == 2 and "no such folder" in err
    status, _, err = run_cli("grade")
    assert status == 2 and "--batch DIR" in err


def test_a_notebook_without_exercise_ids_needs_lab(tmp_path):
    nb = tmp_path / "untitled.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(ADD)]), nb)
    status, _, err = run_cli("grade", str(nb))
    assert status == 1 and "cannot tell which lab" in err
    status, out, err = run_cli("grade", str(nb), "--lab", "99")
    assert status == 0, err
    assert "2/2" in out  # add is graded though no check cell names it


def test_total_timeout_kills_the_worker_and_still_writes_results(tmp_path):
    in_cells = write_notebook(tmp_path / "in_cells.ipynb", extra=[SWALLOW_TIMEOUTS])
    in_checks = write_notebook(tmp_path / "in_checks.ipynb",
                               q2="def mean(xs):\n    import time\n    time.sleep(600)")
    with timed() as took:
        status, out, err = run_cli("grade", str(in_cells), str(in_checks), "--timeout", "4", "--wall-factor", "1",
                                   "--cell-timeout", "1000", "--check-timeout", "1000", "-j", "2", "--json", str(tmp_path / "r.json"))
    # stopped at the total limit, not at the cell's or the check's (1000 s) nor the sleep's end (600 s)
    assert took.within(15), took
    assert status == 0, err
    cells, checks = json.loads((tmp_path / "r.json").read_text())
    assert cells["score"] == 0.0 and cells["max_score"] == 6.0
    for t in cells["tests"]:
        assert "total time limit of 4s" in t["output"] and "before any check ran" in t["output"]
    assert "stopped in cell 9 (import time)" in cells["output"]
    assert scores(checks) == {"lab99.q1": 2.0, "lab99.q2": 0.0, "lab99.q3": 0.0}
    assert "while this exercise was being checked" in exercises_of(checks)["lab99.q2"]["output"]
    assert "before this exercise was checked" in exercises_of(checks)["lab99.q3"]["output"]


def test_a_kernel_that_cannot_start_zeroes_every_exercise(tmp_path, monkeypatch):
    monkeypatch.setattr(session, "KERNEL_MODULE", "crashing_kernel")  # tests/fixtures: segfaults at once
    result = runner.grade_notebook(write_notebook(tmp_path / "x.ipynb"), Limits(total_timeout=30))
    assert [t.id for t in result.tests] == list(POINTS) and result.score == 0.0 and result.max_score == 6.0
    assert result.error and "killed by SIGSEGV" in result.error and "about to crash" in result.error
    assert all("not graded: the kernel could not start" in t.output for t in result.tests)


ACCEPT_LENGTH = """def accept_length_of(response):
    meta = response["meta_info"]
    if not meta.get("spec_verify_ct"):
        return None
    return (meta["completion_tokens"] - {offset}) / meta["spec_verify_ct"]
"""


def test_response_records_go_through_the_kernel(tmp_path):
    """Lab 3's checks call the student's functions on dicts like SGLang's /generate responses."""
    notebooks = []
    for name, offset in (("right", 1), ("wrong", 0)):
        cells = [nbformat.v4.new_code_cell(ACCEPT_LENGTH.format(offset=offset)), nbformat.v4.new_code_cell('check("lab98.q1")')]
        notebooks.append(tmp_path / f"{name}.ipynb")
        nbformat.write(nbformat.v4.new_notebook(cells=cells), notebooks[-1])
    status, out, err = run_cli("grade", *map(str, notebooks), "--json", str(tmp_path / "r.json"), "-j", "2")
    assert status == 0, err
    right, wrong = json.loads((tmp_path / "r.json").read_text())
    assert right["score"] == right["max_score"] == 1.0, right
    assert 0 < wrong["score"] < 1.0 and "meta_info={" in wrong["tests"][0]["output"]  # right where it returns None


def test_check_in_a_notebook_gives_feedback(capsys):
    res = registry.check("lab99.q1", {"add": lambda a, b: a + b})
    assert res.score == 1.0 and "lab99.q1 [PASS] 2/2" in capsys.readouterr().out
    res = registry.check("lab99.q2", {})
    assert res.score == 0.0 and "define `mean`" in capsys.readouterr().out


def test_command_modules_import_no_heavy_modules():
    code = ("import sys, specdec.cli.grade, specdec.grading.runner, specdec.grading.report;"
            "print(sorted(m for m in ('torch', 'numpy', 'IPython', 'nbformat') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.stdout.strip() == "[]", proc.stderr


def test_cells_tagged_live_are_not_run_while_grading(tmp_path):
    """Lab 3's cells that start servers are tagged `live`: grading skips them and says which."""
    nb = write_notebook(tmp_path / "live.ipynb", extra=["add = None  # would cost lab99.q1 if it ran",
                                                         "import time\ntime.sleep(3600)  # a server that never answers"])
    doc = nbformat.read(nb, as_version=4)
    for cell in doc.cells[-2:]:
        cell.metadata["tags"] = ["live"]
    nbformat.write(doc, nb)
    with timed() as took:
        status, out, err = run_cli("grade", str(nb), "--json", str(tmp_path / "r.json"))
    assert status == 0, err
    assert took.within(30), took  # the live cell's hour-long sleep did not run
    entry = json.loads((tmp_path / "r.json").read_text())
    assert scores(entry) == POINTS
    assert "Not run while grading (2 cells tagged `live`" in entry["output"] and "cell 9 (add = None" in entry["output"]
    assert "not run while grading: 2 cells tagged `live` (cells 9, 10)" in out


def test_a_check_cell_shows_its_result_once(capsys):
    """check() prints one line; as the cell's last value its result must not be shown again as a repr."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        shell.run_cell(ADD.replace("### BEGIN SOLUTION\n", "").replace("    ### END SOLUTION", ""))
        shell.run_cell('from specdec.grading import check\ncheck("lab99.q1")')
    finally:
        InteractiveShell.clear_instance()
    out = capsys.readouterr().out
    assert out.count("lab99.q1 [PASS] 2/2") == 1 and "CheckResult" not in out and "Printed(" not in out, out
