"""What a GPU node offers and what a server needs of it: the GPUs and their free memory (nvidia-smi,
no CUDA context in this process), SGLang's optional kernels, and each server's share of a GPU.

How SGLang sizes its memory (0.5.16, model_runner's profile_max_num_token): at start a server notes
the memory free on its GPU, T; after loading its weights it keeps for its KV cache what is still free
minus T * (1 - mem_fraction_static), then caps that at --max-total-tokens. The fraction is therefore
relative to what each server saw free when it started, and a server that starts while another is
allocating sees less free than it noted and fails ("Not enough memory"; 0.5.16 on an H200, Lab 3's two
servers at 0.3: "Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.3",
benchmarks/logs/gpu_lab_servers.log). Several servers starting together on one GPU are sized by
--max-total-tokens instead (memory_plan; room.lab_servers starts fraction-sized ones one after the other).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

GIB = 1 << 30
MIB = 1 << 20
# The smallest KV cache a server is given, in tokens: SGLang 0.5.16 prefills up to 16384 tokens at once
# (max_prefill_tokens in benchmarks/logs/sglang_zoo.log).
MIN_KV_TOKENS = 16384
DEFAULT_HEADROOM = 0.2  # of the free memory, left for CUDA contexts, graphs and activations
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt")


def gib(n_bytes: float) -> str:
    return f"{n_bytes / GIB:.1f}"


def size(n_bytes: float) -> str:
    """'11 MiB', '13.5 GiB'."""
    return f"{n_bytes / MIB:.0f} MiB" if n_bytes < GIB else f"{n_bytes / GIB:.1f} GiB"


@dataclass(frozen=True)
class Gpu:
    """One GPU as nvidia-smi lists it; `uuid` (else `index`) names it in a child's CUDA_VISIBLE_DEVICES."""

    index: int
    name: str
    total_bytes: int
    free_bytes: int
    uuid: str = ""


def has_gpu_device() -> bool:
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")


def parse_gpu_query(text: str) -> list[Gpu]:
    """`nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.free --format=csv,noheader,nounits` (MiB)."""
    gpus = []
    for line in text.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 5:
            continue
        index, uuid, name, total, free = fields
        try:
            gpus.append(Gpu(int(index), name, int(float(total)) * MIB, int(float(free)) * MIB, uuid))
        except ValueError:
            continue  # "[N/A]" on some virtual GPUs
    return gpus


def visible(gpus: list[Gpu], cuda_visible_devices: str | None) -> list[Gpu]:
    """The GPUs a process may use under CUDA_VISIBLE_DEVICES (indices or UUIDs), in its order."""
    if cuda_visible_devices is None:
        return list(gpus)
    out = []
    for item in (s.strip() for s in cuda_visible_devices.split(",")):
        if not item:
            break  # CUDA stops at the first empty or invalid entry
        match = [g for g in gpus if str(g.index) == item or (g.uuid and g.uuid.startswith(item))]
        if not match:
            break
        out.append(match[0])
    return out


TORCH_QUERY = """import torch
for i in range(torch.cuda.device_count()):
    free, total = torch.cuda.mem_get_info(i)
    print(i, "", torch.cuda.get_device_name(i), total // 2**20, free // 2**20, sep=",")
"""


def query_gpus(timeout: float = 60.0) -> list[Gpu]:
    """The GPUs this process may use, with their free memory now; [] without any."""
    if not has_gpu_device() and shutil.which("nvidia-smi") is None:
        return []
    if shutil.which("nvidia-smi"):
        try:
            query = ["nvidia-smi", "--query-gpu=index,uuid,name,memory.total,memory.free", "--format=csv,noheader,nounits"]
            out = subprocess.run(query, capture_output=True, text=True, check=False, timeout=timeout)
            if out.returncode == 0:
                return visible(parse_gpu_query(out.stdout), os.environ.get("CUDA_VISIBLE_DEVICES"))
        except (OSError, subprocess.TimeoutExpired):
            pass
    # No nvidia-smi: ask torch, in a child process so that this one holds no CUDA context (a room lives
    # for hours; a context costs memory on the GPU its students share). Indices are then CUDA's own.
    try:
        out = subprocess.run([sys.executable, "-c", TORCH_QUERY], capture_output=True, text=True, check=False,
                             timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return []
    gpus = parse_gpu_query(out.stdout) if out.returncode == 0 else []
    inherited = os.environ.get("CUDA_VISIBLE_DEVICES")
    if inherited:  # a child given CUDA_VISIBLE_DEVICES=<uuid> must get this GPU, not the node's GPU of that index
        names = [s.strip() for s in inherited.split(",")]
        gpus = [Gpu(g.index, g.name, g.total_bytes, g.free_bytes, names[g.index]) for g in gpus if g.index < len(names)]
    return gpus


def parse_driver(text: str) -> tuple[str | None, str | None]:
    """(driver version, the newest CUDA the driver supports) from nvidia-smi's header."""
    driver = re.search(r"Driver Version:\s*([\d.]+)", text)
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", text)
    return (driver[1] if driver else None), (cuda[1] if cuda else None)


def driver_info(timeout: float = 60.0) -> tuple[str | None, str | None]:
    if not shutil.which("nvidia-smi"):
        return None, None
    try:
        out = subprocess.run(["nvidia-smi"], capture_output=True, text=True, check=False, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    return parse_driver(out.stdout)


def module_present(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def fa3_present() -> bool | None:
    """Whether sgl_kernel has its FA3 attention library (the offline pack strips it); None without sgl_kernel."""
    try:
        spec = importlib.util.find_spec("sgl_kernel")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    return any(Path(spec.origin).parent.rglob("flash_ops*"))


# ----- what one server needs ---------------------------------------------------------------------------
def read_config(model_dir: str | Path) -> dict:
    try:
        return json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def _dtype_bytes(config: dict) -> int:
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return 4 if dtype in ("float32", "float") else 2


def _head_dim(config: dict) -> int:
    return int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])


def kv_bytes_per_token(config: dict, layers: int | None = None) -> int:
    """Bytes of K and V one token takes in a KV cache of `layers` layers (default: the model's)."""
    if not config:
        return 0
    kv_heads = int(config.get("num_key_value_heads") or config["num_attention_heads"])
    layers = int(config["num_hidden_layers"]) if layers is None else layers
    return 2 * kv_heads * _head_dim(config) * layers * _dtype_bytes(config)


def estimated_parameters(config: dict) -> int:
    """A Llama/Qwen2-shaped model's parameter count from config.json (for directories without weights)."""
    h, layers, vocab = int(config["hidden_size"]), int(config["num_hidden_layers"]), int(config["vocab_size"])
    heads = int(config["num_attention_heads"])
    kv_heads, hd = int(config.get("num_key_value_heads") or heads), _head_dim(config)
    attention = 2 * h * heads * hd + 2 * h * kv_heads * hd
    mlp = 3 * h * int(config.get("intermediate_size") or 4 * h)
    embeddings = vocab * h * (1 if config.get("tie_word_embeddings") else 2)
    return embeddings + layers * (attention + mlp)


def weights_bytes(model_dir: str | Path) -> int:
    """The weight files' size on disk (an upper bound when stored in float32), or the estimate from config.json."""
    d = Path(model_dir)
    files = {f for pattern in WEIGHT_FILES for f in d.glob(pattern)}
    if files:
        return sum(f.stat().st_size for f in files)
    config = read_config(d)
    try:
        return estimated_parameters(config) * _dtype_bytes(config)
    except (KeyError, TypeError, ValueError):
        return 0


@dataclass(frozen=True)
class ServerNeeds:
    """What one server holds for good: its weights, and per token of KV cache (target and draft caches)."""

    weights_bytes: int
    kv_bytes_per_token: int


def server_needs(target_dir: str | Path, algorithm: str = "none", draft_dir: str | Path | None = None) -> ServerNeeds:
    """A SGLang server's weights and KV bytes per token; the draft's cache holds as many tokens as the target's."""
    config = read_config(target_dir)
    weights, kv = weights_bytes(target_dir), kv_bytes_per_token(config)
    if algorithm == "NEXTN" and config:
        kv += kv_bytes_per_token(config, int(config.get("num_nextn_predict_layers") or 1))
    elif draft_dir and algorithm in ("EAGLE", "EAGLE3", "STANDALONE"):
        weights += weights_bytes(draft_dir)
        kv += kv_bytes_per_token(read_config(draft_dir))
    return ServerNeeds(weights, kv)


class MemoryPlanError(ValueError):
    """The servers do not fit the GPU (one line)."""


@dataclass(frozen=True)
class MemoryPlan:
    """How `servers` SGLang servers share a GPU with `free_bytes` free."""

    free_bytes: int
    servers: int
    headroom: float
    share_bytes: int  # each server's weights and KV caches
    max_total_tokens: int  # --max-total-tokens: each server's KV cache, in tokens
    mem_fraction_static: float  # --mem-fraction-static

    def describe(self) -> str:
        return (f"{self.servers} server(s) on {size(self.free_bytes)} free: {size(self.share_bytes)} each "
                f"({self.max_total_tokens} KV tokens), {self.headroom:.0%} left for contexts, graphs and activations")


def memory_plan(free_bytes: int, servers: int, needs: ServerNeeds, headroom: float = DEFAULT_HEADROOM) -> MemoryPlan:
    """Each server's share of a GPU, whatever order the servers start in.

    A share is (1 - headroom) * free / servers, and a server's KV cache is its share less its weights
    (--max-total-tokens). --mem-fraction-static is 1 - headroom for every server: in the worst order a
    server notes T = free before any other allocates, and finds the others' shares gone before it
    sizes its cache; it then keeps free - others - weights - T * headroom, which is its own share
    because the shares add up to (1 - headroom) * free. (A fraction of 1/servers would fail there.)
    """
    if not 0 < headroom < 1:
        raise MemoryPlanError(f"headroom must be in (0, 1), got {headroom}")
    if servers < 1:
        raise MemoryPlanError(f"servers must be >= 1, got {servers}")
    share = int(free_bytes * (1 - headroom) / servers)
    per_token = max(needs.kv_bytes_per_token, 1)
    tokens = (share - needs.weights_bytes) // per_token
    if tokens < MIN_KV_TOKENS:
        need = needs.weights_bytes + MIN_KV_TOKENS * per_token
        fit = max(0, math.floor(free_bytes * (1 - headroom) / need))
        raise MemoryPlanError(
            f"{servers} server(s) do not fit {size(free_bytes)} free: each gets {size(share)}, and needs "
            f"{size(needs.weights_bytes)} of weights plus a KV cache of {MIN_KV_TOKENS} tokens "
            f"({size(MIN_KV_TOKENS * per_token)}); {fit} fit: fewer students per GPU, more GPUs, or a smaller model")
    return MemoryPlan(free_bytes, servers, headroom, share, int(tokens), round(1 - headroom, 3))


__all__ = [
    "DEFAULT_HEADROOM",
    "GIB",
    "MIN_KV_TOKENS",
    "Gpu",
    "MemoryPlan",
    "MemoryPlanError",
    "ServerNeeds",
    "driver_info",
    "fa3_present",
    "gib",
    "has_gpu_device",
    "kv_bytes_per_token",
    "memory_plan",
    "module_present",
    "parse_driver",
    "parse_gpu_query",
    "query_gpus",
    "read_config",
    "server_needs",
    "size",
    "visible",
    "weights_bytes",
]
