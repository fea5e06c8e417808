"""The machine a timing was taken on: what to record beside a result, the line to print beside a timing,
and a warning when other work is running. One place for the zoo's evaluation, the command line's timings
and the benchmark scripts. Torch's threads and version are the caller's to pass (this side has no torch).
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo's), else what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(threads: int, **more) -> dict:
    """What to record beside a result: cpu, threads, then `more` (e.g. torch=torch.__version__), python, platform."""
    return {"cpu": cpu_name(), "threads": threads, **more, "python": sys.version.split()[0],
            "platform": platform.platform()}


def machine_line(threads: int) -> str:
    """What a timing was taken on, to print beside it: cores, threads, load average."""
    return f"{os.cpu_count()} cores, {threads} thread(s), load average {os.getloadavg()[0]:.2f}"


def busy_warning() -> str | None:
    """A warning when other work is running: timings are then slower and noisier than the machine's."""
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load > 0.75 * cores:
        return (f"warning: this machine is busy (load average {load:.2f} on {cores} cores): the timings above are "
                "slower and noisier than it can do; run again when it is idle")
    return None


__all__ = ["busy_warning", "cpu_name", "machine", "machine_line"]
