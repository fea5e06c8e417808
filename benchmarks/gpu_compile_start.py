"""Where a compiled server's start goes (issue 21's goal: a second start of an 8B-shaped server compiles in under 15 s).

Each start is a fresh process (the last of a variant's under cProfile, which slows it) that builds what `specdec serve` builds in its engine process (cli/serve_engine.py's
load_engine: random weights, the Engine, the warm-up that captures every batch width) with one compile cache
folder shared by the starts; start 1 fills it, start 2 reads it. Per start: seconds to load and to warm up, the
graphs dynamo traced (each region's, by input shapes), dynamo's and inductor's own seconds, the warm-up's top
functions by cumulative time (cProfile), and the step it then runs (ms per greedy step at widths 1 and 16).
`--plan` names each start's variant, which changes how the regions are compiled, in this script only, to see what a
change would save before making it (VARIANTS): `static` (today's: torch.compile(dynamic=False), a trace per shape),
`dynamic` (dynamic=None: after a region's second shape dynamo traces it once with symbolic sizes), `nobundle` and
`nostatic` (inductor's Triton bundle in its FX graph cache, or its static CUDA launcher, off), `tuneall` (every
region's trace tuned by coordinate descent, as before regions.tunes; `static` tunes only one-token traces).

usage (GPU node): PYTHONPATH=. python3 benchmarks/gpu_compile_start.py --out $OUT/compile_start [--plan static,static/dynamic,dynamic]
CPU smoke run: --shape tiny --max-running 2 --context 128 --device cpu --compile off (that the script runs: nothing compiles)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def child(a: argparse.Namespace) -> dict:
    """One start, in this process: build the serve engine as the engine process does, then time its steps."""
    import cProfile
    import io
    import pstats

    import torch
    import torch._dynamo
    import torch._inductor.config
    from torch._dynamo.utils import compile_times, counters

    from specdec.cli import serve
    from specdec.decoder import regions

    traced: list[str] = []
    real_compile = torch.compile

    dynamic, options = VARIANTS[a.variant]
    for key, value in options.items():
        setattr(torch._inductor.config, key, value)
    if a.variant == "tuneall":
        regions.tunes = lambda x: True

    def counting(fn, **kw):  # the same compile, each graph handed to the backend counted with its input shapes
        if "dynamic" in kw:  # the regions' compile (the step scope's too)
            kw["dynamic"] = dynamic
        from torch._dynamo.backends.registry import lookup_backend
        inductor = lookup_backend("inductor")

        def backend(gm, example):
            traced.append(f"{getattr(fn, '__qualname__', fn)} " + " ".join(
                str(tuple(t.shape)) for t in example if hasattr(t, "shape") and t.dim() and t.numel() < 1e7))
            return inductor(gm, example)

        return real_compile(fn, backend=backend, **kw)

    regions.torch.compile = counting  # the regions' compile (regions.py calls torch.compile through its module)
    p = argparse.ArgumentParser()
    serve.add_arguments(p)
    args = p.parse_args(["--random-weights", a.shape, "--max-running-requests", str(a.max_running),
                         "--context-length", str(a.context), "--compile", a.compile, "--compile-scope", "layers",
                         "--compile-cache", a.cache, "--device", a.device])
    from specdec.cli.serve_engine import load_engine

    prof = cProfile.Profile()
    t0 = time.perf_counter()
    if a.profile:  # cProfile slows Python (dynamo's tracing is Python): its start's seconds are not comparable
        prof.enable()
    loaded = load_engine(args)
    prof.disable()
    total = time.perf_counter() - t0
    engine = loaded.engine
    s = io.StringIO()
    if a.profile:
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(45)
    steps = {}
    for width in (1, min(16, a.max_running)):
        prompts = [list(range(5, 5 + 100))] * width
        engine.generate(prompts, max_new_tokens=8, stop_at_eos=False)  # this width's prefill and steps captured
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t = time.perf_counter()
        r = engine.generate(prompts, max_new_tokens=a.new_tokens, stop_at_eos=False)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        steps[str(width)] = round((time.perf_counter() - t) * 1e3 / max(1, r.steps), 3)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    return {"variant": a.variant, "device": device, "load_and_warm_s": round(total, 1), "graphs_traced": len(traced),
            "traced": sorted(set(traced)), "traced_counts": {k: traced.count(k) for k in sorted(set(traced))},
            "dynamo_compile_times": compile_times(repr="str", aggregate=True)[:4000],
            "ms_per_step": steps,
            "coordesc_benchmarks": counters["inductor"]["coordesc_tuning_bench"], "profile_top": s.getvalue()[:12000]}


VARIANTS = {  # name -> (torch.compile's dynamic= for the regions, inductor config set before the start)
    "static": (False, {}),
    "dynamic": (None, {}),
    "nobundle": (False, {"bundle_triton_into_fx_graph_cache": False}),
    "nostatic": (False, {"use_static_cuda_launcher": False}),
    "tuneall": (False, {}),  # and every region's trace tuned by coordinate descent (main before regions.tunes)
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--shape", default="8b")
    ap.add_argument("--max-running", type=int, default=16)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--plan", default="static,static,static/dynamic,dynamic,dynamic",
                    help="starts in order, each a variant (" + ", ".join(VARIANTS) + "); '/' starts a new, empty "
                         "compile cache; the last start before a '/' runs under cProfile")
    ap.add_argument("--compile", default="on", help="off: the CPU smoke run (nothing compiled)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--variant", default="static", help=argparse.SUPPRESS)
    ap.add_argument("--cache", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print("RESULT " + json.dumps(child(a)), flush=True)
        return 0
    out = Path(a.out or tempfile.mkdtemp())
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for group in a.plan.split("/"):
        cache, plan = tempfile.mkdtemp(prefix="cc-"), group.split(",")
        for start, variant in enumerate(plan, 1):
            t = time.time()
            cmd = [sys.executable, __file__, "--child", "--variant", variant, "--cache", cache, "--shape", a.shape,
                   "--max-running", str(a.max_running), "--context", str(a.context), "--device", a.device,
                   "--new-tokens", str(a.new_tokens), "--compile", a.compile] + (["--profile"] if start == len(plan) else [])
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
            p = subprocess.run(cmd, capture_output=True, text=True, env=env)
            line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                print(f"{variant} start {start}: FAILED rc {p.returncode}\n{p.stderr[-4000:]}", flush=True)
                break
            r = json.loads(line[7:]) | {"start": start, "plan": group, "process_s": round(time.time() - t, 1),
                                        "compiled_line": [x for x in p.stderr.splitlines() if "compiled in" in x]}
            results.append(r)
            print(f"== {group}: start {start} ({variant}{', profiled' if start == len(plan) else ''}): process "
                  f"{r['process_s']} s, load+warm-up {r['load_and_warm_s']} s, {r['compiled_line']}, "
                  f"{r['graphs_traced']} graphs traced, coordinate-descent benchmarks {r['coordesc_benchmarks']}, "
                  f"ms per step {r['ms_per_step']}", flush=True)
            for k, n in r["traced_counts"].items():
                print(f"   {n} x {k}")
            print(r["dynamo_compile_times"])
            print(r["profile_top"][:6000], flush=True)
            (out / "compile_start.json").write_text(json.dumps(
                {"date": time.strftime("%Y-%m-%d"), "device": r["device"], "runs": results}, indent=1))
    return 0


# --- docs/results.md: this script's section (benchmarks/report.py stitches the sections) ---------------------------

def render() -> str:
    """The starts of benchmarks/results/gpu_compile_start/call*.json, one row each."""
    import page
    from page import load, provenance, table

    names = sorted(f.name for f in (page.RES / "gpu_compile_start").glob("call*.json"))
    every = [(n.removesuffix(".json"), load(f"gpu_compile_start/{n}")) for n in names]
    if not every:
        return ""
    calls = [(n, c["runs"]) for n, c in every]
    devices = sorted({c["device"] for _, c in every})
    from gpu_fast_path import compile_seconds

    compiled = lambda r: compile_seconds("\n".join(r["compiled_line"]))  # noqa: E731

    def tuning(r) -> float | None:  # dynamo's timer of the coordinate-descent tuner, seconds (a row of its table)
        line = next((x for x in r["dynamo_compile_times"].splitlines() if "coordinate_descent_tuning" in x), None)
        return float(line.split()[-1]) if line else None

    def tuned(runs, r) -> str:  # which traces were tuned: a call with a `tuneall` start ran after regions.tunes
        after = any(x["variant"] == "tuneall" for x in runs)
        return "one-token" if after and r["variant"] != "tuneall" else "every"

    rows = [[c, r["plan"] if "plan" in r else r["variant"], r["start"], r["variant"], tuned(runs, r), compiled(r),
             tuning(r), r["graphs_traced"], r.get("coordesc_benchmarks"), r["ms_per_step"].get("1"),
             r["ms_per_step"].get("16")] for c, runs in calls for r in runs]
    warm = [(r, tuned(runs, r)) for _, runs in calls for r in runs
            if r["start"] > 1 and r["variant"] in ("static", "tuneall") and tuning(r)]
    files = [f"benchmarks/results/gpu_compile_start/{n}" for n in names]
    said = lambda runs, which: ", ".join(f"{tuning(r):.1f} s of {compiled(r)} s" for r, t in runs if t == which)  # noqa: E731
    return f"""### Where a compiled server's second start goes

{provenance(files, " and ".join(devices), "`benchmarks/gpu_compile_start.py`",
            ["benchmarks/logs/gpu_compile_start.log"], ["benchmarks/results/gpu_compile_start/"])}

Each start is a fresh process that builds the engine of `specdec serve --random-weights 8b --max-running-requests 16
--compile on --compile-scope layers` (loading, compiling and the warm-up that captures every batch width), then times
greedy steps at widths 1 and 16. The starts of one plan share one compile cache folder: the first fills it, the next
read it. The last start of each plan ran under cProfile, which slows its compiling. Variants, in the script only:
`static` is main's regions (`torch.compile(dynamic=False)`, a trace per shape), `dynamic` compiles them with
`dynamic=None`, `nobundle` turns off inductor's Triton bundle in its FX graph cache, `nostatic` its static CUDA launcher,
`tuneall` tunes every trace's kernels (main before call 3, whose `static` tunes only one-token traces).

{table(["call", "plan", "start", "variant", "traces tuned", "compiled s", "of which tuning s", "graphs traced", "tuning benchmarks",
        "ms/step, 1 row", "ms/step, 16 rows"], rows)}

"Of which tuning s" is dynamo's timer of inductor's coordinate-descent tuner ("tuning benchmarks" the kernel runs it made,
counted from call 2). With every trace tuned, a start from a warm cache still tuned: {said(warm, "every")}. The first start had tuned those kernels and inductor's autotune cache
was on; neither variant of its caching stopped the re-tuning. It looks like inductor's open issue pytorch/pytorch#172819
(a kernel loaded from the FX graph cache loses the mark that its cached config was found by coordinate descent, so it is
tuned again; fixes were proposed in pytorch/pytorch#173391 and #181292), not verified on the GPU image's torch. Fewer traces (`dynamic`) saved seconds, not the tuning. Since call 3, `specdec/decoder/regions.py` tunes only a
trace that reads one token (`regions.tunes`: where model.Linear's projections are reductions inductor writes; at more
tokens they are cuBLAS matmuls). Then the starts after the first tuned {said(warm, "one-token")} (the first of
them also compiled the untuned traces anew: other inductor options are another cache entry); the last of them ran under cProfile, and the unprofiled figure was not measured (the
session's device time ran out), so the goal of a second start under 15 s is not shown met.
"""


if __name__ == "__main__":
    raise SystemExit(main())
