"""How many tensor operations one speculative step of the EAGLE head's trees dispatches, against the chain's: on
a GPU under a CUDA graph each is a kernel of a few microseconds whatever its size, so at the zoo's size the count
is the step's cost. The zoo, CPU, eager, fp32, 2 prompts, 48 new tokens (ops counted with a TorchDispatchMode;
views included, so the count overstates the kernels, the same way for every shape); ms per step on the CPU beside it.

usage: PYTHONPATH=. python benchmarks/cpu_tree_ops.py   (log: benchmarks/logs/cpu_tree_ops.log)
"""

from __future__ import annotations

import subprocess
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specdec.decoder.engine import Engine
from specdec.zoo.evaluate import load_zoo_bundle, trained_tokenizer
from specdec.zoo.registry import PACKAGE_DIR

SHAPES = ((7, 1, 8), (7, 4, 8), (15, 1, 16), (15, 2, 16), (15, 4, 16))


class Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    torch.set_num_threads(1)
    bundle, _ = load_zoo_bundle(PACKAGE_DIR / "tiny")
    tok = trained_tokenizer(bundle.paths["target"])
    prompts = [tok.encode("def fibonacci(n):\n    if n < 2:\n").ids, tok.encode("The quick brown fox jumps over").ids]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"the zoo's EAGLE head, CPU eager fp32, {len(prompts)} prompts, 48 new tokens; code at {commit}"
          + (" + uncommitted changes" if subprocess.run(["git", "diff", "--quiet", "specdec"]).returncode else ""))
    for shape in SHAPES:
        e = Engine(bundle, "eagle", k=shape[0], topk=shape[1], num_draft_tokens=shape[2], max_batch=2, max_len=256,
                   cuda_graphs="off")
        e.generate(prompts, max_new_tokens=8)  # warm-up
        t = time.perf_counter()
        r = e.generate(prompts, max_new_tokens=48)
        dt = time.perf_counter() - t
        with Count() as c:
            e.generate(prompts, max_new_tokens=48)
        print(f"{'/'.join(map(str, shape)):>8s}: {r.steps} steps, {c.n / r.steps:6.0f} ops per step, "
              f"{dt / r.steps * 1e3:5.1f} ms per step, tau {r.stats.tau:.2f}", flush=True)


if __name__ == "__main__":
    main()
