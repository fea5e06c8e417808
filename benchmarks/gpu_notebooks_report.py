"""What the notebooks executed on the GPU node by benchmarks/gpu_notebooks.sh did, from the executed copies it brings
back (a folder or a .tgz holding nb/*.ipynb, and grade_labN.json): for each notebook the code cells that ran, the
cells that failed (their exception), what went to stderr, and its check lines; for each grade, the scores.

    python3 benchmarks/gpu_notebooks_report.py OUT_OR_TGZ... >> benchmarks/logs/gpu_notebooks.log
"""

from __future__ import annotations

import json
import re
import sys
import tarfile
import tempfile
from pathlib import Path

import nbformat

ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Lab 3's step times (Exercise 8, from /server_info: SGLang sends them only with SGLANG_RECORD_STEP_TIME=1)
SHOWN = re.compile(r"^(total: .*|device: .*|.*final loss.*|.*servers still running.*|both servers answer after.*"
                   r"|.*plain step .* ms, speculative step .* ms.*|.*sent no step times.*)$", re.M)
CHECK = re.compile(r"^lab\d\.q\d+ \[(PASS|FAIL)\]", re.M)


def unpacked(src: Path) -> Path:
    if src.is_dir():
        return src
    into = Path(tempfile.mkdtemp(prefix="gpu-notebooks-"))
    with tarfile.open(src) as tar:
        tar.extractall(into, filter="data")
    return into


def notebook_lines(path: Path) -> list[str]:
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    ran = [c for c in code if c.get("execution_count") is not None]
    lines = [f"{path.name}: {len(ran)} of {len(code)} code cells ran"]
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                lines.append(f"  FAILED at cell {i} ({cell.get('id')}): {out.ename}: {ANSI.sub('', out.evalue).splitlines()[0][:240]}")
            elif out.get("name") == "stderr" and out.text.strip():
                lines.append(f"  stderr, cell {i} ({cell.get('id')}): {out.text.strip().splitlines()[-1][:200]}")
    text = "".join(o.get("text", "") for c in code for o in c.get("outputs", []) if o.get("name") == "stdout")
    checks = CHECK.findall(text)
    if checks:
        lines.append(f"  checks printed: {checks.count('PASS')} PASS, {checks.count('FAIL')} FAIL")
    lines += [f"  {m.strip()}" for m in SHOWN.findall(text)]
    return lines


def grade_lines(path: Path) -> list[str]:
    docs = json.loads(path.read_text())
    docs = docs if isinstance(docs, list) else [docs]
    return [f"{path.name}: {Path(d.get('notebook', '?')).name} {d['score']:g} / {d['max_score']:g}" for d in docs]


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for src in map(Path, argv):
        root = unpacked(src)
        print(f"# {src.name}")
        for nb in sorted((root / "nb").glob("*.ipynb")):  # pathlib: hidden names too
            print(*notebook_lines(nb), sep="\n")
        for grade in sorted(root.glob("grade_lab*.json")):
            print(*grade_lines(grade), sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
