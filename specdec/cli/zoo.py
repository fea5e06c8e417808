"""`specdec zoo info|path|build|eval`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specdec.cli.common import UsageError
from specdec.zoo.build import build_zoo
from specdec.zoo.evaluate import evaluate_zoo
from specdec.zoo.recipes import get_recipe
from specdec.zoo.registry import ZooError, default_out, find_zoo, read_meta, zoo_parts
from specdec.zoo.report import format_info


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="zoo_command", metavar="ACTION", required=True)
    info = sub.add_parser("info", help="what the zoo holds: parts, sizes, training, measured figures")
    info.add_argument("name", nargs="?", default="tiny")
    info.add_argument("--json", action="store_true")
    path = sub.add_parser("path", help="print the directory of the zoo's target")
    path.add_argument("name", nargs="?", default="tiny")
    path.add_argument("--part", choices=["target", "draft", "heads", "eagle", "root"], default="target")
    build = sub.add_parser("build", help="train the zoo (progress bars); the CPU recipe takes minutes")
    build.add_argument("--recipe", default="tiny-cpu", help="tiny (shipped, GPU recipe), tiny-cpu, small (GPU workshop size)")
    build.add_argument("--device", default="cpu", help="cpu or cuda")
    build.add_argument("--out", type=Path, default=None, help="output directory (default: the zoo's home)")
    build.add_argument("--steps-scale", type=float, default=1.0, help="multiply every stage's steps (for quick trials)")
    build.add_argument("--eval", action="store_true", help="measure the zoo figures after training")
    ev = sub.add_parser("eval", help="measure held-out loss and acceptance per proposer and category")
    ev.add_argument("name", nargs="?", default="tiny")
    ev.add_argument("--prompts", type=int, default=8, help="prompts per category")
    ev.add_argument("--new-tokens", type=int, default=48)
    ev.add_argument("--write", action="store_true", help="store the figures in zoo.json and docs/zoo.md")


def _size(d: Path) -> int:
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file())


def main(args) -> int:

    try:
        if args.zoo_command == "path":
            parts = zoo_parts(args.name)
            print(parts["target"].parent if args.part == "root" else parts[args.part])
            return 0
        if args.zoo_command == "info":
            parts = zoo_parts(args.name)
            root = find_zoo(args.name)
            meta = read_meta(root)
            info = {"name": args.name, "root": str(root),
                    "parts": {p: {"path": str(d), "bytes": _size(d)} for p, d in parts.items()},
                    "total_bytes": _size(root), **{k: v for k, v in meta.items() if k not in ("parts",)}}
            if args.json:
                print(json.dumps(info, indent=2))
            else:
                print(format_info(info))
            return 0
        if args.zoo_command == "build":

            try:
                recipe = get_recipe(args.recipe)
            except KeyError as exc:
                raise UsageError(str(exc.args[0])) from None
            if args.device.startswith("cuda"):
                if not torch.cuda.is_available():
                    raise UsageError("--device cuda but no CUDA device is visible; use --device cpu")
            out = args.out or default_out(recipe.name)
            build_zoo(recipe, out, args.device, progress=True, steps_scale=args.steps_scale)
            if args.eval:
                evaluate_zoo(out, write=True)
            return 0
        if args.zoo_command == "eval":

            root = find_zoo(args.name) if not Path(args.name).is_dir() else Path(args.name)
            if root is None:
                zoo_parts(args.name)  # raises with the rebuild hint
            try:
                evaluate_zoo(root, prompts=args.prompts, new_tokens=args.new_tokens, write=args.write)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
            return 0
    except ZooError as exc:
        raise UsageError(str(exc)) from None
    return 2
