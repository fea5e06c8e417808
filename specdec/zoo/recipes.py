"""Zoo recipes: model shapes and training budgets for each size."""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec.decoder.model import ModelConfig


@dataclass
class Stage:
    steps: int
    batch: int
    seq_len: int
    lr: float
    eval_every: int = 200


@dataclass
class Recipe:
    name: str
    vocab_size: int
    target: dict  # ModelConfig fields of the Qwen2 body (and of its MTP layer)
    draft: dict  # ModelConfig fields of the smaller Llama draft
    eagle_intermediate: int
    num_heads: int  # parallel MTP heads
    target_stage: Stage
    draft_stage: Stage
    heads_stage: Stage  # MTP layer, parallel heads and EAGLE head, trained together on the frozen target
    # Self-distillation: greedy continuations by the target, mixed into the drafts' training data.
    self_data_seqs: int = 8192
    self_data_new_tokens: int = 384
    self_data_batch: int = 256
    generated_fraction: float = 0.5
    # The MTP layer is trained chained over len(mtp_weights) draft steps (decode uses k = 4), step d's
    # loss weighted by mtp_weights[d - 1]: step d only counts when steps 1..d-1 were accepted, so its
    # weight falls roughly as the chance of that (0.7 per step).
    mtp_weights: tuple[float, ...] = (1.0, 0.7, 0.49, 0.343)
    max_code_bytes: int | None = None
    seed: int = 0
    notes: str = ""
    extra: dict = field(default_factory=dict)

    def target_config(self) -> ModelConfig:
        return ModelConfig(vocab_size=self.vocab_size, model_type="qwen2", attention_bias=True, **self.target)

    def draft_config(self) -> ModelConfig:
        return ModelConfig(vocab_size=self.vocab_size, model_type="llama", tie_word_embeddings=True, **self.draft)


RECIPES: dict[str, Recipe] = {
    # Shipped in the repository (<= 16 MB in bf16), trained on an H200 by benchmarks/train_zoo_gpu.sh.
    "tiny": Recipe(
        name="tiny", vocab_size=4096,
        target=dict(hidden_size=256, intermediate_size=640, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=2048, rope_theta=10000.0),
        draft=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=1, max_position_embeddings=2048, rope_theta=10000.0),
        eagle_intermediate=320, num_heads=4,
        target_stage=Stage(steps=1200, batch=64, seq_len=512, lr=2e-3, eval_every=100),
        draft_stage=Stage(steps=2500, batch=64, seq_len=512, lr=3e-3, eval_every=250),
        heads_stage=Stage(steps=2500, batch=64, seq_len=512, lr=2e-3, eval_every=250),
        notes="shipped; GPU recipe"),
    # The CPU recipe: a smaller variant that rebuilds in minutes on a laptop (2 cores: < 10 min).
    "tiny-cpu": Recipe(
        name="tiny-cpu", vocab_size=2048,
        target=dict(hidden_size=128, intermediate_size=320, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=1, max_position_embeddings=1024, rope_theta=10000.0),
        draft=dict(hidden_size=64, intermediate_size=160, num_hidden_layers=1, num_attention_heads=1,
                   num_key_value_heads=1, max_position_embeddings=1024, rope_theta=10000.0),
        eagle_intermediate=192, num_heads=4,
        target_stage=Stage(steps=500, batch=16, seq_len=256, lr=3e-3, eval_every=100),
        draft_stage=Stage(steps=250, batch=16, seq_len=256, lr=4e-3, eval_every=125),
        heads_stage=Stage(steps=350, batch=16, seq_len=256, lr=3e-3, eval_every=175),
        self_data_seqs=256, self_data_new_tokens=160, self_data_batch=64,
        max_code_bytes=3_000_000, notes="CPU recipe"),
    # The workshop size: the largest target the recipe trains in about 5 minutes on one H200.
    "small": Recipe(
        name="small", vocab_size=4096,
        target=dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                    num_key_value_heads=4, max_position_embeddings=2048, rope_theta=10000.0),
        draft=dict(hidden_size=256, intermediate_size=640, num_hidden_layers=3, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=2048, rope_theta=10000.0),
        eagle_intermediate=2048, num_heads=4,
        target_stage=Stage(steps=2500, batch=64, seq_len=512, lr=1e-3, eval_every=250),
        draft_stage=Stage(steps=1500, batch=64, seq_len=512, lr=2e-3, eval_every=250),
        heads_stage=Stage(steps=800, batch=64, seq_len=512, lr=1e-3, eval_every=200),
        self_data_seqs=4096, notes="GPU workshop size; not shipped"),
}


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise KeyError(f"unknown recipe {name!r}; choose from {', '.join(RECIPES)}")
    return RECIPES[name]
