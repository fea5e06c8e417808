"""benchmarks/gpu_launch_defaults.sh (issue 18: the default SGLang commands, proven on a GPU node) on a CPU:
its arguments, the default commands it would run (--dry-run), its time budget, and the whole case loop
rehearsed through `specdec serve` (LAUNCH_BACKEND=specdec, a stand-in nvidia-smi on PATH)."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_launch_defaults.sh"
CASES = ["zoo-none", "zoo-NEXTN", "zoo-EAGLE", "zoo-STANDALONE", "zoo-NGRAM", "8b-none", "8b-EAGLE", "8b-NGRAM"]
FAKE_SMI = """#!/bin/sh
case "$*" in *query-gpu=memory.used*) echo 0 ;; *query-compute-apps*) ;; *) echo "0, stand-in, 0, 0, 0, none" ;; esac
"""


def script(tmp_path: Path, *args: str, timeout: float = 120, **env) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nvidia-smi").write_text(FAKE_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    full_env = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": sys.executable,
                "PATH": f"{bin_dir}:{os.environ['PATH']}", **env}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=full_env, cwd=ROOT,
                          timeout=timeout, check=False)


def test_cases_and_groups_are_checked(tmp_path):
    listed = script(tmp_path, "--list")
    assert listed.returncode == 0 and listed.stdout.split() == CASES
    for bad in ("zoo-FOO", "eagle"):
        r = script(tmp_path, "zoo-none", bad)
        assert r.returncode == 2 and r.stderr.strip().startswith(f"gpu_launch_defaults: unknown case {bad}; cases: zoo-none")
        assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "out" / "summary").exists()  # nothing ran
    assert "usage" in script(tmp_path, "--help").stdout


def test_dry_run_shows_each_default_command_with_its_kv_pool(tmp_path):
    r = script(tmp_path, "--dry-run", "zoo-NEXTN", "8b-EAGLE", "zoo-NEXTN")  # a case named twice runs once
    assert r.returncode == 0, r.stdout + r.stderr
    blocks = r.stdout.split("== ")[1:]
    assert [b.split(":")[0] for b in blocks] == ["zoo-NEXTN", "8b-EAGLE"]
    assert blocks[0].splitlines()[0] == ("zoo-NEXTN: specdec launch --model tiny --speculative-algorithm NEXTN "
                                         "--num-steps 3 --topk 1 --num-draft-tokens 4 --backend sglang")  # issue 18's
    for block in blocks:
        lines = block.strip().splitlines()
        cmd = shlex.split(lines[-1])
        assert cmd[1:3] == ["-m", "sglang.launch_server"] and "--mem-fraction-static" not in cmd
        assert "--max-total-tokens" in cmd and lines[1].startswith("# KV pool: --max-total-tokens")
        assert "--mem-fraction-static" not in lines[0]  # the student's command: no memory flags
    eagle = shlex.split(blocks[-1].strip().splitlines()[-1])
    shapes = tmp_path / "out" / "shapes"
    assert eagle[eagle.index("--model-path") + 1] == str(shapes / "8b")
    assert eagle[eagle.index("--speculative-draft-model-path") + 1] == str(shapes / "8b-eagle")
    assert eagle[eagle.index("--max-total-tokens") + 1] == str(48 * 4096)
    assert "--speculative-draft-load-format" in eagle and eagle[eagle.index("--load-format") + 1] == "dummy"
    head = json.loads((shapes / "8b-eagle" / "config.json").read_text())
    assert head["num_hidden_layers"] == 1 and head["architectures"] == ["LlamaForCausalLMEagle"]
    assert json.loads((shapes / "8b" / "config.json").read_text())["num_hidden_layers"] == 32


def test_a_case_that_cannot_fit_the_budget_is_skipped_and_said_so(tmp_path):
    r = script(tmp_path, "zoo-none", "8b-none", BUDGET="30")
    assert r.returncode == 2, r.stdout + r.stderr
    summary = (tmp_path / "out" / "summary").read_text().splitlines()
    assert [ln.split()[0] for ln in summary] == ["zoo-none", "8b-none"]
    assert all("skipped: " in ln and "of the 30 s budget left" in ln for ln in summary)
    assert "0/2 cases started" in r.stdout


@pytest.mark.slow
def test_the_case_loop_rehearsed_on_a_cpu(tmp_path):
    """Each case as on the GPU node, through specdec serve: background start, one /generate, SIGTERM, checks."""
    r = script(tmp_path, "zoo-STANDALONE", timeout=300, LAUNCH_BACKEND="specdec", CASE_LIMIT="150")
    assert r.returncode == 0, r.stdout + r.stderr
    (line,) = (tmp_path / "out" / "summary").read_text().splitlines()
    assert line.startswith("zoo-STANDALONE  ok: started yes in") and "/generate 200 (16 tokens)" in line, line
    assert "SIGTERM -> exit 0; no process left; GPU memory back" in line, line
    assert "1/1 cases started with the default command and stopped cleanly" in r.stdout
    assert "(a rehearsal through specdec serve: no SGLang)" in r.stdout  # no torch imported for the node's versions
    assert "specdec launch: stopped" in (tmp_path / "out" / "gpu_launch_defaults.log").read_text()


def test_the_two_gpu_script_renders_tp_2_beside_one_gpu():
    """benchmarks/gpu_lab3.py tp2 (issue 19, section 5: run on nvidia-h200-x2 when it is lent): the one-GPU
    servers each on a GPU of their own, the two-GPU ones under --tp-size 2, the same flags otherwise."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gpu_lab3

    waves = gpu_lab3.tp2_waves((1, 4, 16, 64))
    servers = {name: (cfg.command(), env) for wave in waves for name, (cfg, env) in wave.items()}
    assert set(servers) == {"plain8b_tp1", "eagle8b_tp1", "plain8b_tp2", "eagle8b_tp2"}
    for name, (cmd, env) in servers.items():
        line = " ".join(cmd)
        assert ("--tp-size 2" in line) == name.endswith("tp2"), line
        assert ("CUDA_VISIBLE_DEVICES" in env) == name.endswith("tp1")
        assert ("--speculative-algorithm EAGLE" in line) == name.startswith("eagle"), line
        assert "--load-format dummy" in line and re.search(r"--cuda-graph-max-bs(-decode)? 64", line), line
    assert servers["plain8b_tp1"][1]["CUDA_VISIBLE_DEVICES"] != servers["eagle8b_tp1"][1]["CUDA_VISIBLE_DEVICES"]
