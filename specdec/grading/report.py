"""Grading results as Gradescope's results.json, a CSV table (a row per notebook), and a summary."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from specdec.grading.registry import EXERCISE_ID
from specdec.grading.results import NotebookResult
from specdec.grading.submission import SKIP_TAGS

SUMMARY_PROBLEMS = 10  # notebook-level problems listed in the summary; the rest are counted


def points(x: float) -> str:
    """2.0 -> "2", 1.3333 -> "1.3333"."""
    return f"{x:.4f}".rstrip("0").rstrip(".")


def notebook_output(result: NotebookResult) -> str:
    """The top-level `output` of results.json: what went wrong outside the exercises."""
    lines = []
    if result.error:
        lines.append(f"Grading failed: {result.error}")
    if result.problems:
        lines.append("Problems while running the notebook:")
        lines += [f"- {p}" for p in result.problems]
    if result.skipped:
        lines.append(skipped_line(result))
    return "\n".join(lines)


def skipped_line(result: NotebookResult) -> str:
    why = "; ".join(f"`{t}`: {SKIP_TAGS[t]}" for t in result.skipped_tags)
    return (f"Not run while grading ({len(result.skipped)} cells tagged {why}, and no graded function reads "
            f"them): {', '.join(result.skipped)}")


def gradescope(result: NotebookResult) -> dict[str, Any]:
    """The results.json object of one notebook, in Gradescope's shape."""
    return {
        "score": result.score,
        "max_score": result.max_score,
        "execution_time": result.execution_time,
        "output": notebook_output(result),
        "tests": [
            {"name": f"{t.id}: {t.title}", "score": t.score, "max_score": t.max_score, "output": t.output}
            for t in result.tests
        ],
    }


def results_json(results: list[NotebookResult], single: bool) -> str:
    """One object for a single notebook (Gradescope's file); else a list, each with its `notebook`."""
    if single:
        doc: Any = gradescope(results[0])
    else:
        doc = [{"notebook": r.notebook, **gradescope(r)} for r in results]
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def _id_key(ex_id: str) -> tuple[int, int]:
    m = EXERCISE_ID.fullmatch(ex_id)
    return (int(m.group(1)), int(m.group(2))) if m else (1 << 30, 0)


def status(result: NotebookResult) -> str:
    """`graded`, or `failed` when grading could not run (not a notebook, no checks for its lab)."""
    return "failed" if result.error else "graded"


def results_csv(results: list[NotebookResult]) -> str:
    """A row per notebook: notebook, status, total, max_score, the points of each exercise id (2 decimals),
    and the error that stopped grading, if one did."""
    ids = sorted({t.id for r in results for t in r.tests}, key=_id_key)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["notebook", "status", "total", "max_score", *ids, "error"])
    for r in results:
        got = {t.id: f"{t.score:.2f}" for t in r.tests}
        error = r.error.splitlines()[0].removeprefix(f"{r.notebook}: ") if r.error else ""  # the row names it
        writer.writerow([r.notebook, status(r), f"{r.score:.2f}", f"{r.max_score:.2f}", *(got.get(i, "") for i in ids),
                         error])
    return buf.getvalue()


def _indent(text: str, prefix: str) -> list[str]:
    return [prefix + line for line in text.splitlines()]


def summary(result: NotebookResult) -> str:
    """What a person reads: each exercise with its points and feedback, the total, the problems."""
    lines = [result.notebook]
    if result.error:
        lines.append(f"  grading failed: {result.error}")
    width = max((len(t.id) for t in result.tests), default=0)
    for t in result.tests:
        first, *rest = (t.output or "").splitlines() or [""]
        score = f"{points(t.score)}/{points(t.max_score)}"
        lines.append(f"  {t.id:<{width}}  {score:>9}  {t.title}: {first}")
        lines += _indent("\n".join(rest), " " * (width + 15))
    lines.append(f"  {'total':<{width}}  {points(result.score) + '/' + points(result.max_score):>9}"
                 f"  ({result.execution_time:.1f}s)")
    if result.problems:
        lines.append(f"  problems while running the notebook ({len(result.problems)}):")
        for p in result.problems[:SUMMARY_PROBLEMS]:
            first, *rest = p.splitlines()
            lines.append(f"    {first[:200]}" + (" [...]" if rest or len(first) > 200 else ""))
        if len(result.problems) > SUMMARY_PROBLEMS:
            lines.append(f"    ... and {len(result.problems) - SUMMARY_PROBLEMS} more")
    if result.skipped:
        numbers = ", ".join(label.split(" (")[0].removeprefix("cell ") for label in result.skipped)
        tags = " or ".join(f"`{t}`" for t in result.skipped_tags)
        lines.append(f"  not run while grading: {len(result.skipped)} cells tagged {tags} (cells {numbers})")
    return "\n".join(lines)
