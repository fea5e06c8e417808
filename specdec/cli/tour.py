"""`specdec tour`: every lab's core in a few seconds, a short printed report and plots.

Every number is computed when the tour runs (seeded, so a rerun prints the same).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from specdec.cli.common import add_threads, one_line_errors, threads
from specdec.cli.tour_lab2 import tour_lab2
from specdec.sim import formulas, montecarlo, verify
from specdec.sim.formulas import expected_tokens_per_step, optimal_k, walltime_improvement
from specdec.sim.stats import chi_square_test

ALPHAS = (0.6, 0.8, 0.9)
KS = (1, 2, 4, 8)
C = 0.05  # draft step / target step cost ratio for the table
STICKINESS = (0.0, 0.3, 0.5, 0.7, 0.9, 0.97)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    one_line_errors(parser)
    parser.add_argument("--out", default="tour-output", help="folder for the plots (default tour-output/)")
    parser.add_argument("--no-memory-bound", action="store_true",
                        help="skip Lab 2's last part: the oracle on a random-weight target of 428 MB, too big for the "
                             "CPU's caches, built and decoded plainly and speculatively")
    add_threads(parser)


def _figure(title: str, xlabel: str, ylabel: str):
    from matplotlib.figure import Figure  # no pyplot: no global backend state, renders with Agg

    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.add_subplot()
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _save(fig, outdir: Path, name: str) -> Path:
    path = outdir / name
    fig.savefig(path, dpi=100)
    return path


def tour_lab1(outdir: str | Path = "tour-output") -> str:
    """Lab 1 in brief: the speedup formula, Monte Carlo against it, a chi-square check; saves 4 plots."""


    t0 = time.perf_counter()
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    lines = ["== Lab 1: the draft/verify loop, simulated (tau = tokens per verify step = accepted + 1) =="]

    # 1. the i.i.d. model
    lines.append(f"tau and walltime improvement (draft cost c={C} of a target step):")
    lines.append("  alpha " + "".join(f"   k={k}: tau  speedup" for k in KS) + "   optimal k")
    for a in ALPHAS:
        cells = "".join(
            f"   {formulas.expected_tokens_per_step(a, k):8.3f} {formulas.walltime_improvement(a, k, C):7.3f}x"
            for k in KS
        )
        best_k, best = formulas.optimal_k(a, C)
        lines.append(f"  {a:5.2f} {cells}   {best_k:3d} ({best:.3f}x)")

    # 2. Monte Carlo against the formula
    iid = montecarlo.run_iid(0.8, 4, 50_000, seed=0)
    s = iid.stats
    lines.append("Monte Carlo vs formula (k=4; formula/measured - 1: > 0 the formula is optimistic, < 0 pessimistic):")
    lines.append(f"  i.i.d. acceptances, alpha=0.8: tau {s.tau:.3f} +- {s.tau_stderr:.3f}   "
                 f"formula {iid.tau_from_alpha_text:.3f}")
    sweep = []
    for st in STICKINESS:
        lang = montecarlo.ToyLanguage.make(stickiness=st)
        r = montecarlo.run_markov(lang, 4, 200, 128, seed=1)
        sweep.append((st, r))
        rel = r.tau_from_alpha_text / r.stats.tau - 1
        lines.append(  # the error from the spread between sequences: steps within one sequence are correlated
            f"  toy language, stickiness {st:4.2f}: tau {r.stats.tau:.3f} +- {r.tau_stderr_sequences:.3f}   "
            f"formula at text alpha {r.alpha_text:.3f}: {r.tau_from_alpha_text:.3f} ({rel:+.1%})"
        )

    # 3. speculative sampling keeps the target distribution
    rng = np.random.default_rng(0)
    v, k, n = 8, 3, 40_000
    p = rng.dirichlet(np.ones(v), size=k + 1)
    q = rng.dirichlet(np.ones(v), size=k)
    drafts = verify.sample_categorical(np.broadcast_to(q, (n, k, v)), rng)
    p_rows, q_rows = np.broadcast_to(p, (n, k + 1, v)), np.broadcast_to(q, (n, k, v))
    _, emitted = verify.speculative_sample_batch(p_rows, q_rows, drafts, rng)
    good = chi_square_test(emitted[:, 0], p[0])
    _, emitted_bug = verify.speculative_sample_batch(p_rows, q_rows, drafts, rng, on_reject=lambda p, q: q)
    bug = chi_square_test(emitted_bug[:, 0], p[0])
    lines.append(f"chi-square, first emitted token vs the target p (V={v}, k={k}, {n} steps):")
    lines.append(f"  speculative sampling                     p-value {good.pvalue:.3g}")
    lines.append(f"  planted bug: after a rejection sample q  p-value {bug.pvalue:.3g}")

    # 4. plots
    saved = [
        _plot_tokens_per_step(outdir),
        _plot_speedup(outdir),
        _plot_histogram(outdir, iid, dict(sweep)[0.9]),
        _plot_montecarlo(outdir, sweep),
    ]
    lines.append("plots: " + ", ".join(str(p) for p in saved))
    lines.append(f"(Lab 1 tour: {time.perf_counter() - t0:.1f} s)")
    report = "\n".join(lines)
    print(report)
    return report


def _plot_tokens_per_step(outdir: Path) -> Path:


    ks = np.arange(1, 17)
    fig, ax = _figure("Tokens per verify step (i.i.d. model)", "k (drafts per step)", "tau")
    for a in (0.5, 0.6, 0.7, 0.8, 0.9, 0.95):
        ax.plot(ks, expected_tokens_per_step(a, ks), marker=".", label=f"alpha={a}")
    ax.legend()
    return _save(fig, outdir, "lab1_tokens_per_step_vs_k.png")


def _plot_speedup(outdir: Path) -> Path:


    ks = np.arange(1, 17)
    fig, ax = _figure("Walltime improvement, alpha = 0.8", "k (drafts per step)", "speedup over plain decoding")
    for c in (0.0, 0.02, 0.05, 0.1, 0.2):
        line = ax.plot(ks, walltime_improvement(0.8, ks, c), marker=".", label=f"c={c}")
        k_best, best = optimal_k(0.8, c, k_max=16)
        ax.plot([k_best], [best], "o", color=line[0].get_color(), markersize=9, fillstyle="none")
    ax.legend(title="draft cost c")
    return _save(fig, outdir, "lab1_speedup_vs_k.png")


def _plot_histogram(outdir: Path, iid, markov) -> Path:

    fig, ax = _figure("Accepted drafts per step (k = 4)", "accepted drafts", "fraction of steps")
    x = np.arange(iid.k + 1)
    ax.bar(x - 0.2, iid.stats.histogram / iid.stats.steps, width=0.4, label="i.i.d., alpha = 0.8")
    ax.bar(x + 0.2, markov.stats.histogram / markov.stats.steps, width=0.4, label="toy language, stickiness 0.9")
    ax.legend()
    return _save(fig, outdir, "lab1_accepted_histogram.png")


def _plot_montecarlo(outdir: Path, sweep) -> Path:
    fig, ax = _figure("Monte Carlo vs i.i.d. formula (toy language, k = 4)", "stickiness", "tau")
    st = [s for s, _ in sweep]
    ax.errorbar(st, [r.stats.tau for _, r in sweep], yerr=[2 * r.stats.tau_stderr for _, r in sweep],
                marker="o", capsize=3, label="measured (+- 2 s.e.)")
    ax.plot(st, [r.tau_from_alpha_text for _, r in sweep], marker="s", label="formula at the text's alpha")
    ax.legend()
    return _save(fig, outdir, "lab1_montecarlo_vs_formula.png")


def main(args: argparse.Namespace) -> int:
    n = threads(args)
    tour_lab1(args.out)
    tour_lab2(args.out, n, memory_bound=not args.no_memory_bound)
    return 0
