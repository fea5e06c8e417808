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
sys.path.insert(0, str(REPO / "tests"))
from notebook_tools import a_class  # noqa: E402


def main() -> None:
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


if __name__ == "__main__":
    main()
