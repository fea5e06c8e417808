"""`specdec room --students N`: one server per student on this node, each on its own port with its own API
key, in a CSV (name,url,key) to hand out; Ctrl-C or `specdec room --stop` stops them all.

    specdec room --students 12 --algorithm NEXTN --out room.csv     # SGLang where a GPU and SGLang are present
    specdec room --students 4 --engine specdec                       # the CPU path: specdec serve
    specdec room --stop                                              # from another shell
"""

from __future__ import annotations

import argparse
import shlex
import socket
import sys
from pathlib import Path

from specdec.cli.common import UsageError
from specdec.cli.launch import zoo_dirs
from specdec.serving.ops.gpu import DEFAULT_HEADROOM, MemoryPlanError, ServerNeeds, fa3_present, query_gpus, server_needs
from specdec.serving.ops.launch import ALGORITHMS, ALIASES, NEEDS_DRAFT, LaunchConfig, LaunchConfigError, detect_backend
from specdec.serving.ops.lifecycle import stop_on_signals
from specdec.serving.ops.room import (
    Room,
    RoomError,
    export_line,
    gpu_plans,
    jupyter_lines,
    new_key,
    pick_ports,
    pick_spaced_ports,
    seat_names,
    sglang_seats,
    specdec_seats,
    stop_room,
    student_env,
    write_csv,
)
from specdec.zoo import ModelNotFound

ENGINES = ("auto", "sglang", "specdec")
NCCL_GAP = 1000  # SGLang's NCCL ports start this far above the last HTTP port


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--students", type=int, default=None, help="servers to start, one per student")
    p.add_argument("--stop", action="store_true", help="stop the running room (its servers and itself) and exit")
    p.add_argument("--model", default="tiny", help="zoo name or model directory (default: tiny)")
    p.add_argument("--algorithm", "--speculative-algorithm", dest="algorithm", default="none",
                   help=f"{', '.join(ALGORITHMS)} (or mtp, eagle, draft, ngram); several, comma-separated (none,NEXTN), "
                        "give each student one server per algorithm, with one key")
    p.add_argument("--draft", default=None, help="draft directory (EAGLE, STANDALONE); a zoo model brings its own")
    p.add_argument("--num-steps", type=int, default=None)
    p.add_argument("--topk", type=int, default=None)
    p.add_argument("--num-draft-tokens", type=int, default=None)
    p.add_argument("--engine", choices=ENGINES, default="auto",
                   help="sglang, specdec (specdec serve), or auto: SGLang where a GPU and SGLang are present")
    p.add_argument("--host", default="127.0.0.1", help="address the servers listen on (0.0.0.0: other machines too)")
    p.add_argument("--url-host", default=None,
                   help="host name written in the CSV (default: --host, or this machine's name with 0.0.0.0)")
    p.add_argument("--port-base", type=int, default=30000, help="ports from here up (busy ones are skipped)")
    p.add_argument("--out", default="room.csv", help="the CSV to hand out: name,url,key (default room.csv)")
    p.add_argument("--state", default=None, help="the room's state file (default: room.json in ~/.cache/specdec/servers)")
    p.add_argument("--headroom", type=float, default=DEFAULT_HEADROOM,
                   help="SGLang: share of free GPU memory left for contexts, graphs and activations "
                        f"(default {DEFAULT_HEADROOM:g})")
    p.add_argument("--attention-backend", default="auto",
                   help="SGLang: auto = triton where sgl_kernel has no FA3 library (the offline pack), else SGLang's choice")
    p.add_argument("--cuda-graph-max-bs", type=int, default=16, help="SGLang: largest batch captured in a CUDA graph")
    p.add_argument("--sglang-version", default=None, help="spell flags for this SGLang version (default: the installed one)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="add to every server's environment")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds for every server to become healthy")
    p.add_argument("--grace", type=float, default=15.0, help="seconds between SIGTERM and SIGKILL when stopping")
    p.add_argument("--dry-run", action="store_true", help="print each server's command line and exit")


def plural(n: int, word: str) -> str:
    return word if n == 1 else word + "s"


def parse_env(items: list[str]) -> dict[str, str]:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--env takes KEY=VALUE, got {item!r}")
        env[key] = value
    return env


def base_config(args: argparse.Namespace, algorithm: str, engine: str, shared: bool = False) -> LaunchConfig:
    """A seat's configuration but its port and key; zoo names become directories for SGLang. With `shared`
    (several algorithms), each takes only the settings that apply to it."""
    algo = ALIASES.get(algorithm.lower(), algorithm.upper())
    cfg = {"model": args.model, "algorithm": algorithm, "draft": args.draft, "num_steps": args.num_steps,
           "topk": args.topk, "num_draft_tokens": args.num_draft_tokens, "backend": engine, "host": args.host}
    if shared:
        if algo not in NEEDS_DRAFT:
            cfg["draft"] = None
        if algo in ("none", "NGRAM"):
            cfg.update(num_steps=None, topk=None)
        if algo == "none":
            cfg["num_draft_tokens"] = None
    try:
        cfg.update(zoo_dirs(args.model, cfg["draft"], algo, engine))  # the zoo's draft or EAGLE head, either engine
        if engine == "sglang":
            backend = args.attention_backend
            if backend == "auto":
                backend = "triton" if fa3_present() is False else None
            cfg.update(cuda_graph_max_bs=args.cuda_graph_max_bs, attention_backend=backend)
        return LaunchConfig(**cfg)
    except (LaunchConfigError, ModelNotFound) as exc:
        raise UsageError(str(exc)) from None


def label(cfg: LaunchConfig) -> str:
    return "plain" if cfg.algorithm == "none" else cfg.algorithm.lower()


def plan_seats(args: argparse.Namespace, engine: str) -> list:
    """The seats (each student: a server per algorithm, one key), with ports and (SGLang) each GPU's memory plan."""
    algorithms = [a.strip() for a in args.algorithm.split(",") if a.strip()]
    configs = [base_config(args, a, engine, shared=len(algorithms) > 1) for a in algorithms]
    if not configs or len({c.algorithm for c in configs}) < len(configs):
        raise UsageError(f"--algorithm takes one name or several, comma-separated and distinct, got {args.algorithm!r}")
    names, bases, keys, students = [], [], [], []
    for student in seat_names(args.students):
        key = new_key()
        for cfg in configs:
            names.append(student if len(configs) == 1 else f"{student}-{label(cfg)}")
            bases.append(cfg)
            keys.append(key)
            students.append(student)
    host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    try:
        ports, skipped = pick_ports(len(names), args.port_base, host)
        # SGLang: an NCCL port each too, well above the HTTP ports
        nccl_ports = pick_spaced_ports(len(names), ports[-1] + NCCL_GAP, host=host) if engine == "sglang" else []
    except RoomError as exc:
        raise UsageError(str(exc)) from None
    if skipped:
        print(f"ports in use, skipped: {', '.join(map(str, skipped))}")
    public = args.url_host or (socket.gethostname() if args.host in ("0.0.0.0", "::") else None)
    if engine == "specdec":
        return specdec_seats(bases, names, ports, keys, public, students)
    gpus = query_gpus()
    if not gpus:
        raise UsageError("--engine sglang needs a GPU, and none is visible (nvidia-smi); --engine specdec runs on a CPU")
    try:
        each = [server_needs(c.model, c.algorithm, c.draft) for c in configs]
        needs = ServerNeeds(max(x.weights_bytes for x in each), max(x.kv_bytes_per_token for x in each))
        plans = gpu_plans(len(names), gpus, needs, args.headroom)
    except MemoryPlanError as exc:
        raise UsageError(str(exc)) from None
    for g in gpus:
        if g.index in plans:
            p = plans[g.index]
            print(f"GPU {g.index} ({g.name}): {p.describe()}; --mem-fraction-static {p.mem_fraction_static} "
                  f"--max-total-tokens {p.max_total_tokens}")
    if configs[0].attention_backend == "triton" and args.attention_backend == "auto":
        print("sgl_kernel has no FA3 library: --attention-backend triton")
    return sglang_seats(bases, names, ports, keys, gpus, plans, nccl_ports, public, students)


def print_student_lines(seats: list, report) -> None:
    """Per student, the line to paste before starting Jupyter (Lab 3 reads it), and once how to set it inside."""
    envs = student_env(seats)
    report("for Lab 3, each student pastes their line into a shell before starting Jupyter:")
    for who, env in envs.items():
        report(f"  {who}: {export_line(env)}")
    who, first = next(iter(envs.items()))
    report(f"  or in Jupyter, e.g. {who}, in a cell run before the others:")
    for line in jupyter_lines(first):
        report(f"    {line}")


def main(args: argparse.Namespace) -> int:
    if args.stop:
        print(stop_room(args.state, args.grace))
        return 0
    if args.students is None or args.students < 1:
        raise UsageError("give --students N (N >= 1), or --stop")
    if not 0 < args.headroom < 1:
        raise UsageError(f"--headroom must be in (0, 1), got {args.headroom}")
    out = Path(args.out)
    if not out.resolve().parent.is_dir():
        raise UsageError(f"{out}: its folder does not exist")
    env = parse_env(args.env)
    engine = detect_backend() if args.engine == "auto" else args.engine
    seats = plan_seats(args, engine)
    for seat in seats:
        seat.env.update(env)
    print(f"{len(seats)} {'SGLang' if engine == 'sglang' else 'specdec serve'} {plural(len(seats), 'server')} for "
          f"{args.students} {plural(args.students, 'student')}, "
          f"algorithm {args.algorithm}, ports {seats[0].spec.port}-{seats[-1].spec.port}", flush=True)
    if args.dry_run:
        for seat in seats:
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in seat.env.items())
            print(f"{seat.name} {seat.url}: {env + ' ' if env else ''}{shlex.join(seat.spec.command(args.sglang_version))}")
        return 0

    def report(line: str) -> None:
        print(line, flush=True)

    # SIGTERM (`specdec room --stop`), SIGINT (Ctrl-C) and SIGHUP stop the room, whatever it inherited (a room
    # started with `&` in a script has SIGINT ignored)
    with stop_on_signals():
        try:
            with Room(seats, args.state, grace=args.grace, report=report, version=args.sglang_version) as room:
                try:
                    room.start()
                    took = room.wait_healthy(args.timeout)
                    write_csv(out, seats)
                    print_student_lines(seats, report)
                    report(f"all {len(seats)} {plural(len(seats), 'server')} ready in {took:.0f} s; hand out {out} (name,url,key); "
                           "Ctrl-C, SIGTERM, SIGHUP or `specdec room --stop` stops them")
                    room.watch()
                except KeyboardInterrupt as stop:
                    report(f"stopping the room ({stop.args[0] if stop.args else 'interrupted'})")
                except RoomError as exc:
                    print(f"specdec room: {exc}", file=sys.stderr, flush=True)
                    if room.servers:
                        report("stopping the other servers")
                    return 1
        except RoomError as exc:  # could not stop (rare): the state file is kept for --stop
            print(f"specdec room: {exc}", file=sys.stderr)
            return 1
    report("room stopped")
    return 0
