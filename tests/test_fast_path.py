"""The fast path is the path users run: what `specdec decode` and `specdec serve` load (fused projections)."""

import argparse

import pytest
import torch

from specdec.decoder.engine import Engine
from specdec.decoder.methods import METHODS


@pytest.fixture(scope="module")
def fused_bundle():
    from specdec.zoo import load_bundle

    return load_bundle("tiny", device="cpu", dtype=torch.float32, fuse=True)


def is_fused(module: torch.nn.Module) -> bool:
    """Every attention packs q/k/v and every MLP gate/up; none keeps the separate matmuls."""
    names = {n.rsplit(".", 1)[-1] for n, _ in module.named_modules()}
    return {"qkv_proj", "gate_up_proj"} <= names and not names & {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"}


def cli_args(verb: str, *argv: str) -> argparse.Namespace:
    import importlib

    p = argparse.ArgumentParser()
    importlib.import_module(f"specdec.cli.{verb}").add_arguments(p)
    return p.parse_args(list(argv))


def test_every_part_with_layers_is_fused(fused_bundle):
    for part in ("target", "draft", "mtp", "eagle"):
        assert is_fused(getattr(fused_bundle, part)), part


@torch.no_grad()
def test_fused_logits_equal_unfused_and_transformers(tiny_bundle, fused_bundle, code_prompts):
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([code_prompts[2]])
    ours = fused_bundle.target(ids)[0]
    assert (ours - tiny_bundle.target(ids)[0]).abs().max().item() < 1e-5
    hf = AutoModelForCausalLM.from_pretrained(str(tiny_bundle.paths["target"]), dtype=torch.float32).eval()
    assert (ours - hf(ids).logits).abs().max().item() < 1e-4


@pytest.mark.parametrize("method", list(METHODS))
def test_every_proposer_decodes_the_same_tokens_fused(tiny_bundle, fused_bundle, code_prompts, method):
    """Greedy, a ragged batch: fusing changes no token of any proposer (nor its acceptance)."""
    runs = [Engine(b, method, k=3, cuda_graphs="off").generate(code_prompts, 24) for b in (tiny_bundle, fused_bundle)]
    assert runs[0].tokens == runs[1].tokens
    assert (runs[0].accepted == runs[1].accepted).all()


@pytest.mark.parametrize("verb", ["decode", "serve"])
def test_the_cli_loads_the_fused_model_unless_told_not_to(verb):
    from specdec.cli import fast

    b = fast.load(cli_args(verb), ("draft",), "cpu", torch.float32, draft=None)
    assert is_fused(b.target) and is_fused(b.draft)
    b = fast.load(cli_args(verb, "--no-fuse"), (), "cpu", torch.float32)
    assert not is_fused(b.target) and hasattr(b.target.layers[0].self_attn, "q_proj")
