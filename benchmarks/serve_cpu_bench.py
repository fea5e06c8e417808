"""`specdec serve` on this CPU: a plain server and one per speculative algorithm, each swept with the
Lab 3 benchmark (concurrency 1..16, three prompt categories), then compared with the plain one.

usage: python benchmarks/serve_cpu_bench.py --out benchmarks/results/serve_cpu  (log: benchmarks/logs/serve_cpu.log)
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from specdec.serving.measure.bench import SweepConfig, format_sweep, run_sweep
from specdec.serving.measure.compare import compare, crossovers, format_comparison, plot_comparison
from specdec.serving.measure.machine import cpu_name
from specdec.serving.ops.launch import LaunchConfig
from specdec.serving.ops.lifecycle import launch
from specdec.zoo import zoo_parts

K = 4


def configs() -> dict[str, LaunchConfig]:
    zoo = zoo_parts("tiny")
    chain = dict(num_steps=K, topk=1, num_draft_tokens=K + 1)
    common = dict(backend="specdec", max_running_requests=16)
    return {"plain": LaunchConfig("tiny", "none", **common),
            "NEXTN": LaunchConfig("tiny", "NEXTN", **chain, **common),
            "EAGLE": LaunchConfig("tiny", "EAGLE", draft=str(zoo["eagle"]), **chain, **common),
            "STANDALONE": LaunchConfig("tiny", "STANDALONE", draft=str(zoo["draft"]), **chain, **common),
            "NGRAM": LaunchConfig("tiny", "NGRAM", num_draft_tokens=K + 1, **common),
            "HEADS": LaunchConfig("tiny", "HEADS", **chain, **common)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--concurrency", default="1,2,4,8,16")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--min-run-s", type=float, default=1.0, help="each run lasts at least this long (seconds)")
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    levels = tuple(int(c) for c in args.concurrency.split(","))
    print(f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"load average {os.getloadavg()[0]:.2f}; server: specdec serve, 1 CPU thread each, tiny zoo, k = {K}; "
          f"{args.max_new_tokens} new tokens per request, concurrency {levels}", flush=True)
    runs = {}
    for name, cfg in configs().items():
        t0 = time.perf_counter()
        with launch(cfg, timeout=300, progress=False) as server:
            runs[name] = run_sweep(SweepConfig(server.url, concurrency=levels, max_new_tokens=args.max_new_tokens,
                                               min_run_s=args.min_run_s, repeats=args.repeats),
                                   progress=False)
        (args.out / f"{name}.json").write_text(json.dumps(runs[name], indent=1) + "\n")
        print(f"\n== {name} ({time.perf_counter() - t0:.0f} s, load average {os.getloadavg()[0]:.2f})\n"
              + format_sweep(runs[name]), flush=True)
    for name in runs:
        if name != "plain":
            cmp = compare(runs["plain"], runs[name])
            (args.out / f"compare_{name}.json").write_text(json.dumps(cmp, indent=1) + "\n")
            print(f"\n== {name} against plain\n" + format_comparison(cmp), flush=True)
            if name == "NEXTN":
                plot_comparison(runs["plain"], runs[name], cmp, args.out)


def render() -> str:
    """docs/results.md's section on this script's run (benchmarks/report.py stitches the sections)."""
    from page import LOGS, RES, provenance, table

    d = RES / "serve_cpu"
    if not (d / "plain.json").is_file():
        return ""
    plain = json.loads((d / "plain.json").read_text())
    levels = sorted({r["concurrency"] for r in plain["runs"]})
    lo, hi = levels[0], levels[-1]
    rows = []
    for f in sorted(d.glob("compare_*.json")):
        c = json.loads(f.read_text())
        pooled = {r["concurrency"]: r for r in c["rows"] if r["category"] == "all"}
        cross = crossovers(c["rows"])  # the course's rule, read from the rows (the stored crossover predates it)
        rows.append([f.stem.removeprefix("compare_"), pooled[lo]["accept_length"], pooled[lo]["base_tok_s"],
                     pooled[lo]["spec_tok_s"], pooled[lo]["speedup"], pooled[hi]["base_tok_s"], pooled[hi]["spec_tok_s"],
                     pooled[hi]["speedup"], cross["measured"].get("text", cross["measured"]["status"]),
                     cross["predicted"].get("text", cross["predicted"]["status"])])
    s = plain["settings"]
    machine = (LOGS / "serve_cpu.log").read_text().split(";")[0].split(", load average")[0]
    return f"""### Lab 3 on the CPU: `specdec serve` with each algorithm

{provenance(["benchmarks/results/serve_cpu"], machine, "`benchmarks/serve_cpu_bench.py`", ["benchmarks/logs/serve_cpu.log"],
            ["benchmarks/results/serve_cpu/"])}

A plain server and one per algorithm, each `specdec serve` on the tiny zoo with k = 4, one CPU thread, up to 16 running requests;
each swept by the Lab 3 benchmark at concurrency {", ".join(map(str, levels))} over the prompt categories
{", ".join(s["categories"])}, {s["max_new_tokens"]} new tokens per request (ignore_eos), the cache flushed before each run.
Throughput is output tokens/s over all requests, from the server's token counts; the accept length is token-weighted,
(completion_tokens - 1) / spec_verify_ct. The prediction is Lab 1's `speedup_from_costs` with the step times the server
measured (`step_time_dict`).

{table(["algorithm", f"accept length (c={lo})", f"plain tok/s c={lo}", f"spec tok/s c={lo}", f"speedup c={lo}",
        f"plain tok/s c={hi}", f"spec tok/s c={hi}", f"speedup c={hi}", "crossover, measured", "crossover, predicted"], rows)}
"""


if __name__ == "__main__":
    main()
