"""What a compile scope costs to start, on the CPU: `Engine(compile="step")` traces the whole step (every layer
inlined) per capture, `compile="layers"` one decoder layer for all layers and the LM head (regional compilation,
specdec/decoder/regions.py). Random weights in the zoo's tiny layer shape with L layers, plain greedy decoding,
one row, emulated graphs (the CPU twin of CUDA graphs), inductor's C++ backend; each (L, scope) a process of its
own with an empty inductor cache:
  cold   the first 12 tokens: the prefill and one captured step, compiled from nothing
  warm   the same again after dynamo forgets its traces (torch._dynamo.reset): traced again, inductor's kernels
         read from its cache, as a later process start reads the persistent compile cache
with the number of graphs dynamo traced, and whether the tokens are eager decoding's. A GPU's inductor compiles
Triton kernels and tunes them instead (benchmarks/gpu_fast_path.py measures that); what this shows is how each
scope's start grows with the number of layers.

usage: python benchmarks/cpu_regional_compile.py --out benchmarks/results/cpu_regional_compile.json
       [--layers 4,16] [--backend inductor|eager]   (its log goes to benchmarks/logs/, under the same name)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SCOPES = ("step", "layers")


def one(layers: int, scope: str, backend: str) -> dict:
    """One measurement, in this process (run with an empty TORCHINDUCTOR_CACHE_DIR)."""
    import torch
    import torch._dynamo
    from torch._dynamo.backends.registry import lookup_backend

    from specdec.decoder.bundle import ModelBundle
    from specdec.decoder.engine import Engine
    from specdec.decoder.model import ModelConfig, Transformer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    bundle = ModelBundle("random", Transformer(ModelConfig(num_hidden_layers=layers)).eval(), tokenizer=None)
    prompts = [list(range(1, 20))]
    eager = Engine(bundle, "ar", cuda_graphs="off").generate(prompts, max_new_tokens=12).tokens
    traced, real_compile = [], torch.compile

    def counting(fn, **kw):  # the backend asked for, and a count of the graphs it is handed
        target = lookup_backend(backend)
        return real_compile(fn, backend=lambda gm, ex: traced.append(1) or target(gm, ex), **kw)

    torch.compile = counting
    out = {"layers": layers, "scope": scope, "backend": backend}
    for run in ("cold", "warm"):
        torch._dynamo.reset()
        traced.clear()
        t0 = time.perf_counter()
        got = Engine(bundle, "ar", cuda_graphs="emulate", compile=scope).generate(prompts, max_new_tokens=12).tokens
        out[f"{run}_s"] = round(time.perf_counter() - t0, 2)
        out[f"{run}_graphs"] = len(traced)
        out[f"{run}_same_as_eager"] = got == eager
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("cpu_regional_compile.json"))
    p.add_argument("--layers", default="4,16", help="comma-separated numbers of layers")
    p.add_argument("--backend", default="inductor", help="inductor (the real compile), or eager (dynamo's trace only)")
    p.add_argument("--one", nargs=2, metavar=("LAYERS", "SCOPE"), help=argparse.SUPPRESS)  # a child process
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(one(int(args.one[0]), args.one[1], args.backend)))
        return 0
    log_dir = args.out.parent.parent / "logs" if args.out.parent.name == "results" else args.out.parent
    log_path = log_dir / (args.out.stem + ".log")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    env = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": platform.processor() or
           platform.machine(), "cpus": os.cpu_count(), "load_average": os.getloadavg()[0],
           "commit": commit.stdout.strip(), "backend": args.backend}
    lines = [f"{env['date']} commit {env['commit']}, {env['cpus']} CPUs (load {env['load_average']:.2f}), one thread, "
             f"backend {args.backend}"]
    runs = []
    for layers in (int(x) for x in args.layers.split(",")):
        for scope in SCOPES:
            with tempfile.TemporaryDirectory(prefix="inductor-") as cache:
                child = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "PYTHONPATH": str(ROOT)}
                r = subprocess.run([sys.executable, __file__, "--one", str(layers), scope, "--backend", args.backend],
                                   capture_output=True, text=True, env=child, cwd=ROOT)
            if r.returncode != 0:
                raise SystemExit(f"L={layers} {scope}: exit status {r.returncode}\n{r.stderr[-2000:]}")
            runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
            e = runs[-1]
            lines.append(f"L={layers:>3} --compile-scope {scope:<6}: cold {e['cold_s']:6.2f} s ({e['cold_graphs']} graphs), "
                         f"warm {e['warm_s']:6.2f} s ({e['warm_graphs']} graphs), tokens as eager: "
                         f"{e['cold_same_as_eager'] and e['warm_same_as_eager']}")
            print(lines[-1], flush=True)
    args.out.write_text(json.dumps({"env": env, "runs": runs}, indent=2) + "\n")
    log_path.write_text("\n".join(lines) + "\n")
    return 0


# --- docs/results.md: this script's section (benchmarks/report.py stitches the sections) ----------------------

def render() -> str:
    from page import load, provenance, table

    data = load("cpu_regional_compile.json")
    if not data or data["env"].get("backend") != "inductor":
        return ""
    rows = [[e["layers"], e["scope"], e["cold_s"], e["cold_graphs"], e["warm_s"], e["warm_graphs"],
             e["cold_same_as_eager"] and e["warm_same_as_eager"]] for e in data["runs"]]
    return f"""### What each compile scope costs to start, by number of layers (CPU)

{provenance(["benchmarks/results/cpu_regional_compile.json"], "the 2-core development CPU", "`benchmarks/cpu_regional_compile.py`",
            ["benchmarks/logs/cpu_regional_compile.log"], ["benchmarks/results/cpu_regional_compile.json"])}

Random weights in the tiny zoo's layer shape with L layers, plain greedy decoding, one row, emulated graphs, inductor's
C++ backend, code at {data["env"]["commit"]}; each (L, scope) in a process of its own with an empty inductor cache. Cold: the
prefill and one captured step compiled from nothing; warm: the same after dynamo forgets its traces, inductor's kernels
read from its cache (as a later start reads the persistent compile cache). The GPU's figures for both scopes are in
"The default `specdec decode` path on random weights".

{table(["layers", "--compile-scope", "cold s", "graphs traced", "warm s", "graphs traced (warm)", "tokens as eager"], rows)}
"""


if __name__ == "__main__":
    sys.exit(main())
