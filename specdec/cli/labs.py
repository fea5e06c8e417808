"""`specdec labs`: generate labs/ from solutions/ (never edit labs/ by hand), or --check them."""

from __future__ import annotations

import argparse
from pathlib import Path

from specdec.cli.common import UsageError
from specdec.grading.labgen import LabgenError, drift, generate, write


def _count(expected: dict[Path, str]) -> str:
    return f"{len(expected)} notebook" + ("" if len(expected) == 1 else "s")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--solutions", default="solutions", metavar="DIR", help="solution notebooks (default solutions/)")
    parser.add_argument("--labs", default="labs", metavar="DIR", help="where the labs go (default labs/)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if labs/ is out of date")


def main(args: argparse.Namespace) -> int:
    solutions, labs = Path(args.solutions), Path(args.labs)
    try:
        expected = generate(solutions, labs)
    except LabgenError as exc:
        raise UsageError(str(exc)) from None
    if args.check:
        problems = drift(expected, labs)
        for p in problems:
            print(p)
        if problems:
            print(f"{labs}/ is out of date with {solutions}/: run `specdec labs`")
            return 1
        print(f"{labs}/ agrees with {solutions}/ ({_count(expected)})")
        return 0
    labs.mkdir(parents=True, exist_ok=True)
    for path, text in expected.items():
        if not path.exists() or path.read_bytes() != text.encode("utf-8"):
            write(path, text)
            print(f"wrote {path}")
    for p in drift(expected, labs):
        print(f"note: {p} (left as it is)")
    print(f"{labs}/ is up to date ({_count(expected)})")
    return 0
