"""`specdec bench`: a concurrency sweep against a running server, or the comparison of two sweeps.

    specdec bench --url URL --categories predictable,code,open --concurrency 1,2,4,8,16,32 --max-new-tokens 128 --out spec.json
    specdec bench --compare base.json spec.json [--plots DIR] [--json OUT]

Each concurrency level is warmed (one untimed wave at that level) before it is timed, since servers capture
CUDA graphs lazily; each run lasts at least --min-run-s seconds (default 5, several seconds on a GPU; use 0
or 1 on a small CPU) and carries a 95% bootstrap interval of its tokens/s; --compare says "within noise"
where the speedup's interval contains 1.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specdec.cli.common import UsageError
from specdec.serving.measure.bench import DEFAULT_MIN_RUN_S, ENDPOINTS, SCHEMAS, SweepConfig, format_sweep, run_sweep
from specdec.serving.measure.client import ClientError
from specdec.serving.measure.compare import compare, format_comparison, plot_comparison
from specdec.serving.measure.prompts import CATEGORIES, DEFAULT_CATEGORIES


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=None, help="the server, e.g. http://127.0.0.1:30000")
    p.add_argument("--api-key", default=None)
    p.add_argument("--categories", default=",".join(DEFAULT_CATEGORIES),
                   help=f"comma-separated: {', '.join(CATEGORIES)} (default: {', '.join(DEFAULT_CATEGORIES)})")
    p.add_argument("--concurrency", default="1,2,4,8,16,32", help="comma-separated levels")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--requests-per-run", type=int, default=None,
                   help="at least this many requests per run (default: max(2 x concurrency, 8))")
    p.add_argument("--min-run-s", type=float, default=DEFAULT_MIN_RUN_S,
                   help=f"each run keeps sending until it has also lasted this many seconds (default {DEFAULT_MIN_RUN_S:g}: "
                        "several seconds on a GPU, so launch jitter averages out; 0 or 1 on a small CPU)")
    p.add_argument("--min-tokens", type=int, default=0, help="... and produced this many output tokens")
    p.add_argument("--repeats", type=int, default=1,
                   help="measure each run this many times and pool them; the interval then resamples the repeats "
                        "too, so drift between them (a shared or throttled machine) shows as width")
    p.add_argument("--no-warm-levels", action="store_true",
                   help="do not send an untimed wave at each concurrency before timing it")
    p.add_argument("--warmup", type=int, default=2, help="requests sent once before the sweep")
    p.add_argument("--endpoint", choices=ENDPOINTS, default="generate")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--no-flush", action="store_true", help="do not /flush_cache before each run")
    p.add_argument("--out", default=None, help="write the sweep as JSON here")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--compare", nargs=2, metavar=("BASE", "SPEC"), default=None,
                   help="compare two sweeps (plain, speculative) instead of running one")
    p.add_argument("--plots", default=None, help="with --compare: folder for the PNG plots (default: beside SPEC)")
    p.add_argument("--json", default=None, help="with --compare: write the comparison as JSON here")


def _ints(text: str, name: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"--{name} takes comma-separated integers, got {text!r}") from None
    if not values:
        raise UsageError(f"--{name} is empty")
    return values


def _load(path: str) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read sweep {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("schema") not in SCHEMAS:
        raise UsageError(f"{path} is not a `specdec bench` sweep (schema {' or '.join(SCHEMAS)})")
    return data


def run_compare(args) -> int:
    base, spec = (_load(p) for p in args.compare)
    try:
        cmp = compare(base, spec)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(format_comparison(cmp))
    spec_path = Path(args.compare[1])
    folder = Path(args.plots) if args.plots else spec_path.with_name(f"{spec_path.stem}-vs-{Path(args.compare[0]).stem}-plots")
    paths = plot_comparison(base, spec, cmp, folder)
    print("plots: " + ", ".join(str(p) for p in paths))
    if args.json:
        Path(args.json).write_text(json.dumps(cmp, indent=1))
        print(f"comparison written to {args.json}")
    return 0


def main(args) -> int:
    if args.compare:
        return run_compare(args)
    if not args.url:
        raise UsageError("give --url (a running server) or --compare BASE SPEC")
    try:
        cfg = SweepConfig(args.url, tuple(c.strip() for c in args.categories.split(",") if c.strip()),
                          _ints(args.concurrency, "concurrency"), args.max_new_tokens, args.requests_per_run,
                          args.warmup, args.endpoint, args.temperature, flush=not args.no_flush, api_key=args.api_key,
                          min_run_s=args.min_run_s, min_tokens=args.min_tokens, repeats=args.repeats,
                          warm_levels=not args.no_warm_levels)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        result = run_sweep(cfg, progress=not args.quiet)
    except ClientError as exc:
        print(f"specdec bench: {exc}")
        return 1
    print(format_sweep(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(f"sweep written to {args.out}")
    return 0
