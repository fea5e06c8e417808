"""Sampling a running server with py-spy (a profiler that attaches to a pid): where each of its threads spends
its time while a benchmark drives it. Used by gpu_tree_sweep.py --pyspy; py-spy is not a dependency of the
course (pip install py-spy, or its static binary beside the checkout).

usage: python benchmarks/pyspy.py RAW [--top N]   (summarise a raw file `py-spy record -f raw` wrote)
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import re
import signal
import subprocess
from pathlib import Path

FRAME = re.compile(r" \((?:.*/)?([^/]+/[^/]+\.py):\d+\)$")  # "f (/x/y/server/app.py:12)" -> "f (server/app.py)"


@contextlib.contextmanager
def record(binary: str, pid: int, raw: Path, rate: int = 200, native: bool = False, gil: bool = False):
    """py-spy samples every thread of `pid` into `raw` while the block runs: without pausing it, or (native) pausing
    it for each sample to read the C/C++ frames too (torch's, CUDA's); gil: only the thread holding the GIL (who
    keeps the others waiting)."""
    how = (["--native"] if native else ["--nonblocking"]) + (["--gil"] if gil else [])
    proc = subprocess.Popen([binary, "record", "-p", str(pid), "-r", str(rate), "-f", "raw", "-o", str(raw),
                             "--threads", *how], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def summarize(raw: Path, top: int = 25) -> list[str]:
    """Per thread: its samples, then the functions with the most samples anywhere on its stack (inclusive),
    and the leaves (exclusive), as percentages of that thread's samples."""
    samples: collections.Counter = collections.Counter()
    inclusive: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    leaves: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        thread, *frames = stack.split(";")
        thread = re.sub(r"^thread \(\d+\): ", "", thread)
        thread = re.sub(r"_\d+$", "_*", thread)  # asyncio's worker threads, pooled
        names = [FRAME.sub(r" (\1)", f) for f in frames]
        samples[thread] += int(n)
        for name in set(names):
            inclusive[thread][name] += int(n)
        if names:
            leaves[thread][names[-1]] += int(n)
    lines = []
    for thread, total in samples.most_common():
        lines.append(f"-- thread {thread}: {total} samples")
        outer = max(inclusive[thread].values(), default=0)  # the frames every sample passes through say nothing
        for name, n in [(f, n) for f, n in inclusive[thread].most_common() if n < outer][:top]:
            lines.append(f"  {100 * n / total:5.1f}% incl  {name}")
        for name, n in leaves[thread].most_common(top // 2):
            lines.append(f"  {100 * n / total:5.1f}% self  {name}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("raw", type=Path)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    print("\n".join(summarize(args.raw, args.top)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
