"""The grading worker: runs one notebook's code cells, then every check of its labs, in this process.

runner.py starts it as `python -m specdec.grading.worker JOB.json` in a session of its own. The
results go to the file the job names, rewritten after every step so that a worker killed halfway
leaves what it did; never to stdout, which the student's code shares.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from specdec.grading import limits
from specdec.grading.limits import ProcessExitBlocked, TimeLimitExceeded, time_limit
from specdec.grading.registry import CheckResult, Exercise, exercises_for_lab, run_check, set_autograding

MESSAGE_CHARS = 1000  # a student's exception message can be megabytes
CELL_FILE_PREFIX = "<ipython-input-"  # how IPython names the code of a cell in tracebacks


@dataclass
class Job:
    """What the parent asks: written by runner.py as JSON."""

    notebook: str
    cwd: str
    cells: list[list[Any]]  # [number, source] of each code cell, in order
    labs: list[int]
    cell_timeout: float
    check_timeout: float
    results: str  # absolute path


class Progress:
    """The results file, replaced atomically after each step."""

    def __init__(self, path: str):
        self.path = path
        self.pid = os.getpid()
        self.data: dict[str, Any] = {
            "phase": "starting",  # loading the checks; then "cells", "checks", "done"
            "plan": [],  # [{id, points, title}] of every exercise to grade
            "plan_errors": [],
            "cell": None,  # number of the cell running now
            "check": None,  # id of the check running now
            "cells_run": 0,
            "cell_problems": [],  # [{cell, kind, message}]
            "tests": [],  # [{id, score, message, seconds}], score a fraction
            "worker_error": None,
        }

    def update(self, **changes: Any) -> None:
        self.data.update(changes)
        self.save()

    def save(self) -> None:
        if os.getpid() != self.pid:  # a fork made by the student's code must not write
            return
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.data, f)
        os.replace(tmp, self.path)


def clip(text: str, limit: int = MESSAGE_CHARS) -> str:
    """Keep the start and the end of a long text."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]} [... {len(text) - 2 * half} characters cut ...] {text[-half:]}"


def describe(exc: BaseException) -> str:
    """`ValueError: message`, safe against a broken or huge __str__."""
    try:
        # a SyntaxError's str() names IPython's internal file name for the cell
        msg = str(exc.msg) if isinstance(exc, SyntaxError) else str(exc)
    except Exception:
        msg = "<the exception's message could not be printed>"
    name = type(exc).__name__
    return clip(f"{name}: {msg}" if msg else name)


def cell_line(exc: BaseException) -> int | None:
    """The line of the cell where the exception came from, when the traceback shows it."""
    if isinstance(exc, SyntaxError) and str(exc.filename or "").startswith(CELL_FILE_PREFIX):
        return exc.lineno
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(CELL_FILE_PREFIX):
            return tb.tb_lineno
        tb = tb.tb_next
    return None


def make_shell() -> Any:
    """An IPython shell (magics, display()) that ignores exit() instead of failing on it."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    class GradingShell(InteractiveShell):
        exit_requested = False

        def ask_exit(self) -> None:  # what exit() and quit() call
            self.exit_requested = True

        def enable_gui(self, gui: str | None = None) -> None:  # %matplotlib inline: no event loop
            pass

    cfg = Config()
    cfg.HistoryManager.enabled = False  # no sqlite file in $HOME, no contention between workers
    cfg.InteractiveShell.colors = "nocolor"
    return GradingShell.instance(config=cfg)


def restore_stdio() -> None:
    """Undo a student's redirection (or closing) of sys.stdout and sys.stderr."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, f"__{name}__")
        if stream is None or stream.closed:
            try:
                stream = open(fd, "w", encoding="utf-8", errors="replace", closefd=False)
            except OSError:
                stream = open(os.devnull, "w")
            setattr(sys, f"__{name}__", stream)
        setattr(sys, name, stream)


def run_cell(shell: Any, number: int, source: str, seconds: float) -> dict[str, Any] | None:
    """Run one cell under a time limit; return its problem (error, timeout, exit) or None."""
    shell.exit_requested = False
    restore_stdio()
    error: BaseException | None = None
    try:
        with time_limit(seconds):
            result = shell.run_cell(source, store_history=True)
        error = result.error_before_exec or result.error_in_exec
    except BaseException as exc:  # the alarm, or the student's code broke IPython itself
        error = exc
    finally:
        limits.disarm()
    go_on = "ignored: the following cells still ran"
    if isinstance(error, TimeLimitExceeded):
        line = cell_line(error)
        where = f" at line {line}" if line else ""
        return {"cell": number, "kind": "timeout",
                "message": f"timed out after {seconds:g}s{where} (an infinite loop?): stopped there"}
    if isinstance(error, ProcessExitBlocked):
        return {"cell": number, "kind": "exit", "message": f"called os._exit(), {go_on}"}
    if isinstance(error, SystemExit):
        return {"cell": number, "kind": "exit", "message": f"called sys.exit() or raised SystemExit, {go_on}"}
    if error is not None:
        line = cell_line(error)
        where = f"line {line}: " if line else ""
        return {"cell": number, "kind": "error", "message": where + describe(error)}
    if shell.exit_requested:
        return {"cell": number, "kind": "exit", "message": f"called exit(), {go_on}"}
    return None


def grade_one(ex: Exercise, ns: dict[str, Any], seconds: float) -> CheckResult:
    """Run one check under a time limit; whatever the student's code does becomes a reason."""

    restore_stdio()
    limits.guard_exits()
    try:
        with time_limit(seconds):
            res = run_check(ex, ns)
        return CheckResult(res.score, clip(str(res.message), 2 * MESSAGE_CHARS))
    except TimeLimitExceeded:
        return CheckResult(0.0, f"timed out: checking took longer than {seconds:g}s (an infinite loop in your code?)")
    except ProcessExitBlocked:
        return CheckResult(0.0, "your code called os._exit() while being checked")
    except SystemExit:
        return CheckResult(0.0, "your code called sys.exit() (or raised SystemExit) while being checked")
    except BaseException as exc:
        return CheckResult(0.0, f"your code raised {describe(exc)}")
    finally:
        limits.disarm()


def load_plan(labs: list[int], progress: Progress) -> list[Exercise]:
    """Every registered exercise of the labs (imported before any student code runs)."""

    plan: list[Exercise] = []
    for lab in labs:
        try:
            found = exercises_for_lab(lab)
        except Exception as exc:
            progress.data["plan_errors"].append(f"could not load the checks of lab {lab}: {describe(exc)}")
            continue
        if not found:
            progress.data["plan_errors"].append(f"lab {lab} has no checks (no exercises registered for lab{lab}.qM)")
        plan.extend(found)
    progress.data["plan"] = [{"id": e.id, "points": e.points, "title": e.title} for e in plan]
    return plan


def grade(job: Job, progress: Progress) -> None:
    """Run the cells, then the checks, recording each step."""

    set_autograding(True)
    plan = load_plan(job.labs, progress)
    if not plan:
        progress.update(phase="done")
        return
    progress.update(phase="cells")
    sys.path.insert(0, job.cwd)  # as in Jupyter: the notebook imports modules beside it
    limits.guard_exits()
    shell = make_shell()
    for number, source in job.cells:
        progress.update(cell=number)
        problem = run_cell(shell, number, source, job.cell_timeout)
        if problem:
            progress.data["cell_problems"].append(problem)
        progress.data["cells_run"] += 1
    progress.update(cell=None, phase="checks")
    try:
        os.chdir(job.cwd)  # the checks run where the cells started, whatever the student did
    except OSError:
        pass
    for ex in plan:
        progress.update(check=ex.id)
        start = time.monotonic()
        res = grade_one(ex, shell.user_ns, job.check_timeout)
        progress.data["tests"].append({"id": ex.id, "score": res.score, "message": res.message,
                                       "seconds": round(time.monotonic() - start, 3)})
    progress.update(check=None, phase="done")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    with open(args[0], encoding="utf-8") as f:
        job = Job(**json.load(f))
    sys.argv = [job.notebook]  # what the student's code sees: as in Jupyter, not our job file
    progress = Progress(job.results)
    status = 0
    try:
        grade(job, progress)
    except BaseException as exc:  # a bug of ours, or the student's code broke the worker
        status = 3
        try:
            progress.update(worker_error=describe(exc))
        except BaseException:
            pass  # the parent then reports a worker that died without results
    try:
        sys.__stdout__.flush()
    except Exception:
        pass
    limits.real_exit(status)  # skip the student's atexit handlers and lingering threads


if __name__ == "__main__":
    main()
