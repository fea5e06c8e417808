"""Generate the student notebooks labs/NN_x.ipynb from solutions/NN_x.ipynb.

In code cells, the lines from `### BEGIN SOLUTION` to `### END SOLUTION` become one line
`raise NotImplementedError()` at the marker's indentation; in markdown cells, the lines from
`<!-- BEGIN SOLUTION -->` to `<!-- END SOLUTION -->` become `*Your answer here.*`. Outputs and
execution counts are stripped; notebook metadata is kept. `--check` only compares.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat

# Cell metadata that only records a past run (JupyterLab timings, collapsed outputs).
RUN_METADATA = ("execution", "collapsed", "scrolled")


@dataclass(frozen=True)
class Markers:
    """How a solution block is delimited in one kind of cell, and what replaces it."""

    begin: str
    end: str
    stub: str


CODE = Markers("### BEGIN SOLUTION", "### END SOLUTION", "raise NotImplementedError()")
MARKDOWN = Markers("<!-- BEGIN SOLUTION -->", "<!-- END SOLUTION -->", "*Your answer here.*")


class LabgenError(Exception):
    """A solution notebook cannot become a lab (the message names the notebook and the cell)."""


def strip_blocks(source: str, m: Markers) -> str:
    """Replace each block (markers included) with the stub at the BEGIN marker's indentation."""
    out: list[str] = []
    begin_line = 0  # line number of the open BEGIN marker, 0 when outside a block
    indent = ""
    for n, line in enumerate(source.splitlines(keepends=True), start=1):
        text = line.strip()
        if text == m.begin:
            if begin_line:
                raise ValueError(f"line {n}: `{m.begin}` inside the block opened on line {begin_line}")
            begin_line, indent = n, line[: len(line) - len(line.lstrip())]
        elif text == m.end:
            if not begin_line:
                raise ValueError(f"line {n}: `{m.end}` without a `{m.begin}` before it")
            out.append(indent + m.stub + ("\n" if line.endswith("\n") else ""))
            begin_line = 0
        elif _looks_like_marker(text, m):
            # a near miss would copy the solution into the students' notebook
            raise ValueError(f"line {n}: malformed marker {text!r}: write exactly `{m.begin}` or `{m.end}`")
        elif not begin_line:
            out.append(line)
    if begin_line:
        raise ValueError(f"line {begin_line}: `{m.begin}` without a `{m.end}` after it")
    return "".join(out)


def _looks_like_marker(text: str, m: Markers) -> bool:
    if m is MARKDOWN:
        return text.startswith("<!--") and "SOLUTION" in text.upper()
    return "BEGIN SOLUTION" in text.upper() or "END SOLUTION" in text.upper()


def _source(cell: dict[str, Any]) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def make_lab(nb: dict[str, Any], name: str) -> dict[str, Any]:
    """The lab version of a solution notebook (a dict in nbformat 4), changed in place."""
    if nb.get("nbformat") != 4 or not isinstance(nb.get("cells"), list):
        raise LabgenError(f"{name}: not a notebook in nbformat 4")
    with_ids = nb.get("nbformat_minor", 0) >= 5
    for i, cell in enumerate(nb["cells"], start=1):
        kind = cell.get("cell_type")
        try:
            if kind == "code":
                cell["source"] = strip_blocks(_source(cell), CODE)
                cell["outputs"], cell["execution_count"] = [], None
            elif kind == "markdown":
                cell["source"] = strip_blocks(_source(cell), MARKDOWN)
        except ValueError as exc:
            raise LabgenError(f"{name}, cell {i} ({kind}): {exc}") from None
        meta = cell.get("metadata", {})
        for key in RUN_METADATA:
            meta.pop(key, None)
        if with_ids and "id" not in cell:
            cell["id"] = f"cell-{i}"  # nbformat would pick a random one: the output must not change
    return nb


def lab_text(solution: Path) -> str:
    """The text of the lab notebook generated from one solution notebook."""
    try:
        nb = json.loads(solution.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LabgenError(f"{solution}: cannot read it as a notebook: {exc}") from None
    if not isinstance(nb, dict):
        raise LabgenError(f"{solution}: not a notebook")
    node = nbformat.from_dict(make_lab(nb, str(solution)))
    try:
        nbformat.validate(node)
    except nbformat.ValidationError as exc:
        raise LabgenError(f"{solution}: not a valid notebook: {str(exc).splitlines()[0]}") from None
    return nbformat.writes(node).rstrip("\n") + "\n"


def generate(solutions: Path, labs: Path) -> dict[Path, str]:
    """Lab path -> its text, for every solution notebook (all built before anything is written)."""
    if not solutions.is_dir():
        raise LabgenError(f"{solutions}: no such folder (run from the repository root, or pass --solutions)")
    return {labs / src.name: lab_text(src) for src in sorted(solutions.glob("*.ipynb"))}


def drift(expected: dict[Path, str], labs: Path) -> list[str]:
    """What differs between labs/ and what solutions/ generates."""
    problems = []
    for path, text in expected.items():
        if not path.exists():
            problems.append(f"{path}: missing")
        elif path.read_bytes() != text.encode("utf-8"):
            problems.append(f"{path}: differs from what its solution notebook generates")
    for path in sorted(labs.glob("*.ipynb")) if labs.is_dir() else []:
        if path not in expected and not path.name.endswith(".executed.ipynb"):  # `specdec execute`'s copies
            problems.append(f"{path}: has no solution notebook")
    return problems


def write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    os.replace(tmp, path)
