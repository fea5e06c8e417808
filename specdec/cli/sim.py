"""`specdec sim`: the i.i.d. speedup model, or a Monte Carlo of the draft/verify loop (Lab 1).

Convention: tau = tokens per verify step = accepted drafts + 1.
"""

from __future__ import annotations

import argparse
import json
import math

from specdec.cli.common import UsageError, one_line_errors
from specdec.sim import formulas, montecarlo


def add_arguments(parser: argparse.ArgumentParser) -> None:
    one_line_errors(parser)
    parser.add_argument("--alpha", type=float,
                        help="per-draft acceptance probability, in [0, 1] (with --monte-carlo: only for --iid)")
    parser.add_argument("--k", type=int, default=4, help="drafts per verify step (default 4)")
    parser.add_argument("--c", type=float, default=0.0, help="cost of a draft step / a target step (default 0)")
    parser.add_argument("--k-max", type=int, default=32, help="largest k searched for the optimum (default 32)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    mc = parser.add_argument_group("Monte Carlo (--monte-carlo)")
    mc.add_argument("--monte-carlo", action="store_true", help="simulate the loop instead of the formula")
    mc.add_argument("--steps", type=int, default=500, help="verify steps per sequence (default 500)")
    mc.add_argument("--sequences", type=int, default=64, help="independent sequences (default 64)")
    mc.add_argument("--seed", type=int, default=0)
    mc.add_argument("--vocab", type=int, default=32, help="toy vocabulary size, even, >= 4 (default 32)")
    mc.add_argument("--stickiness", type=float, default=0.9,
                    help="P(next context is as easy/hard as this one), in [0, 1) (default 0.9)")
    mc.add_argument("--sharpness", type=float, default=4.0, help="target logit scale: higher = lower entropy")
    mc.add_argument("--greedy", action="store_true", help="greedy drafts and greedy verification")
    mc.add_argument("--iid", action="store_true",
                    help="the formula's own world: independent Bernoulli(--alpha) acceptances")


def _validate(args: argparse.Namespace) -> None:
    if args.alpha is not None and not 0 <= args.alpha <= 1:
        raise UsageError(f"--alpha must be in [0, 1], got {args.alpha}")
    if args.k < 1:
        raise UsageError(f"--k must be >= 1, got {args.k}")
    if not (args.c >= 0 and math.isfinite(args.c)):
        raise UsageError(f"--c must be >= 0, got {args.c}")
    if args.k_max < 1:
        raise UsageError(f"--k-max must be >= 1, got {args.k_max}")
    if args.monte_carlo:
        if args.steps < 1 or args.sequences < 1:
            raise UsageError("--steps and --sequences must be >= 1")
        if args.vocab < 4 or args.vocab % 2:
            raise UsageError(f"--vocab must be an even number >= 4, got {args.vocab}")
        if not 0 <= args.stickiness < 1:
            raise UsageError(f"--stickiness must be in [0, 1), got {args.stickiness}")
        if args.sharpness < 0:
            raise UsageError(f"--sharpness must be >= 0, got {args.sharpness}")
        if args.iid and args.alpha is None:
            raise UsageError("--iid needs --alpha")
        if args.alpha is not None and not args.iid:
            raise UsageError("--alpha with --monte-carlo needs --iid: the toy language's acceptance comes from its own "
                             "distributions (see --stickiness, --sharpness)")
        if args.iid and args.greedy:
            raise UsageError("--iid and --greedy exclude each other")
    elif args.alpha is None:
        raise UsageError("--alpha is required (or use --monte-carlo)")


def formula_report(alpha: float, k: int, c: float, k_max: int) -> dict:
    best_k, best = formulas.optimal_k(alpha, c, k_max)
    return {
        "alpha": alpha,
        "k": k,
        "c": c,
        "k_max": k_max,
        "expected_tokens_per_step": formulas.expected_tokens_per_step(alpha, k),
        "walltime_improvement": formulas.walltime_improvement(alpha, k, c),
        "optimal_k": best_k,
        "optimal_walltime_improvement": best,
        "convention": "tau = tokens per verify step = accepted drafts + 1",
    }


def montecarlo_report(args: argparse.Namespace) -> dict:
    if args.iid:
        res = montecarlo.run_iid(args.alpha, args.k, args.steps * args.sequences, seed=args.seed)
        setup = {"engine": "iid", "alpha": args.alpha}
    else:
        cfg = montecarlo.ToyLanguageConfig(
            vocab=args.vocab, sharpness=args.sharpness, stickiness=args.stickiness, seed=args.seed
        )
        lang = montecarlo.ToyLanguage.make(cfg)
        mode = "greedy" if args.greedy else "sample"
        res = montecarlo.run_markov(
            lang, args.k, args.steps, args.sequences, mode=mode, seed=args.seed, progress=not args.json
        )
        setup = {"engine": "markov", "vocab": args.vocab, "stickiness": args.stickiness,
                 "sharpness": args.sharpness, "sequences": args.sequences}
    out = {**setup, "seed": args.seed, "c": args.c, **res.as_dict()}
    out["tau_measured"] = out["tau"]
    # the cost model of the formula, fed with the measured tau: a step costs k c + 1 target steps
    out["walltime_improvement_measured"] = res.stats.tau / (args.k * args.c + 1)
    out["walltime_improvement_from_alpha_text"] = formulas.walltime_improvement(res.alpha_text, args.k, args.c)
    return out


def _print_formula(r: dict) -> None:
    print(f"alpha={r['alpha']:g}  k={r['k']}  c={r['c']:g}   (tau = accepted drafts + 1)")
    print(f"  expected tokens per step (tau)   {r['expected_tokens_per_step']:.4f}")
    print(f"  walltime improvement             {r['walltime_improvement']:.4f}x")
    print(f"  optimal k in 1..{r['k_max']:<3}              {r['optimal_k']}"
          f"  ({r['optimal_walltime_improvement']:.4f}x)")


def _print_montecarlo(r: dict) -> None:
    k = r["k"]
    what = f"engine={r['engine']} mode={r['mode']} k={k} steps={r['steps']} seed={r['seed']}"
    print(f"Monte Carlo: {what}   (tau = accepted drafts + 1)")
    print(f"  tau measured                     {r['tau']:.4f} +- {r['tau_stderr']:.4f}")
    print(f"  per-draft acceptance rate        {r['acceptance_rate']:.4f}")
    label = "alpha given to the i.i.d. engine" if r["engine"] == "iid" else "alpha over the text's contexts"
    print(f"  {label:<32} {r['alpha_text']:.4f} -> formula tau {r['tau_from_alpha_text']:.4f}")
    print(f"  alpha at verified positions      {r['alpha_verified']:.4f} -> formula tau "
          f"{r['tau_from_alpha_verified']:.4f}")
    label = f"walltime improvement at c={r['c']:g}"
    print(f"  {label:<32} {r['walltime_improvement_measured']:.4f}x measured, "
          f"{r['walltime_improvement_from_alpha_text']:.4f}x from the formula")
    print("  position  accepted  i.i.d. alpha_verified^i")
    for i, (m, p) in enumerate(zip(r["by_position"], r["by_position_iid_from_alpha_verified"]), 1):
        print(f"  {i:>8}  {m:8.4f}  {p:8.4f}")
    print("  accepted  steps    fraction")
    for n, count in enumerate(r["histogram"]):
        print(f"  {n:>8}  {count:<7d}  {count / r['steps']:.4f}")


def main(args: argparse.Namespace) -> int:
    _validate(args)
    if args.monte_carlo:
        report = montecarlo_report(args)
        printer = _print_montecarlo
    else:
        report = formula_report(args.alpha, args.k, args.c, args.k_max)
        printer = _print_formula
    if args.json:
        print(json.dumps(report))
    else:
        printer(report)
    return 0
