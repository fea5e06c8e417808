"""benchmarks/gpu_serve_stop.py on the CPU (the tiny shape, not compiled: no compile workers here): the server starts as
a script's `&`, its process tree is recorded, `kill $pid` stops it, nothing of the tree is left, and the section reads
the results; so that the script the lead runs on the GPU cannot rot unnoticed."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.slow  # a `specdec serve` start
def test_a_stopped_server_leaves_none_of_its_processes(tmp_path, monkeypatch):
    out = tmp_path / "gpu_serve_stop"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, str(BENCH / "gpu_serve_stop.py"), "--out", str(out), "--shape", "tiny",
                           "--compile", "off", "--device", "cpu"], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads((out / "serve_stop.json").read_text())
    assert r["healthy"] and r["request_status"] == 200 and r["exit_status"] == 0 and r["left"] == {}
    assert len(r["tree"]) >= 2  # the HTTP process and its engine process at least
    assert any("specdec serve" in c for c in r["tree"].values()) and any("spawn_main" in c for c in r["tree"].values())

    monkeypatch.syspath_prepend(str(BENCH))
    import gpu_serve_stop
    import page

    monkeypatch.setattr(page, "RES", tmp_path)
    section = gpu_serve_stop.render()
    assert "leaves behind" in section and f"as {len(r['tree'])} processes" in section
    assert "exit status 0" in section and "and 0 of those processes" in section
