"""A persistent cache for torch.compile, so that only a model's first start on a GPU pays for compiling.

Inductor keeps compiled graphs (its FX graph cache), Triton kernels and tuned tile sizes (its autotune cache)
on disk under TORCHINDUCTOR_CACHE_DIR, by default in /tmp, which a reboot or another user's clean-up empties.
Here they live under a per-user directory, one folder per model shape, dtype, GPU, torch version and row count: a
second start finds every kernel and tuning result there and skips inductor's minutes of work (tracing still
runs, a few seconds). No torch here, so that the command line names the folder without importing it:
cuda_graphs.use_cache points inductor at a folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

CACHE_ENV = "SPECDEC_COMPILE_DIR"  # where the per-key folders go (default ~/.cache/specdec/compile)
# What a compiled step's kernels depend on, of a model's config (names of ModelConfig / config.json)
SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "attention_bias", "tie_word_embeddings")


def cache_root() -> Path:
    """The folder of every compile cache: $SPECDEC_COMPILE_DIR, else ~/.cache/specdec/compile."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "specdec" / "compile")


def cache_key(shape: dict, dtype: str, gpu: str, torch_version: str, scope: str = "step", drafter: str = "",
              rows: int | None = None) -> str:
    """A folder name for one (model shape, dtype, GPU, torch version, compile scope, rows): readable first, then a
    digest of all of it. `shape` holds at least SHAPE_FIELDS (other keys are ignored: a name or a path does not
    change a kernel). The scope (cuda_graphs.SCOPES) compiles other graphs, so a folder warm for one is cold for
    the other (--compile auto reads a folder's presence); "step" keeps the key it had before scopes existed.
    `drafter`: what else a whole-step compile compiles (a tree's drafter, e.g. "eagle-tree7x4x16": minutes more
    than the target's steps), so that a folder warm for the chain is not taken as warm for a tree.
    `rows`: the engine's running rows (--max-running-requests, --batch). A server of 64 rows failed at start on the
    folder servers of 16 rows had written, inside a compiled step read from it (`AssertionError: expected size
    68==20`: 64 and 16 rows, each with 4 staging rows; H200, torch 2.11, benchmarks/logs/gpu_tree_sweep_step.log), so
    each row count has a folder of its own. A context length of another size read the same folder without harm
    (benchmarks/logs/gpu_compile_cache_rows.log). Why torch reused a step compiled for other rows was not found."""
    kept = {f: shape.get(f) for f in SHAPE_FIELDS}
    parts = [kept, dtype, gpu, torch_version] + ([] if scope == "step" else [scope]) + ([drafter] if drafter else [])
    parts += [] if rows is None else [f"rows{rows}"]
    text = json.dumps(parts, sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    readable = f"{gpu}-torch{torch_version}-{dtype}-L{kept['num_hidden_layers']}-H{kept['hidden_size']}"
    readable += ("" if scope == "step" else f"-{scope}") + (f"-{drafter}" if drafter else "")
    readable += "" if rows is None else f"-R{rows}"
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", readable) + "-" + digest
