"""`specdec tour`, Lab 2: the tiny zoo decodes one code prompt plainly and with every proposer; then
a random-weight target too big for the CPU's caches decodes plainly and with the oracle proposer.

Each speculative output is checked token for token against plain decoding (greedy, fp32), and
tokens/s of every method is measured in this run, so the speedups are this machine's.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

from specdec.decoder.methods import LABELS
from specdec.decoder.engine import Engine
from specdec.decoder.roofline import StepCosts, memory_bound_run, read_floor
from specdec.serving.measure.machine import busy_warning, machine_line
from specdec.zoo import load_bundle
from specdec.zoo.evaluate import line_prompt, trained_tokenizer
from specdec.zoo.report import table

# The prompt is the first 3 lines; the 4th only fixes where the tokens split (see line_prompt).
PROMPT_TEXT = ("def parse_args(argv=None):\n    import argparse\n    parser = argparse.ArgumentParser(description=__doc__)\n"
               "    return parser.parse_args(argv)\n")
PROMPT_LINES = 3
K, NEW_TOKENS, REPEATS = 4, 64, 5
# The memory-bound run: fewer tokens than benchmarks/cpu_membound.py, to keep the tour short.
MEMORY_BOUND_TOKENS, MEMORY_BOUND_REPEATS = 96, 2


def _plot(outdir: Path, rows: list[dict]) -> Path:
    from matplotlib.figure import Figure  # no pyplot: no global backend state

    fig = Figure(figsize=(9, 3.6), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    names = [LABELS[r["method"]] for r in rows]
    ax1.bar(names, [r["tau"] for r in rows], color="tab:blue")
    ax1.set(title=f"Tokens per verify step (k = {K})", ylabel="tau")
    ax2.bar(names, [r["speedup"] for r in rows], color=["tab:gray"] + ["tab:orange"] * (len(rows) - 1))
    ax2.axhline(1.0, color="black", lw=0.8)
    ax2.set(title="Speedup over plain decoding, this machine", ylabel="x plain tokens/s")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", labelrotation=30)
        ax.grid(axis="y", alpha=0.3)
    path = outdir / "lab2_tau_and_speedup.png"
    fig.savefig(path, dpi=100)
    return path


def tour_lab2(outdir: str | Path = "tour-output", threads: int = 1, memory_bound: bool = True) -> str:
    """Decode PROMPT with plain decoding and each proposer (k = 4, batch 1); print and return the table.
    `memory_bound`: then the oracle on a target too big for the CPU's caches (a 428 MB model)."""

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    bundle = load_bundle("tiny", device="cpu", dtype=torch.float32)
    tok = trained_tokenizer(bundle.paths["target"])
    prompt = [line_prompt(tok, PROMPT_TEXT, PROMPT_LINES)]
    methods = tuple(LABELS)
    engines = {m: Engine(bundle, m, k=K, max_batch=1, max_len=len(prompt[0]) + NEW_TOKENS + K + 2, cuda_graphs="off")
               for m in methods}
    for e in engines.values():  # warm-up: first calls pay one-off costs
        e.generate(prompt, max_new_tokens=8)
    runs: dict[str, list] = {m: [] for m in methods}
    for _ in range(REPEATS):  # interleaved, so that a slower moment of the machine hits every method
        for m in methods:
            runs[m].append(engines[m].generate(prompt, max_new_tokens=NEW_TOKENS, profile=True))  # no syncs on a CPU
    plain_tps = statistics.median(r.tokens_per_s for r in runs["ar"])
    plain_tokens = runs["ar"][0].tokens
    rows = []
    for m in methods:
        res = runs[m][0]
        s = res.stats
        tps = statistics.median(r.tokens_per_s for r in runs[m])
        rows.append({"method": m, "tau": s.tau if s else 1.0, "by_position": list(s.by_position) if s else [],
                     "tokens_per_s": tps, "speedup": tps / plain_tps, "steps": res.steps,
                     "identical": all(r.tokens == plain_tokens for r in runs[m])})
    lines = [f"== Lab 2: static-k speculative decoding on the tiny zoo (CPU, fp32, greedy, k={K}, batch 1, "
             f"{len(plain_tokens[0])} new tokens, median of {REPEATS} runs; {machine_line(torch.get_num_threads())}) ==",
             f"prompt: {tok.decode(prompt[0])!r}",
             table(["method", "tau", "acceptance by position", "target forwards", "tokens/s", "speedup", "identical"],
                   [[LABELS[r["method"]], f"{r['tau']:.2f}", " ".join(f"{x:.2f}" for x in r["by_position"]) or "-",
                     r["steps"], f"{r['tokens_per_s']:.0f}", f"{r['speedup']:.2f}x", "yes" if r["identical"] else "NO"]
                    for r in rows]),
             "continuation (plain): " + repr(tok.decode(plain_tokens[0]))]
    costs = {m: StepCosts.measured(runs["ar"], runs[m]) for m in methods[1:]}  # seconds per step, in this run
    in_plain_steps = {m: (K * c.draft / c.plain, c.verify / c.plain) for m, c in costs.items()}  # drafts, verify
    slower = [r for r in rows[1:] if round(r["speedup"], 2) < 1]  # as the table prints it: 0.998 shows as 1.00x, not slower
    if slower:  # say why at once: this is the first thing a newcomer sees
        split = ", ".join(f"{LABELS[m]} {d:.1f} + {v:.1f}" for m, (d, v) in in_plain_steps.items())
        lines.append(f"why {len(slower)} of {len(rows) - 1} are slower here: one speculative step cost this many plain "
                     f"steps on this CPU (k drafts + a verify of k + 1 positions): {split}. A plain step of this small "
                     f"target takes {costs['mtp'].plain * 1e3:.1f} ms, of which streaming its weights takes "
                     f"{read_floor(bundle.target) * 1e3:.1f} ms: it is not bound by reading its weights, so a draft "
                     "module's step is not much cheaper and k + 1 positions cost more than one; on a memory-bound GPU "
                     "they cost about the same and speculation pays (docs/results.md).")
    if warn := busy_warning():
        lines.append(warn)
    if not all(r["identical"] for r in rows):
        lines.append("WARNING: a speculative output differs from plain decoding: the decoder is not lossless here")
    lines.append(f"plot: {_plot(outdir, rows)}")
    print("\n".join(lines), flush=True)
    if memory_bound:
        lines += _memory_bound(costs["mtp"], next(r["tau"] for r in rows if r["method"] == "mtp"))
    lines.append(f"(Lab 2 tour: {time.perf_counter() - t0:.1f} s)")
    print(lines[-1])
    return "\n".join(lines)


def _memory_bound(mtp: StepCosts, mtp_tau: float) -> list[str]:
    """The oracle on a random-weight target too big for the caches, set beside the tiny zoo's MTP layer
    (its step costs and tau measured above)."""
    head = ("== Lab 2 on a target too big for this CPU's caches: random weights, the oracle proposer (skip with "
            "--no-memory-bound) ==")
    print(head, flush=True)

    def progress(step: str) -> None:  # one line on the terminal, rewritten in place
        print(f"\r  memory-bound run: {step} ...".ljust(60), end="", file=sys.stderr, flush=True)

    run = memory_bound_run(new_tokens=MEMORY_BOUND_TOKENS, repeats=MEMORY_BOUND_REPEATS, progress=progress)
    print("\r" + " " * 60 + "\r", end="", file=sys.stderr, flush=True)
    c = run.costs
    lines = [head, *run.lines(),
             f"why it pays here: the oracle drafts almost for free ({K * c.draft / c.plain:.3f} plain steps a step), so a "
             f"speculative step costs about its verify, {c.verify / c.plain:.2f} plain steps, for {run.tau_measured:.2f} "
             f"tokens. The MTP layer above paid {K * mtp.draft / mtp.plain:.1f} + {mtp.verify / mtp.plain:.1f} plain steps "
             f"for {mtp_tau:.2f} tokens; its {K} drafts took {K * mtp.draft * 1e3:.1f} ms, {K * mtp.draft / c.plain:.2f} of a "
             f"plain step of this target. ({run.seconds:.1f} s; {machine_line(run.threads)})"]
    if warn := busy_warning():
        lines.append(warn)
    print("\n".join(lines[1:]), flush=True)
    return lines
