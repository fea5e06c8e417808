"""What every verb of the command line shares: the one-line usage error."""

from __future__ import annotations

import argparse


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


def one_line_errors(parser: argparse.ArgumentParser) -> None:
    """Make argparse's own errors (e.g. --k abc) one line too, without the usage block."""

    def error(message: str):
        parser.exit(2, f"{parser.prog}: error: {message}\n")

    parser.error = error



def add_threads(parser: argparse.ArgumentParser) -> None:
    """--threads: torch's CPU threads for a verb that runs a model."""
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: the tiny models' matrices are too small to share out, and "
                             "on a busy machine threads spin against each other and a step can take ten times longer)")


def threads(args: argparse.Namespace) -> int:
    if args.threads < 1:
        raise UsageError(f"--threads must be >= 1, got {args.threads}")
    return args.threads
