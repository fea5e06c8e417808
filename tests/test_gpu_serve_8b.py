"""benchmarks/gpu_serve_8b.py's `ours` part on the CPU (the zoo's tiny shape of random weights, short runs): every
server starts, is swept and stopped, its numbers land in the summary, and render() makes the docs section from
them, so that the script the lead runs on the GPU cannot rot unnoticed."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.slow  # three `specdec serve` processes started together (--together), each swept alone at two levels
def test_the_8b_serve_benchmark_runs_its_part_on_the_cpu(tmp_path, monkeypatch):
    out = tmp_path / "gpu_serve_8b"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "HOME": str(tmp_path / "home"),
           "PYTHONPATH": str(BENCH.parent)}
    # 10 tokens: 9 after the first in 3 verify steps of 3 (the simulated accept length exactly, where 24 made 2.88)
    proc = subprocess.run([sys.executable, str(BENCH / "gpu_serve_8b.py"), "--which", "ours", "--shape", "tiny",
                           "--levels", "1,2", "--min-run-s", "0", "--max-new-tokens", "10", "--together", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary_ours.json").read_text())
    assert summary["errors"] == {}
    assert set(summary["tok_s"]) == {"ours_plain", "ours_spec", "ours_adaptive"}
    assert all(set(v) == {"1", "2"} and min(v.values()) > 0 for v in summary["tok_s"].values())
    spec = json.loads((out / "sweep_ours_spec.json").read_text())
    assert all(r["accept_length"] == pytest.approx(3.0, abs=0.3) for r in spec["runs"])  # the oracle's, not the model's
    assert "starting together: ours_plain, ours_spec, ours_adaptive" in proc.stdout
    assert "ours_spec concurrency 1:" in proc.stdout and "SIMULATED accept length 3" in \
        (out / "logs" / "ours_spec.log").read_text()
    assert len(summary["pids"]) == 3
    for pid in summary["pids"].values():  # every server stopped
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

    monkeypatch.syspath_prepend(str(BENCH))
    import gpu_serve_8b
    import page

    monkeypatch.setattr(page, "RES", tmp_path)  # render() reads every summary_*.json of the folder
    section = gpu_serve_8b.render()
    assert "8B-shaped model of random weights" in section and "| 1 | " in section and "Goals: adaptive" in section
    assert "SGLang plain |" not in section  # no SGLang in this part: no empty columns, no goal against it
    assert "different cards" not in section

    # a part split over device calls (--servers), on another card: merged, and said
    (out / "summary_ours_adaptive.json").write_text(json.dumps({**summary, "device": "NVIDIA H200", "tok_s": {
        "ours_adaptive": {"1": 1.0, "2": 1.0}}}))
    section = gpu_serve_8b.render()
    assert "different cards" in section and "ours_adaptive: NVIDIA H200" in section


@pytest.mark.slow  # two `specdec serve` starts, one after the other
def test_restart_starts_each_server_again_and_the_section_reads_both_starts(tmp_path, monkeypatch):
    out = tmp_path / "gpu_serve_8b_two"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "HOME": str(tmp_path / "home"),
           "PYTHONPATH": str(BENCH.parent)}
    proc = subprocess.run([sys.executable, str(BENCH / "gpu_serve_8b.py"), "--which", "ours", "--servers", "plain",
                           "--restart", "--shape", "tiny", "--levels", "1", "--min-run-s", "0", "--max-new-tokens", "4",
                           "--out", str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ours = json.loads((out / "summary_ours_plain.json").read_text())
    assert ours["errors"] == {} and set(ours["tok_s"]) == set(ours["startup_s"]) == {"ours_plain", "ours_plain_restart"}
    assert ours["pids"]["ours_plain"] != ours["pids"]["ours_plain_restart"]  # a second process, not the first kept
    for pid in ours["pids"].values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

    monkeypatch.syspath_prepend(str(BENCH))
    import gpu_serve_8b
    import page

    monkeypatch.setattr(page, "RES", tmp_path)
    ours["compile_s"] = {"ours_plain": 66, "ours_plain_restart": 14}
    ours["tok_s"] = {"ours_plain": {"1": 95.0}, "ours_plain_restart": {"1": 80.0}}
    (out / "summary_ours_plain.json").write_text(json.dumps(ours))
    (out / "summary_sglang.json").write_text(json.dumps({**ours, "which": "sglang", "tok_s": {"sglang_plain": {"1": 100.0}}}))
    section = gpu_serve_8b.render_two_process()
    assert "| 1 | 100.00 | 95.00 | 0.95 | 80.00 | 0.80 |" in section and "met at every level" in section
    assert "compiled in 14 s). Goal: a second start\n  compiles in under 15 s: met" in section
