"""`specdec decode`: JSON output, --compare, and one-line errors for bad input."""

import json
import os
import subprocess
import sys

import pytest


def specdec(*args) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "specdec", *args], capture_output=True, text=True, env=env, timeout=120)


def error_line(r: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("specdec: no CUDA")]
    assert r.returncode != 0 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def test_json_output():
    r = specdec("decode", "--model", "tiny", "--method", "mtp", "--k", "2", "--max-new-tokens", "16", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    ids = out["token_ids"][0]
    assert 1 <= len(ids) <= 16 and all(isinstance(t, int) and 0 <= t < 4096 for t in ids)
    assert isinstance(out["text"][0], str) and out["text"][0]
    assert 1.0 <= out["tau"] <= 3.0
    assert len(out["acceptance_by_position"]) == 2
    assert all(0.0 <= a <= 1.0 for a in out["acceptance_by_position"])
    assert out["acceptance_by_position"][0] >= out["acceptance_by_position"][1]  # a later draft needs the earlier
    assert out["tokens_per_s"] > 0
    # 16 tokens: one from the prefill, the rest in steps of tau tokens
    assert out["steps"] == pytest.approx((len(ids) - 1) / out["tau"], abs=1.0)


def test_compare_reports_identical_output():
    r = specdec("decode", "--model", "tiny", "--method", "eagle", "--k", "3", "--max-new-tokens", "24", "--compare")
    assert r.returncode == 0, r.stderr
    assert "identical output: True" in r.stdout
    assert "speedup" in r.stdout


def test_unknown_model():
    line = error_line(specdec("decode", "--model", "no-such-zoo", "--max-new-tokens", "4"))
    assert "unknown model 'no-such-zoo'" in line


def test_k_zero():
    line = error_line(specdec("decode", "--model", "tiny", "--k", "0"))
    assert "--k must be >= 1" in line


@pytest.mark.parametrize("model", ["tiny", "target-dir"])
def test_draft_with_another_vocabulary(tmp_path, model):
    """--draft replaces the zoo's own draft, whether the model is named by zoo or by directory."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from specdec.zoo.registry import PACKAGE_DIR

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    spec = "tiny" if model == "tiny" else str(PACKAGE_DIR / "tiny" / "target")
    line = error_line(specdec("decode", "--model", spec, "--method", "draft", "--draft", str(tmp_path),
                              "--max-new-tokens", "4"))
    assert "vocabulary (100) differs from the target's (4096)" in line
