"""benchmarks/cpu_suite_processes.py: its kinds and sums (the full run is the benchmark itself, not a test)."""

import os
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import cpu_suite_processes as csp  # noqa: E402


def test_processes_are_told_apart_by_command_line_and_parent():
    serve = "/v/bin/python -m specdec serve --model tiny --port 0"
    assert csp.kind("/v/bin/python -B -c from multiprocessing.spawn import spawn_main; spawn_main()", serve) \
        == "engine process of specdec serve (spawned)"
    assert csp.kind("/v/bin/python -B -c from multiprocessing.spawn import spawn_main;", "bash") == "multiprocessing child"
    assert csp.kind("/v/bin/python -m ipykernel_launcher -f k.json") == "notebook kernel"
    assert csp.kind("/v/bin/python -P -m specdec.grading.kernel 3 8 42") == "grader's notebook kernel"
    assert csp.kind("/v/bin/python -u -c import sys;exec(eval(sys.stdin.readline()))") \
        == "pytest-xdist worker (in-process tests)"
    assert csp.kind("/v/bin/python -m specdec tour --out /tmp/pytest-of-x/t") == "specdec tour"
    assert csp.kind("/v/bin/python /r/benchmarks/gpu_floor.py --smoke --out /tmp/pytest-1") == "script gpu_floor.py"


def test_sums_keep_python_processes_only_and_sort_by_cpu():
    seen = {"1": {"cmd": "/v/bin/python -m specdec serve --port 0", "ppid": "0", "cpu": 0.5},
            "2": {"cmd": "/v/bin/python -B -c from multiprocessing.spawn import spawn_main", "ppid": "1", "cpu": 2.0},
            "3": {"cmd": "/v/bin/python -B -c from multiprocessing.spawn import spawn_main", "ppid": "1", "cpu": 2.5},
            "4": {"cmd": "bash -c make test", "ppid": "0", "cpu": 9.0}}
    rows = csp.aggregate(seen)
    assert [r["kind"] for r in rows] == ["engine process of specdec serve (spawned)", "specdec serve"]
    assert rows[0] == {"kind": "engine process of specdec serve (spawned)", "processes": 2, "cpu_s": 4.5, "each_s": 2.25}


def test_the_sampler_sees_its_own_process():
    seen, stop = {}, threading.Event()
    stop.set()  # one pass, then stop
    csp.sample(seen, stop)
    assert str(os.getpid()) in seen and seen[str(os.getpid())]["cpu"] > 0
