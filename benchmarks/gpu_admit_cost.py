"""Issue 21: what admitting a request costs the running batch, beside what a step costs.

A server in a closed loop admits a request whenever one finishes: at concurrency 16 with 128-token outputs
and about 4 tokens a step, one admit every 2 steps. Every running row waits while the engine prefills
(eagerly, outside the CUDA graphs); if an admit costs several steps, admission, not the step, sets the
server's speed. Measured on the zoo with the server's engine (fused, CUDA graphs):

- the step at a full batch (every row running);
- admitting n prompts (1, 4, all rows) into free rows while the others run: its time, its top-level
  operator and kernel counts, and how long the GPU was busy (bound by the GPU's work, or by the host's
  launches?); --profile: where one admit's host time goes (cProfile).

usage: python benchmarks/gpu_admit_cost.py [--method M --k K --rows R --repeats N --profile] [--smoke] [--out DIR]
(--smoke: the CPU, a few repeats: that the script runs)
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from pathlib import Path

import torch

from specdec.decoder.engine import Engine, SamplingParams
from specdec.zoo import load_bundle

PROMPT = ("The history of the city begins with a small settlement on the river, where traders met each spring "
          "to exchange grain, salt and cloth. Over the next")


def timed(fn, sync, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return out


def kernels(fn, sync, dev: torch.device) -> dict:
    """Operators called at the top level by one call of fn, and on a GPU the kernels it launched and how long they ran."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        fn()
        sync()
    ev = prof.events()
    ops = sum(1 for e in ev if e.cpu_parent is None and e.device_type == torch.autograd.DeviceType.CPU)
    gpu = [e for e in ev if e.device_type == torch.autograd.DeviceType.CUDA]
    # the GPU's busy time, against the call's: is an admit bound by the GPU's work or by the host's launches?
    busy_ms = sum(getattr(e, "device_time", 0.0) or 0.0 for e in gpu) / 1e3
    return {"top_level_ops": ops, "gpu_kernels": len(gpu), "gpu_busy_ms": round(busy_ms, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="the CPU, a few repeats: that the script runs")
    ap.add_argument("--method", default="eagle")
    ap.add_argument("--k", type=int, default=7)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--profile", action="store_true", help="print where one admit's host time goes (cProfile)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    dev = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    if args.smoke:
        args.repeats, args.rows = 1, 2
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    bundle = load_bundle("tiny", device=str(dev), dtype=dtype, fuse=True)
    engine = Engine(bundle, args.method, k=args.k, max_batch=args.rows,
                    cuda_graphs="on" if dev.type == "cuda" else "off")
    prompt = bundle.tokenizer(PROMPT)["input_ids"]
    sp = SamplingParams(max_new_tokens=1500, stop_at_eos=False)
    engine.admit([prompt] * args.rows, [sp] * args.rows)
    for _ in range(5):
        engine.step()  # every capture of this width made here, not timed

    res = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "method": args.method,
           "k": args.k, "rows": args.rows, "prompt_tokens": len(prompt), "torch": torch.__version__}
    res["step_s"] = statistics.median(timed(engine.step, engine.sync, args.repeats))

    def readmit(n: int):
        """Free n consecutive rows and admit n prompts into them: what a batch waits for while they prefill."""
        def run():
            for s in range(n):
                engine.retire(s)
            engine.admit([prompt] * n, [sp] * n)
        return run

    for n in sorted({1, min(4, args.rows), args.rows}):
        t = statistics.median(timed(readmit(n), engine.sync, args.repeats))
        res[f"admit_{n}_s"] = t
        res[f"admit_{n}_kernels"] = kernels(readmit(n), engine.sync, dev)
        print(f"admit {n:2d} prompt(s): {t * 1e3:.2f} ms ({t / res['step_s']:.1f} steps of {args.rows} rows); "
              f"{res[f'admit_{n}_kernels']}", flush=True)
    print(f"step of {args.rows} rows: {res['step_s'] * 1e3:.2f} ms", flush=True)
    if args.profile:
        import cProfile
        import io
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for _ in range(10):
            readmit(1)()
        engine.sync()
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(30)
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(20)
        print("10 admits of 1 prompt, cProfile (by cumulative time, then by own time):\n" + text.getvalue(), flush=True)
    print("RESULT " + json.dumps(res), flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "admit_cost.json").write_text(json.dumps(res, indent=1))


CASES = ("eagle-16", "eagle-64", "mtp-16", "ar-16", "ar-64")  # the committed runs: method-rows


def render() -> str:
    """What an admit costs against a step, per drafter and batch (benchmarks/results/gpu_admit_cost/)."""
    from page import load, provenance, table

    runs = {c: load(f"gpu_admit_cost/{c}.json") for c in CASES}
    if not all(runs.values()):
        return ""
    rows, busy = [], []
    for r in runs.values():
        for n in (1, 4, r["rows"]):
            cost, ops = r[f"admit_{n}_s"], r[f"admit_{n}_kernels"]
            rows.append([r["method"], r["k"], r["rows"], 1e3 * r["step_s"], n, 1e3 * cost, cost / r["step_s"],
                         ops["top_level_ops"], ops["gpu_kernels"], ops["gpu_busy_ms"]])
            busy.append(ops["gpu_busy_ms"] / (1e3 * cost))
    one = [r["admit_1_s"] / r["step_s"] for r in runs.values()]
    every = [r[f"admit_{r['rows']}_s"] / r["admit_1_s"] for r in runs.values()]
    files = [f"benchmarks/results/gpu_admit_cost/{c}.json" for c in CASES]
    # what sent us here: the zoo server's step by its own clock and as its requests saw it (gpu_tree_sweep.py)
    sweep = (load("gpu_tree_sweep_layers/summary.json") or {}).get("ours", {}).get("7,1,8", {})
    c16 = sweep.get("by_concurrency", {}).get("16", {})
    seen = ""
    if c16.get("step_time_s") and c16.get("step_time_s_client") and c16.get("accept_length_sglang"):
        per_request = 128 / c16["accept_length_sglang"]  # verify steps a 128-token request takes
        seen = (f"At concurrency 16, `specdec serve` (the zoo's EAGLE head, chain 7,1,8, compiled by layers) stepped in "
                f"{1e3 * c16['step_time_s']:.2f} ms by its own clock while each request saw "
                f"{1e3 * c16['step_time_s_client']:.2f} ms a step (`benchmarks/logs/gpu_tree_sweep_layers.log`). A closed "
                f"loop of 16 requests of 128 tokens, {per_request:.0f} steps each, admits one every "
                f"{per_request / 16:.1f} steps, and every running row waits while the engine prefills, eagerly, outside "
                "the CUDA graphs. ")
    return f"""### What admitting a request costs the running batch

{provenance(files, "one " + runs["eagle-16"]["device"], "`benchmarks/gpu_admit_cost.py`",
            ["benchmarks/logs/gpu_admit_cost.log"], ["benchmarks/results/gpu_admit_cost/"])}

{seen}Here the engine of the zoo's server (fused, CUDA graphs) admits n prompts of
{runs["eagle-16"]["prompt_tokens"]} tokens into free rows while the other rows run:

{table(["method", "k", "rows", "step ms", "prompts admitted", "admit ms", "admit / step", "top-level ops", "GPU kernels",
        "GPU busy ms"], rows)}

- Admitting one request costs {min(one):.1f} to {max(one):.1f} steps of a full batch; admitting every row in one prefill
  costs {min(every):.1f}x to {max(every):.1f}x what admitting one costs.
- The GPU is busy for {min(busy):.0%} to {max(busy):.0%} of an admit: it is bound by the host's launches of a few hundred
  eager operators, not by the GPU's work. Compiling the prefill (an experiment, in the log) halved the operators but not
  the time (inductor's kernels are launched from Python too); what would remove it is a prefill replayed as a CUDA graph,
  or admissions prepared while the GPU runs the step, as SGLang's overlap scheduler does.
"""


def served(log: Path) -> dict[tuple[str, str], tuple[float, float, float]]:
    """(server, concurrency) -> (output tok/s, step ms by the server, step ms as a request saw it) from a log's sweep
    lines, the server named by its part's "== " header."""
    out, part = {}, ""
    for line in log.read_text().splitlines() if log.exists() else []:
        if line.startswith("== "):
            part = line[3:].split(" (")[0]  # "sglang", "ours after", "ours before"
        elif m := re.search(r" c=(\d+): (\d+) tok/s.* step ([\d.]+) ms \(server\) / ([\d.]+) ms \(client\)", line):
            out[part, m.group(1)] = (float(m.group(2)), float(m.group(3)), float(m.group(4)))
    return out


def render_captured() -> str:
    """The captured prefill against the eager one, admitting and serving, one device call
    (benchmarks/results/gpu_admit_cost_captured/, benchmarks/logs/gpu_admit_cost_captured.log)."""
    from gpu_tree_sweep import at
    from page import ROOT, load, provenance, table

    cases = ("eagle-16", "ar-64")
    runs = {(b, c): load(f"gpu_admit_cost_captured/{b}-{c}.json") for b in ("before", "after") for c in cases}
    log = "benchmarks/logs/gpu_admit_cost_captured.log"
    tok = served(ROOT / log)
    if not all(runs.values()) or not tok:
        return ""
    rows = []
    for c in cases:
        before, after = runs["before", c], runs["after", c]
        for n in (1, before["rows"]):
            rows.append([before["method"], before["rows"], n, 1e3 * before[f"admit_{n}_s"], before[f"admit_{n}_s"] / before["step_s"],
                         1e3 * after[f"admit_{n}_s"], after[f"admit_{n}_s"] / after["step_s"],
                         before[f"admit_{n}_s"] / after[f"admit_{n}_s"]])
    levels = sorted({c for _, c in tok}, key=int)
    rate = lambda who, c: tok.get((who, c), (None,))[0]  # noqa: E731
    serve = [[c, rate("sglang", c), rate("ours before", c), rate("ours after", c),
              rate("ours after", c) / rate("sglang", c) if rate("ours after", c) and rate("sglang", c) else None]
             for c in levels]
    _, own, seen = tok.get(("ours after", levels[-1]), (None, float("nan"), float("nan")))
    # admission's share there: a request of 128 tokens takes 128 / accept length steps, so c requests admit c / that a step
    after = load("gpu_admit_cost_captured/serve_after_summary.json") or {}
    accept = at(after, "ours", "7,1,8", levels[-1]).get("accept_length_sglang") or float("nan")
    admits = int(levels[-1]) * accept / 128
    admit_ms = 1e3 * runs["after", "eagle-16"]["admit_1_s"]
    files = [f"benchmarks/results/gpu_admit_cost_captured/{b}-{c}.json" for b in ("before", "after") for c in cases]
    return f"""### A captured prefill: admitting without stopping the batch

{provenance(files, "one " + runs["after", "eagle-16"]["device"], "`benchmarks/gpu_admit_cost.py`, `benchmarks/gpu_tree_sweep.py`",
            [log], ["benchmarks/results/gpu_admit_cost_captured/"])}

Since the section above, a greedy admission replays a CUDA graph of the prefill, captured the first time each slot, row
count and prompt bucket (16, 32, ... 512 tokens; the prompts padded, as a ragged batch's shorter rows are) is met; a
sampled first token or a longer prompt prefills eagerly (`Engine._prefill`). In one call, the same checkout with the eager
prefill put back ("before") and as committed ("after"):

{table(["method", "rows", "prompts admitted", "before ms", "before / step", "after ms", "after / step", "faster"], rows)}

Served, `specdec serve --compile off` and SGLang, the zoo's EAGLE head, chain 7,1,8, open prompts, 128 tokens, output
tok/s:

{table(["concurrency", "SGLang", "ours before", "ours after", "after / SGLang"], serve)}

At concurrency {levels[-1]}, after, our server stepped in {own:.2f} ms by its own clock while a request saw {seen:.2f} ms a
step. Admission explains little of that now: at an accept length of {accept:.2f}, {levels[-1]} requests of 128 tokens
admit {admits:.1f} requests a step, about {admits * admit_ms:.1f} ms at {admit_ms:.2f} ms each (EAGLE, 16 rows above). The
rest is host work for each row and step, not yet measured (the scheduler, detokenizing and streaming are the candidates).
"""



if __name__ == "__main__":
    main()
