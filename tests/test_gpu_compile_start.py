"""benchmarks/gpu_compile_start.py on the CPU (the tiny shape, nothing compiled: the CPU has no CUDA graphs to compile
into): each start of a plan is a process of its own, its facts land in the results file, and render() makes the docs
section from such a file, so that the script the lead runs on the GPU cannot rot unnoticed."""

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def test_each_start_is_a_process_and_the_section_reads_the_results(tmp_path, monkeypatch):
    out = tmp_path / "cs"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, str(BENCH / "gpu_compile_start.py"), "--shape", "tiny", "--max-running", "2",
                           "--context", "256", "--new-tokens", "8", "--device", "cpu", "--compile", "off",
                           "--plan", "static,dynamic", "--out", str(out), "--torch-source"], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((out / "compile_start.json").read_text())
    assert result["device"] == "CPU" and [(r["start"], r["variant"]) for r in result["runs"]] == [(1, "static"), (2, "dynamic")]
    assert all(set(r["ms_per_step"]) == {"1", "2"} and min(r["ms_per_step"].values()) > 0 for r in result["runs"])
    assert all(r["graphs_traced"] == 0 for r in result["runs"])  # --compile off: nothing reaches dynamo
    assert "== static,dynamic: start 2 (dynamic, profiled)" in proc.stdout and "cumulative" in result["runs"][1]["profile_top"]
    assert [r["profiled"] for r in result["runs"]] == [False, True]
    assert all(r["tuned_kernels"] == [] for r in result["runs"])  # recorded in every start (none on the CPU)
    assert "def recheck_autotune_cache" in (out / "torch_source.txt").read_text()  # what keep_tuned_configs wraps

    monkeypatch.syspath_prepend(str(BENCH))
    import gpu_compile_start
    import page

    monkeypatch.setattr(page, "RES", tmp_path)
    (tmp_path / "gpu_compile_start").mkdir()
    run = {**result["runs"][1], "compiled_line": ["specdec: compiled in 19 s"], "coordesc_benchmarks": 201,
           "dynamo_compile_times": "Function  Runtimes (s)\nCachingAutotuner.coordinate_descent_tuning   12.5779\n",
           "variant": "static"}
    (tmp_path / "gpu_compile_start" / "call1.json").write_text(json.dumps({**result, "runs": [run]}))
    section = gpu_compile_start.render()
    assert "second start goes" in section and "| call1 | static,dynamic | 2 | static | yes | every | no | 19 | 12.58 |" in section
    assert "warm starts compiled in\n  19 s (12.6 s tuning)" in section and "not shown met" in section
    # a later call's unprofiled warm start, with keep_tuned_configs (static after call 4): the goal read from it
    kept = {**run, "compiled_line": ["specdec: compiled in 8 s"], "profiled": False, "start": 2,
            "dynamo_compile_times": "CachingAutotuner.coordinate_descent_tuning   1.4506\n"}
    (tmp_path / "gpu_compile_start" / "call5.json").write_text(json.dumps({**result, "runs": [kept]}))
    section = gpu_compile_start.render()
    assert "| call5 | static,dynamic | 2 | static | no | one-token | yes | 8 | 1.45 |" in section
    assert "compiled in\n  8 s (1.5 s tuning); the steps did not change" in section and "under 15 s:\n  met" in section
    assert "In call5's warm start it tuned no kernel again." in section  # the CPU compiles nothing: no kernel tuned
    (tmp_path / "gpu_compile_start" / "call5.json").write_text(json.dumps({**result, "runs": [
        {**kept, "tuned_kernels": [{"kernel": "triton_poi_x", "static": True, "configs": 0, "cache_state": "hit"}]}]}))
    assert "it tuned 1 kernel again (`triton_poi_x`)" in gpu_compile_start.render()
