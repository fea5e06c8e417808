"""benchmarks/cpu_regional_compile.py, a compile scope's start on the CPU, with dynamo's trace only (--backend eager):
every (layers, scope) runs, decodes as eager and counts what it traced, so that the script cannot rot unnoticed."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "cpu_regional_compile.py"


@pytest.mark.slow  # two processes that import torch and trace: about 8 s
def test_the_regional_compile_benchmark_runs_and_counts_the_traces(tmp_path):
    out = tmp_path / "results" / "rc.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--backend", "eager", "--layers", "3", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    assert [(e["layers"], e["scope"]) for e in runs] == [(3, "step"), (3, "layers")]
    assert all(e["cold_same_as_eager"] and e["warm_same_as_eager"] and e["cold_s"] > 0 for e in runs)
    # one capture: the whole step once, or one layer (for all 3) and the head
    assert [(e["cold_graphs"], e["warm_graphs"]) for e in runs] == [(1, 1), (2, 2)]
    assert "L=  3 --compile-scope layers" in (tmp_path / "logs" / "rc.log").read_text()
