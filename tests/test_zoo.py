"""The shipped zoo: loads offline in transformers and in specdec, matches SGLang's layouts, stays
small; training lowers the loss; the corpus is deterministic; damaged zoos give clear errors."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from specdec.zoo.registry import PACKAGE_DIR

ZOO = PACKAGE_DIR / "tiny"
TOL = 1e-4
MTP_OWN = {"input_proj.weight", "token_layernorm.weight", "hidden_layernorm.weight", "final_layernorm.weight"}


def tensors(d: Path) -> dict[str, tuple]:
    with safe_open(str(d / "model.safetensors"), framework="pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


def config(d: Path) -> dict:
    return json.loads((d / "config.json").read_text())


# -- loading ------------------------------------------------------------------------------------
@pytest.mark.parametrize("part", ["target", "draft"])
@torch.no_grad()
def test_transformers_logits_equal_ours(tiny_bundle, code_prompts, part):
    hf = AutoModelForCausalLM.from_pretrained(str(ZOO / part), dtype=torch.float32, local_files_only=True).eval()
    ours = tiny_bundle.target if part == "target" else tiny_bundle.draft
    ids = torch.tensor([code_prompts[2]])
    assert (hf(ids).logits - ours(ids)[0]).abs().max().item() < TOL


@pytest.mark.parametrize("part", ["target", "draft"])
def test_autotokenizer_has_special_tokens(part):
    tok = AutoTokenizer.from_pretrained(str(ZOO / part), local_files_only=True)
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<|bos|>", "<|endoftext|>", "<|pad|>")
    assert None not in (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    assert tok.eos_token_id == config(ZOO / part)["eos_token_id"]


def test_project_tokenizer_encodes_as_trained():
    """specdec's loader must encode exactly as tokenizer.json (the tokenizer the zoo was trained with)."""
    from tokenizers import Tokenizer

    from specdec.decoder.bundle import load_tokenizer

    text = "def f(x):\n    return [1, 22, 333]  # Monday, Tuesday\n"
    raw = Tokenizer.from_file(str(ZOO / "target" / "tokenizer.json")).encode(text).ids
    for part in ("target", "draft"):
        assert load_tokenizer(ZOO / part)(text)["input_ids"] == raw, part


def test_own_loaders_load_every_part(tiny_bundle):
    b = tiny_bundle
    assert None not in (b.mtp, b.heads, b.eagle, b.draft)
    assert b.heads.num_heads >= 4
    assert b.draft.config.vocab_size == b.target.config.vocab_size
    assert b.eagle.config.hidden_size == b.mtp.config.hidden_size == b.target.config.hidden_size


# -- layouts ------------------------------------------------------------------------------------
def test_eagle_matches_sglang_llama_eagle_layout():
    cfg, t = config(ZOO / "eagle"), tensors(ZOO / "eagle")
    H = config(ZOO / "target")["hidden_size"]
    assert cfg["architectures"] == ["LlamaForCausalLMEagle"] and cfg["num_hidden_layers"] == 1
    assert cfg["hidden_size"] == H
    assert AutoConfig.from_pretrained(str(ZOO / "eagle"), local_files_only=True).model_type == "llama"
    assert t["fc.weight"] == (H, 2 * H) and t["fc.bias"] == (H,)
    assert not any(k.startswith("model.") or "embed_tokens" in k or "lm_head" in k for k in t)
    assert all(k.startswith(("fc.", "layers.0.")) for k in t)
    assert "layers.0.input_layernorm.weight" not in t
    hd, nh, nkv, inter = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["intermediate_size"]
    expect = {"self_attn.q_proj.weight": (nh * hd, H), "self_attn.k_proj.weight": (nkv * hd, H),
              "self_attn.v_proj.weight": (nkv * hd, H), "self_attn.o_proj.weight": (H, nh * hd),
              "mlp.gate_proj.weight": (inter, H), "mlp.up_proj.weight": (inter, H), "mlp.down_proj.weight": (H, inter),
              "post_attention_layernorm.weight": (H,)}
    assert {k[len("layers.0."):]: v for k, v in t.items() if k.startswith("layers.0.")} == expect


def test_target_matches_mimo_layout():
    cfg, t = config(ZOO / "target"), tensors(ZOO / "target")
    H = cfg["hidden_size"]
    assert cfg["model_type"] == "qwen2" and cfg["architectures"] == ["MiMoForCausalLM"]
    assert cfg["num_nextn_predict_layers"] == 1
    mtp = {k[len("model.mtp_layers.0."):]: v for k, v in t.items() if k.startswith("model.mtp_layers.0.")}
    assert mtp["input_proj.weight"] == (H, 2 * H)
    assert all(mtp[k] == (H,) for k in MTP_OWN - {"input_proj.weight"})
    assert "input_proj.bias" not in mtp
    body = {k[len("model.layers.0."):]: v for k, v in t.items() if k.startswith("model.layers.0.")}
    assert {k: v for k, v in mtp.items() if k not in MTP_OWN} == body
    assert not any(k.startswith("model.mtp_layers.") and not k.startswith("model.mtp_layers.0.") for k in t)


def test_zoo_fits_the_size_budget():
    total = sum(f.stat().st_size for f in ZOO.rglob("*") if f.is_file())
    assert total <= 16_000_000, f"{total:,} bytes"


# -- training and corpus ------------------------------------------------------------------------
def test_short_cpu_training_lowers_the_loss():
    from specdec.decoder.model import ModelConfig, Transformer
    from specdec.zoo.recipes import Stage
    from specdec.zoo.train import eval_lm, sample_batch, train_lm

    torch.manual_seed(0)
    # A periodic stream: easy to learn in a few steps, so a broken loop shows.
    stream = torch.arange(200).remainder(17).repeat(20) + 3
    model = Transformer(ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64))
    windows = sample_batch(stream, 8, 32, torch.Generator().manual_seed(1))
    before = eval_lm(model, windows, "cpu")
    gen = torch.Generator().manual_seed(0)
    log = train_lm(model, lambda n: sample_batch(stream, n, 32, gen), stream, Stage(steps=40, batch=8, seq_len=32, lr=1e-2,
                   eval_every=20), "cpu", "test", progress=False)
    after = eval_lm(model, windows, "cpu")
    assert after < before - 1.0, (before, after)
    assert log.best["heldout_loss"] < before


def test_corpus_is_deterministic():
    from specdec.zoo.corpus import build_corpus, is_heldout

    a, b = build_corpus(seed=0), build_corpus(seed=0)
    assert a.modules == b.modules and a.train == b.train and a.heldout == b.heldout
    assert a.modules == sorted(a.modules)
    # the split hashes names: the same on every machine and Python version
    assert is_heldout("codeop.py") and is_heldout("reprlib.py") and not is_heldout("os.py")
    assert all(len(a.heldout[c]) > 0 for c in ("predictable", "code", "open-ended"))


def test_grounded_prompts_hold_their_continuation():
    """Lab 2's input-grounded category: deterministic, from held-out code only, the prompt ending in the edit
    marker and the passage's first lines, and the continuation (the rest of the passage) already in the prompt."""
    import random

    from specdec.zoo.corpus import EDIT_MARKER, PROMPT_CATEGORIES, build_corpus, grounded_example, grounded_prompts

    corpus = build_corpus(seed=0)
    pairs = grounded_prompts(corpus, n=4)
    assert pairs == grounded_prompts(build_corpus(seed=0), n=4) and len(pairs) == 4
    assert pairs != grounded_prompts(corpus, n=4, seed=1)
    assert PROMPT_CATEGORIES == ("predictable", "code", "open-ended", "grounded")
    for prompt, continuation in pairs:
        passage, _, again = prompt.partition(EDIT_MARKER)
        assert again and passage.startswith(again) and passage.endswith(continuation.rstrip("\n"))
        assert continuation.strip() and continuation.rstrip("\n") in prompt  # the answer is in the input
        assert again.count("\n") == 2 and len(passage.splitlines()) == 12
        assert any(passage in doc for doc in corpus.heldout["code"])  # held-out text, never trained on
        assert not any(passage in doc for doc in corpus.train)
    assert grounded_example("a\n\nb\n" * 10, random.Random(0)) is None  # no passage without blank lines


# -- damaged zoos -------------------------------------------------------------------------------
def specdec(*args, zoo_dir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPECDEC_ZOO_DIR": str(zoo_dir), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "specdec", *args], capture_output=True, text=True, env=env, timeout=120)


def error_line(r: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("specdec: no CUDA")]
    assert r.returncode != 0 and len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


@pytest.fixture
def broken_zoo(tmp_path):
    shutil.copytree(ZOO, tmp_path / "broken")
    return tmp_path


def test_missing_file_names_it_and_the_rebuild_command(broken_zoo):
    missing = broken_zoo / "broken" / "draft" / "model.safetensors"
    missing.unlink()
    for args in (["zoo", "info", "broken"], ["decode", "--model", "broken", "--max-new-tokens", "4"]):
        line = error_line(specdec(*args, zoo_dir=broken_zoo))
        assert str(missing) in line and "specdec zoo build" in line, line


def test_truncated_weights_name_the_file_and_the_rebuild_command(broken_zoo):
    f = broken_zoo / "broken" / "target" / "model.safetensors"
    f.write_bytes(f.read_bytes()[:1000])
    line = error_line(specdec("decode", "--model", "broken", "--max-new-tokens", "4", zoo_dir=broken_zoo))
    assert str(f) in line and "specdec zoo build" in line, line


def test_corrupted_zoo_json_names_it(broken_zoo):
    f = broken_zoo / "broken" / "zoo.json"
    f.write_text("{ not json")
    line = error_line(specdec("zoo", "info", "broken", zoo_dir=broken_zoo))
    assert str(f) in line and "specdec zoo build" in line, line


# -- zoo info -----------------------------------------------------------------------------------
def test_info_report_lists_parts_sizes_and_figures():
    from specdec.zoo.report import format_info, zoo_info

    info = zoo_info(ZOO)
    text = format_info(info)
    for part, d in info["parts"].items():
        assert d["path"] in text and f"{d['bytes']:,}" in text
    assert f"{info['total_bytes']:,}" in text
    if info.get("figures"):
        assert "tau = tokens per verify step" in text and "What the zoo was built to reach" in text
    else:
        assert "specdec zoo eval tiny --write" in text
    bare = format_info({k: v for k, v in info.items() if k != "figures"})
    assert "not measured yet" in bare and "specdec zoo eval tiny --write" in bare


def test_eval_writes_figures_and_keeps_the_other_keys(tmp_path, capsys):
    """A tiny `specdec zoo eval --write` on a copy: figures land in zoo.json beside the old keys."""
    from specdec.zoo.evaluate import METHODS, evaluate_zoo
    from specdec.zoo.report import format_info, zoo_info

    root = tmp_path / "copy"
    shutil.copytree(ZOO, root)
    before = json.loads((root / "zoo.json").read_text())
    fig = evaluate_zoo(root, prompts=2, new_tokens=8, write=True, loss_windows_per_category=4)
    after = json.loads((root / "zoo.json").read_text())
    assert {k: v for k, v in after.items() if k != "figures"} == {k: v for k, v in before.items() if k != "figures"}
    assert after["figures"]["acceptance"] == fig["acceptance"]
    for m in METHODS:
        for c in ("predictable", "code", "open-ended"):
            rows = fig["acceptance"][m][c]
            assert [r["k"] for r in rows] == [1, 2, 3, 4]
            assert all(r["identical_to_plain"] and 1.0 <= r["tau"] <= r["k"] + 1 for r in rows), (m, c)
    assert all(v["loss"] > 0 and v["windows"] == 4 for part in fig["heldout_loss"].values() for v in part.values())
    assert len(fig["goals"]) == 2 + 1 + len(METHODS)
    assert "What the zoo was built to reach" in capsys.readouterr().out
    assert "tau = tokens per verify step" in format_info(zoo_info(root))


# -- the MTP layer trained as decoding chains it ----------------------------------------------------
@torch.no_grad()
def test_unrolled_mtp_training_matches_the_cached_decode_chain():
    """Step d of the training forward at position a + d - 1 equals the layer run as a decode runs it:
    its KV cache extended over positions 0..a with target states, then one draft step at a time fed
    its own output state (and the token that follows, as when the earlier drafts were accepted)."""
    from specdec.decoder.draft_modules import MTPLayer
    from specdec.decoder.kv_cache import KVCache
    from specdec.decoder.model import ModelConfig
    from specdec.zoo.train import mtp_unrolled

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, attention_bias=True)
    mtp, embed = MTPLayer(cfg).eval(), torch.nn.Embedding(50, 32)
    B, T, depths = 2, 12, 4
    hidden, next_ids = torch.randn(B, T, 32), torch.randint(0, 50, (B, T))
    states = mtp_unrolled(mtp, hidden, next_ids, embed, depths)
    assert len(states) == depths and all(g.shape == (B, T, 32) for g in states)
    for a in range(T - depths + 1):
        cache = KVCache.for_model(mtp, B, T)
        g = mtp(hidden[:, :a + 1], next_ids[:, :a + 1], torch.arange(a + 1).expand(B, a + 1), embed, cache)[:, -1:]
        assert torch.allclose(g[:, 0], states[0][:, a], atol=1e-5)
        for d in range(2, depths + 1):
            p = a + d - 1
            g = mtp(g, next_ids[:, p:p + 1], torch.full((B, 1), p), embed, cache)
            assert torch.allclose(g[:, 0], states[d - 1][:, p], atol=1e-5), (a, d)
    # Not the same as feeding every step the target's state: the chain really reads its own output.
    plain = mtp(hidden, next_ids, torch.arange(T).expand(B, T), embed)
    assert torch.allclose(plain, states[0], atol=1e-5) and not torch.allclose(plain[:, 1:], states[1][:, 1:], atol=1e-3)


def test_unrolled_mtp_losses_train_every_step():
    from specdec.decoder.draft_modules import MTPLayer
    from specdec.decoder.model import ModelConfig, Transformer
    from specdec.zoo.train import draft_losses

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=64)
    target, mtp = Transformer(cfg).eval().requires_grad_(False), MTPLayer(cfg)
    x = torch.randint(0, 40, (2, 17))
    losses, agree = draft_losses(target, mtp, None, None, x, (1.0, 0.5, 0.25))
    assert set(losses) == {"mtp"} and set(agree) == {"mtp", "mtp2", "mtp3"}
    losses["mtp"].backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in mtp.parameters())
    # the deeper steps add their losses to step 1's
    step1, _ = draft_losses(target, mtp, None, None, x, (1.0,))
    assert step1["mtp"].item() < losses["mtp"].item()


def test_chained_soft_ce_against_a_hand_computation():
    """Two steps over B=1, T=3, V=2: step 1 counts positions 0..2, step 2 only 1..2 (no chain anchored at -1)."""
    import math

    from specdec.decoder.draft_modules import chained_soft_ce, soft_ce

    step1 = torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0], [0.0, math.log(3.0)]]])  # q = (1/2, 1/2), (3/4, 1/4), (1/4, 3/4)
    step2 = torch.tensor([[[5.0, -5.0], [0.0, 0.0], [math.log(3.0), 0.0]]])  # position 0 must not count
    teacher = torch.tensor([[[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]]])
    ce1 = [-math.log(1 / 2), -(0.5 * math.log(3 / 4) + 0.5 * math.log(1 / 4)), -math.log(3 / 4)]
    ce2 = [-(0.5 * math.log(1 / 2) + 0.5 * math.log(1 / 2)), -math.log(1 / 4)]
    want = 1.0 * sum(ce1) / 3 + 0.7 * sum(ce2) / 2
    assert chained_soft_ce([step1, step2], teacher, [1.0, 0.7]).item() == pytest.approx(want, rel=1e-6)
    assert soft_ce(step1, teacher).item() == pytest.approx(sum(ce1) / 3, rel=1e-6)
    with pytest.raises(ValueError, match="2 depths of logits but 1 weights"):
        chained_soft_ce([step1, step2], teacher, [1.0])


def test_zoo_training_uses_the_library_loss():
    """One implementation per rule: train.py's MTP loss is chained_soft_ce over the unrolled steps, the same
    number as the loss written out step by step (as train.py computed it before the loss moved to the library)."""
    from specdec.decoder import draft_modules
    from specdec.decoder.draft_modules import MTPLayer, soft_ce
    from specdec.decoder.model import ModelConfig, Transformer
    from specdec.zoo import train
    from specdec.zoo.train import draft_losses, mtp_unrolled

    assert train.soft_ce is draft_modules.soft_ce and train.chained_soft_ce is draft_modules.chained_soft_ce
    torch.manual_seed(1)
    cfg = ModelConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=64)
    target, mtp = Transformer(cfg).eval().requires_grad_(False), MTPLayer(cfg)
    x, weights = torch.randint(0, 40, (2, 13)), (1.0, 0.7, 0.49)
    losses, _ = draft_losses(target, mtp, None, None, x, weights)
    ids = x[:, :-1]
    t_logits, h = target(ids)
    teacher = t_logits.softmax(-1)[:, 1:]
    states = mtp_unrolled(mtp, h[:, :-1], ids[:, 1:], target.embed_tokens, len(weights))
    by_hand = sum(w * soft_ce(target.lm_head(g[:, d - 1:]), teacher[:, d - 1:]) for d, (g, w) in enumerate(zip(states, weights), 1))
    assert losses["mtp"].item() == pytest.approx(by_hand.item(), rel=1e-6)


def test_chain_acceptance_counts_whole_chains():
    """Position d counts an anchor only when drafts 1..d all equal the target's greedy tokens (a hand loop)."""
    from specdec.decoder.draft_modules import MTPLayer
    from specdec.decoder.model import ModelConfig, Transformer
    from specdec.zoo.train import chain_acceptance, mtp_unrolled

    torch.manual_seed(2)
    cfg = ModelConfig(vocab_size=6, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=64)
    target, mtp = Transformer(cfg).eval(), MTPLayer(cfg).eval()
    rows, first, depths = torch.randint(0, 6, (3, 20)), 4, 3
    got = chain_acceptance(target, mtp, rows, first, depths, "cpu")
    with torch.no_grad():
        t_logits, h = target(rows)
        states = mtp_unrolled(mtp, h[:, :-1], rows[:, 1:], target.embed_tokens, depths)
        hits, n = [0] * depths, 0
        for b in range(3):
            for a in range(first, rows.shape[1] - 1 - depths):
                n += 1
                for d in range(1, depths + 1):
                    if target.lm_head(states[d - 1][b, a + d - 1]).argmax() != t_logits[b, a + d].argmax():
                        break
                    hits[d - 1] += 1
    assert got == [round(x / n, 4) for x in hits]
    assert all(x >= y for x, y in zip(got, got[1:]))
