"""A submitted notebook as the grader sees it: its cells, its lab(s), where each answer lies.

Read with the json module, not nbformat: a notebook that Jupyter opens should grade even if it
breaks a detail of the schema, and the parent process stays light.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from specdec.grading.registry import EXERCISE_ID

FILENAME_LAB = re.compile(r"^(\d+)_")  # labs/01_simulated_loop.ipynb -> lab 1
# Cells grading skips, by tag, and why (the feedback names each one skipped). No graded function reads
# them: the graded functions take data, so none needs a server or a measurement the notebook made.
SKIP_TAGS = {
    "live": "they need live servers",  # Lab 3: cells that start, query or stop servers
    "demo": "they measure and plot what the exercises built",  # Lab 1 and Lab 2: Monte Carlo and decoding runs
}


class SubmissionError(Exception):
    """The file cannot be graded at all (missing, not JSON, not a notebook)."""


@dataclass
class Cell:
    number: int  # 1-based position in the notebook, markdown cells included
    kind: str  # "code", "markdown", "raw"
    source: str
    tags: tuple[str, ...] = ()  # the cell's metadata tags (Jupyter's "tags")

    @property
    def skipped(self) -> bool:
        """Tagged `live` or `demo`: not run while grading."""
        return any(t in SKIP_TAGS for t in self.tags)

    def label(self) -> str:
        """`cell 7 (def mean(xs):)`: a name a student can find in the notebook."""
        first = next((ln.strip() for ln in self.source.splitlines() if ln.strip()), "")
        if len(first) > 40:
            first = first[:37] + "..."
        return f"cell {self.number} ({first})" if first else f"cell {self.number}"


@dataclass
class Submission:
    path: Path
    cells: list[Cell]
    labs: list[int] = field(default_factory=list)  # empty: could not tell which lab

    @property
    def code_cells(self) -> list[Cell]:
        return [c for c in self.cells if c.kind == "code"]

    @property
    def graded_cells(self) -> list[Cell]:
        """The code cells grading runs: all but those tagged `live` or `demo`."""
        return [c for c in self.code_cells if not c.skipped]

    @property
    def skipped_cells(self) -> list[Cell]:
        return [c for c in self.code_cells if c.skipped]

    def answer_cells(self) -> dict[str, list[int]]:
        """Exercise id -> numbers of the code cells of its answer (since the previous check cell)."""
        sections: dict[str, list[int]] = {}
        pending: list[int] = []
        for cell in self.code_cells:
            pending.append(cell.number)
            ids = [m.group(0) for m in EXERCISE_ID.finditer(cell.source)]
            for ex_id in ids:
                sections.setdefault(ex_id, list(pending))
            if ids:
                pending = []
        return sections


def _tags(cell: dict) -> tuple[str, ...]:
    meta = cell.get("metadata")
    tags = meta.get("tags") if isinstance(meta, dict) else None
    return tuple(t for t in tags if isinstance(t, str)) if isinstance(tags, list) else ()


def _source(cell: dict, key: str) -> str:
    src = cell.get(key, "")
    if isinstance(src, list):
        return "".join(s for s in src if isinstance(s, str))
    return src if isinstance(src, str) else ""


def parse_notebook(text: str, path: Path) -> list[Cell]:
    """The cells of a notebook given as JSON text (nbformat 4, or 3 with worksheets)."""
    try:
        nb = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SubmissionError(f"{path}: not a notebook: invalid JSON ({exc})") from None
    if not isinstance(nb, dict):
        raise SubmissionError(f"{path}: not a notebook: the JSON is not an object")
    if isinstance(nb.get("cells"), list):
        raw, key = nb["cells"], "source"
    elif isinstance(nb.get("worksheets"), list):  # nbformat 3
        raw = [c for ws in nb["worksheets"] if isinstance(ws, dict) for c in ws.get("cells", [])]
        key = "input"
    else:
        raise SubmissionError(f"{path}: not a notebook: it has no list of cells")
    cells = []
    for i, c in enumerate(raw, start=1):
        if not isinstance(c, dict):
            raise SubmissionError(f"{path}: not a notebook: cell {i} is not an object")
        kind = str(c.get("cell_type", ""))
        cells.append(Cell(i, kind, _source(c, key if kind == "code" else "source"), _tags(c)))
    return cells


def detect_labs(cells: list[Cell], path: Path) -> list[int]:
    """Labs whose exercise ids appear in code cells (the check() calls), else anywhere, else the
    lab of the file name's NN_ prefix. Prose mentioning another lab must not add its exercises."""
    for group in ([c for c in cells if c.kind == "code"], cells):
        labs = {int(m.group(1)) for c in group for m in EXERCISE_ID.finditer(c.source)}
        if labs:
            return sorted(labs)
    m = FILENAME_LAB.match(path.name)
    return [int(m.group(1))] if m else []


def load_submission(path: str | Path, labs: list[int] | None = None) -> Submission:
    """Read a notebook; `labs` overrides the labs found in it."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SubmissionError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SubmissionError(f"{path}: cannot read: {exc}") from None
    cells = parse_notebook(text, path)
    return Submission(path, cells, sorted(set(labs)) if labs else detect_labs(cells, path))
