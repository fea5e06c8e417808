"""One-row projections on a GPU: gemv.py's split Triton kernel, tile by tile, against inductor's reduction and cuBLAS.

For every weight of the Llama-3.1-8B and Llama-3.2-1B shapes (fused qkv and gate/up, o, down, the LM head), y = x W^T
at one row (a batch-1 decode step's projections), over enough distinct weights to leave the L2 cache, every call of
a measurement in one CUDA graph (no launch gaps):
  cublas     F.linear
  inductor   the compiled multiply-and-sum model.Linear runs under torch.compile, tuned by coordinate descent
  ours       gemv.partials with each candidate tile (rows a program, columns a load, slices of K, warps, stages),
             alone (compiled, its sum folds into the next kernel) and with the sum as a kernel of its own
--record writes the best tile of each weight shape where the kernel beat inductor's reduction by --margin into
specdec/decoder/tuned/gemv.json under the GPU's name (only for the weights in --weights), which model.Linear then
runs under torch.compile on that GPU. Results to one JSON (and a log beside it), rewritten after each weight.

usage: PYTHONPATH=. python3 benchmarks/gpu_gemv.py --out $OUT/gemv.json [--shapes 8b,1b] [--record]
       PYTHONPATH=. python3 benchmarks/gpu_gemv.py --out - --from results.json --record --weights qkv,o --margin -0.05
On the CPU (the test): the smoke shapes, gemv.reference_partials in the kernel's place, timed by the clock.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_floor import SHAPES, SMOKE_SHAPES  # noqa: E402

from specdec.decoder import gemv  # noqa: E402

WEIGHTS = ("qkv", "o", "gate_up", "down", "lm_head")


def weight_shapes(shape: dict) -> dict[str, tuple[int, int]]:
    """{weight: (N, K)} of one model shape, q/k/v and gate/up fused as the engine runs them."""
    H, I = shape["hidden_size"], shape["intermediate_size"]
    D = shape.get("head_dim") or H // shape["num_attention_heads"]
    q, kv = shape["num_attention_heads"] * D, shape["num_key_value_heads"] * D
    return {"qkv": (q + 2 * kv, H), "o": (H, q), "gate_up": (2 * I, H), "down": (H, I),
            "lm_head": (shape["vocab_size"], H)}


def candidates(N: int, K: int, programs=(264, 16384)) -> list[gemv.Tile]:
    """Tiles that cut N x K evenly, give each thread 8 to 32 products a load, and make a few waves of programs
    (an H200 has 132 SMs)."""
    out = []
    for rows, chunk, splits, warps, stages in itertools.product((1, 2, 4, 8, 16), (128, 256, 512, 1024, 2048),
                                                                (1, 2, 4, 8, 16, 32), (4, 8), (1, 3)):
        tile = gemv.Tile(rows, chunk, splits, warps, stages)
        per_thread = rows * chunk / (32 * warps)
        if 8 <= per_thread <= 32 and tile.fits(N, K) and programs[0] <= N // rows * splits <= programs[1]:
            out.append(tile)
    return out


def timer(device: str):
    """Seconds a call of each fn in fns: on a GPU all captured in one CUDA graph, on the CPU by the clock."""
    if device == "cpu":
        def clock(fns, iters=3):
            t0 = time.perf_counter()
            for _ in range(iters):
                for f in fns:
                    f()
            return (time.perf_counter() - t0) / iters / len(fns)
        return clock
    from gpu_profile import graph_time  # every call captured in one CUDA graph

    return graph_time


def measure(N: int, K: int, device: str, dtype, bw: float, budget_bytes: float, tiles: list[gemv.Tile],
            deadline: float) -> dict:
    """One weight shape: every candidate's microseconds a call and its largest error against fp32."""
    nbytes = N * K * torch.finfo(dtype).bits // 8
    ws = [torch.randn(N, K, device=device, dtype=dtype) * 0.02 for _ in range(max(2, math.ceil(budget_bytes / nbytes)))]
    x = torch.randn(1, K, device=device, dtype=dtype)
    ref = F.linear(x.float(), ws[0].float())[0]
    time_of = timer(device)
    partials = gemv.partials if device == "cuda" else gemv.reference_partials  # the CPU has no Triton
    row = {"N": N, "K": K, "MB": round(nbytes / 1e6, 2), "floor_us": round(nbytes / bw * 1e6, 2), "tiles": []}

    def entry(fn) -> dict:
        err = (fn(ws[0]).float().flatten() - ref).abs().max().item()
        t = time_of([lambda w=w: fn(w) for w in ws])
        return {"us": round(t * 1e6, 2), "x_floor": round(t / (nbytes / bw), 3), "max_err": round(err, 5)}

    row["cublas"] = entry(lambda w: F.linear(x, w))
    import torch._inductor.config as ic
    red = lambda x, w: (x.float() * w.float()).sum(-1).to(x.dtype)  # noqa: E731
    with ic.patch(coordinate_descent_tuning=True):
        if device == "cuda":  # the CPU run checks the procedure: its reduction stays eager (no compile to wait for)
            torch._dynamo.reset()  # one compile per weight shape: past dynamo's 8 recompiles it would run eager
            red = torch.compile(red, dynamic=False)
        row["inductor"] = entry(lambda w: red(x, w))
    for tile in tiles:
        if time.monotonic() > deadline:
            row["stopped"] = "time budget"
            break
        try:
            alone = entry(lambda w: partials(x, w, tile).sum(0))  # the error of the whole product
            alone["us"] = round(time_of([lambda w=w: partials(x, w, tile) for w in ws]) * 1e6, 2)  # the kernel alone
            alone["x_floor"] = round(alone["us"] / 1e6 / (nbytes / bw), 3)
            summed = time_of([lambda w=w: partials(x, w, tile).sum(0).to(dtype) for w in ws])
            row["tiles"].append({"tile": tile.__dict__, **alone, "with_sum_us": round(summed * 1e6, 2)})
        except Exception as exc:  # noqa: BLE001  (a tile that does not compile: recorded, the rest go on)
            row["tiles"].append({"tile": tile.__dict__, "error": f"{type(exc).__name__}: {str(exc)[:160]}"})
    ok = [t for t in row["tiles"] if "us" in t]
    row["best"] = min(ok, key=lambda t: t["us"]) if ok else None
    del ws
    return row


def best_tiles(results: dict, weights: tuple[str, ...], margin: float,
               shapes: tuple[str, ...] | None = None) -> dict[tuple[int, int], gemv.Tile]:
    """The tile of each measured weight shape (of `weights`, in `shapes`: all if None) whose kernel beat inductor's
    reduction by `margin` (a negative margin: lost to it by at most that much)."""
    out = {}
    for sname, shape in results["shapes"].items():
        if shapes is not None and sname not in shapes:
            continue
        for name, row in shape.items():
            best = row.get("best")
            if name in weights and best and best["us"] < (1 - margin) * row["inductor"]["us"]:
                out[(row["N"], row["K"])] = gemv.Tile(**best["tile"])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="8b,1b")
    ap.add_argument("--weights", default=",".join(WEIGHTS), help="which weights --record pins")
    ap.add_argument("--record", action="store_true", help="write the winners into specdec/decoder/tuned/gemv.json")
    ap.add_argument("--margin", type=float, default=0.03, help="how much faster than inductor a pinned tile must be")
    ap.add_argument("--budget-s", type=float, default=240)
    ap.add_argument("--tuned", default=str(gemv.TUNED), help="the tuned file --record writes")
    ap.add_argument("--cpu", action="store_true", help="the CPU run (the test's), even on a GPU machine")
    ap.add_argument("--from", dest="source", help="record from this results file (of this script) instead of measuring")
    args = ap.parse_args(argv)
    if args.source:  # the tiles of an earlier sweep, chosen again (other weights, another margin)
        results = json.loads(Path(args.source).read_text())
        pinned = best_tiles(results, tuple(args.weights.split(",")), args.margin, tuple(args.shapes.split(",")))
        gemv.record(results["env"]["device"], pinned, Path(args.tuned))
        print(f"recorded {len(pinned)} tiles for {results['env']['device']} in {args.tuned}: "
              + ", ".join(f"{n}x{k} {t}" for (n, k), t in sorted(pinned.items())))
        return 0
    cuda = torch.cuda.is_available() and not args.cpu
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    shapes = SHAPES if cuda else SMOKE_SHAPES
    if cuda:
        from gpu_bench import copy_bandwidth
        bw = copy_bandwidth()
    else:
        bw = 20e9  # a nominal CPU figure: the CPU run checks the procedure, not the numbers
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.with_suffix(".log").open("w")

    def say(*a):
        print(*a, flush=True)
        print(*a, file=log, flush=True)

    gpu = torch.cuda.get_device_name() if cuda else "cpu"
    results = {"env": {"device": gpu, "torch": torch.__version__, "triton": gemv.triton and gemv.triton.__version__,
                       "copy_Bps": bw,
                       "date": time.strftime("%Y-%m-%d %H:%M:%S")}, "shapes": {}}
    deadline = time.monotonic() + args.budget_s
    for sname in args.shapes.split(","):
        results["shapes"][sname] = {}
        for wname, (N, K) in weight_shapes(shapes[sname]).items():
            tiles = candidates(N, K) if cuda else [gemv.Tile(r, 16, s) for r in (1, 4) for s in (1, 2)]
            row = measure(N, K, device, dtype, bw, 600e6 if cuda else 4e6, tiles, deadline)
            results["shapes"][sname][wname] = row
            best = row["best"] or {}
            say(f"{sname} {wname:8s} {N}x{K}: floor {row['floor_us']} us, cuBLAS {row['cublas']['us']}, inductor "
                f"{row['inductor']['us']}, ours {best.get('us')} ({best.get('with_sum_us')} with the sum) "
                f"{best.get('tile')}, {len(row['tiles'])} tiles{' (stopped: time budget)' if 'stopped' in row else ''}")
            out.write_text(json.dumps(results, indent=1))
    if args.record:
        pinned = best_tiles(results, tuple(args.weights.split(",")), args.margin)
        gemv.record(gpu, pinned, Path(args.tuned))
        results["recorded"] = {f"{n}x{k}": t.__dict__ for (n, k), t in pinned.items()}
        say(f"recorded {len(pinned)} tiles for {gpu} in {args.tuned}: {sorted(results['recorded'])}")
    out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())


# --- docs/results.md: the section this script's results feed (benchmarks/report.py stitches the sections) ----

def weight_of(t: dict) -> str | None:
    """Which projection an inductor kernel of a compiled step's profile is (one row of torch.profiler's table), or None:
    inductor names a kernel by what it fuses, not by its weight, so the output projection is the reduction over a
    transposed input and the others go by their time a call (gate/up over 45 us, down 25 to 45, qkv 12 to 20 on the
    8B shape); the LM head (one call a step) and gemv.py's kernel (one name for all four) are left out."""
    per = t["us"] / t["calls"]
    if not t["name"].startswith("triton_red") or "_sum_" not in t["name"] or t["calls"] < 2:
        return None
    if "transpose" in t["name"]:
        return "o"
    return "gate_up" if per > 45 else "down" if per > 25 else "qkv" if per > 12 else None


def by_weight(kernels: dict) -> dict[str, list[float]]:
    """A compiled step's projection kernels by weight: {weight: [us a call, ...]}."""
    out: dict[str, list[float]] = {}
    for t in kernels["top"]:
        if w := weight_of(t):
            out.setdefault(w, []).append(t["us"] / t["calls"])
    return out


def render() -> str:
    """One-row projections in Triton: the sweep, the step's kernels with and without, the default path with them."""
    import re

    from page import load, provenance, table

    sweep, sweep1, first, only_o, both, e2e = (load(f"gpu_gemv/{n}.json") for n in (
        "sweep", "sweep_1b", "step_first", "kernels_o", "kernels", "decode8b"))
    if not (sweep and sweep1 and first and only_o and both and e2e):
        return ""
    rows = []
    for shape, res in (("8b", sweep), ("1b", sweep1)):
        for w, r in res["shapes"][shape].items():
            b = r["best"]
            t = b["tile"]
            rows.append([shape, w, f'{r["N"]} x {r["K"]}', r["floor_us"], r["cublas"]["us"], r["inductor"]["us"], b["us"],
                         f'{t["rows"]}, {t["chunk"]}, {t["splits"]}, {t["warps"]}, {t["stages"]}', b["with_sum_us"]])
    ks = {r["variant"].endswith("gemv"): r for r in both["sections"]["compiled_kernels"]}
    ko = {r["variant"].endswith("gemv"): r for r in only_o["sections"]["compiled_kernels"]}
    krows = [[label, f'{r[False]["graph_us"]:.0f}', f'{r[True]["graph_us"]:.0f}',
              f'{r[True]["graph_us"] / r[False]["graph_us"] - 1:+.1%}', f'{r[False]["kernels_per_step"]:.0f} / {r[True]["kernels_per_step"]:.0f}']
             for label, r in (("o alone (call 3)", ko), ("qkv, o, gate/up, down (call 4)", ks))]
    gemv_calls = next(t for t in ks[True]["top"] if t["name"] == "_gemv")
    plain_proj = sum(t["us"] for t in ks[False]["top"] if weight_of(t))
    before, after_o = by_weight(ko[False]), by_weight(ko[True])
    pins = load("gpu_pin_configs/pin.json")
    unpinned = [r["tpot_ms"] for r in pins["runs"] if r["phase"] == "unpinned" and r.get("tpot_ms")] if pins else []
    spread = f"{max(unpinned) / min(unpinned) - 1:.1%}" if unpinned else "several percent"
    ms = {r["variant"]: r["ms"] for r in first["runs"] if "ms" in r}
    runs = {r["variant"]: r for r in e2e["runs"] if r.get("tpot_ms")}
    floor = e2e["floor"]["8b"]
    s1, s2, off = (runs[v]["tpot_ms"] for v in ("start 1 (step)", "start 2 (step)", "compile off"))
    log = (Path(__file__).parent / "logs" / "gpu_gemv.log").read_text()
    sg_rate = [float(x) for x in re.findall(r"gen throughput \(token/s\): ([\d.]+)", log)]
    sg_ms = 1e3 / (sum(sg_rate) / len(sg_rate))
    goal = 1.20 * floor
    return f"""### One-row projections in Triton

{provenance(["benchmarks/results/gpu_gemv/kernels.json"], e2e["env"]["device"], "`benchmarks/gpu_gemv.py`",
            ["benchmarks/logs/gpu_gemv.log"], ["benchmarks/results/gpu_gemv/"])}

Compiled, `model.Linear` at one row is an inductor reduction per weight, each compile tuning its own tile sizes:
the down projection ran {min(before["down"]):.1f} to {max(before["down"]):.1f} µs a call in one compile's step and
{max(after_o["down"]):.1f} in another's (call 3 below), and three compiles of the default path from empty caches took
times per token {spread} apart ("Pinned tile sizes" below). `specdec/decoder/gemv.py` is one Triton kernel for
every one-row projection, each program taking a few outputs over a slice of K, with its tile per weight shape tuned
once per GPU and committed (`specdec/decoder/tuned/gemv.json`): the same kernel in every layer and every compile.
The sweep, y = x W^T at one row over enough distinct weights to leave the L2 cache, every call in one CUDA graph
(µs a call; tile = rows a program, columns a load, slices of K, warps, stages; "with the sum": the slices' sum as a
kernel of its own, which in the compiled step inductor folds into the kernel after):

{table(["shape", "weight", "N x K", "floor", "cuBLAS", "inductor", "ours", "tile", "ours with the sum"], rows)}

Alone, the kernel is within a few percent of inductor's reduction on the wide weights and faster on the small ones
(the 8B output projection {rows[1][6]} µs against {rows[1][5]}). In the compiled 8B step (batch 1, 512 tokens of
context; torch.profiler over the compiled forward, µs a step; each variant compiled once, one after the other in one
process):

{table(["through the kernel", "step without, µs", "with, µs", "change", "kernels a step, without / with"], krows)}

- With all four projections through it ({gemv_calls["calls"]:.0f} calls a step, {gemv_calls["us"] / gemv_calls["calls"]:.2f}
  µs a call on average, {gemv_calls["us"]:.0f} µs a step against {plain_proj:.0f} for inductor's projections) the step
  ran {ks[True]["graph_us"] / 1e3:.2f} ms against {ks[False]["graph_us"] / 1e3:.2f}. The projections took about
  what this compile's inductor kernels took; the step ran {ks[False]["kernels_per_step"] - ks[True]["kernels_per_step"]:.0f}
  fewer kernels, and what a compile's tuning still decides is only the small kernels between the projections. The 8B tiles (qkv, o, gate/up, down: the best of
  the sweep where it was at most 5% slower than inductor's reduction alone) are committed; the LM head keeps the
  reduction (fused with the final norm). No 1B tile was committed then (the 1B step was not measured with them); the
  next session committed the 1B's and measured them end to end ("The default `specdec decode` path on random weights").
- Through the kernel for the output projection alone (call 3), the step was slower: the other projections' kernels,
  alike in every layer now, came out tuned worse (gate/up {max(after_o["gate_up"]):.1f} µs a call against
  {min(before["gate_up"]):.1f} to {max(before["gate_up"]):.1f}). In call 1, with the
  qkv and output projections through it, {ms[next(k for k in ms if k.endswith("gemv"))]:.3f} ms against
  {ms[next(k for k in ms if not k.endswith("gemv"))]:.3f}.
- End to end, `specdec decode --random-weights 8b --method ar` (the default path: fused, compiled, CUDA graphs,
  these tiles), 512-token prompt, 256 new tokens: {s1:.3f} ms a token at the first start (compiled in
  {runs["start 1 (step)"]["compile_s"]} s), {s2:.3f} at the second (from the compile cache,
  {runs["start 2 (step)"]["compile_s"]} s): {s1 / floor:.2f}x and {s2 / floor:.2f}x the floor of {floor:.3f} ms
  (`--compile off`: {off:.3f}). SGLang's time per token on the same shape in the same call was cut off by the call's
  time limit; its own decode log in that call reports {sum(sg_rate) / len(sg_rate):.1f} tokens/s at batch 1
  ({sg_ms:.3f} ms a token, a context of 600 to 760 tokens), which would make ours {sg_ms / s2:.2f}x to {sg_ms / s1:.2f}x.
  Issue 21's goals (<= 1.20x the floor = {goal:.2f} ms, >= 1.15x SGLang) were then still missed, by {s1 - goal:.2f} to
  {s2 - goal:.2f} ms a token; the next session's call, with the host a step behind the device, met them ("The default
  `specdec decode` path on random weights").
- Correctness on the H200 (`tests/test_gemv.py`, call 4: 5 passed): the kernel against its written-out twin
  (`gemv.reference_partials`) in fp32 and bf16, and one 8B-shaped layer compiled with every tuned projection through
  the kernel against the eager layer's logits in fp32.
"""
