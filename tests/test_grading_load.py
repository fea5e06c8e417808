"""A machine busy with other work must not change a grade: the limits count the kernel's CPU time.

The same notebooks are graded on a quiet machine and again while three busy loops share one core with the
grading (held to that core, so that the kernel gets about a quarter of it; the other cores stay with the rest of
the suite, which loops on every core would slow too). A notebook whose cell computes
for 1.5 s of CPU time, under a cell limit of 3 s, takes longer than 3 s on the wall clock under
that load: wall-clock limits cut it off (and cost the exercise defined after it), CPU-time limits do not.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from specdec.grading import runner
from specdec.grading.results import Limits
from tests.test_grading import POINTS, lab99, write_notebook  # noqa: F401 (lab99: the fixture registers lab 99)

COMPUTE = "import time\nt0 = time.thread_time()\nwhile time.thread_time() - t0 < 1.5:\n    pass\n"
LIMITS = Limits(cell_timeout=3, check_timeout=3, total_timeout=60)


@pytest.fixture
def busy():
    """Hold this process to one core and start 3 busy loops there (what it starts from then on, the kernels, runs
    on that core too); stop them and give the cores back afterwards."""
    procs: list[subprocess.Popen] = []
    cores = os.sched_getaffinity(0)

    def start() -> None:
        os.sched_setaffinity(0, {min(cores)})
        for _ in range(3):
            # each in a session of its own: with autogroup scheduling, CPU is shared out by session
            procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True))
        time.sleep(0.5)

    yield start
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()
    os.sched_setaffinity(0, cores)


def grade_all(paths) -> dict[str, tuple[dict[str, float], list[str], float]]:
    out = {}
    for p in paths:
        r = runner.grade_notebook(p, LIMITS)
        out[p.stem] = ({t.id: t.score for t in r.tests}, r.problems, r.execution_time)
    return out


def test_a_loaded_machine_gives_the_same_grades(tmp_path, busy):
    paths = [
        write_notebook(tmp_path / "correct.ipynb"),
        write_notebook(tmp_path / "computes.ipynb", q2=COMPUTE + "def mean(xs):\n    return sum(xs) / len(xs)"),
        write_notebook(tmp_path / "noisy.ipynb", q2="print('x' * 2_000_000)\nfor i in range(100_000):\n    print(i)\n"
                       "def mean(xs):\n    return sum(xs) / len(xs)"),
    ]
    quiet = grade_all(paths)
    busy()
    loaded = grade_all(paths)
    for name, (scores, problems, _) in quiet.items():
        assert scores == POINTS and problems == [], (name, scores, problems)
        assert loaded[name][:2] == (scores, problems), (name, loaded[name])
    # the load was real: the computing notebook's cell alone outlasted its limit on the wall clock
    assert loaded["computes"][2] > LIMITS.cell_timeout, loaded["computes"]
