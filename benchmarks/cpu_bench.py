"""CPU benchmark of the Lab 2 decoder on a zoo, batch 1: plain decoding against every proposer
(MTP layer, MTP heads, draft model, EAGLE head, n-gram) at k = 1..4, greedy, fp32.

Prompts are 48-token windows of held-out standard-library code. Every configuration runs in each
round, interleaved with plain decoding, so that a busy moment of the machine hits all of them;
tokens/s and speedup are medians over the rounds. Output tokens are checked against plain decoding.

usage: .venv/bin/python benchmarks/cpu_bench.py [--zoo tiny] [--prompts 4] [--new-tokens 128]
                                                [--repeats 5] [--threads N] --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from specdec.decoder.engine import Engine
from specdec.serving.measure.machine import machine
from specdec.zoo import load_bundle
from specdec.zoo.corpus import build_corpus
from specdec.zoo.evaluate import PROMPT_TOKENS, spread_windows, trained_tokenizer
from specdec.zoo.report import LABELS, table

METHODS = tuple(m for m in LABELS if m != "ar")  # every proposer
KS = (1, 2, 3, 4)


def run(args) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    bundle = load_bundle(args.zoo, device="cpu", dtype=torch.float32)
    tok = trained_tokenizer(bundle.paths["target"])
    code = [tok.encode(d).ids for d in build_corpus().heldout["code"]]
    prompts = spread_windows(code, args.prompts, PROMPT_TOKENS, args.new_tokens)
    configs = [("ar", 1)] + [(m, k) for m in METHODS for k in KS]
    max_len = max(map(len, prompts)) + args.new_tokens + max(KS) + 2
    engines = {(m, k): Engine(bundle, m, k=k, max_batch=1, max_len=max_len, cuda_graphs="off") for m, k in configs}
    for e in engines.values():  # warm-up: first-call allocations
        e.generate([prompts[0]], max_new_tokens=8)
    load_before = os.getloadavg()
    # rounds[cfg] = list over repeats of (tokens, seconds, per-prompt results)
    rounds: dict[tuple, list] = {c: [] for c in configs}
    bar = tqdm(total=args.repeats * len(prompts) * len(configs), desc="cpu bench", mininterval=2)
    t0 = time.time()
    for _ in range(args.repeats):
        per = {c: [] for c in configs}
        for p in prompts:
            for m, k in configs:
                per[(m, k)].append(engines[(m, k)].generate([p], max_new_tokens=args.new_tokens, profile=True))
                bar.update()
        for c in configs:
            rounds[c].append(per[c])
    bar.close()
    seconds = time.time() - t0
    plain_tps = [sum(r.new_tokens for r in rs) / sum(r.wall_s for r in rs) for rs in rounds[("ar", 1)]]
    plain_tokens = [r.tokens for r in rounds[("ar", 1)][0]]
    results = []
    for m, k in configs:
        tps = [sum(r.new_tokens for r in rs) / sum(r.wall_s for r in rs) for rs in rounds[(m, k)]]
        last = rounds[(m, k)][-1]
        steps = sum(r.steps for r in last)
        acc = [a for r in last for a in r.accepted.ravel().tolist() if a >= 0]
        times = {key: sum(r.times.get(key, 0.0) for r in last) for key in ("prefill", "draft", "verify", "host")}
        results.append({
            "method": m, "k": k if m != "ar" else 0,
            "tokens_per_s": round(statistics.median(tps), 1), "tokens_per_s_runs": [round(x, 1) for x in tps],
            "speedup": round(statistics.median(t / p for t, p in zip(tps, plain_tps)), 3),
            "tau": round(sum(acc) / len(acc) + 1, 3) if acc else 1.0,
            "target_forwards": steps, "new_tokens": sum(r.new_tokens for r in last),
            "seconds_split": {key: round(v, 4) for key, v in times.items()},
            "identical_to_plain": all([r.tokens for r in rs] == plain_tokens for rs in rounds[(m, k)]),
        })
    return {"zoo": args.zoo, "device": "cpu", "dtype": "float32", "batch": 1, "temperature": 0.0,
            "prompts": len(prompts), "prompt_tokens": PROMPT_TOKENS, "new_tokens": args.new_tokens,
            "repeats": args.repeats, "seconds": round(seconds, 1),
            **machine(torch.get_num_threads(), torch=torch.__version__),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "command": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]), "results": results}


def format_table(out: dict) -> str:
    rows = []
    for r in out["results"]:
        t = r["seconds_split"]
        busy = sum(t.values()) or 1.0
        rows.append([LABELS.get(r["method"], "plain"), r["k"] or "-", f"{r['tau']:.2f}", r["target_forwards"],
                     f"{r['tokens_per_s']:.0f}", f"{r['speedup']:.2f}x", f"{t['draft'] / busy:.0%}",
                     f"{t['verify'] / busy:.0%}", "yes" if r["identical_to_plain"] else "NO"])
    head = (f"{out['cpu']}, {out['threads']} threads, torch {out['torch']}, Python {out['python']}; batch 1, fp32, "
            f"greedy; {out['prompts']} held-out code prompts x {out['new_tokens']} new tokens, median of "
            f"{out['repeats']} rounds; load average {out['load_average_before'][0]} before, "
            f"{out['load_average_after'][0]} after")
    return head + "\n" + table(["method", "k", "tau", "target forwards", "tokens/s", "speedup", "draft time",
                                "verify time", "same as plain"], rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--zoo", default="tiny")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    out = run(args)
    print(format_table(out))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


def render() -> str:
    """docs/results.md's section on this script's run (benchmarks/report.py stitches the sections)."""
    from page import load, provenance, table

    c = load("cpu_bench.json")
    if not c:
        return "### CPU: the shipped tiny zoo, batch 1\n\nNot measured yet: run `python benchmarks/cpu_bench.py`.\n"
    rows = [[r["method"], r["k"], r["tokens_per_s"], r["tau"], r["speedup"], "yes" if r["identical_to_plain"] else "NO"]
            for r in c["results"]]
    meta = (f"{c['cpu']}, {c['threads']} threads, torch {c['torch']}, Python {c['python']}; {c['prompts']} held-out code "
            f"prompts of {c['prompt_tokens']} tokens, {c['new_tokens']} new tokens, greedy, fp32; tokens/s is the median of "
            f"{c['repeats']} rounds (load average before/after: {c['load_average_before']} / {c['load_average_after']}).")
    return f"""### CPU: the shipped tiny zoo, batch 1

{provenance(["benchmarks/results/cpu_bench.json"], c["cpu"], "`benchmarks/cpu_bench.py`", ["benchmarks/logs/cpu_bench.log"],
            ["benchmarks/results/cpu_bench.json"])}

{meta}

{table(["method", "k", "tokens/s", "tau", "speedup over plain", "identical to plain"], rows)}

On this CPU a verify step of k+1 tokens costs
clearly more than a plain step and a draft step about half of one, so of the tiny zoo's proposers only n-gram lookup
(whose drafting is free) pays; Lab 2 measures exactly this, and the GPU sections show where speculation does pay.
"""


if __name__ == "__main__":
    sys.exit(main())
