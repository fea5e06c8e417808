"""Issue 21 on one GPU, each part in one device call, the course's default path beside real SGLang 0.5.16:

  decode SHAPE  `benchmarks/gpu_fast_path.py --shapes SHAPE` (the default `specdec decode` path: fused, CUDA
                graphs, compiled with the persistent cache; first and second start; --compile off; --no-fuse)
                then SGLang plain on the same shape (random weights, --load-format dummy, triton attention,
                CUDA graphs): batch-1 time per output token at 512 tokens of context, (e2e(256) - e2e(1)) / 255,
                the measure gpu_fast_path.py takes of ours
  serve         the tiny zoo, plain and NEXTN (k = 3: 3 steps, topk 1, 4 draft tokens), `specdec serve` with its
                default flags and SGLang: output tokens/s from `specdec bench` at concurrency 1, 4, 16, 64
                (code and open prompts, 128 tokens, runs of at least 5 s, each level warmed first); each
                server's start-up time (the four start together); every sweep compared with its plain server's

usage (GPU node): PACK=.sglang-pack . .sglang-pack/setup.sh; PYTHONPATH=. python3 benchmarks/gpu_fast_path_sglang.py
                  decode --shape 8b --out $OUT/decode8b [--total-s 570]      |   serve --out $OUT/serve
Servers are stopped by the launcher (process group); nothing is left behind.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_lab3 import (CHAIN, ZOO, compare_with, env_report, measure_one_by_one, model_dir, say,  # noqa: E402
                      start_all, tpot_at_context)

from specdec.serving.measure.bench import SweepConfig, format_sweep, run_sweep  # noqa: E402
from specdec.serving.ops.launch import LaunchConfig  # noqa: E402

LEVELS = (1, 4, 16, 64)


def part_decode(out: Path, shape: str, budget_s: float, total_s: float = 0.0) -> None:
    """Ours (gpu_fast_path.py, within budget_s), then SGLang; with total_s, SGLang first, so that a slow SGLang start
    (50 to 150 s) cannot leave the call without its anchor, and ours within what is left of total_s."""
    t = time.time()

    def ours(budget: float) -> None:
        run = subprocess.run([sys.executable, "benchmarks/gpu_fast_path.py", "--shapes", shape, "--starts", "2",
                              "--budget-s", f"{budget:.0f}", "--out", str(out / "gpu_fast_path.json")],
                             capture_output=True, text=True, cwd=ROOT)
        say(f"ours ({time.time() - t:.0f} s, exit {run.returncode}):\n" + run.stdout[-6000:] + run.stderr[-3000:])

    if budget_s and not total_s:
        ours(budget_s)
    sglang_decode(out, shape)
    if budget_s and total_s:
        left = total_s - (time.time() - t) - 30  # the rest of the call, less the time to stop and write
        if left < 60:
            say(f"ours skipped: {left:.0f} s left of --total-s {total_s:.0f}")
        else:
            ours(min(budget_s, left))


def sglang_decode(out: Path, shape: str) -> None:
    """SGLang plain on the same shape (random weights): batch-1 time per output token at 512 tokens of context."""
    common = dict(backend="sglang", attention_backend="triton", cuda_graph_max_bs=4, load_format="dummy",
                  mem_fraction_static=0.5, disable_radix_cache=True, max_running_requests=4,
                  extra_args=("--max-total-tokens", "16384"))
    servers = start_all({f"sglang_plain_{shape}": (LaunchConfig(model_dir(shape, Path("/tmp/specdec-shapes")),
                                                                 **common), {})}, out / "logs")
    summary = {"startup_s": {}, "tpot_512": {}, "errors": {}}

    def measure(name, srv):
        summary["startup_s"][name] = srv.startup_s
        summary["tpot_512"][name] = tpot_at_context(srv.url)
        say(f"{name}: batch-1 TPOT at 512 context {summary['tpot_512'][name]['tpot_s'] * 1e3:.3f} ms")

    measure_one_by_one(servers, measure, lambda n, e: summary["errors"].update({n: e}),
                       lambda: (out / "sglang.json").write_text(json.dumps(summary, indent=1)))
    for n, s in servers.items():
        if isinstance(s, str):
            summary["errors"][n] = s
    (out / "sglang.json").write_text(json.dumps(summary, indent=1))


def part_serve(out: Path, levels: tuple[int, ...], min_run_s: float) -> None:
    target = str(ZOO / "target")
    sg = dict(backend="sglang", attention_backend="triton", cuda_graph_max_bs=max(levels), mem_fraction_static=0.5,
              disable_radix_cache=True, max_running_requests=max(levels), extra_args=("--max-total-tokens", "60000"))
    ours = dict(backend="specdec", max_running_requests=max(levels))
    configs = {"sglang_plain": (LaunchConfig(target, **sg), {}),
               "sglang_nextn": (LaunchConfig(target, "NEXTN", **CHAIN, **sg), {}),
               "specdec_plain": (LaunchConfig("tiny", **ours), {}),
               "specdec_nextn": (LaunchConfig("tiny", "NEXTN", **CHAIN, **ours), {})}
    for name, (cfg, _) in configs.items():
        say(name, "command:", " ".join(cfg.command() if cfg.backend == "sglang" else cfg.specdec_command()))
    summary = {"startup_s": {}, "errors": {}}
    servers = {}
    # all four start together (one device call has ten minutes): start-up times are with the others starting
    servers.update(start_all(configs, out / "logs", timeout=420))
    sweeps = {}

    def measure(name, srv):
        summary["startup_s"][name] = srv.startup_s
        cfg = SweepConfig(srv.url, ("code", "open"), levels, 128, warmup=4, min_run_s=min_run_s)
        t = time.time()
        sweeps[name] = run_sweep(cfg, progress=False)
        (out / f"sweep_{name}.json").write_text(json.dumps(sweeps[name], indent=1))
        say(f"{name}: sweep in {time.time() - t:.0f} s\n" + format_sweep(sweeps[name]))

    measure_one_by_one(servers, measure, lambda n, e: summary["errors"].update({n: e}),
                       lambda: (out / "summary.json").write_text(json.dumps(summary, indent=1)))
    for n, s in servers.items():
        if isinstance(s, str):
            summary["errors"][n] = s
    for side in ("sglang", "specdec"):
        compare_with(f"{side}_plain", {k: v for k, v in sweeps.items() if k.startswith(side)}, out)
    for alg in ("plain", "nextn"):  # ours against SGLang, same algorithm
        if f"sglang_{alg}" in sweeps and f"specdec_{alg}" in sweeps:
            compare_with(f"sglang_{alg}", {f"specdec_{alg}": sweeps[f"specdec_{alg}"]}, out)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("part", choices=("decode", "serve"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="8b", help="decode: 8b or 1b")
    ap.add_argument("--budget-s", type=float, default=330.0, help="decode: gpu_fast_path.py's budget (0: SGLang only)")
    ap.add_argument("--total-s", type=float, default=0.0,
                    help="decode: the call's seconds; SGLang is then measured first and ours in what is left")
    ap.add_argument("--levels", default=",".join(map(str, LEVELS)), help="serve: concurrency levels")
    ap.add_argument("--min-run-s", type=float, default=5.0, help="serve: the shortest timed run")
    args = ap.parse_args()
    out = Path(args.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("SPECDEC_RUN_DIR", str(out / "run"))
    env_report(out)
    if args.part == "decode":
        part_decode(out, args.shape, args.budget_s, args.total_s)
    else:
        part_serve(out, tuple(int(x) for x in args.levels.split(",")), args.min_run_s)
    say("done")
    return 0


# --- docs/results.md: the serve part's section (benchmarks/report.py stitches the sections) ----------------------

def render_serve() -> str:
    from page import load, provenance, table

    ours, theirs = load("gpu_fast_path_sglang/compare_specdec_nextn.json"), load("gpu_fast_path_sglang/compare_sglang_nextn.json")
    summary = load("gpu_fast_path_sglang/summary.json")
    if not (ours and theirs and summary):
        return ""
    key = lambda r: (r["category"], r["concurrency"])  # noqa: E731
    mine = {key(r): r for r in ours["rows"] if r["category"] != "all"}
    rows = []
    for r in theirs["rows"]:
        m = mine.get(key(r))
        if m is None or r["category"] == "all":
            continue
        rows.append([r["category"], r["concurrency"], r["base_tok_s"], m["base_tok_s"], m["base_tok_s"] / r["base_tok_s"],
                     r["spec_tok_s"], m["spec_tok_s"], m["spec_tok_s"] / r["spec_tok_s"], r["accept_length"], m["accept_length"]])
    start = summary["startup_s"]
    return f"""### `specdec serve` beside SGLang on the zoo, with the fast path's defaults

{provenance(["benchmarks/results/gpu_fast_path_sglang/summary.json"], "NVIDIA H200", "`benchmarks/gpu_fast_path_sglang.py serve`",
            ["benchmarks/logs/gpu_fast_path_sglang.log"], ["benchmarks/results/gpu_fast_path_sglang/"])}

The tiny zoo, plain and NEXTN (3 steps, topk 1, 4 draft tokens; `specdec serve --k 3`), output tokens/s from `specdec bench`
(code and open prompts, 128 tokens, every level warmed, runs of at least 4 s). `specdec serve` ran with the defaults of
the time: fused, CUDA graphs, and compiled, each batch width captured before it listened, which took
{start["specdec_plain"]:.0f} s (plain) and {start["specdec_nextn"]:.0f} s (NEXTN) to start, against SGLang's
{start["sglang_plain"]:.0f} s and {start["sglang_nextn"]:.0f} s (the four started together). A start that long is why
`--compile auto` now compiles only where the cache already holds the model's kernels.

{table(["category", "concurrency", "SGLang plain tok/s", "ours plain tok/s", "ours / SGLang", "SGLang NEXTN tok/s",
        "ours NEXTN tok/s", "ours / SGLang", "SGLang accept length", "ours"], rows)}
"""


if __name__ == "__main__":
    raise SystemExit(main())
