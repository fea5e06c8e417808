"""`specdec zoo build`: corpus -> tokenizer -> target -> draft -> MTP layer, heads, EAGLE head -> files."""

from __future__ import annotations

import json
import platform
import shutil
import sys
import time
from pathlib import Path

import torch

from specdec.decoder.checkpoint import eagle_config, save_eagle, save_heads, save_transformer
from specdec.decoder.draft_modules import EagleHead, MTPHeads, MTPLayer
from specdec.decoder.model import ModelConfig, Transformer
from specdec.zoo.corpus import build_corpus
from specdec.zoo.recipes import Recipe
from specdec.zoo.tokenizer import BOS, EOS, PAD, save_tokenizer, train_tokenizer
from specdec.zoo.train import MixedBatches, generate_self_data, token_stream, train_draft_modules, train_lm


def target_config(recipe: Recipe) -> ModelConfig:
    """The recipe's target: a Qwen2 body (biases on q, k, v)."""
    return ModelConfig(vocab_size=recipe.vocab_size, model_type="qwen2", attention_bias=True, **recipe.target)


def draft_config(recipe: Recipe) -> ModelConfig:
    """The recipe's draft: a smaller Llama with tied embeddings."""
    return ModelConfig(vocab_size=recipe.vocab_size, model_type="llama", tie_word_embeddings=True, **recipe.draft)


def build_zoo(recipe: Recipe, out: Path, device: str = "cpu", progress: bool = True,
              steps_scale: float = 1.0) -> dict:
    """Train every part of the zoo and write it under `out` (target/, draft/, heads/, eagle/, zoo.json)."""
    t_start = time.time()
    torch.manual_seed(recipe.seed)
    out = Path(out)
    tmp = out.with_name(out.name + ".partial")  # write aside, then swap: a failed build loses nothing
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)

    def say(msg: str) -> None:
        if progress:
            print(f"[zoo {recipe.name}] {msg}", flush=True)

    corpus = build_corpus(seed=recipe.seed, max_code_bytes=recipe.max_code_bytes)
    say(f"corpus: {corpus.summary()}")
    tok = train_tokenizer(corpus.train, recipe.vocab_size)
    train = token_stream(tok, corpus.train, recipe.seed)
    heldout = token_stream(tok, corpus.heldout["code"], recipe.seed)
    say(f"tokenizer: {tok.get_vocab_size()} tokens; train {len(train):,} tokens, held-out code {len(heldout):,}")
    special = dict(bos_token_id=tok.token_to_id(BOS), eos_token_id=tok.token_to_id(EOS), pad_token_id=tok.token_to_id(PAD))

    def scaled(stage):
        return type(stage)(**{**stage.__dict__, "steps": max(1, int(stage.steps * steps_scale)),
                              "eval_every": max(1, int(stage.eval_every * steps_scale))})

    tcfg = target_config(recipe)
    tcfg.bos_token_id, tcfg.eos_token_id, tcfg.pad_token_id = special.values()
    ts = scaled(recipe.target_stage)
    target = Transformer(tcfg)
    corpus_batches = MixedBatches(train, None, ts.seq_len, 0.0, recipe.seed)
    log_t = train_lm(target, corpus_batches, heldout, ts, device, "target", recipe.seed, progress)
    say(f"target: {target.num_params():,} params, best {log_t.best}")

    # Self-distillation data: the target's own greedy continuations of corpus windows.
    t_gen = time.time()
    n_seqs = max(recipe.self_data_batch, int(recipe.self_data_seqs * steps_scale))
    generated = generate_self_data(target, train, n_seqs, ts.seq_len + 1 - recipe.self_data_new_tokens,
                                   recipe.self_data_new_tokens, recipe.self_data_batch, device, recipe.seed, progress)
    gen_info = {"sequences": len(generated), "tokens": generated.numel(), "seconds": round(time.time() - t_gen, 1)}
    say(f"self-distillation data: {gen_info}")
    mixed = MixedBatches(train, generated, ts.seq_len, recipe.generated_fraction, recipe.seed + 1)

    dcfg = draft_config(recipe)
    dcfg.bos_token_id, dcfg.eos_token_id, dcfg.pad_token_id = special.values()
    draft = Transformer(dcfg)
    log_d = train_lm(draft, mixed, heldout, scaled(recipe.draft_stage), device, "draft", recipe.seed + 1, progress,
                     teacher=target)
    say(f"draft: {draft.num_params():,} params, best {log_d.best}")

    mtp = MTPLayer(tcfg)
    heads = MTPHeads(tcfg.hidden_size, recipe.num_heads)
    eagle = EagleHead(eagle_config(tcfg, recipe.eagle_intermediate))
    log_h = train_draft_modules(target, mtp, heads, eagle, mixed, heldout, scaled(recipe.heads_stage), device,
                                recipe.seed, progress, recipe.mtp_weights)
    say(f"draft modules: best {log_h.best}")

    for sub in ("target", "draft"):
        save_tokenizer(tok, tmp / sub)
    save_transformer(tmp / "target", target.float(), mtp.float())
    save_transformer(tmp / "draft", draft.float())
    save_heads(tmp / "heads", heads.float(), {"vocab_size": tcfg.vocab_size, "base_model": "../target"})
    save_eagle(tmp / "eagle", eagle.float())
    meta = {
        "name": recipe.name,
        "recipe": recipe.name,
        "notes": recipe.notes,
        "parts": {"target": "target", "draft": "draft", "heads": "heads", "eagle": "eagle"},
        "params": {"target": target.num_params(), "mtp_layer": sum(p.numel() for p in mtp.parameters()),
                   "draft": draft.num_params(), "heads": sum(p.numel() for p in heads.parameters()),
                   "eagle": sum(p.numel() for p in eagle.parameters())},
        "corpus": corpus.summary(),
        "training": {"device": device if not device.startswith("cuda") else torch.cuda.get_device_name(),
                     "torch": torch.__version__, "python": sys.version.split()[0], "platform": platform.platform(),
                     "seconds": round(time.time() - t_start, 1), "self_distillation_data": gen_info,
                     "stages": [log.__dict__ for log in (log_t, log_d, log_h)]},
    }
    (tmp / "zoo.json").write_text(json.dumps(meta, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    say(f"wrote {out} in {meta['training']['seconds']} s")
    return meta
