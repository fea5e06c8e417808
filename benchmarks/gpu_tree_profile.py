"""Issue 22: where a draft tree's step spends its time on the GPU, against the chain's (the zoo's EAGLE head, batch 1).

Per shape (num_steps, topk, num_draft_tokens; topk 1 is the chain), the Lab 2 engine on the zoo (bf16, fused):
  graphs    the path `specdec serve` runs (CUDA graphs): ms per step, and its split into the draft's captured step
            and the verify's (generate(profile=True): a sync between them)
  kernels   torch.profiler over the same decode, eager (a profiler over replayed graphs crashed in gpu_floor.py): GPU
            time and kernels per step, by kernel name; the same kernels run inside the graphs
Results: one JSON (--out) and its log beside it.

usage (GPU): PYTHONPATH=. python3 benchmarks/gpu_tree_profile.py --out $OUT/tree_profile.json [--shapes 15,1,16:15,4,16]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec.decoder.cuda_graphs import Graphs  # noqa: E402
from specdec.decoder.engine import Engine  # noqa: E402
from specdec.zoo import load_bundle  # noqa: E402
from specdec.zoo.evaluate import trained_tokenizer  # noqa: E402

PROMPTS = ("def fibonacci(n):\n    if n < 2:\n", "The quick brown fox jumps over", "Once upon a time, in a small")
LOG: Path | None = None


def say(*a) -> None:
    line = " ".join(map(str, a))
    print(line, flush=True)
    if LOG is not None:
        with LOG.open("a") as f:
            f.write(line + "\n")


def n_steps(result) -> int:
    return result.steps if isinstance(result.steps, int) else len(result.steps)


def graphs(bundle, prompts, shape, new: int, compile: str | bool = False) -> dict:
    """compile: a scope, or "step-tuneall": the step scope with every capture tuned (before Graphs' tune=False)."""
    s, k, n = shape
    if compile == "step-tuneall":
        with tune_all():
            return graphs(bundle, prompts, shape, new, "step")
    e = Engine(bundle, "eagle", k=s, topk=k, num_draft_tokens=n, max_batch=1, max_len=1024, cuda_graphs="on",
               compile=compile)
    t = time.perf_counter()
    for p in prompts:  # captures (and compiles), for every span the runs meet
        e.generate([p], max_new_tokens=new)
    first_s = time.perf_counter() - t
    steps, wall, split = 0, 0.0, dict(draft=0.0, verify=0.0, host=0.0)
    for p in prompts:
        torch.cuda.synchronize()
        t = time.perf_counter()
        r = e.generate([p], max_new_tokens=new)
        torch.cuda.synchronize()
        wall += time.perf_counter() - t
        steps += n_steps(r)
    for p in prompts:  # again, with a sync between the draft and the verify
        r = e.generate([p], max_new_tokens=new, profile=True)
        for key in split:
            split[key] += r.times.get(key, 0.0)
    return dict(ms_per_step=1e3 * wall / steps, steps=steps, tokens=new * len(prompts), first_s=first_s,
                split_ms_per_step={key: 1e3 * v / steps for key, v in split.items()})  # the same prompts, greedy: the same steps


@contextlib.contextmanager
def tune_all():
    """Every capture compiled with inductor's tuning, whatever its caller asks (the code before this commit)."""
    call = Graphs.__call__
    Graphs.__call__ = lambda self, *a, tune=True, **kw: call(self, *a, tune=True, **kw)
    try:
        yield
    finally:
        Graphs.__call__ = call


def kernels(bundle, prompts, shape, new: int) -> dict:
    s, k, n = shape
    e = Engine(bundle, "eagle", k=s, topk=k, num_draft_tokens=n, max_batch=1, max_len=1024, cuda_graphs="off")
    e.generate(prompts[:1], max_new_tokens=8)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        steps = sum(n_steps(e.generate([p], max_new_tokens=new)) for p in prompts)
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None)
        if t is None:
            t = getattr(ev, "cuda_time_total", 0.0)
        if t and ev.count:
            rows.append((ev.key, ev.count, t))
    rows.sort(key=lambda r: -r[2])
    total = sum(r[2] for r in rows)
    count = sum(r[1] for r in rows)
    return dict(gpu_us_per_step=total / steps, kernels_per_step=count / steps, steps=steps,
                top=[dict(kernel=key[:90], per_step=c / steps, us_per_step=t / steps) for key, c, t in rows[:14]])


def main() -> None:
    global LOG
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="7,1,8:7,4,8:15,1,16:15,4,16")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--no-kernels", action="store_true", help="leave out the eager kernel profile")
    ap.add_argument("--compile", default="off", help="off, or a list of scopes (step,layers; step-tuneall: step with "
                    "every capture tuned): each shape's graphed decode also compiled (a tree's drafter too)")
    args = ap.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    LOG = out.with_suffix(".log")
    shapes = [tuple(int(x) for x in part.split(",")) for part in args.shapes.split(":")]
    bundle = load_bundle("tiny", device="cuda", dtype=torch.bfloat16, fuse=True)
    tok = trained_tokenizer(bundle.paths["target"])
    prompts = [tok.encode(p).ids for p in PROMPTS]
    say(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; zoo bf16 fused, batch 1, "
        f"{len(prompts)} prompts x {args.max_new_tokens} new tokens")
    result = {}
    for shape in shapes:
        g = graphs(bundle, prompts, shape, args.max_new_tokens)
        kern = None if args.no_kernels else kernels(bundle, prompts, shape, args.max_new_tokens)
        result[",".join(map(str, shape))] = dict(graphs=g, kernels=kern)
        split = ", ".join(f"{key} {v:.2f}" for key, v in g["split_ms_per_step"].items())
        say(f"{shape}: graphs {g['ms_per_step']:.2f} ms/step ({g['steps']} steps; with syncs: {split} ms)" + (
            "" if kern is None else f"; eager GPU {kern['gpu_us_per_step'] / 1e3:.2f} ms/step in "
                                    f"{kern['kernels_per_step']:.0f} kernels"))
        for row in [] if kern is None else kern["top"]:
            say(f"    {row['us_per_step']:8.1f} us  {row['per_step']:6.1f}x  {row['kernel']}")
        out.write_text(json.dumps(result, indent=1))
    for scope in [] if args.compile == "off" else args.compile.split(","):
        for shape in shapes:
            g = graphs(bundle, prompts, shape, args.max_new_tokens, scope)
            result[",".join(map(str, shape))][f"graphs_compile_{scope}"] = g
            split = ", ".join(f"{key} {v:.2f}" for key, v in g["split_ms_per_step"].items())
            say(f"{shape}: graphs + compile {scope} {g['ms_per_step']:.2f} ms/step ({g['steps']} steps; with syncs: "
                f"{split} ms); first runs (capture and compile) {g['first_s']:.0f} s")
            out.write_text(json.dumps(result, indent=1))


def render() -> str:
    """docs/results.md's section: each shape's step, graphed, eager by kernel, and compiled."""
    from page import load, provenance, table

    data = load("gpu_tree_profile.json")
    if not data:
        return ""
    ms = lambda r, k: None if not r else r[k]  # noqa: E731
    rows = []
    for shape, r in data.items():
        g, kern = r["graphs"], r["kernels"]
        step, layers = r.get("graphs_compile_step"), r.get("graphs_compile_layers")
        rows.append([shape, g["ms_per_step"], g["split_ms_per_step"]["draft"], g["split_ms_per_step"]["verify"],
                     kern["gpu_us_per_step"] / 1e3, kern["kernels_per_step"], ms(step, "ms_per_step"),
                     ms(step, "first_s"), ms(layers, "ms_per_step"), ms(layers, "first_s")])
    topk = {shape: sum(t["us_per_step"] for t in r["kernels"]["top"] if "TopK" in t["kernel"] or "bitonicSort" in t["kernel"])
            for shape, r in data.items()}
    widest = max(topk, key=topk.get)
    res = "benchmarks/results/gpu_tree_profile.json"
    return f"""### Where a tree's step goes (batch 1)

{provenance([res], "one NVIDIA H200", "`benchmarks/gpu_tree_profile.py`", ["benchmarks/logs/gpu_tree_profile.log"], [res])}

The Lab 2 engine on the zoo (bf16, fused), one row, three prompts of 96 new tokens. ms per step under CUDA graphs,
split into the draft's captured step and the verify's (a sync between them); the eager GPU time and kernels of a step
(torch.profiler: the same kernels run inside the graphs); and the graphed step compiled whole (`step`: a tree's drafter
included) or by layers, with the seconds its first runs took (capture and compile). The number of steps differs a little
between the compiled and the uncompiled runs: bf16 kernels that fuse round differently, and greedy drafts follow.

{table(["shape", "graphs ms/step", "draft ms", "verify ms", "eager GPU ms/step", "kernels/step", "compiled step ms/step",
        "its first runs s", "compiled layers ms/step", "its first runs s"], rows)}

- Top-k over the vocabulary, the tree's own cost: {topk[widest]:.0f} us of {widest}'s eager step are torch.topk's
  kernels (gatherTopK and the sort of its K results), none of the chain's (an argmax).
"""


def render_untuned() -> str:
    """docs/results.md's section: a tree compiled whole with and without tuning its several-token captures."""
    from page import load, provenance, table

    runs = {v: load(f"gpu_tree_profile_untuned/{v}.json") for v in ("step-tuneall", "step", "layers")}
    if not all(runs.values()):
        return ""
    labels = {"step-tuneall": "step, every capture tuned (before)", "step": "step, a tree's several-token captures "
              "untuned (now)", "layers": "layers"}
    rows, got = [], {}
    for v, data in runs.items():
        for shape, r in data.items():
            g = r.get(f"graphs_compile_{v}")
            if g:
                got[v, shape] = g
                rows.append([labels[v], shape, g["ms_per_step"], g["steps"], g["first_s"]])
    tree, chain = got[("step", "7,4,16")], got[("step", "7,1,8")]
    before = got[("step-tuneall", "7,4,16")]
    files = [f"benchmarks/results/gpu_tree_profile_untuned/{v}.json" for v in runs]
    rate = lambda g: 1.0 / (g["ms_per_step"] * g["steps"])  # noqa: E731  same prompts and tokens: per step x steps
    return f"""### What tuning a tree's captures cost

{provenance(files, "one NVIDIA H200", "`benchmarks/gpu_tree_profile.py --compile step,layers,step-tuneall --no-kernels`",
            ["benchmarks/logs/gpu_tree_profile_untuned.log"], files)}

Compiled whole (`--compile-scope step`), every capture was compiled with inductor's coordinate-descent tuning
(`cuda_graphs.INDUCTOR_OPTIONS`), which tunes the one-token projections of a batch-1 plain step. A tree's captures read
several tokens a row (the drafter's K per depth, the verify's N), where the projections are cuBLAS matmuls. Each variant
below ran in a process of its own with an empty inductor cache, the zoo's EAGLE head, one row, three prompts of 96 new
tokens (the same for every run: greedy).

{table(["compile", "shape", "ms/step", "steps", "first runs s (capture and compile)"], rows)}

- The tree 7,4,16 compiled in **{tree["first_s"]:.0f} s** untuned against {before["first_s"]:.0f} s tuned; its step
  {tree["ms_per_step"]:.2f} ms against {before["ms_per_step"]:.2f} ms ({tree["ms_per_step"] / before["ms_per_step"] - 1:+.0%}).
- Untuned, the tree decodes the three prompts' tokens at {rate(tree) / rate(chain):.2f}x the rate of the chain 7,1,8
  compiled whole (as many tokens each: the rate is 1 / (steps x ms per step)).
"""


if __name__ == "__main__":
    main()
