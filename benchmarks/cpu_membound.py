"""CPU: the oracle proposer on a target too big for the CPU's caches, measured beside Lab 1's prediction.

A random-weight Llama-shaped target (specdec.decoder.roofline.MEMORY_BOUND, about 430 MB in fp32) decodes
one prompt plainly and with the oracle at alpha 0.8, k 4 (greedy, batch 1), interleaved; the prediction
is Lab 1's speedup_from_costs from the step costs measured in the same runs. The tiny zoo's target runs
the same way as the control: a target that fits in the caches.

usage: .venv/bin/python benchmarks/cpu_membound.py [--threads 1] [--new-tokens 128] [--repeats 5] --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from specdec.decoder.roofline import memory_bound_run, oracle_run
from specdec.serving.measure.machine import machine
from specdec.zoo import load_bundle


def progress(name: str):
    return lambda step: print(f"[{name}] {step}", file=sys.stderr, flush=True)


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    kw = dict(alpha=args.alpha, k=args.k, new_tokens=args.new_tokens, repeats=args.repeats)
    load_before, t0 = os.getloadavg(), time.perf_counter()
    big = memory_bound_run(progress=progress("memory-bound"), **kw)
    tiny = oracle_run(load_bundle("tiny", device="cpu", dtype=torch.float32).target, "the tiny zoo's target",
                      progress=progress("tiny zoo"), **kw)
    for name, r in (("memory-bound target", big), ("control, the tiny zoo's target", tiny)):
        print(f"== {name} ({r.seconds:.1f} s, load average {r.load_average[0]:.2f}) ==", *r.lines(), sep="\n")
    return {**machine(torch.get_num_threads(), torch=torch.__version__),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()], "seconds": round(time.perf_counter() - t0, 1),
            "command": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
            "memory_bound": big.as_dict(), "tiny_zoo_target": tiny.as_dict()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5, help="plain and oracle runs each, interleaved")
    p.add_argument("--alpha", type=float, default=0.8)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    out = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"{out['cpu']}, {args.threads} thread(s), torch {out['torch']}; load average {out['load_average_before'][0]} "
          f"before, {out['load_average_after'][0]} after; {out['seconds']} s in all; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
