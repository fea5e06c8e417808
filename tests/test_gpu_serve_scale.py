"""benchmarks/gpu_serve_scale.py (issue 21: `specdec serve` and SGLang as concurrency grows) and benchmarks/pyspy.py
(where a server's threads spend a sweep), on the CPU: the launch configs of both backends, a smoke run of ours, and
py-spy's raw samples summarised per thread."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def scale(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import gpu_serve_scale

    return gpu_serve_scale


def test_each_server_is_launched_with_its_algorithm_and_shape(scale):
    for name, (algorithm, draft, shape) in scale.SERVERS.items():
        ours, env = scale.config("ours", name, 64)
        theirs, senv = scale.config("sglang", name, 64)
        assert ours.backend == "specdec" and theirs.backend == "sglang" and env == {}
        assert ours.algorithm == theirs.algorithm == algorithm and ours.draft == theirs.draft == draft
        assert ("--compile", "off") == ours.extra_args[:2] and senv == {"SGLANG_RECORD_STEP_TIME": "1"}
        assert ours.max_running_requests == theirs.max_running_requests == theirs.cuda_graph_max_bs == 64
        assert (theirs.num_steps, theirs.topk, theirs.num_draft_tokens) == (shape or (None, None, None))
    assert scale.SERVERS["eagle"][2] == (7, 1, 8) and scale.SERVERS["mtp"][2] == (3, 1, 4)


@pytest.mark.slow  # one `specdec serve` started and swept: a few seconds
def test_the_scale_sweep_runs_against_specdec_serve_on_the_cpu(tmp_path):
    out = tmp_path / "smoke"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, str(BENCH / "gpu_serve_scale.py"), "--cpu-smoke", "--servers", "plain",
                           "--out", str(out)], capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((out / "summary.json").read_text())
    run = res["ours"]["plain"]
    assert set(run["by_concurrency"]) == {"1", "2"} and "sglang" not in res and res["left_running"] == []
    assert all(r["errors"] == 0 and r["output_tok_s"] > 0 for r in run["by_concurrency"].values())
    assert set(run["loop_seconds"]) == {"admit", "step", "deliver"} and run["loop_seconds"]["step"] > 0


def test_pyspy_samples_are_summarised_per_thread(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    from pyspy import summarize

    raw = tmp_path / "raw.txt"
    raw.write_text(
        "thread (11): MainThread;run (/x/asyncio/runners.py:118);send (/y/server/app.py:70) 30\n"
        "thread (11): MainThread;run (/x/asyncio/runners.py:118) 70\n"
        "thread (12): specdec-engine;_loop (/z/server/scheduler.py:230);step (/z/decoder/engine.py:392) 3\n"
        "thread (12): specdec-engine;_loop (/z/server/scheduler.py:231);_deliver (/z/server/scheduler.py:300) 1\n"
        "thread (13): asyncio_0;_worker (/t/futures/thread.py:89) 2\nthread (14): asyncio_1;_worker (/t/futures/thread.py:89) 2\n")
    lines = summarize(raw, top=5)
    assert lines[0] == "-- thread MainThread: 100 samples"
    assert "   30.0% incl  send (server/app.py)" in lines and "   70.0% self  run (asyncio/runners.py)" in lines
    assert "-- thread specdec-engine: 4 samples" in lines and "   75.0% incl  step (decoder/engine.py)" in lines
    assert "-- thread asyncio_*: 4 samples" in lines  # a pool's threads, pooled
    assert not any("incl  run (asyncio/runners.py)" in x for x in lines)  # a frame in every sample says nothing
