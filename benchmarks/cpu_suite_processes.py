"""Issue 20: where the test suite's CPU goes, by process. Runs pytest as `make test` runs it (its xdist line; extra pytest arguments after --) while a
sampler reads every process's CPU time from /proc four times a second, then sums the Python processes by kind: the
xdist workers (the tests that run in-process), notebook kernels, `specdec serve` and its engine process (spawned),
the grader's kernels, the CLI and benchmark scripts the tests start. A process that lives less than a quarter of a
second may be missed; its CPU is then not counted.

usage: PYTHONPATH=. .venv/bin/python benchmarks/cpu_suite_processes.py --out /tmp/procs [-- pytest args]
       (Linux only: it reads /proc)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ("serve", "launch", "grade", "room", "preflight", "decode", "tour", "bench", "labs", "sim", "zoo", "execute")


def kind(cmd: str, parent: str = "") -> str:
    """What a process is, from its command line (and its parent's, for a spawned child)."""
    if "spawn_main" in cmd:
        return "engine process of specdec serve (spawned)" if "specdec serve" in parent else "multiprocessing child"
    if "resource_tracker" in cmd:
        return "multiprocessing resource tracker"
    if "ipykernel" in cmd:
        return "notebook kernel"
    if "specdec.grading.kernel" in cmd:
        return "grader's notebook kernel"
    if "exec(eval(sys.stdin.readline()))" in cmd:
        return "pytest-xdist worker (in-process tests)"
    words = cmd.split()
    if "-m" in words and "pytest" in words:
        return "pytest"
    if "specdec" in words:
        return "specdec " + next((w for w in words if w in SCRIPTS), "(other)")
    script = next((w for w in words if w.endswith(".py")), "")
    if script:
        return "script " + Path(script).name
    return "other: " + cmd[:60]


def sample(seen: dict, stop: threading.Event, period: float = 0.25) -> None:
    """Every process's command line, parent and largest CPU time seen (user + system, seconds)."""
    hz = os.sysconf("SC_CLK_TCK")
    while True:  # one pass at least, then one each period until stopped
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                rest = stat[stat.rindex(")") + 2:].split()
                cpu = (int(rest[11]) + int(rest[12])) / hz
                if pid not in seen:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    seen[pid] = {"cmd": cmd[:300], "ppid": rest[1], "cpu": cpu}
                seen[pid]["cpu"] = max(seen[pid]["cpu"], cpu)
            except (OSError, ValueError, IndexError):
                pass  # the process ended while it was read
        if stop.wait(period):
            return


def aggregate(seen: dict) -> list[dict]:
    """The Python processes summed by kind, most CPU first."""
    by: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for v in seen.values():
        if "python" not in v["cmd"] and "specdec" not in v["cmd"]:
            continue
        k = kind(v["cmd"], seen.get(v["ppid"], {}).get("cmd", ""))
        by[k][0] += 1
        by[k][1] += v["cpu"]
    return [{"kind": k, "processes": n, "cpu_s": round(c, 1), "each_s": round(c / n, 2)}
            for k, (n, c) in sorted(by.items(), key=lambda kv: -kv[1][1])]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, pytest_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(own)
    args.out.mkdir(parents=True, exist_ok=True)
    seen: dict = {}
    stop = threading.Event()
    sampler = threading.Thread(target=sample, args=(seen, stop), daemon=True)
    sampler.start()
    t0, c0 = time.time(), os.times()
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider", *pytest_args]
    run = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, MPLBACKEND="Agg"), capture_output=True, text=True)
    wall, c1 = time.time() - t0, os.times()
    stop.set()
    sampler.join()
    rows = aggregate(seen)
    children = c1.children_user + c1.children_system - c0.children_user - c0.children_system
    summary = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "pytest": " ".join(cmd[2:]),
               "result": run.stdout.strip().splitlines()[-1] if run.stdout.strip() else "", "exit": run.returncode,
               "wall_s": round(wall, 1), "children_cpu_s": round(children, 1),
               "sampled_python_cpu_s": round(sum(r["cpu_s"] for r in rows), 1), "kinds": rows}
    (args.out / "cpu_suite_processes.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"{summary['result']}\nwall {wall:.0f} s; CPU of pytest and everything it started {children:.0f} s; "
          f"sampled in Python processes {summary['sampled_python_cpu_s']:.0f} s")
    for r in rows[:25]:
        print(f"{r['cpu_s']:8.1f} s CPU {r['processes']:5d} processes {r['each_s']:6.2f} s each  {r['kind']}")
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
