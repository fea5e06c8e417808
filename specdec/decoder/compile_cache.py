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


# --- tile sizes pinned per GPU kind (issue 21: the same step compiled twice on an H200 ran 4.34 and 4.58 ms) ----------
# Inductor tunes each Triton kernel's tile sizes by timing candidates (coordinate descent), and timings are noisy: two
# compiles of one step differ by a few percent. The tile sizes of the fastest compile measured on a GPU kind are
# committed under tuned/ (benchmarks/gpu_pin_configs.py writes them) and written into a compile cache before its
# first compile: a kernel compiled from the same source (same torch, Triton and GPU kind) then takes them instead of
# tuning its own. They are inductor's own autotune cache entries (`*.best_config`), by path inside the cache folder.
TUNED_ENV = "SPECDEC_TUNED"  # "off": compile without them (to measure against them, or to pin new ones)
TUNED_DIR = Path(__file__).resolve().parent / "tuned"


def tuned_name(gpu: str, torch_version: str, triton_version: str) -> str:
    """The file of one GPU kind's pinned tile sizes, for one torch and Triton (kernel sources differ by each). Letters,
    digits, dots and dashes only: the device machines return no file whose name has a '+' (torch's "+cu130")."""
    return re.sub(r"[^A-Za-z0-9.-]+", "_", f"{gpu}-torch{torch_version}-triton{triton_version}") + ".json"


def collect_tuned(cache_dir: Path) -> dict[str, dict]:
    """Every tile size that autotuning chose under `cache_dir` (its .best_config files), by path inside the folder;
    the tuning's own duration left out."""
    cache_dir = Path(cache_dir)
    found = {}
    for f in sorted(cache_dir.rglob("*.best_config")):
        config = json.loads(f.read_text())
        config.pop("time_taken_ms", None)
        found[f.relative_to(cache_dir).as_posix()] = config
    return found


def install_tuned(cache_dir: Path, configs: dict[str, dict]) -> int:
    """Write `configs` (collect_tuned's form) into `cache_dir`, over what a local tuning left there: a kernel of the
    same source then reads these tile sizes. Returns how many files were written (0 when all were in place)."""
    cache_dir, written = Path(cache_dir), 0
    for rel, config in configs.items():
        parts = Path(rel).parts
        if Path(rel).is_absolute() or ".." in parts or not rel.endswith(".best_config"):
            raise ValueError(f"not a path inside a compile cache: {rel!r}")
        path, text = cache_dir.joinpath(*parts), json.dumps(config, sort_keys=True)
        if not (path.is_file() and path.read_text() == text):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written += 1
    return written


def pinned_tuned(gpu: str, torch_version: str, triton_version: str, folder: Path | None = None) -> dict[str, dict]:
    """The tile sizes committed for this GPU kind, torch and Triton ({} where none are, or $SPECDEC_TUNED=off)."""
    if os.environ.get(TUNED_ENV, "").lower() == "off":
        return {}
    f = Path(folder or TUNED_DIR) / tuned_name(gpu, torch_version, triton_version)
    return json.loads(f.read_text())["configs"] if f.is_file() else {}
