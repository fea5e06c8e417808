"""benchmarks/gpu_decode_gap.py on the CPU with --smoke (the zoo's tiny shape, uncompiled, no graphs): each scope runs
the decode path's engine and records its time per token, its phases and the host profile, so the GPU script cannot
rot unnoticed; and its section renders from the committed H200 run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.slow  # two `specdec decode`-built engines in a process: about 4 s
def test_the_gap_script_runs_on_the_cpu(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, str(BENCH / "gpu_decode_gap.py"), "--smoke", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads((tmp_path / "gpu_decode_gap.json").read_text())["runs"]
    assert [r["scope"] for r in runs] == ["step", "layers"] and all("error" not in r for r in runs), runs
    for r in runs:
        assert r["new_tokens"] == 16 and r["steps"] == 15 and r["tpot_ms"] > 0 and not r["compiled"]
        assert r["replay_ms"] == {} and r["gap_ms"] is None  # no graphs on a CPU: nothing to replay
        assert set(r["phases_ms_per_step"]) >= {"prefill", "verify", "host"}
        assert r["cprofile_step_calls"] == r["steps"] and r["cprofile_top"]  # the profile covers the whole loop
    assert "tiny step: compiled False" in (tmp_path / "gpu_decode_gap.log").read_text()


def test_the_gap_section_reads_the_committed_run(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import gpu_decode_gap

    text = gpu_decode_gap.render()
    data = json.loads((BENCH / "results" / "gpu_decode_gap.json").read_text())
    for r in data["runs"]:
        assert f"| {r['shape']} | {r['scope']} | {r['tpot_ms']:.2f} |" in text
    assert "the host adds" in text and "gpu_floor.py" in text and "Compiled twice from empty caches" in text
