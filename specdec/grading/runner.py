"""Grade one notebook: run it in a worker process of its own, under time limits, and collect scores.

The worker (worker.py) runs in a new session: at the total time limit, or when it is done, the
whole process group is killed, children of the student's code included. Whatever it wrote to its
results file counts; every exercise it did not grade gets zero with the reason.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

from specdec.grading.outcome import assemble
from specdec.grading.results import Limits, NotebookResult, WorkerRun
from specdec.grading.submission import Submission, SubmissionError, load_submission

OUTPUT_TAIL_BYTES = 8192  # what is kept of the worker's stdout+stderr (the student may print GBs)

_running: set[int] = set()  # process groups of the workers running now (several with --jobs)
_running_lock = threading.Lock()


class OutputTail(threading.Thread):
    """Drain a pipe, keeping only its last bytes, so that the worker never blocks on a full pipe."""

    def __init__(self, stream: IO[bytes], keep: int = OUTPUT_TAIL_BYTES):
        super().__init__(daemon=True)
        self.fd = stream.fileno()
        self.keep = keep
        self.tail = b""

    def run(self) -> None:
        try:
            while chunk := os.read(self.fd, 1 << 16):
                self.tail = (self.tail + chunk)[-self.keep :]
        except OSError:
            pass

    def text(self) -> str:
        return self.tail.decode("utf-8", errors="replace")


def worker_env(tmp: str) -> dict[str, str]:
    """The worker's environment: this copy of specdec first, a non-GUI matplotlib, no $HOME writes."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env["MPLBACKEND"] = "Agg"
    env["IPYTHONDIR"] = os.path.join(tmp, "ipython")
    env["PYTHONIOENCODING"] = "utf-8"  # a student's print of non-ASCII must not fail under LANG=C
    return env


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def stop_all() -> None:
    """Kill every running worker: Ctrl-C reaches only this thread, not the others' workers."""
    with _running_lock:
        groups = list(_running)
    for pgid in groups:
        kill_group(pgid)


def read_results(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def run_worker(sub: Submission, limits: Limits) -> WorkerRun:
    """Run the worker on the notebook's code cells; kill its process group when done or late."""
    with tempfile.TemporaryDirectory(prefix="specdec-grade-", ignore_cleanup_errors=True) as tmp:
        results = os.path.join(tmp, "results.json")
        cwd = str(sub.path.resolve().parent)
        job = {
            "notebook": str(sub.path),
            "cwd": cwd,
            "cells": [[c.number, c.source] for c in sub.code_cells],
            "labs": sub.labs,
            "cell_timeout": limits.cell_timeout,
            "check_timeout": limits.check_timeout,
            "results": results,
        }
        job_path = os.path.join(tmp, "job.json")
        with open(job_path, "w", encoding="utf-8") as f:
            json.dump(job, f)
        # -P: the notebook's folder goes on sys.path only after the worker imported specdec
        proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "specdec.grading.worker", job_path],
            cwd=cwd, env=worker_env(tmp), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )
        with _running_lock:
            _running.add(proc.pid)
        drain = OutputTail(proc.stdout)  # type: ignore[arg-type]
        drain.start()
        timed_out = False
        try:
            proc.wait(timeout=limits.total_timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:  # also on Ctrl-C: never leave the student's processes behind
            kill_group(proc.pid)
            with _running_lock:
                _running.discard(proc.pid)
            proc.wait()
            drain.join(timeout=2.0)
            if not drain.is_alive():  # else a grandchild that left the group holds the pipe: leave it
                proc.stdout.close()  # type: ignore[union-attr]
        return WorkerRun(read_results(results), proc.returncode, timed_out, drain.text())


def grade_notebook(path: str | Path, limits: Limits | None = None,
                   labs: list[int] | None = None) -> NotebookResult:
    """Grade one notebook; `labs` overrides the labs found in it. Never raises for bad input."""
    start = time.monotonic()
    limits = limits or Limits()
    try:
        sub = load_submission(path, labs)
    except SubmissionError as exc:
        return NotebookResult(str(path), error=str(exc))
    if not sub.labs:
        return NotebookResult(str(path), error=f"{path}: cannot tell which lab this notebook is "
                              "(no exercise id labN.qM in it): pass --lab N")
    run = run_worker(sub, limits)
    return assemble(sub, run, limits, time.monotonic() - start)
