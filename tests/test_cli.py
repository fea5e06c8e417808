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
