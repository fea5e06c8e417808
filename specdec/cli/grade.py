"""`specdec grade NOTEBOOK...`: run each notebook in a kernel of its own, check it from here, report.

Exit status 0 when grading worked, whatever the scores; with several notebooks, a notebook that
could not be graded (not a notebook, no checks for its lab) is a row with status `failed` and its
error, and the status is 1 only if none could be; 1 for a single notebook that could not be graded;
2 for bad arguments (a missing file).
"""

from __future__ import annotations

import argparse
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from specdec.cli.common import UsageError
from specdec.grading import report, runner
from specdec.grading.results import Limits, NotebookResult
from specdec.grading.submission import Submission

EPILOG = """Each notebook runs in a kernel process of its own (IPython, MPLBACKEND=Agg) in the
notebook's folder; every exercise of the labs whose labN.qM ids it names is checked from this
process, which calls the notebook's functions in the kernel with data in and data out. A cell that
kills the kernel is skipped: a fresh kernel runs the cells before it again. The cases are seeded by
exercise and notebook (the same notebook gets the same grade); set SPECDEC_GRADING_SECRET to a
secret string to make them unpredictable. SPECDEC_EXTRA_CHECKS=mod1,mod2 adds the EXERCISES of
more modules (importable here, e.g. through PYTHONPATH): the grader's own test fixtures use it."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = Limits()
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("notebooks", nargs="*", metavar="NOTEBOOK", help="notebooks to grade")
    parser.add_argument("--batch", metavar="DIR",
                        help="grade every notebook under DIR (a class's submissions, one folder each or not), "
                             "leaving out checkpoints and executed copies; with --csv, one row per notebook")
    parser.add_argument("--json", metavar="PATH",
                        help="write Gradescope's results.json (for several notebooks: a list, each with `notebook`)")
    parser.add_argument("--csv", metavar="PATH", help="write a row per notebook: notebook, status, total, max_score, each exercise, error")
    parser.add_argument("--cell-timeout", type=float, default=defaults.cell_timeout, metavar="S",
                        help=f"seconds of CPU time per cell before it is interrupted (default {defaults.cell_timeout:g})")
    parser.add_argument("--check-timeout", type=float, default=defaults.check_timeout, metavar="S",
                        help=f"seconds of CPU time for the calls of an exercise's cases (default {defaults.check_timeout:g})")
    parser.add_argument("--timeout", type=float, default=defaults.total_timeout, metavar="S",
                        help=f"seconds of CPU time per notebook in all, then it is killed (default {defaults.total_timeout:g})")
    parser.add_argument("--wall-factor", type=float, default=defaults.wall_factor, metavar="F",
                        help="every limit also holds on the wall clock, F times longer: it stops code that waits "
                             f"instead of computing (default {defaults.wall_factor:g}; 1: wall-clock limits)")
    parser.add_argument("--memory", type=float, default=defaults.memory_gb, metavar="GIB",
                        help=f"a kernel's data memory; past it allocations fail (default {defaults.memory_gb:g}, 0: no limit)")
    parser.add_argument("--lab", type=int, action="append", metavar="N",
                        help="grade as lab N (default: the labs whose labN.qM ids the notebook names)")
    parser.add_argument("--kernel-user", metavar="NAME",
                        help="run each notebook's kernel as this user (the grader runs as root): its processes cannot "
                             "signal the grader or write the results (see README, Threat model)")
    parser.add_argument("-j", "--jobs", type=int, default=1, metavar="N", help="notebooks graded at once (default 1)")


def batch_notebooks(folder: str) -> list[str]:
    """The notebooks under `folder`, sorted; Jupyter's checkpoints and `specdec execute`'s copies left out."""
    root = Path(folder)
    if not root.is_dir():
        raise UsageError(f"--batch {folder}: no such folder")
    found = sorted(str(p) for p in root.rglob("*.ipynb")
                   if ".ipynb_checkpoints" not in p.parts and not p.name.endswith(".executed.ipynb"))
    if not found:
        raise UsageError(f"--batch {folder}: no notebooks in it")
    return found


def _validate(args: argparse.Namespace) -> None:
    """Refuse bad arguments before hours of grading, not after."""
    if args.batch:
        args.notebooks = [*args.notebooks, *batch_notebooks(args.batch)]
    if not args.notebooks:
        raise UsageError("give the notebooks to grade, or --batch DIR")
    for nb in args.notebooks:
        path = Path(nb)
        if not path.exists():
            raise UsageError(f"{nb}: no such file")
        if path.is_dir():
            raise UsageError(f"{nb}: is a directory, not a notebook")
    for name in ("cell_timeout", "check_timeout", "timeout"):
        if not getattr(args, name) > 0:
            raise UsageError(f"--{name.replace('_', '-')} must be a positive number of seconds")
    if not args.wall_factor >= 1:
        raise UsageError("--wall-factor must be at least 1 (the wall clock never runs slower than a CPU)")
    if not args.memory >= 0:
        raise UsageError("--memory must be a number of GiB (0: no limit)")
    if args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    for out in (args.json, args.csv):
        if out and not Path(out).resolve().parent.is_dir():
            raise UsageError(f"{out}: its folder does not exist")


def grade_all(args: argparse.Namespace, limits: Limits) -> list[NotebookResult]:
    """Grade every notebook, printing each summary in order and a progress line as each ends."""
    paths: list[str] = args.notebooks
    several = len(paths) > 1
    done = 0
    lock = threading.Lock()

    # every notebook is read, and every check imported, before any kernel runs: no student's code can
    # change another's file, or a module the grader has yet to import
    subs = [runner.read(p, args.lab) for p in paths]
    runner.plan_of(sorted({lab for s in subs if isinstance(s, Submission) for lab in s.labs}), [])

    def one(path: str, sub: Submission | NotebookResult) -> NotebookResult:
        nonlocal done
        result = sub if isinstance(sub, NotebookResult) else runner.grade_submission(sub, limits)
        with lock:
            done += 1
            if several:
                score = "failed" if result.error else f"{report.points(result.score)}/{report.points(result.max_score)}"
                print(f"[{done}/{len(paths)}] {path}: {score} ({result.execution_time:.1f}s)", file=sys.stderr, flush=True)
        return result

    results: list[NotebookResult] = []
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures: list[Future[NotebookResult]] = [pool.submit(one, p, s) for p, s in zip(paths, subs)]
        try:
            for fut in futures:
                results.append(fut.result())
                print(report.summary(results[-1]) + ("\n" if several else ""), flush=True)
        except KeyboardInterrupt:
            for fut in futures:
                fut.cancel()
            runner.stop_all()
            raise
    return results


def _write(path: str, text: str) -> None:
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{path}: cannot write: {exc.strerror or exc}") from None


def main(args: argparse.Namespace) -> int:
    _validate(args)
    limits = Limits(cell_timeout=args.cell_timeout, check_timeout=args.check_timeout, total_timeout=args.timeout,
                    memory_gb=args.memory, wall_factor=args.wall_factor, kernel_user=args.kernel_user)
    results = grade_all(args, limits)
    runner.end_strays()  # as PID 1 of a container: no process of a notebook's is left to rewrite what follows
    if args.json:
        _write(args.json, report.results_json(results, single=len(results) == 1))
    if args.csv:
        _write(args.csv, report.results_csv(results))
    failed = [r for r in results if r.error]
    for r in failed:
        msg = r.error.splitlines()[0]
        where = "" if msg.startswith(r.notebook) else f"{r.notebook}: "
        print(f"specdec grade: error: {where}{msg}", file=sys.stderr)
    return 1 if failed and len(failed) == len(results) else 0
