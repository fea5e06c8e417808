"""Time `specdec grade --batch -j 2` on a class of thirty Lab 3 notebooks (solutions, labs, broken
files, one endless loop), with the default limits. Usage: python benchmarks/grade_class.py [LOG]"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    sys.path.insert(0, str(REPO / "tests"))
    from notebook_tools import a_class

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "submissions"
        expected = a_class(REPO / "solutions" / "03_sglang_live.ipynb", REPO / "labs" / "03_sglang_live.ipynb", root,
                           loops=True)
        print(f"{len(expected)} notebooks; load average before: {os.getloadavg()[0]:.2f}; {os.cpu_count()} cores",
              flush=True)
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "specdec", "grade", "--batch", str(root), "--csv",
                               str(Path(tmp) / "scores.csv"), "-j", "2"], cwd=REPO, capture_output=True, text=True)
        seconds = time.monotonic() - start
        print(proc.stderr.replace(str(root) + "/", ""))
        print((Path(tmp) / "scores.csv").read_text().replace(str(root) + "/", ""))
        print(f"exit status {proc.returncode}; {len(expected)} notebooks in {seconds:.1f} s with -j 2; "
              f"load average after: {os.getloadavg()[0]:.2f}")


# --- docs/results.md: the section its log feeds (benchmarks/report.py stitches the sections) ----------------

def render() -> str:
    """The class's grading from benchmarks/logs/grade_class.log (what main printed)."""
    import csv
    import io
    import re

    from page import LOGS, provenance, table

    log = LOGS / "grade_class.log"
    if not log.is_file():
        return ""
    text = log.read_text()
    first, last = text.splitlines()[0], text.strip().splitlines()[-1]
    cores = re.search(r"(\d+) cores", first).group(1)
    per = re.findall(r"^\[\d+/\d+\] (\w+)/\S+: (\S+) \(([\d.]+)s\)$", text, flags=re.MULTILINE)
    rows = list(csv.DictReader(io.StringIO(text[text.index("notebook,status"):].split("\n\n")[0])))
    kinds: dict[str, list] = {}
    for name, score, seconds in per:
        kinds.setdefault(re.sub(r"\d+$", "", name), []).append((score, float(seconds)))
    trows = [[kind, len(v), ", ".join(sorted({s for s, _ in v})), max(t for _, t in v)] for kind, v in kinds.items()]
    loop = max(float(s) for _, _, s in per)
    rest = sum(float(s) for _, _, s in per) - loop
    status = {s: sum(r["status"] == s for r in rows) for s in sorted({r["status"] for r in rows})}
    return f"""### A class of thirty Lab 3 notebooks, graded in one batch

{provenance(["benchmarks/logs/grade_class.log"], f"the {cores}-core development CPU", "`benchmarks/grade_class.py`",
            ["benchmarks/logs/grade_class.log"])}

`specdec grade --batch DIR --csv scores.csv -j 2` with the default limits on a class built by `tests/notebook_tools.a_class`:
solutions, untouched labs, labs with one exercise done, broken files and notebooks that misbehave (exit, kill their
kernel, run out of memory, loop for ever in a cell). {first}; {", ".join(f"{n} {s}" for s, n in status.items())}.
Per kind of submission (the grader's score, the longest time of one notebook in seconds):

{table(["submission", "notebooks", "scores", "longest s"], trows)}

{last[0].upper() + last[1:]}. The notebook that loops took {loop:.1f} s; the other {len(per) - 1} took {rest:.1f} s
between them. `tests/test_grade_class.py` grades the same class without the loop.
"""


if __name__ == "__main__":
    main()
