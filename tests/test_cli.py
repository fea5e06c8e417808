"""The command line: help is fast (no torch or numpy at import), unknown verbs and bad input fail
with one line."""

import subprocess
import sys


def run(*args):
    return subprocess.run([sys.executable, "-m", "specdec", *args], capture_output=True, text=True, timeout=300)


def test_help_lists_every_verb_without_importing_torch_or_numpy():
    code = ("import sys, specdec.cli as c; c.build_parser(); "
            "print('numpy' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"]
    help_text = run("--help").stdout
    for verb in ("tour", "sim", "decode", "zoo", "grade", "labs"):
        assert verb in help_text


def test_bad_decode_input_is_one_line():
    r = run("decode", "--model", "no-such-model", "--max-new-tokens", "4")
    assert r.returncode != 0
    assert "no-such-model" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_verb_imports_only_its_own_module():
    """`specdec sim` is Lab 1: numpy only, never torch (only the chosen verb's module is imported)."""
    code = ("import sys, specdec.cli as c; c.main(['sim', '--alpha', '0.5', '--k', '2', '--json']); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stderr


def test_a_misspelled_flag_gets_the_verbs_own_one_line_error():
    r = run("sim", "--alfa", "0.8")
    assert r.returncode == 2 and r.stderr.strip() == "specdec sim: error: unrecognized arguments: --alfa 0.8"


def test_alpha_is_not_silently_ignored_by_the_monte_carlo():
    r = run("sim", "--alpha", "0.8", "--monte-carlo")
    assert r.returncode == 2 and "--iid" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_cuda_without_a_gpu_is_one_line():
    import torch

    if torch.cuda.is_available():
        return
    r = run("decode", "--device", "cuda", "--max-new-tokens", "2")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("specdec: no CUDA")]
    assert r.returncode == 2 and lines == ["specdec decode: error: --device cuda but no CUDA device is visible; use --device cpu"]


def test_an_unknown_zoo_names_the_recipes_that_exist():
    r = run("zoo", "path", "huge")
    assert r.returncode == 2 and "recipes: tiny, tiny-cpu, small" in r.stderr and "--recipe huge" not in r.stderr


def test_execute_runs_a_notebook_headless_and_names_a_failing_cell(tmp_path):
    import json

    nb = {"cells": [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": s}
                    for s in ("x = 1", "print('total: 1 / 2')", "1 / 0", "print('never')")],
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "n.ipynb").write_text(json.dumps(nb))
    r = run("execute", str(tmp_path / "n.ipynb"))
    assert r.returncode == 1 and "total: 1 / 2" in r.stdout and "stopped at cell 3" in r.stdout, r.stdout + r.stderr
    assert "without encryption" not in r.stderr and "WARNING" not in r.stderr, r.stderr  # the kernel talks over IPC
    assert not [p for p in tmp_path.iterdir() if "ipc" in p.name]  # its sockets went to a private folder, now gone
    done = json.loads((tmp_path / "n.executed.ipynb").read_text())
    assert "".join(done["cells"][1]["outputs"][0]["text"]) == "total: 1 / 2\n"
    (tmp_path / "bad.ipynb").write_text("{not json")
    r = run("execute", str(tmp_path / "bad.ipynb"))
    assert r.returncode == 2 and "not a notebook" in r.stderr


def test_a_bad_serve_flag_is_named():
    for flag in ("--k", "--max-running-requests"):
        r = run("serve", flag, "0")
        assert r.returncode == 2 and f"{flag} must be >= 1, got 0" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
