"""benchmarks/gpu_floor.py, the GPU run against the bandwidth floor, on the CPU with --smoke (tiny
shapes, emulated graphs, dynamo tracing without inductor): every section runs and records numbers,
so the script the lead runs on the GPU cannot rot unnoticed."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_floor.py"


@pytest.mark.slow
def test_the_floor_benchmark_runs_every_section_on_the_cpu(tmp_path):
    out = tmp_path / "floor.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(out)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    sec = res["sections"]
    assert res["errors"] == 0 and res["skipped"] == 0, [e for v in sec.values() for e in v if "error" in e]
    assert set(sec) == {"bandwidth", "build", "steps", "loop", "anchor"}
    steps = sec["steps"]
    # every shape x batch x width x cache without compile; with compile at batch 1 (one shape in the smoke run)
    assert len([e for e in steps if not e["compile"]]) == 2 * 2 * 2 * 2
    assert {(e["batch"], e["width"], e["cache"]) for e in steps if e["compile"]} == {(1, w, c) for w in (1, 2)
                                                                                    for c in (64, 128)}
    for e in steps:
        assert e["ms"] > 0 and e["floor_ms"] > 0 and e["step"] == ("plain" if e["width"] == 1 else "verify")
        assert e["span"] == e["cache"]  # a 24-token context in caches of 64 and 128: the bucket is the cache
    loops = sec["loop"]
    # fp32: the verify step's greedy tokens are the plain step's, and the oracle's output is both
    assert all(e["lossless"] and e["same_as_plain"] and e["verify_agrees_with_plain_for"] == 8
               for e in loops if e["method"] == "oracle")
    assert {(e["method"], e["compile"]) for e in loops} == {(m, c) for m in ("plain", "oracle") for c in (False, True)}
    assert {e["method"] for e in loops} == {"plain", "oracle"} and all(e["decode_tokens_per_s"] > 0 for e in loops)
    assert all(e["generate_tokens_per_s"] > 0 for e in sec["anchor"])
    log = out.with_suffix(".log").read_text()
    assert "== summary" in log and "-- goals" in log and "0 measurements failed" in log


def test_the_floor_benchmark_refuses_bad_arguments(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import gpu_floor  # its main() here: a process of its own would spend 2 s importing torch to refuse

    assert gpu_floor.main(["--smoke", "--shapes", "70b", "--out", str(tmp_path / "x.json")]) == 2
    assert "--shapes takes 1b, 8b" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
