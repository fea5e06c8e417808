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
region's trace tuned by coordinate descent, as before regions.tunes; `static` tunes only one-token traces), `retune`
(without cuda_graphs.keep_tuned_configs, so a warm start tunes its one-config kernels again: pytorch/pytorch#172819).

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
    from specdec.decoder import cuda_graphs, regions

    traced: list[str] = []
    real_compile = torch.compile

    dynamic, options = VARIANTS[a.variant]
    for key, value in options.items():
        setattr(torch._inductor.config, key, value)
    if a.variant == "tuneall":
        regions.tunes = lambda x: True
    if a.variant == "retune":
        cuda_graphs.keep_tuned_configs = lambda: False
    tuned_kernels = record_tuned()

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
            "coordesc_benchmarks": counters["inductor"]["coordesc_tuning_bench"], "profile_top": s.getvalue()[:12000],
            "tuned_kernels": tuned_kernels}


def record_tuned() -> list[dict]:
    """Each kernel inductor tunes by coordinate descent in this start: its name, whether the static CUDA launcher loaded
    it (only those pass through recheck_autotune_cache), its configs, and whether it was reloaded from a cache."""
    import importlib

    th = importlib.import_module("torch._inductor.runtime.triton_heuristics")
    seen: list[dict] = []
    tune = th.CachingAutotuner.coordinate_descent_tuning

    def recorded(self, launcher, *args, **kwargs):
        static = getattr(self, "is_statically_launchable", lambda: None)
        seen.append({"kernel": self.inductor_meta.get("kernel_name") or getattr(self.fn, "__name__", "?"),
                     "static": bool(static()) if callable(static) else None, "configs": len(self.configs or []),
                     "cache_state": (getattr(self, "autotune_cache_info", None) or {}).get("autotune_cache_state")})
        return tune(self, launcher, *args, **kwargs)

    th.CachingAutotuner.coordinate_descent_tuning = recorded
    return seen


def torch_source() -> str:
    """The device torch's own code that cuda_graphs.keep_tuned_configs wraps (pytorch/pytorch#172819), for the log."""
    import inspect

    import torch
    import torch._inductor.runtime.autotune_cache as ac
    import torch._inductor.runtime.triton_heuristics as th

    parts = [f"torch {torch.__version__}"]
    for fn in (th.check_autotune_cache, th.CachingAutotuner.recheck_autotune_cache, ac._load_cached_autotuning):
        parts.append(inspect.getsource(fn))
    return "\n".join(parts)


VARIANTS = {  # name -> (torch.compile's dynamic= for the regions, inductor config set before the start)
    "static": (False, {}),
    "dynamic": (None, {}),
    "nobundle": (False, {"bundle_triton_into_fx_graph_cache": False}),
    "nostatic": (False, {"use_static_cuda_launcher": False}),
    "tuneall": (False, {}),  # and every region's trace tuned by coordinate descent (main before regions.tunes)
    "retune": (False, {}),  # without cuda_graphs.keep_tuned_configs (main before it: pytorch/pytorch#172819)
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
    ap.add_argument("--no-profile", action="store_true", help="no start under cProfile (the starts' seconds as users see them)")
    ap.add_argument("--torch-source", action="store_true", help="write the device torch's code that keep_tuned_configs wraps")
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
    if a.torch_source:
        (out / "torch_source.txt").write_text(torch_source())
    results = []
    for group in a.plan.split("/"):
        cache, plan = tempfile.mkdtemp(prefix="cc-"), group.split(",")
        for start, variant in enumerate(plan, 1):
            t = time.time()
            profiled = start == len(plan) and not a.no_profile
            cmd = [sys.executable, __file__, "--child", "--variant", variant, "--cache", cache, "--shape", a.shape,
                   "--max-running", str(a.max_running), "--context", str(a.context), "--device", a.device,
                   "--new-tokens", str(a.new_tokens), "--compile", a.compile] + (["--profile"] if profiled else [])
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
            p = subprocess.run(cmd, capture_output=True, text=True, env=env)
            line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                print(f"{variant} start {start}: FAILED rc {p.returncode}\n{p.stderr[-4000:]}", flush=True)
                break
            r = json.loads(line[7:]) | {"start": start, "plan": group, "process_s": round(time.time() - t, 1), "profiled": profiled,
                                        "compiled_line": [x for x in p.stderr.splitlines() if "compiled in" in x]}
            results.append(r)
            print(f"== {group}: start {start} ({variant}{', profiled' if profiled else ''}): process "
                  f"{r['process_s']} s, load+warm-up {r['load_and_warm_s']} s, {r['compiled_line']}, "
                  f"{r['graphs_traced']} graphs traced, coordinate-descent benchmarks {r['coordesc_benchmarks']}, "
                  f"ms per step {r['ms_per_step']}", flush=True)
            for k, n in r["traced_counts"].items():
                print(f"   {n} x {k}")
            if start > 1 and r.get("tuned_kernels"):  # a warm start: which kernels were tuned again
                kinds: dict[str, int] = {}
                for t in r["tuned_kernels"]:
                    key = f"static {t['static']}, {t['configs']} config(s), cache {t['cache_state']}"
                    kinds[key] = kinds.get(key, 0) + 1
                print(f"   tuned again: {len(r['tuned_kernels'])} kernels: {kinds}; e.g. "
                      + ", ".join(t["kernel"] for t in r["tuned_kernels"][:6]))
            print(r["dynamo_compile_times"])
            print(r["profile_top"][:6000], flush=True)
            (out / "compile_start.json").write_text(json.dumps(
                {"date": time.strftime("%Y-%m-%d"), "device": r["device"], "runs": results}, indent=1))
    return 0


# --- docs/results.md: this script's section (benchmarks/report.py stitches the sections) ---------------------------

BEFORE_TUNES = {"call1", "call2"}  # calls run before regions.tunes (every trace tuned)
BEFORE_KEEP = {"call1", "call2", "call3", "call4"}  # calls run before cuda_graphs.keep_tuned_configs


def render() -> str:
    """The starts of benchmarks/results/gpu_compile_start/call*.json, one row each."""
    import page
    from page import load, provenance, table

    names = sorted(f.name for f in (page.RES / "gpu_compile_start").glob("call*.json"))
    every = [(n.removesuffix(".json"), load(f"gpu_compile_start/{n}")) for n in names]
    if not every:
        return ""
    devices = sorted({c["device"] for _, c in every})
    from gpu_fast_path import compile_seconds

    compiled = lambda r: compile_seconds("\n".join(r["compiled_line"]))  # noqa: E731

    def tuning(r) -> float | None:  # dynamo's timer of the coordinate-descent tuner, seconds (a row of its table)
        line = next((x for x in r["dynamo_compile_times"].splitlines() if "coordinate_descent_tuning" in x), None)
        return float(line.split()[-1]) if line else None

    def tuned(call, r) -> str:  # which traces were tuned
        return "every" if call in BEFORE_TUNES or r["variant"] == "tuneall" else "one-token"

    def kept(call, r) -> str:  # whether a reloaded kernel kept its tuned config (cuda_graphs.keep_tuned_configs)
        if r["variant"] == "keeptuned":
            return "partly (a first try, in the script)"
        return "yes" if r["variant"] == "static" and call not in BEFORE_KEEP else "no"

    def plan(r) -> str:  # call 1 did not record its plan: three starts of each variant
        return r.get("plan") or ",".join([r["variant"]] * 3)

    def profiled(r) -> bool:  # calls 1-3 ran the last start of each plan under cProfile
        return r.get("profiled", r["start"] == len(plan(r).split(",")))

    starts = [(c, r) for c, call in every for r in call["runs"]]
    rows = [[c, plan(r), r["start"], r["variant"], "yes" if profiled(r) else "no", tuned(c, r), kept(c, r), compiled(r),
             tuning(r), r["graphs_traced"], r.get("coordesc_benchmarks"), r["ms_per_step"].get("1"),
             r["ms_per_step"].get("16")] for c, r in starts]
    warm = [(c, r) for c, r in starts if r["start"] > 1 and r["variant"] in ("static", "tuneall", "retune")]

    def said(pick) -> str:
        chosen = [r for c, r in warm if pick(c, r)]
        return ", ".join(f"{compiled(r)} s" + (f" ({tuning(r):.1f} s tuning)" if tuning(r) else "") for r in chosen) or "none"

    plain = lambda c, r: not profiled(r) and kept(c, r) == "no" and tuned(c, r) == "one-token"  # noqa: E731
    keeping = lambda c, r: not profiled(r) and kept(c, r) == "yes"  # noqa: E731
    met = [compiled(r) for c, r in warm if keeping(c, r)]
    again = [(c, r) for c, r in warm if keeping(c, r) and r.get("tuned_kernels") is not None]
    kernels = lambda n: f"{n} kernel" + ("s" if n != 1 else "")  # noqa: E731
    still = "".join((f" In {c}'s warm start it tuned {kernels(len(r['tuned_kernels']))} again ("
                     + ", ".join(f"`{t['kernel']}`" for t in r["tuned_kernels"]) + "): loaded by the static launcher, "
                     "their autotune cache entry a hit; why their tuned config did not stick was not looked into.")
                    if r["tuned_kernels"] else f" In {c}'s warm start it tuned no kernel again." for c, r in again)
    files = [f"benchmarks/results/gpu_compile_start/{n}.json" for n, _ in every]
    return f"""### Where a compiled server's second start goes

{provenance(files, " and ".join(devices), "`benchmarks/gpu_compile_start.py`",
            ["benchmarks/logs/gpu_compile_start.log"], ["benchmarks/results/gpu_compile_start/"])}

Each start is a fresh process that builds the engine of `specdec serve --random-weights 8b --max-running-requests 16
--compile on --compile-scope layers` (loading, compiling and the warm-up that captures every batch width), then times
greedy steps at widths 1 and 16. The starts of one plan share one compile cache folder: the first fills it, the next
read it. In calls 1 to 3 the last start of each plan ran under cProfile, which slows its compiling; calls 4 and 5 ran
none under it. Variants, in the script only: `static` is main's regions (`torch.compile(dynamic=False)`, a trace per
shape), `dynamic` compiles them with `dynamic=None`, `nobundle` turns off inductor's Triton bundle in its FX graph cache,
`nostatic` its static CUDA launcher, `tuneall` tunes every trace's kernels (main before call 3), `retune` leaves out
`keep_tuned_configs` (main before call 5), `keeptuned` was a first try at it inside the script.

{table(["call", "plan", "start", "variant", "profiled", "traces tuned", "tuned configs kept", "compiled s",
        "of which tuning s", "graphs traced", "tuning benchmarks", "ms/step, 1 row", "ms/step, 16 rows"], rows)}

"Of which tuning s" is dynamo's timer of inductor's coordinate-descent tuner ("tuning benchmarks" the kernel runs it
made, counted from call 2).

- **Every trace tuned** (calls 1 and 2): a start from a warm cache still tuned; its warm starts compiled in
  {said(lambda c, r: tuned(c, r) == "every")}. The first start had tuned those kernels and inductor's autotune cache was on;
  neither variant of its caching stopped the re-tuning. Fewer traces (`dynamic`) saved seconds, not the tuning.
- **Only one-token traces tuned** (`regions.tunes`, since call 3: where model.Linear's projections are reductions
  inductor writes; at more tokens they are cuBLAS matmuls): the warm starts, unprofiled, compiled in {said(plain)}
  (call 3's first of them also compiled the untuned traces anew: other inductor options are another cache entry).
- **Why they were tuned again** (call 4 printed the device torch's code): this is inductor's open issue
  pytorch/pytorch#172819. In torch 2.11, `CachingAutotuner.recheck_autotune_cache`, which a kernel reloaded from the FX
  graph cache by the static launcher runs, reads the autotune cache only for a kernel with several configs, and does not
  carry the cached config's `found_by_coordesc` over, so `run()` tunes the kernel again. (The local torch 2.13 has both
  fixed.) `specdec/decoder/cuda_graphs.py`'s `keep_tuned_configs`, called by `use_cache`, wraps it: a one-config
  kernel whose cached best was found by coordinate descent takes that config, marked if it is the kernel's own and
  compiled if the tuner moved off it; where torch already did so it changes nothing. Call 4's first try only marked, and
  the 9 kernels the tuner had moved were tuned again.
- **With `keep_tuned_configs`** (call 5, beside `retune` in the same call; call 6 again): the warm starts compiled in
  {said(keeping)}; the steps did not change. Goal, a second start of an 8B-shaped server compiling in under 15 s:
  {"met" if met and max(met) < 15 else "not shown met"} for the engine process `specdec serve` starts. The server itself, beside SGLang, is the section above.{still}
"""


if __name__ == "__main__":
    raise SystemExit(main())
