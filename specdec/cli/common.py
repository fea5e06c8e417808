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
