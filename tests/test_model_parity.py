"""Our model against transformers on the same weights (fp32): prefill and token-by-token decode."""

import tempfile

import pytest
import torch

from specdec.decoder.checkpoint import load_transformer
from specdec.decoder.kv_cache import KVCache

TOL = 1e-4


@pytest.fixture(scope="module")
def hf_tiny(tiny_bundle):
    from transformers import AutoModelForCausalLM  # imported here: at collection, every worker would pay its seconds

    return AutoModelForCausalLM.from_pretrained(str(tiny_bundle.paths["target"]), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def llama_pair():
    """A random Llama with GQA and Llama 3 RoPE scaling, saved and loaded back by us."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=257, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512,
                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                      rope_theta=50000.0, tie_word_embeddings=True)
    hf = LlamaForCausalLM(cfg).eval()
    d = tempfile.mkdtemp()
    hf.save_pretrained(d)
    ours, _ = load_transformer(d)
    return hf, ours


def decode_logits(model, ids):
    """Prefill half, then one token at a time through the KV cache: [1, T, V]."""
    T = ids.shape[1]
    cache = KVCache.for_model(model, 1, T + 4)
    half = T // 2
    out = [model(ids[:, :half], cache.positions(half), cache)[0]]
    cache.commit(half)
    for t in range(half, T):
        out.append(model(ids[:, t:t + 1], cache.positions(1), cache)[0])
        cache.commit(1)
    return torch.cat(out, 1)


def test_tiny_target_loads_in_transformers_as_qwen2(hf_tiny):
    assert type(hf_tiny).__name__ == "Qwen2ForCausalLM"


@torch.no_grad()
def test_prefill_and_decode_match_transformers_batch1(tiny_bundle, hf_tiny, code_prompts):
    ids = torch.tensor([code_prompts[2]])
    ref = hf_tiny(ids).logits
    ours = tiny_bundle.target(ids)[0]
    assert (ours - ref).abs().max().item() < TOL
    assert (decode_logits(tiny_bundle.target, ids) - ref).abs().max().item() < TOL


@torch.no_grad()
def test_ragged_batch4_matches_transformers_row_by_row(tiny_bundle, hf_tiny, code_prompts):
    """Four prompts of different lengths in one batch, each row at its own positions."""
    model = tiny_bundle.target
    B, W = len(code_prompts), max(map(len, code_prompts))
    lens = torch.tensor([len(p) for p in code_prompts])
    assert len(set(lens.tolist())) == B
    ids = torch.zeros(B, W, dtype=torch.long)
    for b, p in enumerate(code_prompts):
        ids[b, : len(p)] = torch.tensor(p)
    cache = KVCache.for_model(model, B, W + 8)
    logits, _ = model(ids, torch.arange(W).expand(B, W), cache)
    cache.commit(lens)
    nxt = torch.tensor([3, 5, 7, 11])  # then decode one more token per row, each at its own position
    step, _ = model(nxt.unsqueeze(1), cache.positions(1), cache)
    for b, p in enumerate(code_prompts):
        ref = hf_tiny(torch.tensor([p + [int(nxt[b])]])).logits[0]
        assert (logits[b, : len(p)] - ref[:-1]).abs().max().item() < TOL
        assert (step[b, 0] - ref[-1]).abs().max().item() < TOL


@torch.no_grad()
def test_llama_gqa_rope_scaling_matches_transformers(llama_pair):
    hf, ours = llama_pair
    ids = torch.randint(0, 257, (2, 150))  # past the original 64 positions, where llama3 scaling acts
    ref = hf(ids).logits
    assert (ours(ids)[0] - ref).abs().max().item() < TOL
    assert (decode_logits(ours, ids[:1]) - ref[:1]).abs().max().item() < TOL


def test_unsupported_config_is_a_clear_error(tmp_path):
    from specdec.decoder.model import ModelConfig

    with pytest.raises(ValueError, match="unsupported model_type"):
        ModelConfig.from_hf({"model_type": "gpt2"})
    with pytest.raises(ValueError, match="unsupported rope type"):
        ModelConfig.from_hf({"model_type": "llama", "hidden_size": 8, "num_attention_heads": 2,
                             "num_key_value_heads": 1, "rope_scaling": {"rope_type": "yarn"}})


def test_a_config_our_model_cannot_run_is_a_one_line_error():
    from specdec.decoder.model import ModelConfig, Transformer

    with pytest.raises(ValueError, match="head_dim must be even"):
        Transformer(ModelConfig(hidden_size=30, num_attention_heads=2, num_key_value_heads=1))
    with pytest.raises(ValueError, match="head_dim must be even"):
        ModelConfig.from_hf({"model_type": "llama", "hidden_size": 30, "num_attention_heads": 2, "num_key_value_heads": 1})


def test_a_missing_untied_lm_head_is_an_error_not_the_embedding(tmp_path, tiny_bundle):
    """An untied checkpoint without lm_head.weight must not silently decode with the embedding."""
    from safetensors.torch import load_file, save_file

    from specdec.decoder.checkpoint import CheckpointError, load_transformer

    src = tiny_bundle.paths["target"]
    (tmp_path / "config.json").write_text((src / "config.json").read_text())
    sd = load_file(str(src / "model.safetensors"))
    sd.pop("lm_head.weight")
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="missing tensor lm_head.weight"):
        load_transformer(tmp_path)


@torch.no_grad()
def test_fused_projections_give_the_same_logits(tiny_bundle, code_prompts):
    """The GPU path packs q/k/v and gate/up into single matmuls; the numbers must not change."""
    import copy

    from specdec.decoder.model import fuse_projections

    ids = torch.tensor([code_prompts[0]])
    fused = fuse_projections(copy.deepcopy(tiny_bundle.target))
    assert hasattr(fused.layers[0].self_attn, "qkv_proj") and not hasattr(fused.layers[0].self_attn, "q_proj")
    assert (fused(ids)[0] - tiny_bundle.target(ids)[0]).abs().max().item() < 1e-5
