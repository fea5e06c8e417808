"""Lab 3's two servers started as its notebooks start them (`lab_servers`, the solution's configurations), on the GPU
node: seconds until both answer, one greedy request to each, and nothing left running after stop().

    PACK=.sglang-pack . .sglang-pack/setup.sh; python3 benchmarks/gpu_lab_servers.py >> benchmarks/logs/gpu_lab_servers.log

`lab_servers` starts the two at once and then waits for each (they used to start one after the other: 207.6 s on a
fresh H200, 74.2 s on one that had started SGLang before; benchmarks/logs/gpu_notebooks.log, calls 8 and 4), unless
a server's KV cache is a fraction of the memory it finds free (`--mem-fraction-static F`): then one after the other.
Without SGLang it starts `specdec serve` on the CPU instead, as the notebooks do.

`--crash`: the speculative server is given a flag it does not know, so that it exits at once while the plain one
starts: how soon `lab_servers` says so (it used to wait until the plain one answered, then find the other dead) and
that the plain one is stopped with it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec import LaunchConfig, detect_backend, lab_servers, pid_alive, zoo_parts  # noqa: E402
from specdec.serving.ops import room  # noqa: E402
from specdec.serving.ops.lifecycle import ServerError, session_members  # noqa: E402

K = 4  # the solution's: drafts per verify step, NEXTN with topk 1


def configs(backend: str, fraction: float | None = None) -> tuple[LaunchConfig, LaunchConfig]:
    """The Lab 3 solution's two configurations (solutions/03_sglang_live.ipynb, its set-up cell); `fraction`: each
    SGLang server's KV cache sized by --mem-fraction-static instead (then lab_servers starts them one after the other)."""
    if backend == "sglang":
        model = str(zoo_parts("tiny")["target"])
        gpu = dict(attention_backend="triton", cuda_graph_max_bs=16)
        if fraction is not None:
            gpu["mem_fraction_static"] = fraction
    else:
        model, gpu = "tiny", {}
    plain = LaunchConfig(model, "none", backend=backend, max_running_requests=8, **gpu)
    spec = LaunchConfig(model, "NEXTN", num_steps=K, topk=1, num_draft_tokens=K + 1, backend=backend,
                        max_running_requests=8, **gpu)
    return plain, spec


def crash(backend: str, plain_cfg: LaunchConfig, spec_cfg: LaunchConfig) -> int:
    """The speculative server exits at start (an unknown flag): the seconds until lab_servers raises, and what is left."""
    bad = dataclasses.replace(spec_cfg, extra_args=("--no-such-flag",))
    started = []  # every server lab_servers starts, seen on its way out of room.start
    room.start = lambda cfg, _start=room.start: started.append(_start(cfg)) or started[-1]
    t0 = time.perf_counter()
    try:
        lab_servers(plain_cfg, bad, timeout=600, environ={})
    except ServerError as exc:
        error, after = str(exc).splitlines()[0], time.perf_counter() - t0
    else:
        print(f"{backend}: the speculative server started with --no-such-flag", flush=True)
        return 1
    left = sorted({q for server in started for q in session_members(server.pid, server.ticks)} |
                  {server.pid for server in started if pid_alive(server.pid)})
    out = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "backend": backend, "crash": True,
           "error_after_s": round(after, 1), "error": error, "left_running": left}
    print(json.dumps(out), flush=True)
    print(f"{backend}: the crashed start reported after {after:.1f} s ({error}); left running: {left or 'none'}", flush=True)
    return 1 if left or len(started) != 2 else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--crash", action="store_true", help="the speculative server exits at start: how soon it is said")
    p.add_argument("--mem-fraction-static", type=float, default=None,
                   help="size each SGLang server's KV cache by this fraction (they then start one after the other)")
    args = p.parse_args()
    backend = detect_backend()
    plain_cfg, spec_cfg = configs(backend, args.mem_fraction_static)
    if args.crash:
        return crash(backend, plain_cfg, spec_cfg)
    t0 = time.perf_counter()
    plain, spec = lab_servers(plain_cfg, spec_cfg, timeout=600, environ={})
    ready = time.perf_counter() - t0
    members = set(session_members(plain.pid)) | set(session_members(spec.pid))
    out = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "backend": backend,
           "mem_fraction_static": args.mem_fraction_static, "both_answer_s": round(ready, 1),
           "start_gap_s": round(abs(spec.ticks - plain.ticks) / os.sysconf("SC_CLK_TCK"), 2)}
    try:
        for name, server in (("plain", plain), ("speculative", spec)):
            r = server.client().generate("def fib(n):", max_new_tokens=32, temperature=0.0)
            out[name] = {"completion_tokens": r.completion_tokens, "verify_steps": r.spec.verify_ct if r.spec else None,
                         "algorithm": server.client().server_info().speculative_algorithm}
    finally:
        plain.stop(), spec.stop()
    deadline = time.monotonic() + 30
    while any(map(pid_alive, members)) and time.monotonic() < deadline:
        time.sleep(0.5)
    out["left_running"] = sorted(p for p in members if pid_alive(p))
    print(json.dumps(out), flush=True)
    print(f"{backend}: both servers answer after {ready:.1f} s (started {out['start_gap_s']} s apart); "
          f"left running: {out['left_running'] or 'none'}", flush=True)
    return 1 if out["left_running"] else 0


if __name__ == "__main__":
    sys.exit(main())
