"""`specdec execute NOTEBOOK`: run a notebook headless, as Jupyter would, and write the executed copy.

For a student without a browser, and for an instructor checking a notebook before class. It prints
each `check(...)` result and the cell that failed, if one did.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError
from traitlets.config import Config

from specdec.cli.common import UsageError

RESULT = re.compile(r"^(lab\d+\.q\d+ \[|total: )")  # what check() and the score cell print


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("notebook", type=Path, help="the notebook to run (it runs in its own folder)")
    p.add_argument("--out", type=Path, default=None, help="where the executed copy goes (default: NAME.executed.ipynb beside it)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per cell before it is stopped (default 600)")


def main(args: argparse.Namespace) -> int:
    path = args.notebook
    if not path.is_file():
        raise UsageError(f"{path}: no such notebook")
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as exc:  # not JSON, not a notebook: nbformat raises several kinds
        raise UsageError(f"{path}: not a notebook ({type(exc).__name__})") from None
    out = args.out or path.with_name(path.stem + ".executed.ipynb")
    t0, failed = time.perf_counter(), None
    # The kernel talks to us over Unix sockets in a private folder rather than TCP on localhost: no port another
    # user could reach, and no "[IPKernelApp] WARNING | Kernel is running over TCP without encryption" each run.
    with tempfile.TemporaryDirectory(prefix="specdec-kernel-") as sockets:
        config = Config({"KernelManager": {"transport": "ipc", "ip": str(Path(sockets) / "kernel")}})
        client = NotebookClient(nb, timeout=args.timeout, kernel_name="python3", config=config,
                                resources={"metadata": {"path": str(path.resolve().parent)}})
        try:
            client.execute()
        except (CellExecutionError, CellTimeoutError) as exc:
            failed = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
    nbformat.write(nb, out)
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            for line in o.get("text", "").splitlines():
                if RESULT.match(line):
                    print(line)
    ran = sum(1 for c in nb.cells if c.cell_type == "code" and c.get("execution_count"))
    print(f"{path}: {ran} code cells run in {time.perf_counter() - t0:.1f} s; executed copy: {out}")
    if failed:
        cell = next((i for i, c in enumerate(nb.cells, 1) if c.cell_type == "code" and any(
            o.get("output_type") == "error" for o in c.get("outputs", []))), None)
        print(f"stopped at cell {cell}: {failed}")
        return 1
    return 0
