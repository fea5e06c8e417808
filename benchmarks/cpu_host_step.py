"""What the engine's own Python costs per step, with the device's part taken away.

Under CUDA graphs a step is: host bookkeeping, one graph replay, one sync. The goal is the time outside the
graphs under 5% of a plain 8B step; this measures the bookkeeping alone, on the machine it runs on, by replacing
the captured step with a stub that returns its outputs at once (plain decoding of the tiny zoo, greedy).

usage: python benchmarks/cpu_host_step.py --out benchmarks/results/cpu_host_step.json
       (its log goes to benchmarks/logs/, under the same name)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec.decoder.engine import Engine, SamplingParams  # noqa: E402
from specdec.serving.measure.machine import cpu_name  # noqa: E402
from specdec.zoo import load_bundle  # noqa: E402


def host_us_per_step(bundle, batch: int, steps: int, repeats: int) -> list[float]:
    """Microseconds per engine.step with the captured step stubbed out, one figure per repeat."""
    engine = Engine(bundle, "ar", max_batch=batch, max_len=2048, cuda_graphs="emulate")
    prompt = bundle.tokenizer("import os\nimport sys\n\ndef main(")["input_ids"]
    engine.admit([prompt] * batch, SamplingParams(max_new_tokens=1500, stop_at_eos=False))
    engine.step()  # one real step: every view and buffer the engine keeps is made here
    # (the stub below never marks a row done, so the rows run on past their budget: only the host side is timed)
    host = torch.tensor([[1, -1, 0, 0]] * batch)  # the step's readout: count 1, no drafts, not done, token 0
    engine.graphs = lambda name, fn, *args, state=(), span=None: host  # the device's part, at once
    for _ in range(100):
        engine.step()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        out.append((time.perf_counter() - t0) / steps * 1e6)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--log", default=None, help="default: benchmarks/logs/, named as --out")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    bundle = load_bundle("tiny", device="cpu", dtype=torch.float32)
    root = Path(__file__).resolve().parents[1]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=root).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "specdec"], capture_output=True, text=True,
                           cwd=root).stdout.strip()  # the engine measured is the checkout's, changes included
    res = {"env": {"python": platform.python_version(), "torch": torch.__version__, "cpu": cpu_name(),
                   "load_average": os.getloadavg(), "commit": commit + ("+changes" if dirty else ""),
                   "date": time.strftime("%Y-%m-%d %H:%M:%S")}, "rows": []}
    lines = [f"cpu_host_step: {json.dumps(res['env'])}"]
    for batch in (1, 4):
        us = host_us_per_step(bundle, batch, args.steps, args.repeats)
        res["rows"].append({"batch": batch, "us_per_step": us, "best_us": min(us), "median_us": statistics.median(us)})
        lines.append(f"batch {batch}: host bookkeeping {min(us):.1f} us per step (best of {args.repeats}; median "
                     f"{statistics.median(us):.1f})")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    log = Path(args.log) if args.log else root / "benchmarks" / "logs" / out.with_suffix(".log").name
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
