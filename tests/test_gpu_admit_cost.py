"""benchmarks/gpu_admit_cost.py on the CPU with --smoke: every measurement runs and is recorded, so the
script that measured what an admit costs on the GPU cannot rot unnoticed."""

import json
import runpy
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_admit_cost.py"


@pytest.mark.slow  # a benchmark's smoke run, as the other gpu_* scripts' (1.5 s)
def test_the_admit_cost_benchmark_runs_on_the_cpu(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--smoke", "--profile", "--out", str(tmp_path)])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    out = capsys.readouterr().out
    res = json.loads((tmp_path / "admit_cost.json").read_text())
    assert res["device"] == "cpu" and res["rows"] == 2 and res["step_s"] > 0
    for n in (1, 2):  # one prompt, and every row
        assert res[f"admit_{n}_s"] > 0 and res[f"admit_{n}_kernels"]["top_level_ops"] > 10
        assert res[f"admit_{n}_kernels"]["gpu_kernels"] == 0  # no GPU here: nothing launched, nothing busy
    assert "step of 2 rows" in out and "cProfile" in out and "engine.py" in out and "(_prefill)" in out
