"""A room: one server per student on one node, each on its own port with its own API key.

The servers start together; the room waits until every one can generate, writes the CSV of
name, URL and key to hand out, and then watches them until Ctrl-C, SIGTERM, SIGHUP or `specdec room --stop`
(which reads the state file: the room's pid and each server's process group) stops them all. A
server that fails to start is reported with the end of its log, and the others are stopped.
"""

from __future__ import annotations

import csv
import json
import os
import shlex
import secrets
import signal
import string
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from specdec.serving.measure.client import Client, ClientError
from specdec.serving.ops.gpu import Gpu, MemoryPlan, ServerNeeds, memory_plan
from specdec.serving.ops.launch import LaunchConfig
from specdec.serving.ops.lifecycle import (
    Server,
    ServerCommand,
    ServerError,
    kill_session,
    pid_alive,
    run_dir,
    session_members,
    start,
    start_ticks,
    wait_all_healthy,
)
from specdec.serving.ops.ports import port_free

STATE_NAME = "room.json"
CSV_FIELDS = ("name", "url", "key")
# What a student pastes (the room prints it) and Lab 3 reads: the plain server, the speculative one, their key.
ENV_URL, ENV_SPEC_URL, ENV_KEY = "SPECDEC_URL", "SPECDEC_SPEC_URL", "SPECDEC_API_KEY"


class RoomError(RuntimeError):
    """The room could not start or stop as asked (the message says which server and why)."""


@dataclass(frozen=True)
class Seat:
    """One student's server: its name, what starts it (port and key inside), and its environment."""

    name: str
    spec: LaunchConfig | ServerCommand
    env: dict[str, str] = field(default_factory=dict)
    public_host: str | None = None  # the host name students use (the CSV), when it is not spec.host
    student: str | None = None  # whose seat (default: name); a student may hold several (one per algorithm)

    @property
    def url(self) -> str:
        host = self.public_host or ("127.0.0.1" if self.spec.host in ("0.0.0.0", "::", "") else self.spec.host)
        return f"http://{host}:{self.spec.port}"

    @property
    def key(self) -> str | None:
        return self.spec.api_key

    @property
    def speculative(self) -> bool:
        return isinstance(self.spec, LaunchConfig) and self.spec.algorithm != "none"


# ----- planning: names, ports, keys, GPU memory ---------------------------------------------------------
def seat_names(n: int) -> list[str]:
    width = max(2, len(str(n)))
    return [f"student-{i:0{width}d}" for i in range(1, n + 1)]


KEY_ALPHABET = string.ascii_letters + string.digits


def new_key(length: int = 24) -> str:
    """Letters and digits only: a key starting with '-' would read as a flag on a server's command line."""
    return "".join(secrets.choice(KEY_ALPHABET) for _ in range(length))


def pick_ports(n: int, base: int, host: str = "127.0.0.1",
               is_free: Callable[[int, str], bool] = port_free) -> tuple[list[int], list[int]]:
    """The first n free ports from `base` up, and the busy ones skipped on the way."""
    ports, skipped, port = [], [], base
    while len(ports) < n:
        if port > 65535:
            raise RoomError(f"not enough free ports from {base} up: {len(ports)} found, {n} needed")
        (ports if is_free(port, host) else skipped).append(port)
        port += 1
    return ports, skipped


def pick_spaced_ports(n: int, start: int, stride: int = 16, host: str = "127.0.0.1",
                      is_free: Callable[[int, str], bool] = port_free) -> list[int]:
    """n ports from `start` up, `stride` apart, each free with the next few: SGLang's --nccl-port (torch.distributed's
    rendezvous), where a server may also open a few ports just above it."""
    ports, port = [], start
    while len(ports) < n:
        if port + stride > 65535:
            raise RoomError(f"not enough free NCCL ports from {start} up: {len(ports)} found, {n} needed")
        if all(is_free(p, host) for p in range(port, port + 4)):
            ports.append(port)
        port += stride
    return ports


def spread(n: int, gpus: list[Gpu]) -> list[Gpu]:
    """The GPU of each of n seats, round robin."""
    return [gpus[i % len(gpus)] for i in range(n)]


def gpu_plans(n: int, gpus: list[Gpu], needs: ServerNeeds, headroom: float) -> dict[int, MemoryPlan]:
    """Each GPU's plan for the seats it takes (MemoryPlanError if they do not fit)."""
    counts: dict[int, int] = {}
    for g in spread(n, gpus):
        counts[g.index] = counts.get(g.index, 0) + 1
    return {g.index: memory_plan(g.free_bytes, counts[g.index], needs, headroom) for g in gpus if g.index in counts}


def sglang_seats(bases: list[LaunchConfig], names: list[str], ports: list[int], keys: list[str], gpus: list[Gpu],
                 plans: dict[int, MemoryPlan], nccl_ports: list[int], public_host: str | None = None,
                 students: list[str] | None = None) -> list[Seat]:
    """SGLang servers (`bases`: each seat's configuration): each on its GPU (CUDA_VISIBLE_DEVICES), with its
    share of that GPU's memory.

    Each gets its own --nccl-port too (pick_spaced_ports): left to itself SGLang draws one at random, and
    servers that start together can draw the same one, or a port another seat is about to take.
    """
    seats = []
    for base, name, port, nccl, key, g, student in zip(bases, names, ports, nccl_ports, keys, spread(len(names), gpus),
                                                       students or names):
        plan = plans[g.index]
        extra = ("--max-total-tokens", str(plan.max_total_tokens), "--nccl-port", str(nccl))
        spec = base.replace(backend="sglang", port=port, api_key=key, mem_fraction_static=plan.mem_fraction_static,
                            extra_args=(*base.extra_args, *extra))
        seats.append(Seat(name, spec, {"CUDA_VISIBLE_DEVICES": g.uuid or str(g.index)}, public_host, student))
    return seats


def specdec_seats(bases: list[LaunchConfig], names: list[str], ports: list[int], keys: list[str],
                  public_host: str | None = None, students: list[str] | None = None) -> list[Seat]:
    # a seat's extra_args are SGLang's flags (sglang_seats): `specdec serve` would refuse them
    return [Seat(name, base.replace(backend="specdec", port=port, api_key=key, extra_args=()), public_host=public_host,
                 student=student)
            for base, name, port, key, student in zip(bases, names, ports, keys, students or names)]


# ----- what each student pastes: the environment Lab 3 reads (lab_servers) ------------------------------
def student_env(seats: list[Seat]) -> dict[str, dict[str, str]]:
    """student -> {SPECDEC_URL: the plain server, SPECDEC_SPEC_URL: the (first) speculative one, SPECDEC_API_KEY}.
    A student with only a speculative seat gets no SPECDEC_URL (the lab then starts its own plain server)."""
    out: dict[str, dict[str, str]] = {}
    for seat in seats:
        env = out.setdefault(seat.student or seat.name, {})
        env.setdefault(ENV_SPEC_URL if seat.speculative else ENV_URL, seat.url)
        if seat.key:
            env[ENV_KEY] = seat.key
    return {who: {k: env[k] for k in (ENV_URL, ENV_SPEC_URL, ENV_KEY) if k in env} for who, env in out.items()}


def export_line(env: dict[str, str]) -> str:
    """One shell line: `export SPECDEC_URL=... SPECDEC_API_KEY=... SPECDEC_SPEC_URL=...`."""
    return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())


def jupyter_lines(env: dict[str, str]) -> list[str]:
    """The same as %env lines, for a notebook's first cell (Jupyter's %env takes the rest of the line as it is)."""
    return [f"%env {k}={v}" for k, v in env.items()]


class RoomServer:
    """A server this process did not start (the room's): the url, key and client() of a Server, and a
    stop() that leaves it running, so that a notebook's last cell stops only what the notebook started."""

    started = False  # Server.started is True
    pid = None

    def __init__(self, url: str, api_key: str | None = None):
        self.url, self.api_key = url.rstrip("/"), api_key or None

    def __repr__(self) -> str:
        return f"RoomServer({self.url}, not started here: stop() leaves it running)"

    def client(self, timeout: float = 600.0) -> Client:
        return Client(self.url, api_key=self.api_key, timeout=timeout)

    def stop(self, grace: float | None = None) -> None:
        """Nothing: the room started this server and stops it."""


def lab_servers(plain_cfg: LaunchConfig, spec_cfg: LaunchConfig, timeout: float = 900.0,
                environ: dict[str, str] | None = None, report: Callable[[str], None] = print):
    """Lab 3's two servers, (plain, speculative): the room's where SPECDEC_URL / SPECDEC_SPEC_URL are set
    (key: SPECDEC_API_KEY), else started here from the configurations; one line says which. A room's
    server must answer /server_info with the key, and the speculative one must be speculative (ServerError
    otherwise). Each returned object has .url, .client() and .stop(), which stops only what was started here
    (.started tells)."""
    environ = os.environ if environ is None else environ
    key = environ.get(ENV_KEY) or None
    given = {"plain": (environ.get(ENV_URL) or "").strip(), "speculative": (environ.get(ENV_SPEC_URL) or "").strip()}
    servers: dict[str, Server | RoomServer] = {}
    for role, name in (("plain", ENV_URL), ("speculative", ENV_SPEC_URL)):
        if not given[role]:
            continue
        server = RoomServer(given[role], key)
        try:
            info = server.client(timeout=30).server_info()
        except ClientError as exc:
            raise ServerError(f"{name}={given[role]}: {exc} (is the room running, and {ENV_KEY} that room's key?)") from None
        if (role == "speculative") != bool(info.speculative_algorithm):
            what = f"runs {info.speculative_algorithm}" if info.speculative_algorithm else "is not speculative"
            raise ServerError(f"{name}={given[role]} {what}: {ENV_URL} is for the plain server, {ENV_SPEC_URL} "
                              "for the speculative one")
        servers[role] = server
    started: list[Server] = []
    try:
        # Both at once, then wait for each: an SGLang start takes a minute or two (on a fresh H200, 207.6 s for the two
        # one after the other, 105.3 s together). Not where a server sizes its KV cache by a fraction of the memory it
        # finds free: started beside another one that is allocating, it counts the other's memory as its own weights
        # (a fresh H200, 2026-11-29: "Loaded weights leave no GPU memory for the KV cache under
        # --mem-fraction-static=0.3"); those start one after the other, the second once the first answers.
        together = not any(isinstance(c, LaunchConfig) and c.sized_by_fraction() for c in (plain_cfg, spec_cfg))
        deadline = time.monotonic() + timeout
        for role, cfg in (("plain", plain_cfg), ("speculative", spec_cfg)):
            if role not in servers:
                servers[role] = start(cfg)
                started.append(servers[role])
                if not together:
                    wait_all_healthy([servers[role]], max(deadline - time.monotonic(), 0.1))
        if started:  # no bar: its redraws fill a notebook
            wait_all_healthy(started, max(deadline - time.monotonic(), 0.1))
    except BaseException:  # a crash, a timeout, Ctrl-C: nothing started here outlives the attempt
        for s in started:
            s.stop()
        raise
    room = [f"{role} {s.url}" for role, s in servers.items() if not s.started]
    own = [f"{role} {s.url} (pid {s.pid})" for role, s in servers.items() if s.started]
    parts = ([f"using the room's servers at {', '.join(room)}"] if room else []) + \
            ([f"started our own: {', '.join(own)}"] if own else [])
    report("; ".join(parts) + ("" if room else f" (set {ENV_URL}, {ENV_KEY} and {ENV_SPEC_URL} to use a room's)"))
    return servers["plain"], servers["speculative"]


# ----- the state file: what --stop needs to find every process -------------------------------------------
def state_path(path: str | Path | None = None) -> Path:
    return Path(path) if path else run_dir() / STATE_NAME


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)  # --stop never reads half a file


def read_state(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise RoomError(f"{path}: unreadable room state ({exc}); remove it once no room server runs") from None


def room_running(state: dict) -> bool:
    """The room process that wrote `state` still runs (its pid, started when it says)."""
    pid, ticks = state.get("pid"), state.get("ticks")
    return bool(pid) and pid_alive(pid) and start_ticks(pid) == ticks


def write_csv(path: Path, seats: list[Seat]) -> None:
    with open(path, "w", newline="") as f:
        os.chmod(path, 0o600)  # the keys are in it
        w = csv.writer(f, lineterminator="\n")
        w.writerow(CSV_FIELDS)
        for s in seats:
            w.writerow([s.name, s.url, s.key or ""])


# ----- the room ----------------------------------------------------------------------------------------
class Room:
    """Start every seat, wait for all, watch them, stop them all; the state file lists the process groups."""

    def __init__(self, seats: list[Seat], state: str | Path | None = None, grace: float = 15.0,
                 report: Callable[[str], None] = print, version: str | None = None):
        if not seats:
            raise RoomError("a room needs at least one seat")
        self.seats, self.grace, self.report, self.version = seats, grace, report, version
        self.state = state_path(state)
        self.servers: dict[str, Server] = {}
        self.owns_state = False  # set once this room has written the state file (never remove another room's)
        self.logs = run_dir() / f"room-{time.strftime('%Y%m%d-%H%M%S')}"

    def __enter__(self) -> Room:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def claim(self) -> None:
        """Refuse a second live room on the same state file; a dead one's file is replaced."""
        old = read_state(self.state)
        if old and room_running(old):
            raise RoomError(f"a room is already running (pid {old['pid']}, state {self.state}): "
                            "`specdec room --stop` first, or give this one its own --state")
        if old:
            stop_servers(old, 5.0)  # its room died without stopping them

    def start(self) -> None:
        """Start every server at once (each start takes its own time; none waits for another)."""
        self.claim()
        self.logs.mkdir(parents=True, exist_ok=True)
        self._save()
        for seat in self.seats:
            try:
                self.servers[seat.name] = start(seat.spec, env=seat.env, log_path=self.logs / f"{seat.name}.log",
                                                grace=self.grace, version=self.version)
            except ServerError as exc:
                raise RoomError(f"{seat.name}: {exc}") from None
            self._save()

    def _save(self) -> None:
        self.state.parent.mkdir(parents=True, exist_ok=True)
        servers = [{"name": n, "url": s.url, "pid": s.pid, "ticks": s.ticks, "log": str(s.log_path)}
                   for n, s in self.servers.items()]
        self.owns_state = True
        write_json(self.state, {"pid": os.getpid(), "ticks": start_ticks(os.getpid()), "logs": str(self.logs),
                                "servers": servers})

    def wait_healthy(self, timeout: float, every: float = 10.0) -> float:
        """Until every server can generate; RoomError (with its log's last lines) if one exits or time runs out."""
        t0, total = time.monotonic(), len(self.seats)
        name = {id(server): n for n, server in self.servers.items()}
        ready: list[str] = []
        self.report(f"starting {total} server{'' if total == 1 else 's'} (logs in {self.logs})")

        def on_ready(server: Server, seconds: float) -> None:
            ready.append(name[id(server)])
            self.report(f"  {ready[-1]} ready at {server.url} ({seconds:.0f} s; {len(ready)}/{total})")

        def on_wait(waiting: list[Server], seconds: float) -> None:
            names = [name[id(s)] for s in waiting]
            self.report(f"  waiting for {len(names)}: {', '.join(names[:6])}{' ...' if len(names) > 6 else ''} "
                        f"({seconds:.0f} s)")

        try:
            wait_all_healthy([self.servers[s.name] for s in self.seats], timeout, on_ready=on_ready, on_wait=on_wait,
                             every=every)
        except ServerError as exc:
            server = exc.server
            if server is not None and not server.alive():
                when = "while the others were starting" if name[id(server)] in ready else "before it was healthy"
                raise RoomError(f"{name[id(server)]} ({server.url}) exited with status {server.process.returncode} "
                                f"{when}; log {server.log_path}; last lines:\n{server.log_tail(15)}") from None
            waiting = [s.name for s in self.seats if s.name not in ready]
            tails = "\n".join(f"--- {n}: {self.servers[n].log_path}\n{self.servers[n].log_tail(5)}" for n in waiting)
            raise RoomError(f"not healthy after {timeout:.0f} s: {', '.join(waiting)}\n{tails}") from None
        return time.monotonic() - t0

    def watch(self, every: float = 1.0) -> None:
        """Report a server that dies (the others keep serving) until interrupted."""
        dead: set[str] = set()
        while True:
            for name, server in self.servers.items():
                if name not in dead and not server.alive():
                    dead.add(name)
                    self.report(f"{name} ({server.url}) exited with status {server.process.returncode}; log "
                                f"{server.log_path}; the others keep serving")
            time.sleep(every)

    def stop(self) -> None:
        """Stop every server (SIGTERM, then SIGKILL after the grace period) and remove the state file."""
        # a second Ctrl-C (or SIGTERM, SIGHUP) must not cut the stopping short
        stops = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        old = {s: signal.signal(s, signal.SIG_IGN) for s in stops} if _main_thread() else {}
        try:
            stopping = [threading.Thread(target=s.stop) for s in self.servers.values()]  # all at once: one grace period
            for th in stopping:
                th.start()
            for th in stopping:
                th.join()
            left = [n for n, s in self.servers.items() if not s.stopped]
            if not left and self.owns_state:
                self.state.unlink(missing_ok=True)
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
        if left:
            raise RoomError(f"could not stop {', '.join(left)}; `specdec room --stop` tries again")


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def stop_servers(state: dict, grace: float) -> list[str]:
    """Kill what is left of each server in `state` (only processes started as it records); the names stopped."""
    stopped = []
    for s in state.get("servers", []):
        pid, ticks = s.get("pid"), s.get("ticks")
        if pid and session_members(pid, ticks) and start_ticks(pid) in (None, ticks):
            kill_session(pid, grace, ticks)
            stopped.append(s.get("name", str(pid)))
    return stopped


def stop_room(path: str | Path | None = None, grace: float = 15.0, wait: float = 60.0) -> str:
    """`specdec room --stop`: SIGTERM to the room (it stops its servers), then kill what is left; one line."""
    path = state_path(path)
    state = read_state(path)
    if state is None:
        return f"no room is running (no state file at {path})"
    if room_running(state):
        os.kill(state["pid"], signal.SIGTERM)
        deadline = time.monotonic() + wait
        while room_running(state) and time.monotonic() < deadline:
            time.sleep(0.1)
        if room_running(state):  # stuck: its servers are killed below all the same
            os.kill(state["pid"], signal.SIGKILL)
    left = stop_servers(state, grace)
    path.unlink(missing_ok=True)
    n = len(state.get("servers", []))
    extra = f"; killed {', '.join(left)} directly" if left else ""
    return f"room stopped: {n} server(s){extra}"


__all__ = [
    "CSV_FIELDS",
    "ENV_KEY",
    "ENV_SPEC_URL",
    "ENV_URL",
    "Room",
    "RoomError",
    "RoomServer",
    "Seat",
    "export_line",
    "jupyter_lines",
    "lab_servers",
    "student_env",
    "gpu_plans",
    "new_key",
    "pick_ports",
    "pick_spaced_ports",
    "read_state",
    "seat_names",
    "sglang_seats",
    "specdec_seats",
    "spread",
    "state_path",
    "stop_room",
    "stop_servers",
    "write_csv",
]
