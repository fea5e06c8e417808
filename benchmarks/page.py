"""What every measurement script's `render()` uses to write its section of docs/results.md: the committed
results, markdown tables, and the line that says when, on what, by which script and with which log.

A section's date is the time its results recorded (`env.date`, a sweep's `started`); for results that record
none, the day written beside it in benchmarks/results/dates.json.
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RES = ROOT / "benchmarks" / "results"
LOGS = ROOT / "benchmarks" / "logs"
DATES = RES / "dates.json"  # path -> day, for results and logs that record no date of their own


def load(name: str):
    """benchmarks/results/NAME as JSON, or None when it is not there."""
    f = RES / name
    return json.loads(f.read_text()) if f.is_file() else None


def table(header: list[str], rows: list[list]) -> str:
    fmt = lambda v: f"{v:.2f}" if isinstance(v, float) else ("" if v is None else str(v))  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def _recorded_in(data) -> str | None:
    if isinstance(data, dict):
        for value in ((data.get("env") or {}).get("date") if isinstance(data.get("env"), dict) else None,
                      data.get("started"), data.get("date")):
            if isinstance(value, str) and value[:4].isdigit():
                return value[:10]
    return None


def _dated(rel: str) -> str:
    """The day a result or log that records none was made, from DATES (committed with it: the page must
render the same on any clone, shallow or not, so no date is read from git or a file's mtime)."""
    dates = json.loads(DATES.read_text()) if DATES.is_file() else {}
    if rel not in dates:
        raise KeyError(f"{rel} records no date: add the day it was measured to {DATES.relative_to(ROOT)}")
    return dates[rel]


def recorded(*paths: str | Path) -> str:
    """The day (or 'first to last' days) the given results or logs (paths relative to the repository) were made."""
    days = set()
    for p in paths:
        f = ROOT / p
        files = sorted(f.rglob("*.json")) if f.is_dir() else [f]
        for g in files:
            if not g.is_file():
                continue
            day = None
            if g.suffix == ".json":
                try:
                    day = _recorded_in(json.loads(g.read_text()))
                except ValueError:
                    pass
            day = day or _dated(str(g.relative_to(ROOT)))
            days.add(day)
    if not days:
        return "date unknown"
    return min(days) if len(days) == 1 else f"{min(days)} to {max(days)}"


def provenance(date_of: list[str], device: str, script: str, logs: list[str], results: list[str] = ()) -> str:
    """The section's first line: its date, its device, the script that measures it, its logs and results."""
    cite = lambda xs: ", ".join(f"`{x}`" for x in xs)  # noqa: E731
    parts = [f"Measured {recorded(*date_of)} on {device}", f"script {script}",
             f"log{'s' if len(logs) > 1 else ''} {cite(logs)}"]
    if results:
        parts.append(f"results {cite(results)}")
    return "*" + "; ".join(parts) + ".*"
