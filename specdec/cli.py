"""The `specdec` command line: one verb per module, imported only when used."""

from __future__ import annotations

import argparse
import importlib
import sys

# verb -> (module, one-line help). Each module defines add_arguments(parser) and main(args) -> int.
# Modules must stay light at import time (no torch): `specdec --help` imports them all.
COMMANDS: dict[str, tuple[str, str]] = {
    "tour": ("specdec.tour", "run every lab's core on the embedded tiny models and print a report"),
    "sim": ("specdec.sim_cli", "Lab 1: the speedup model and the Monte Carlo draft/verify loop"),
    "decode": ("specdec.decode_cli", "Lab 2: decode with a proposer and print statistics"),
    "zoo": ("specdec.zoo.cli", "the embedded model zoo: info, path, build"),
    "grade": ("specdec.grading.cli", "grade lab notebooks (Gradescope JSON, CSV, summary)"),
    "labs": ("specdec.grading.labgen", "generate labs/ from solutions/ (or --check that they agree)"),
}


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue  # a verb whose module is not written yet
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod.add_arguments(p)
        p.set_defaults(_module=mod)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_module", None):
        parser.print_help()
        return 2
    try:
        return int(args._module.main(args) or 0)
    except UsageError as exc:
        print(f"specdec {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
