"""Issue 19, 2b: one notebook never breaks grading for others, and honest notebooks lose nothing.

Mostly the pretend lab 99 (tests/fixtures/gradelab.py), graded by `specdec grade` as a class would be.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import numpy as np
import pytest
from cpu_clock import timed
from test_grading import POINTS, REPO, fixture_env, run_cli, scores, write_notebook

from specdec.grading import exercises_for_lab, registry, runner, session
from specdec.grading.calls import LocalCaller
from specdec.grading.codec import BadMessage, Decoder
from specdec.grading.tampering import calls_reference

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
    with timed() as took:
        with pytest.raises(BadMessage, match="bad shape"):
            Decoder([b""]).decode({"ndarray": {"dtype": "float64", "shape": BOMB_SHAPE, "buffer": 0}})
        with pytest.raises(BadMessage, match="bad shape"):  # few dimensions, each too big to be real
            Decoder([b""]).decode({"ndarray": {"dtype": "float64", "shape": [2**40, 0], "buffer": 0}})
    assert took.within(0.5), took


class Claims:
    """A caller whose kernel answers right but claims stand-ins the exercise does not have."""

    def __init__(self, ns):
        self.local = LocalCaller(ns)

    def call(self, name, cases, stand_ins, watch=()):
        reply = self.local.call(name, cases, stand_ins, watch)
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
    with timed() as took:
        status, out, err = run_cli("grade", str(honest), str(hostile), "--json", str(tmp_path / "r.json"),
                                   "--csv", str(tmp_path / "r.csv"), "-j", "2", "--timeout", "60")
    assert took.within(60), (took, out)
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
    assert f"not run: the notebook's code had killed its kernel {runner.MAX_DEATHS} times" in kills_entry["output"]


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


# Graded functions that hand their exercise to the course's own answer, each beside an honest one. Some say so
# in their source (an attribute, importlib, __import__); others hide it in an alias made outside the function
# from strings cut in two, which only the kernel's watch of the reference's code sees.
WRAPPERS = {
    1: ["import numpy as np\nimport specdec.sim.verify\nfrom specdec.sim import verify\nfrom specdec.grading import check",
        "def residual(p, q):\n    return specdec.sim.verify.residual_distribution(p, q)", 'check("lab1.q1")',
        "_step = verify.accept_reject_step\ndef accept_draft(x, p, q, u):\n    return _step(x, p, q, u)",
        'check("lab1.q2")', "def alpha_of(p, q):\n    return float(np.minimum(p, q).sum())", 'check("lab1.q4")'],
    2: ["import importlib\nfrom specdec.grading import check",
        "def commit_step(lengths, accepted, k, done):\n    lab2 = importlib.import_module('specdec.grading.lab2')\n"
        "    return lab2.reference_commit(lengths, accepted, k, done)", 'check("lab2.q2")',
        "_f = getattr(__import__('spec' + 'dec.sim.formulas', fromlist=['x']), 'speedup_' + 'from_costs')\n"
        "def predicted_speedup(tau, k, t_plain, t_draft, t_verify):\n    return _f(tau, t_plain, t_draft, t_verify, k)",
        'check("lab2.q5")', "def speedup_of(spec_tokens, spec_wall_s, plain_tokens, plain_wall_s):\n"
        "    tps = sum(map(len, spec_tokens)) / spec_wall_s\n"
        "    return tps, tps / (sum(map(len, plain_tokens)) / plain_wall_s)", 'check("lab2.q4")'],
    3: ["from specdec.grading import check", "def accept_length_of(meta):\n"
        "    return getattr(__import__('specdec.grading.lab3').grading.lab3, 'reference_accept_length_of')(meta)",
        'check("lab3.q1")', "def acceptance_by_position(histogram):\n"
        "    return [sum(histogram[i:]) / sum(histogram) for i in range(1, len(histogram))]", 'check("lab3.q3")',
        "from specdec.serving.measure.records import acceptance_by_position as _by_position\n"
        "from specdec.grading.lab3 import reference_first_level_not_paying as crossover_concurrency", 'check("lab3.q5")'],
}
WRAPPED = {1: ["lab1.q1", "lab1.q2"], 2: ["lab2.q2", "lab2.q5"], 3: ["lab3.q1", "lab3.q5"]}  # q5: the reference itself
SEEN_IN_SOURCE = {"lab1.q1", "lab2.q2", "lab3.q1"}
HONEST = {1: "lab1.q4", 2: "lab2.q4", 3: "lab3.q3"}


def test_a_wrapper_of_the_reference_scores_nothing_for_its_exercise(tmp_path):
    paths = []
    for lab, cells in WRAPPERS.items():
        paths.append(tmp_path / f"wrappers{lab}.ipynb")
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]), paths[-1])
    status, out, err = run_cli("grade", *map(str, paths), "--json", str(tmp_path / "r.json"), "-j", "2")
    assert status == 0, err
    for lab, entry in zip(WRAPPERS, json.loads((tmp_path / "r.json").read_text())):
        tests = {t["name"].split(":")[0]: t for t in entry["tests"]}
        for ex_id in WRAPPED[lab]:
            assert tests[ex_id]["score"] == 0.0, tests[ex_id]
            assert "calls the course's own answer to this exercise" in tests[ex_id]["output"], tests[ex_id]
        honest = tests[HONEST[lab]]
        assert honest["score"] == honest["max_score"] > 0, honest


def test_the_source_shows_most_wrappers_and_no_solution():
    """The grader's own reading of the source (the kernel's word on what ran can be silenced by the
    notebook), and the solutions, which import specdec's helpers for other uses, pass it."""
    for lab, cells in WRAPPERS.items():
        for ex in exercises_for_lab(lab):
            how = calls_reference(cells, ex.reads, ex.references())
            assert (how is not None) == (ex.id in SEEN_IN_SOURCE), (ex.id, how)
    for lab in (1, 2, 3):
        solution = next((REPO / "solutions").glob(f"0{lab}_*.ipynb"))
        sources = [c.source for c in nbformat.read(solution, as_version=4).cells if c.cell_type == "code"]
        for ex in exercises_for_lab(lab):
            assert calls_reference(sources, ex.reads, ex.references()) is None, ex.id


# A process that leaves its kernel's process group (a new session) and rewrites the --json file whenever it
# holds the grader's results: outside a container it outlives grading (out of scope, README); in one, it used to
# win the race between the grader writing the file and the container ending with its PID 1.
ESCAPE = '''import os, subprocess, sys
args = open(f"/proc/{os.getppid()}/cmdline", "rb").read().split(b"\\0")
target = args[args.index(b"--json") + 1].decode()
FORGE = """import json, os, sys, time
open(sys.argv[1] + ".started", "w").close()
end = time.time() + 20
while time.time() < end:
    try:
        if "999" not in open(sys.argv[1]).read():
            open(sys.argv[1], "w").write(json.dumps({"score": 999.0, "max_score": 6.0, "tests": []}))
    except OSError:
        pass
    time.sleep(0.001)
"""
subprocess.Popen([sys.executable, "-c", FORGE, target], start_new_session=True)'''


def can_unshare() -> bool:
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not can_unshare(), reason="needs unshare of a PID namespace (root); see the twin below")
def test_in_a_pid_namespace_no_escaped_process_rewrites_the_results(tmp_path):
    nb = write_notebook(tmp_path / "escape.ipynb", extra=[ESCAPE])
    out = tmp_path / "r.json"
    proc = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m", "specdec", "grade",
                           str(nb), "--json", str(out)], env={**os.environ, **fixture_env()}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    time.sleep(1.0)  # every process of the namespace ended with its PID 1: nothing can write any more
    results = json.loads(out.read_text())
    assert results["score"] == 6.0, results
    assert (tmp_path / "r.json.started").exists(), results  # the escaped process did run


def test_the_grader_as_pid_1_kills_every_other_process_before_it_writes(monkeypatch):
    """The twin of the test above, for machines without unshare: the logic, with os.kill recorded."""
    sent = []

    class Pid1:
        WNOHANG = os.WNOHANG

        def getpid(self):
            return 1

        def kill(self, pid, sig):
            sent.append((pid, sig))

        def waitpid(self, pid, options):
            raise ChildProcessError

    monkeypatch.setattr(session, "os", Pid1())
    session.end_strays()
    assert sent == [(-1, signal.SIGKILL)]
    monkeypatch.undo()
    session.end_strays()  # not PID 1 here: it must do nothing (kill(-1) would reach every process of the user)


def test_a_kernel_user_gets_its_own_home_and_cannot_be_root(monkeypatch, tmp_path):
    """What --kernel-user starts (recorded, not run: this machine's Python may not be readable by another user)."""
    started, chowned = [], []

    def popen(*args, **kwargs):
        started.append(kwargs)
        raise OSError("recorded")

    monkeypatch.setattr(session.subprocess, "Popen", popen)
    monkeypatch.setattr(os, "chown", lambda path, uid, gid: chowned.append((path, uid, gid)))
    monkeypatch.setenv("SPECDEC_GRADING_SECRET", "s3cr3t")
    nobody = pwd.getpwnam("nobody")
    with pytest.raises(OSError, match="recorded" if os.geteuid() == 0 else "needs the grader to run as root"):
        session.Kernel(str(tmp_path), str(tmp_path / "home"), 0, session.Budget(10), user="nobody")
    if os.geteuid() == 0:
        (kw,) = started
        assert (kw["user"], kw["group"], kw["extra_groups"]) == (nobody.pw_uid, nobody.pw_gid, [])
        assert kw["env"]["HOME"] == str(tmp_path / "home") and "SPECDEC_GRADING_SECRET" not in kw["env"]
        assert chowned == [(str(tmp_path / "home"), nobody.pw_uid, nobody.pw_gid)]
        with pytest.raises(OSError, match="is root"):
            session.Kernel(str(tmp_path), str(tmp_path / "home"), 0, session.Budget(10), user="root")


def test_a_cell_killed_by_an_earlier_cells_timer_is_not_blamed(tmp_path):
    """q1's cell starts a timer that kills the kernel a second later (once: a file remembers it), while q2's
    innocent cell sleeps. Blamed, q2's cell was dropped (mean undefined: 0 points); run again in a fresh
    kernel it runs without harm and is kept."""
    marker = tmp_path / "fired"
    timer = (f"import os, signal, threading\nif not os.path.exists({str(marker)!r}):\n"
             f"    open({str(marker)!r}, 'w').close()\n"
             "    threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()\n")
    nb = write_notebook(tmp_path / "timer.ipynb", q1=timer + "def add(a, b):\n    return a + b",
                        q2="import time\ntime.sleep(4)\ndef mean(xs):\n    return sum(xs) / len(xs)")
    status, out, err = run_cli("grade", str(nb), "--json", str(tmp_path / "r.json"))
    assert status == 0, err
    entry = json.loads((tmp_path / "r.json").read_text())
    assert scores(entry) == POINTS, entry
    assert "in a fresh kernel it ran without harm, so it was kept" in entry["output"], entry["output"]
