"""benchmarks/cpu_host_step.py: the engine's bookkeeping per step with the device's part stubbed out."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "cpu_host_step.py"


def test_the_host_step_benchmark_runs_and_records_both_batches(tmp_path):
    out, log = tmp_path / "host.json", tmp_path / "host.log"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--log", str(log), "--steps", "50",
                           "--repeats", "2"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["batch"] for r in rows] == [1, 4]
    assert all(len(r["us_per_step"]) == 2 and 0 < r["best_us"] <= r["median_us"] for r in rows)
    assert "batch 1: host bookkeeping" in log.read_text()
