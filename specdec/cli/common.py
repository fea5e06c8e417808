"""What every verb of the command line shares: the one-line usage error."""

from __future__ import annotations

import argparse
import os


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


def machine(threads: int) -> str:
    """What a timing was taken on, to print beside it: cores, threads, load average."""
    return f"{os.cpu_count()} cores, {threads} thread(s), load average {os.getloadavg()[0]:.2f}"


def busy_warning() -> str | None:
    """A warning when other work is running: timings are then slower and noisier than the machine's."""
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load > 0.75 * cores:
        return (f"warning: this machine is busy (load average {load:.2f} on {cores} cores): the timings above are "
                "slower and noisier than it can do; run again when it is idle")
    return None
