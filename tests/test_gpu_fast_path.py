"""benchmarks/gpu_fast_path.py, the default `specdec decode` path on random weights, on the CPU with --smoke (the
zoo's tiny shape, no GPU part): every start and variant runs and records its numbers, so that the script the
lead runs on the GPU cannot rot unnoticed."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.slow  # four `specdec decode` processes: about 10 s
def test_the_fast_path_benchmark_runs_on_the_cpu(tmp_path, monkeypatch):
    out = tmp_path / "fp.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "HOME": str(tmp_path / "home")}
    # one scope: on a CPU each runs the same uncompiled decode (2 s of CPU a process), and the loop over scopes is
    # the same for both; layers, not the default, so that --scopes and the flag it passes are exercised
    proc = subprocess.run([sys.executable, str(BENCH / "gpu_fast_path.py"), "--smoke", "--scopes", "layers",
                           "--out", str(out), "--cache-dir", str(tmp_path / "cache")],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    runs = res["runs"]
    assert [e["variant"] for e in runs] == ["start 1 (layers)", "start 2 (layers)", "compile off", "unfused, compile off"]
    assert [e["flags"] for e in runs[:2]] == ["--compile-scope layers"] * 2
    assert all("error" not in e and "skipped" not in e for e in runs), runs
    assert all(e["tpot_ms"] > 0 and e["ttft_ms"] > 0 and e["new_tokens"] == 16 and e["device"] == "cpu" for e in runs)
    assert [e["fused"] for e in runs] == [True] * 3 + [False] and not any(e["compiled"] for e in runs)
    assert all(e["compile_scope"] is None for e in runs)  # a CPU compiles nothing, whatever the scope asked
    assert 24 <= runs[0]["prompt_tokens"] <= 40  # about the 32 asked for, through the text
    log = out.with_suffix(".log").read_text()
    assert "tiny, --compile-scope layers: default path" in log and "--compile-scope step:" not in log
    assert "not compiled" in log
    assert not (tmp_path / "home" / ".cache").exists()  # nothing written to the user's home
    # the machine and the tree it measured: a changed tracked file would be named beside the commit
    assert res["env"]["cpu"] and isinstance(res["env"]["changed_files"], list)

    monkeypatch.syspath_prepend(str(BENCH))
    import gpu_fast_path
    import page

    monkeypatch.setattr(page, "load", lambda name: res)
    section = gpu_fast_path.render()
    assert "The default `specdec decode` path on random weights" in section and "| tiny | start 2 (layers) |" in section
