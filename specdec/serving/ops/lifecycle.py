"""Start a server and make sure it stops: its own session and process group, its log in a file, a
wait for /health_generate, SIGTERM to the group then SIGKILL, and no process left behind after an
exception, Ctrl-C, the launching Python's exit (atexit), a SIGTERM or SIGHUP to it (a handler that
stops its servers first), or its death (a pid file the next launch reaps).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import requests
from tqdm.auto import tqdm

from specdec.serving.measure.client import Client
from specdec.serving.ops.launch import LaunchConfig
from specdec.serving.ops.ports import free_port, port_taken

RUN_DIR_ENV = "SPECDEC_RUN_DIR"  # where pid files and logs go (default ~/.cache/specdec/servers)
HEALTH_PATH = "/health_generate"  # SGLang answers 503 here until it can generate


@dataclass(frozen=True)
class ServerCommand:
    """Any server command line; "{host}" and "{port}" in argv are filled in at launch."""

    argv: tuple[str, ...]
    host: str = "127.0.0.1"
    port: int | None = None
    api_key: str | None = None


class ServerError(RuntimeError):
    """The server did not come up (or died): the message ends with the last lines of its log."""

    def __init__(self, message: str, log_path: Path | None = None, log_tail: str = "", server: Server | None = None):
        self.log_path, self.log_tail, self.server = log_path, log_tail, server
        where = f" (log: {log_path})" if log_path else ""
        super().__init__(f"{message}{where}" + (f"\n--- last lines of the log ---\n{log_tail}" if log_tail else ""))


def brief(text: str, limit: int = 2000) -> str:
    """A long error cut to `limit` characters in its middle: its first line (what failed, the log's path) and its end
    (a traceback's last line names the exception; cutting the end off, as a plain slice does, loses it)."""
    if len(text) <= limit:
        return text
    head = text.split("\n", 1)[0][: limit // 2]
    cut = "\n[...]\n"
    return head + cut + text[len(text) - (limit - len(head) - len(cut)):]


def run_dir() -> Path:
    d = Path(os.environ.get(RUN_DIR_ENV) or Path.home() / ".cache" / "specdec" / "servers")
    d.mkdir(parents=True, exist_ok=True)
    return d


# ----- stop signals: SIGTERM, SIGINT and SIGHUP stop a launcher and its servers
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class StopSignal(KeyboardInterrupt):
    """A stop signal received by the main thread (a KeyboardInterrupt, so Ctrl-C paths handle it too)."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within: SIGTERM, SIGINT and SIGHUP raise StopSignal in the main thread, once (a second signal
    while stopping is ignored, so it cannot cut the stop short); the previous handlers come back after.

    Set explicitly whatever this process inherited: a launcher started with `&` in a script has
    SIGINT ignored, under nohup SIGHUP ignored, and a supervisor may leave them blocked. Servers
    started within inherit the default dispositions (handlers are reset by exec, SIG_IGN is not).
    """
    fired: list[int] = []

    def handler(signum, frame):
        if not fired:
            fired.append(signum)
            raise StopSignal(signum)

    old = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h if h is not None else signal.SIG_DFL)


def _stop_servers_then_die(signum, frame) -> None:
    """SIGTERM or SIGHUP to a Python that launched servers through the API (a notebook kernel, a script):
    stop them, then die of the signal as the default disposition would (exit status 128 + signum)."""
    if os.getpid() == _HANDLER_PID:  # not in a child forked without exec
        _stop_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


_HANDLER_PID: int | None = None


def _guard_api_signals() -> None:
    """Install _stop_servers_then_die for SIGTERM and SIGHUP where they still have the default disposition
    (never over a handler someone else set, nor over an inherited SIG_IGN); main thread only."""
    global _HANDLER_PID
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _stop_servers_then_die)
            _HANDLER_PID = os.getpid()


# ----- processes, read from /proc where there is one (Linux); os.kill(pid, 0) elsewhere
def _stat(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/PID/stat (state, ppid, pgrp, session, ...), or None if gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw[raw.rindex(")") + 2:].split()


def start_ticks(pid: int) -> int | None:
    """When the process started (clock ticks since boot): tells a pid from a reused one."""
    st = _stat(pid)
    return int(st[19]) if st else None


def pid_alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent does not count)."""
    if Path("/proc").is_dir():
        st = _stat(pid)
        return st is not None and st[0] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def session_members(sid: int, since_ticks: int | None = None) -> list[int]:
    """Live processes of session `sid` (the server and everything it started), started at or after since_ticks."""
    if not Path("/proc").is_dir():
        try:
            os.killpg(sid, 0)  # the group is the session's leader group: the best we can see here
            return [sid]
        except (ProcessLookupError, PermissionError):
            return []
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        st = _stat(int(p.name))
        if st and int(st[3]) == sid and st[0] not in ("Z", "X") and (since_ticks is None or int(st[19]) >= since_ticks):
            out.append(int(p.name))
    return out


def _signal_session(sid: int, sig: int, since_ticks: int | None) -> None:
    try:
        os.killpg(sid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in session_members(sid, since_ticks):  # members that moved to a process group of their own
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_session(sid: int, grace: float, since_ticks: int | None = None, leader: subprocess.Popen | None = None) -> bool:
    """SIGTERM to the session, SIGKILL after `grace` seconds; True once nothing of it is left."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        _signal_session(sid, sig, since_ticks)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if leader is not None:
                leader.poll()  # reap it, or it stays a zombie
            if not session_members(sid, since_ticks):
                return True
            time.sleep(0.02)
    return not session_members(sid, since_ticks)


# ----- the server handle
class Server:
    """A started server; a context manager that stops it. `url`, `pid`, `log_path`, `client()`."""

    started = True  # by this process (a room's server, room.RoomServer, is not: its stop() leaves it running)

    def __init__(self, argv: list[str], url: str, process: subprocess.Popen, log_path: Path, pid_file: Path,
                 api_key: str | None, grace: float):
        self.argv, self.url, self.process, self.log_path = argv, url, process, log_path
        self.pid, self.pid_file, self.api_key, self.grace = process.pid, pid_file, api_key, grace
        self.ticks = start_ticks(self.pid)
        self.stopped = False

    def __repr__(self) -> str:
        state = "stopped" if self.stopped else ("running" if self.alive() else f"exited {self.process.returncode}")
        return f"Server({self.url}, pid {self.pid}, {state}, log {self.log_path})"

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def alive(self) -> bool:
        return self.process.poll() is None

    def client(self, timeout: float = 600.0) -> Client:
        return Client(self.url, api_key=self.api_key, timeout=timeout)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace: float | None = None) -> None:
        """SIGTERM to the server's session, SIGKILL after the grace period; safe to call twice."""
        if self.stopped:
            return
        clean = kill_session(self.pid, self.grace if grace is None else grace, self.ticks, self.process)
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        if clean:
            self.stopped = True
            self.pid_file.unlink(missing_ok=True)
            _LIVE.pop(self.pid, None)

    def probe(self, timeout: float = 5.0) -> bool:
        """One look at /health_generate (with the API key): True once the server can generate."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            return requests.get(self.url + HEALTH_PATH, headers=headers, timeout=timeout).status_code == 200
        except requests.RequestException:
            return False  # the port is not open yet

    def wait_healthy(self, timeout: float, progress: bool = True) -> None:
        """Poll /health_generate until 200; raise ServerError if the server exits or time runs out."""
        wait_all_healthy([self], timeout, progress)


def wait_all_healthy(servers: list[Server], timeout: float, progress: bool = False,
                     on_ready: Callable[[Server, float], None] | None = None,
                     on_wait: Callable[[list[Server], float], None] | None = None, every: float = 10.0) -> None:
    """Wait for servers started together until each answers /health_generate; raise ServerError (its `server`: the
    one that failed) as soon as any of them exits or the time runs out, whichever server it is (not once those
    before it are up). on_ready(server, seconds) as each answers; on_wait(those still waiting, seconds) every
    `every` seconds while any is (a room's report)."""
    t0 = last = time.monotonic()
    waiting = list(servers)
    desc = f"starting {servers[0].url}" if len(servers) == 1 else f"starting {len(servers)} servers"
    # mininterval: an SGLang start takes a minute or two; a notebook's captured output keeps every redraw
    with tqdm(total=round(timeout), unit="s", desc=desc, disable=not progress, leave=False,
              mininterval=5, bar_format="{desc}: {n:.0f}/{total:.0f} s") as bar:
        while waiting:
            for server in servers:  # one that answered and then died fails the start as well
                if server.process.poll() is not None:
                    when = "before it was healthy" if server in waiting else "while the others were starting"
                    raise ServerError(f"server exited with status {server.process.returncode} {when}",
                                      server.log_path, server.log_tail(), server)
            for server in list(waiting):
                elapsed = time.monotonic() - t0
                if elapsed > timeout:
                    raise ServerError(f"server not healthy after {timeout:.0f} s", server.log_path, server.log_tail(),
                                      server)
                if server.probe(min(10.0, timeout - elapsed + 0.1)):
                    waiting.remove(server)
                    if on_ready:
                        on_ready(server, time.monotonic() - t0)
            if waiting:
                now = time.monotonic()
                bar.update(min(timeout, now - t0) - bar.n)
                if on_wait and now - last >= every:
                    on_wait(waiting, now - t0)
                    last = now
                # A specdec serve is up in seconds, SGLang in a minute or two; a refused probe costs ~2 ms of CPU
                elapsed = now - t0
                time.sleep(0.05 if elapsed < 2 else 0.1 if elapsed < 30 else 0.5)


_LIVE: dict[int, Server] = {}


def _stop_all() -> None:
    for server in list(_LIVE.values()):
        server.stop(grace=5.0)


atexit.register(_stop_all)


def start(spec: LaunchConfig | ServerCommand, *, env: dict[str, str] | None = None,
          log_path: str | Path | None = None, grace: float = 15.0, version: str | None = None) -> Server:
    """Start a server without waiting for it (its session, log file and pid file); then `wait_healthy` or `probe`.

    `env` is added to the server's environment (e.g. SGLANG_SIMULATE_ACC_LEN, CUDA_VISIBLE_DEVICES), after a
    LaunchConfig's own (LaunchConfig.environment: SGLang's step times).
    `version` picks the SGLang command-line spelling (default: the installed SGLang).
    """
    reap_stale()
    if spec.port and port_taken(spec.host, spec.port):
        # else the health check would find the other server's answer and report it as ours
        raise ServerError(f"port {spec.port} on {spec.host} is already taken (another server?): choose another "
                          "port, or leave it unset for a free one")
    port = spec.port or free_port(spec.host)
    own_env = {}
    if isinstance(spec, LaunchConfig):
        argv, own_env = spec.replace(port=port).command(version), spec.environment()
    else:
        argv = [a.format(host=spec.host, port=port) for a in spec.argv]
    url_host = "127.0.0.1" if spec.host in ("0.0.0.0", "::", "") else spec.host
    url = f"http://{url_host}:{port}"
    folder = run_dir()
    log_path = Path(log_path) if log_path else folder / f"server-{port}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    _guard_api_signals()
    with open(log_path, "w") as log:
        log.write(f"# {' '.join(argv)}\n")
        log.flush()
        try:
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True, env={**os.environ, **own_env, **(env or {})})
        except OSError as exc:
            raise ServerError(f"cannot start {argv[0]}: {exc}") from None
    try:
        pid_file = folder / f"{process.pid}.json"
        server = Server(argv, url, process, log_path, pid_file, spec.api_key, grace)
        _LIVE[process.pid] = server
        pid_file.write_text(json.dumps({"pid": process.pid, "ticks": server.ticks, "owner": os.getpid(),
                                        "owner_ticks": start_ticks(os.getpid()), "argv": argv, "url": url,
                                        "log": str(log_path)}))
    except BaseException:  # a stop signal (or a full disk) between the start and the bookkeeping
        kill_session(process.pid, 5.0, None, process)
        _LIVE.pop(process.pid, None)
        (folder / f"{process.pid}.json").unlink(missing_ok=True)
        raise
    return server


def launch(spec: LaunchConfig | ServerCommand, *, timeout: float = 600.0, env: dict[str, str] | None = None,
           log_path: str | Path | None = None, grace: float = 15.0, progress: bool = True,
           version: str | None = None) -> Server:
    """Start a server and wait until it can generate; use as `with launch(cfg) as server:` or stop() it.

    The arguments are start()'s, and `timeout` seconds for /health_generate to answer 200.
    """
    server = start(spec, env=env, log_path=log_path, grace=grace, version=version)
    try:
        server.wait_healthy(timeout, progress)
    except BaseException:  # a timeout, a crash, Ctrl-C: the server must not outlive the attempt
        server.stop(grace=min(grace, 5.0))
        raise
    return server


def reap_stale(folder: Path | None = None, grace: float = 5.0) -> list[int]:
    """Stop servers whose launching Python died without stopping them; returns their pids.

    A server is only killed while its pid still belongs to the process we started (same start
    time); a server whose launcher still runs (another notebook) is left alone.
    """
    reaped = []
    for f in sorted((folder or run_dir()).glob("*.json")):
        try:
            rec = json.loads(f.read_text())
            pid, ticks, owner, owner_ticks = int(rec["pid"]), rec.get("ticks"), int(rec["owner"]), rec.get("owner_ticks")
        except (ValueError, KeyError, TypeError, OSError):
            f.unlink(missing_ok=True)
            continue
        if owner == os.getpid() or (pid_alive(owner) and start_ticks(owner) == owner_ticks):
            continue
        if ticks is None:  # no /proc: the pid must still lead its own group, as our servers do
            ours = pid_alive(pid) and _same_group(pid)
        else:  # the leader is gone or still the process we started; its session's processes are younger
            ours = start_ticks(pid) in (None, ticks) and bool(session_members(pid, ticks))
        if ours:
            kill_session(pid, grace, ticks)
            reaped.append(pid)
        f.unlink(missing_ok=True)
    return reaped


def _same_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid  # our servers lead their own group
    except (ProcessLookupError, PermissionError):
        return False


__all__ = ["HEALTH_PATH", "RUN_DIR_ENV", "STOP_SIGNALS", "Server", "ServerCommand", "ServerError", "StopSignal",
           "brief", "kill_session", "launch", "pid_alive", "reap_stale", "run_dir", "session_members", "start",
           "start_ticks", "stop_on_signals"]
