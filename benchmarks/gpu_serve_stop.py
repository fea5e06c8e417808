"""What a compiled `specdec serve` leaves behind when a script stops it (the course's rule: no process left behind).

A compiled server has more processes than the two of `specdec serve` (the HTTP process and its engine process):
inductor compiles in a pool of worker processes that the engine process starts. This starts the server as a shell
script's `&` does (its own session, SIGINT ignored), waits until it is healthy, records every process of its tree
(from /proc), serves one request, then sends SIGTERM to the server's pid only (`kill $pid`, not its process group)
and waits for it to exit. Then it lists what of the recorded tree is still alive a few seconds later, and the
server log's lines about leaked resources (multiprocessing's resource tracker warns of a leaked semaphore).

usage (GPU node): PYTHONPATH=. python3 benchmarks/gpu_serve_stop.py --out $OUT/serve_stop [--shape 1b] [--compile on]
CPU smoke run (tests): --shape tiny --compile off --device cpu
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specdec.serving.ops.lifecycle import pid_alive  # noqa: E402
from specdec.serving.ops.ports import free_port  # noqa: E402


def tree_of(pid: int) -> dict[int, str]:
    """pid and its descendants -> their command lines, read from /proc (by parent, not session: a descendant that left
    the server's session is still counted)."""
    parent: dict[int, int] = {}
    argv: dict[int, str] = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{p}/stat").read()
            parent[int(p)] = int(stat.rsplit(")", 1)[1].split()[1])
            argv[int(p)] = open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
    found, todo = {}, [pid]
    while todo:
        p = todo.pop()
        found[p] = argv.get(p, "?")[:160]
        todo += [c for c, pp in parent.items() if pp == p and c not in found]
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="1b", help="--random-weights (tiny for the CPU smoke run)")
    ap.add_argument("--compile", default="on")
    ap.add_argument("--device", default=None)
    ap.add_argument("--start-timeout", type=float, default=300.0)
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    port = free_port("127.0.0.1")
    cmd = [sys.executable, "-m", "specdec", "serve", "--random-weights", a.shape, "--max-running-requests", "4",
           "--context-length", "512", "--compile", a.compile, "--port", str(port)]
    cmd += ["--device", a.device] if a.device else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    log = out / "server.log"
    t0 = time.time()
    with open(log, "w") as f:  # a script's `&`: its own session, SIGINT ignored (what a shell gives a background job)
        server = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                  start_new_session=True,
                                  preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    url = f"http://127.0.0.1:{port}"
    result = {"date": time.strftime("%Y-%m-%d"), "command": cmd, "healthy": False}
    try:
        while time.time() - t0 < a.start_timeout and server.poll() is None:
            try:
                if requests.get(url + "/health_generate", timeout=5).status_code == 200:
                    result["healthy"] = True
                    break
            except requests.RequestException:
                pass
            time.sleep(0.5)
        result["healthy_after_s"] = round(time.time() - t0, 1)
        tree = tree_of(server.pid)
        result["tree"] = {str(p): c for p, c in tree.items()}
        if result["healthy"]:
            r = requests.post(url + "/generate", json={"text": "The capital of France is",
                                                       "sampling_params": {"max_new_tokens": 8}}, timeout=60)
            result["request_status"] = r.status_code
        os.kill(server.pid, signal.SIGTERM)  # `kill $pid`: the server's pid only
        t = time.time()
        try:
            result["exit_status"] = server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            result["exit_status"] = None
        result["exit_after_s"] = round(time.time() - t, 1)
        deadline = time.time() + 5  # what a process given its parent's exit needs to notice it
        while any(pid_alive(p) for p in tree) and time.time() < deadline:  # a process gone stays gone: no need to wait
            time.sleep(0.1)
        left = {p: c for p, c in tree.items() if pid_alive(p)}
        result["left"] = {str(p): c for p, c in left.items()}
    finally:
        for p in list(tree_of(server.pid)) if server.poll() is None else []:
            os.kill(p, signal.SIGKILL)
        for p in result.get("left", {}):  # leave nothing for the next part of the call
            try:
                os.kill(int(p), signal.SIGKILL)
            except ProcessLookupError:
                pass
    text = log.read_text(errors="replace")
    result["log_leaks"] = [x for x in text.splitlines() if "leak" in x.lower()]
    (out / "serve_stop.json").write_text(json.dumps(result, indent=1))
    print(f"healthy: {result['healthy']} after {result['healthy_after_s']} s; {len(result['tree'])} processes in its tree:")
    for p, c in result["tree"].items():
        print(f"  {p} {c}")
    print(f"request status {result.get('request_status')}; SIGTERM to pid {server.pid}: exit status "
          f"{result['exit_status']} after {result['exit_after_s']} s")
    print(f"left 5 s later: {len(result['left'])}" + "".join(f"\n  {p} {c}" for p, c in result["left"].items()))
    print("log lines about leaks: " + ("; ".join(result["log_leaks"]) or "none"))
    return 0 if result["healthy"] and not result["left"] and result["exit_status"] == 0 else 1


# --- docs/results.md: this script's section (benchmarks/report.py stitches the sections) ---------------------------

def render() -> str:
    """benchmarks/results/gpu_serve_stop/serve_stop.json: the processes of a compiled server, and what its stop left."""
    from page import load, provenance

    r = load("gpu_serve_stop/serve_stop.json")
    if not r:
        return ""
    tree = r["tree"].values()
    workers = sum("compile_worker" in c for c in tree)
    leaks = "; ".join(f"`{x.split('UserWarning: ')[-1]}`" for x in r["log_leaks"]) or "none"
    return f"""### What a compiled server leaves behind when a script stops it

{provenance(["benchmarks/results/gpu_serve_stop/serve_stop.json"], "an NVIDIA H200", "`benchmarks/gpu_serve_stop.py`",
            ["benchmarks/logs/gpu_serve_stop.log"], ["benchmarks/results/gpu_serve_stop/"])}

`python {" ".join(r["command"][1:])}` started as a script's `&` starts it (its own session, SIGINT ignored) was healthy after
{r["healthy_after_s"]:g} s as {len(r["tree"])} processes: the HTTP process, its engine process, multiprocessing's resource
tracker and {workers} inductor compile workers that the engine process started. After one request, SIGTERM to the server's
pid alone (`kill $pid`): exit status {r["exit_status"]} after {r["exit_after_s"]:g} s, and {len(r["left"])} of those processes
alive 5 s later. The server's log said, about leaks: {leaks} (the tracker unlinks what an exiting process did not).
"""


if __name__ == "__main__":
    raise SystemExit(main())
