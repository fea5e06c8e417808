"""Issue 19, 2b: one notebook never breaks grading for others, and honest notebooks lose nothing.

Mostly the pretend lab 99 (tests/fixtures/gradelab.py), graded by `specdec grade` as a class would be.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_grading import POINTS, fixture_env, run_cli, scores, write_notebook

from specdec.grading import exercises_for_lab, registry
from specdec.grading.calls import LocalCaller
from specdec.grading.codec import BadMessage, Decoder

BOMB_SHAPE = [10**4299] * 1000 + [0]  # math.prod of it ran for minutes, before any size check

# A kernel that forges replies ahead of the grader's requests: every other one an array of BOMB_SHAPE,
# the others right in form (20 values, lab 99's count) and claiming a stand-in `bogus` that no exercise has.
FORGE = f'''import os, json, struct
bomb = {{"ndarray": {{"dtype": "float64", "shape": [10**4299] * 1000 + [0], "buffer": 0}}}}
for fd in map(int, os.listdir("/proc/self/fd")):
    try:
        if fd > 2 and os.readlink(f"/proc/self/fd/{{fd}}").startswith("pipe:"):
            for i in range(1, 40):
                value = bomb if i % 2 == 0 else 0
                head = json.dumps({{"id": i, "outcomes": [{{"value": value}}] + [{{"value": 0}}] * 19, "bound": ["bogus"], "missing": False,
                                   "not_callable": None, "stopped": None, "buffers": [0]}}).encode()
                data = struct.pack(">I", len(head)) + head
                while data:
                    data = data[os.write(fd, data):]
    except OSError:
        pass'''


BEST_K = """def tokens_per_step(alpha, k):
    return float(k + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)

def best_k(alpha, c, k_max=32):
    plain = tokens_per_step(alpha, 0)
    gains = [tokens_per_step(alpha, k) / (plain * (k * c + 1)) for k in range(1, k_max + 1)]
    return 1 + max(range(k_max), key=gains.__getitem__)
"""


@pytest.fixture(scope="module", autouse=True)
def lab99():
    with pytest.MonkeyPatch.context() as mp:
        for k, v in fixture_env().items():
            mp.setenv(k, v)
        mp.syspath_prepend(str(Path(__file__).parent / "fixtures"))
        yield


def test_an_array_header_with_huge_dimensions_is_refused_at_once():
    start = time.monotonic()
    with pytest.raises(BadMessage, match="bad shape"):
        Decoder([b""]).decode({"ndarray": {"dtype": "float64", "shape": BOMB_SHAPE, "buffer": 0}})
    with pytest.raises(BadMessage, match="bad shape"):  # few dimensions, each too big to be real
        Decoder([b""]).decode({"ndarray": {"dtype": "float64", "shape": [2**40, 0], "buffer": 0}})
    assert time.monotonic() - start < 0.5


class Claims:
    """A caller whose kernel answers right but claims stand-ins the exercise does not have."""

    def __init__(self, ns):
        self.local = LocalCaller(ns)

    def call(self, name, cases, stand_ins):
        reply = self.local.call(name, cases, stand_ins)
        reply.bound = ["bogus", "add"]
        return reply


def test_a_stand_in_the_exercise_does_not_have_is_ignored():
    registry.load("gradelab")
    mean = registry.get_exercise("lab99.q2")
    res = mean.grade(Claims({"mean": lambda xs: sum(xs) / len(xs)}), seed=1)
    assert res.score == 1.0 and "in place of yours" not in res.message, res


def test_a_hostile_notebook_breaks_nothing_for_the_one_graded_beside_it(tmp_path):
    honest = write_notebook(tmp_path / "honest.ipynb")
    hostile = write_notebook(tmp_path / "hostile.ipynb", extra=[FORGE])
    start = time.monotonic()
    status, out, err = run_cli("grade", str(honest), str(hostile), "--json", str(tmp_path / "r.json"),
                               "--csv", str(tmp_path / "r.csv"), "-j", "2", "--timeout", "60")
    assert time.monotonic() - start < 60, out
    entries = {Path(e["notebook"]).stem: e for e in json.loads((tmp_path / "r.json").read_text())}
    assert scores(entries["honest"]) == POINTS, entries["honest"]
    assert set(entries) == {"honest", "hostile"} and entries["hostile"]["max_score"] == 6.0
    assert len((tmp_path / "r.csv").read_text().splitlines()) == 3


def test_the_graders_own_kills_and_many_deaths_keep_what_was_answered(tmp_path):
    """8 cells with an uncaught MemoryError (the grader restarts a full kernel: not the notebook's doing),
    and 9 cells that SIGKILL their kernel: the answers before them still count."""
    memory = write_notebook(tmp_path / "memory.ipynb", extra=["raise MemoryError('full')"] * 8)
    kills = write_notebook(tmp_path / "kills.ipynb",
                           extra=["import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"] * 9)
    status, out, err = run_cli("grade", str(memory), str(kills), "--json", str(tmp_path / "r.json"), "-j", "2")
    assert status == 0, err
    memory_entry, kills_entry = json.loads((tmp_path / "r.json").read_text())
    assert scores(memory_entry) == POINTS, memory_entry
    assert scores(kills_entry) == POINTS, kills_entry
    assert "not run: the notebook's code had killed its kernel 8 times" in kills_entry["output"]


def test_a_stand_in_accepts_what_the_stub_allows():
    """best_k may call its own tokens_per_step(alpha, 0): the stub allows k = 0 (1 token a step)."""
    ns: dict = {}
    exec(BEST_K, ns)  # as in a notebook: tokens_per_step is a global of best_k's, which the stand-in replaces
    q6 = next(ex for ex in exercises_for_lab(1) if ex.id == "lab1.q6")
    res = q6.check(ns, seed=3)
    assert res.score == 1.0, res


# Looks for the grading secret everywhere a kernel could: its environment, the grader's (/proc/<parent>/environ
# shows the environment the grader started with) and the grader's command line, and for any credential in its
# own environment (the grader's other variables stay in /proc/<parent>/environ: README says so); says what it found.
STEAL_SECRET = '''import os, re
found = set(re.findall(r"s3cr3t-[0-9a-z]+", repr(dict(os.environ))))  # any credential of the grader's
for where in (open(f"/proc/{os.getppid()}/environ", "rb").read(), open(f"/proc/{os.getppid()}/cmdline", "rb").read()):
    found |= set(re.findall(r"s3cr3t-grading", where.decode(errors="replace")))
raise ValueError(f"stolen: {sorted(found)}")'''


@pytest.mark.parametrize("how", ["env", "file"])
def test_the_grading_secret_does_not_reach_the_notebook(tmp_path, how):
    nb = write_notebook(tmp_path / "thief.ipynb", extra=[STEAL_SECRET])
    env = {**os.environ, **fixture_env(), "SPECDEC_API_KEY": "s3cr3t-apikey"}
    if how == "env":
        env["SPECDEC_GRADING_SECRET"] = "s3cr3t-grading"
    else:  # the recommended way: a pipe, empty once the grader has read it
        env["SPECDEC_GRADING_SECRET_FILE"] = "/dev/stdin"
    proc = subprocess.run([sys.executable, "-m", "specdec", "grade", str(nb), "--json", str(tmp_path / "r.json")],
                          env=env, input="s3cr3t-grading\n", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    results = (tmp_path / "r.json").read_text()
    assert "stolen: []" in results and "s3cr3t" not in results, results
    assert json.loads(results)["score"] == 6.0


# Answers that take no work: constants (NaN among them, which once passed `abs(x - want) >= tol`) and
# answers made from the shape of the input only.
CONSTANTS = [float("nan"), float("inf"), 0, 1, 2.5, True, False, None, (float("nan"), float("nan")), (0.0, 0.0),
             (1, 1), (float("nan"), 1), [], {}, "EAGLE"]
SHAPE_ONLY = {
    "residual": lambda p, q: np.full(len(p), 1 / len(p)),
    "speculative_step": lambda p_rows, q_rows, drafts, rng: (0, [0]),
    "best_k": lambda alpha, c, k_max=32: 1,
    "choose_k": lambda rate, k, c, k_max=8: (float("nan"), 1),
    "acceptance_summary": lambda log, k: (float("nan"), float("nan")),
}


@pytest.mark.parametrize("lab", [1, 2, 3])
def test_answers_without_work_score_nothing(lab):
    for ex in exercises_for_lab(lab):
        answers = {f"constant {c!r}": lambda *a, c=c: c for c in CONSTANTS}
        if ex.reads in SHAPE_ONLY:
            answers["from the shape of the input"] = SHAPE_ONLY[ex.reads]
        for shown, answer in answers.items():
            res = ex.check({ex.reads: answer}, seed=7)
            assert res.score == 0.0, (ex.id, shown, res)
