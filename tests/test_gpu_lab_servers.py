"""benchmarks/gpu_lab_servers.py on the CPU: Lab 3's two servers started as its notebooks start them (`lab_servers`,
the two at once), one request each, stopped, nothing left; so that the script run on the GPU cannot rot unnoticed."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_lab_servers.py"


@pytest.mark.slow  # two `specdec serve` starts
def test_the_two_lab_servers_start_together_answer_and_leave_nothing(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "SPECDEC_RUN_DIR": str(tmp_path)}
    for key in ("SPECDEC_URL", "SPECDEC_SPEC_URL", "SPECDEC_API_KEY"):
        env.pop(key, None)
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    r = json.loads(lines[-2])
    assert r["backend"] == "specdec" and r["left_running"] == [] and r["start_gap_s"] < 5
    assert r["plain"]["algorithm"] is None and r["plain"]["verify_steps"] is None
    # NEXTN, reported as SGLang reports it; 32 tokens in fewer verify steps than tokens
    assert r["speculative"]["algorithm"] == "EAGLE" and r["speculative"]["completion_tokens"] == 32
    assert 1 <= r["speculative"]["verify_steps"] <= 32
    assert lines[-1].startswith("specdec: both servers answer after ") and lines[-1].endswith("left running: none")


@pytest.mark.slow  # a `specdec serve` start, stopped within a second or two
def test_a_speculative_server_that_crashes_at_start_is_reported_at_once_and_stops_the_plain_one(tmp_path):
    """--crash: the speculative server exits at start (an unknown flag) while the plain one is still importing torch;
    the error names the exit, and the plain server is stopped with it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "SPECDEC_RUN_DIR": str(tmp_path)}
    for key in ("SPECDEC_URL", "SPECDEC_SPEC_URL", "SPECDEC_API_KEY"):
        env.pop(key, None)
    proc = subprocess.run([sys.executable, str(SCRIPT), "--crash"], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    r = json.loads(lines[-2])
    assert r["backend"] == "specdec" and r["crash"] and r["left_running"] == []
    assert r["error"].startswith("server exited with status 2 before it was healthy")
    assert lines[-1].startswith("specdec: the crashed start reported after ") and lines[-1].endswith("left running: none")
