"""The `specdec` command line: one verb per module, and only the chosen verb's module is imported.

`specdec sim` therefore never imports torch, and `specdec --help` imports nothing but this file.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from specdec.cli.common import UsageError

# verb -> (module, one-line help). Each module defines add_arguments(parser) and main(args) -> int.
COMMANDS: dict[str, tuple[str, str]] = {
    "tour": ("specdec.cli.tour", "run every lab's core on the embedded tiny models and print a report"),
    "sim": ("specdec.cli.sim", "Lab 1: the speedup model and the Monte Carlo draft/verify loop"),
    "decode": ("specdec.cli.decode", "Lab 2: decode with a proposer and print statistics"),
    "serve": ("specdec.cli.serve", "Lab 3: serve a model with SGLang's HTTP API and continuous batching"),
    "zoo": ("specdec.cli.zoo", "the embedded model zoo: info, path, build, eval"),
    "grade": ("specdec.cli.grade", "grade lab notebooks (Gradescope JSON, CSV, summary)"),
    "labs": ("specdec.cli.labs", "generate labs/ from solutions/ (or --check that they agree)"),
    "execute": ("specdec.cli.execute", "run a notebook headless and write the executed copy (with its check results)"),
    "launch": ("specdec.cli.launch", "Lab 3: start an SGLang (or specdec serve) server with a checked speculative config"),
    "bench": ("specdec.cli.bench", "Lab 3: concurrency sweep against a server, or --compare two sweeps"),
    "preflight": ("specdec.cli.preflight", "is this node ready for the workshop: GPU, CUDA, SGLang and its pins, models, ports"),
    "room": ("specdec.cli.room", "one server per student on this node, with ports and keys in a CSV; --stop stops them"),
}


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The parser with every verb listed; only `verb`'s module is imported to add its arguments."""
    parser = argparse.ArgumentParser(prog="specdec", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == verb:
            mod = importlib.import_module(module)
            mod.add_arguments(p)
            p.set_defaults(_module=mod, _parser=p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    verb = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(verb if verb in COMMANDS else None)
    args, extra = parser.parse_known_args(argv)
    if extra:  # a misspelled flag: the verb's own usage, not the top level's
        (getattr(args, "_parser", None) or parser).error(f"unrecognized arguments: {' '.join(extra)}")
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


__all__ = ["COMMANDS", "UsageError", "build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
