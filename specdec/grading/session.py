"""The grading process's side of one kernel: start it, ask it things by a deadline, kill it.

A kernel runs in a session of its own: killing its process group takes the student's child
processes with it. Requests and replies go through two pipes (codec.py), never through the
kernel's stdout, whose last bytes are kept only to show what a dying kernel printed.
"""

from __future__ import annotations

import os
import pwd
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from specdec.grading.calls import CallFailed, Outcome, Reply, clip
from specdec.grading.codec import BadMessage, Decoder, Encoder, TimedReader, pack

KERNEL_MODULE = "specdec.grading.kernel"
OUTPUT_TAIL_BYTES = 8192  # what is kept of a kernel's stdout+stderr (the student may print GBs)
START_S = 120.0  # a kernel must be ready this soon (it imports IPython)
GRACE_S = 2.0  # past a time limit the kernel gets this long to stop by itself, then it is killed
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc's unit of CPU time

_running: set[int] = set()  # process groups of the kernels running now (several with --jobs)
_running_lock = threading.Lock()
_stopping = threading.Event()  # Ctrl-C: no kernel may start any more


class KernelGone(Exception):
    """The kernel died, or was killed because it hung or broke the protocol; the message says how."""


class OutOfTime(Exception):
    """The notebook's total time limit passed (its kernel is killed)."""


@dataclass
class Budget:
    """A notebook's time in all: seconds of CPU time run by its kernels' main threads (a fresh kernel
    after a crash spends from the same budget), and a wall-clock backstop `wall_factor` times longer."""

    cpu_s: float
    wall_factor: float = 1.0
    start: float = field(default_factory=time.monotonic)
    used_s: float = 0.0

    @property
    def wall_deadline(self) -> float:
        return self.start + self.cpu_s * self.wall_factor

    def left(self) -> float:
        return self.cpu_s - self.used_s


def main_thread_cpu(pid: int) -> float | None:
    """The CPU seconds a process's main thread has run, read by the grader (Linux's /proc): what the
    kernel says about itself is not trusted. None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/task/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
    except (OSError, IndexError, ValueError):
        return None


class OutputTail(threading.Thread):
    """Drain a pipe, keeping only its last bytes, so that the kernel never blocks on a full pipe."""

    def __init__(self, stream: IO[bytes], keep: int = OUTPUT_TAIL_BYTES):
        super().__init__(daemon=True)
        self.fd = stream.fileno()
        self.keep = keep
        self.tail = b""

    def run(self) -> None:
        try:
            while chunk := os.read(self.fd, 1 << 16):
                self.tail = (self.tail + chunk)[-self.keep :]
        except OSError:
            pass

    def text(self) -> str:
        return self.tail.decode("utf-8", errors="replace")


# What of the grader's environment the kernel gets: what Python, the course's code (its model zoo, its
# servers), numpy/torch and a GPU need; nothing else, so that no credential of the grader's reaches it.
KERNEL_ENV = {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR", "PYTHONPATH",
              "LD_LIBRARY_PATH"}
KERNEL_ENV_PREFIXES = ("LC_", "SPECDEC_", "HF_", "TRANSFORMERS_", "TORCH", "CUDA_", "NVIDIA_", "SGLANG_", "OMP_",
                       "MKL_", "OPENBLAS_", "XDG_")
SECRET_WORDS = ("SECRET", "TOKEN", "KEY", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")


def kept_for_kernel(name: str) -> bool:
    if any(word in name.upper() for word in SECRET_WORDS):
        return False
    return name in KERNEL_ENV or name.startswith(KERNEL_ENV_PREFIXES)


def kernel_env(home: str, user: str | None = None) -> dict[str, str]:
    """A minimal environment (no secret of the grader's), this copy of specdec first, a non-GUI matplotlib,
    IPython's files in a temporary folder; under another user, that folder is its home too."""
    env = {k: v for k, v in os.environ.items() if kept_for_kernel(k)}
    if user:
        env.update(HOME=home, USER=user, LOGNAME=user)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env["MPLBACKEND"] = "Agg"
    env["IPYTHONDIR"] = os.path.join(home, "ipython")
    env["PYTHONIOENCODING"] = "utf-8"  # a student's print of non-ASCII must not fail under LANG=C
    return env


def as_user(user: str, home: str) -> dict[str, Any]:
    """Popen's arguments that start the kernel as `user` (the grader must be root), and its home handed over."""
    if os.geteuid() != 0:
        raise OSError(f"--kernel-user {user} needs the grader to run as root")
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise OSError(f"--kernel-user {user}: no such user") from None
    if entry.pw_uid == 0:
        raise OSError(f"--kernel-user {user} is root: choose a user of its own, which cannot write the results")
    os.chown(home, entry.pw_uid, entry.pw_gid)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def end_strays() -> None:
    """When the grader is PID 1 (a container or PID namespace of its own), kill every other process in it, then
    reap them: run before the results are written, so that no process of a notebook's that left its kernel's
    process group (setsid, a double fork) can rewrite them. Elsewhere it does nothing (kill(-1) would reach
    every process of the user)."""
    if os.getpid() != 1:
        return
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        return
    end = time.monotonic() + 5.0
    while time.monotonic() < end:  # the killed are our children now (orphans go to PID 1): reap them
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not pid:
            time.sleep(0.01)


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def stop_all() -> None:
    """Kill every running kernel and start no more: Ctrl-C reaches only the main thread."""
    _stopping.set()
    with _running_lock:
        groups = list(_running)
    for pgid in groups:
        kill_group(pgid)


def exit_description(returncode: int) -> str:
    """How a process ended, in words: `was killed by SIGKILL (...)`, `exited with status 3`."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        return f"was killed by signal {-returncode}"
    why = {"SIGKILL": " (sent by the code itself, or by the system when memory ran out)",
           "SIGSEGV": " (a segmentation fault: memory accessed through ctypes or a C extension)",
           "SIGABRT": " (aborted by a C library)"}.get(name, "")
    return f"was killed by {name}{why}"


class Kernel:
    """One kernel process and its channel."""

    def __init__(self, cwd: str, home: str, memory_bytes: int, budget: Budget, user: str | None = None):
        if _stopping.is_set():
            raise KernelGone("was not started: grading was interrupted")
        switch = as_user(user, home) if user else {}  # another user cannot signal, trace or outwrite the grader
        self.budget = budget  # the notebook's total time limit
        self.deadline = budget.wall_deadline
        self.charged = 0.0  # of this kernel's CPU time, what the budget already counts
        self.bound_by_budget = False  # the last request's limit was what the budget had left
        self.alive = True
        self.next_id = 0
        req_r, self.requests = os.pipe()
        rep_r, rep_w = os.pipe()
        try:
            # -P: the notebook's folder goes on sys.path only after the kernel imported specdec
            self.proc = subprocess.Popen(
                [sys.executable, "-P", "-m", KERNEL_MODULE, str(req_r), str(rep_w), str(memory_bytes)],
                cwd=cwd, env=kernel_env(home, user), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True, pass_fds=(req_r, rep_w), **switch)
        finally:
            os.close(req_r)
            os.close(rep_w)
        with _running_lock:
            _running.add(self.proc.pid)
        if _stopping.is_set():  # stop_all() ran while it started
            kill_group(self.proc.pid)
        os.set_blocking(self.requests, False)
        self.replies = TimedReader(rep_r)
        self.fds_open = (self.requests, rep_r)  # the grader's ends of the channel, closed by kill()
        self.output = OutputTail(self.proc.stdout)  # type: ignore[arg-type]
        self.output.start()
        self.started = time.monotonic()

    def ready(self) -> Kernel:
        """Wait for the kernel to be ready (it imports IPython meanwhile; the grader may work)."""
        self.receive(min(self.deadline, self.started + START_S))
        self.charge(self.started)
        return self

    def charge(self, since: float) -> None:
        """Count the kernel's CPU time since the last charge against the notebook's budget (where it
        cannot be read, the time on the wall clock since `since`)."""
        cpu = main_thread_cpu(self.proc.pid) if self.proc.returncode is None else None
        if cpu is None:
            cpu = self.charged + max(0.0, time.monotonic() - since)
        self.budget.used_s += max(0.0, cpu - self.charged)
        self.charged = max(self.charged, cpu)

    def exited(self, wait: float) -> bool:
        """Has the kernel process ended (waiting up to `wait` s)? Does not reap it: its pid, which
        names its process group, stays reserved until kill() has killed the group."""
        end = time.monotonic() + wait
        while True:
            if self.proc.returncode is not None:  # reaped already
                return True
            if os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
            if time.monotonic() >= end:
                return False
            time.sleep(0.01)

    def kill(self) -> None:
        """Kill the kernel's process group, the student's processes in it included, and reap it."""
        if self.proc.returncode is None:
            kill_group(self.proc.pid)
            self.exited(wait=1.0)  # its CPU time, final, before reaping it
            self.charge(time.monotonic())
            self.proc.wait()
        self.alive = False
        with _running_lock:
            _running.discard(self.proc.pid)
        # once only: kill() runs again when a run that timed out is closed, and by then another grading thread may
        # hold a new file under the same descriptor number (closing it broke that thread's cleanup)
        fds, self.fds_open = self.fds_open, ()
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.output.join(timeout=2.0)
        if not self.output.is_alive():  # else a grandchild that left the group holds the pipe: leave it
            self.proc.stdout.close()  # type: ignore[union-attr]

    def gone(self, why: str | None = None) -> KernelGone:
        """Kill what is left and say how the kernel ended (with its last output if it died by itself)."""
        if not self.exited(wait=0.0 if why else 1.0):  # it closed the channel: a moment to finish dying
            why = why or "closed its channel to the grader: it was killed"
        self.kill()
        if why:
            return KernelGone(why)
        tail = self.output.text().strip()
        return KernelGone(exit_description(self.proc.returncode) + (f"; its last output:\n{tail[-600:]}" if tail else ""))

    def overdue(self, deadline: float, seconds: float) -> Exception:
        """Kill a kernel that missed its deadline; say which limit it missed."""
        self.kill()
        if deadline >= self.deadline:
            return OutOfTime()
        if not seconds:
            return KernelGone(f"was not ready after {START_S:g}s")
        wall = seconds * self.budget.wall_factor
        limit = f"{seconds:g}s of CPU time" + (f", {wall:g}s on the wall clock" if wall != seconds else "")
        return KernelGone(f"did not stop at the time limit of {limit} (does the code catch the interrupt?): "
                          "it was killed")

    def receive(self, deadline: float, seconds: float = 0.0) -> tuple[dict[str, Any], list[bytes]]:
        """The reply to the last request; replies to earlier ones (a forked copy of the kernel's) are skipped."""
        while True:
            try:
                msg, buffers = self.replies.read(deadline)
            except TimeoutError:
                raise self.overdue(deadline, seconds) from None
            except EOFError:
                raise self.gone() from None
            except BadMessage as exc:
                raise self.gone(f"sent the grader a malformed message ({exc}): it was killed") from None
            if msg.get("id") == self.next_id:
                return msg, buffers
            if not (type(msg.get("id")) is int and msg["id"] < self.next_id):
                raise self.gone("answered out of turn: it was killed")

    def request(self, header: dict[str, Any], buffers: list[bytes], seconds: float) -> tuple[dict[str, Any], list[bytes]]:
        """Send one request, to stop after `seconds` of CPU time or `seconds` x the wall factor on the wall
        clock (less if the notebook's budget has less left); the reply is due by then plus a grace."""
        budget_left = self.budget.left()
        if budget_left <= 0:
            self.kill()
            raise OutOfTime()
        limit = min(seconds, budget_left)
        self.bound_by_budget = limit < seconds
        wall = limit * self.budget.wall_factor
        self.next_id += 1
        sent = time.monotonic()
        deadline = min(self.deadline, sent + wall + GRACE_S)
        data = memoryview(pack({"id": self.next_id, **header, "timeout": limit, "wall": wall}, buffers))
        while data:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [self.requests], [], left)[1]:
                raise self.overdue(deadline, seconds)  # it stopped reading requests
            try:
                data = data[os.write(self.requests, data):]
            except BlockingIOError:
                continue
            except BrokenPipeError:
                raise self.gone() from None
        reply = self.receive(deadline, seconds)
        self.charge(sent)
        return reply

    def spent(self, timed_out: bool) -> None:
        """OutOfTime when the notebook's budget is spent: the last request stopped at the budget's end."""
        if self.budget.left() <= 0 or (timed_out and self.bound_by_budget):
            self.kill()
            raise OutOfTime()

    def run_cell(self, source: str, seconds: float) -> dict[str, Any] | None:
        """Run a cell: None, or its problem {kind, message}; KernelGone if it killed the kernel."""
        msg, _ = self.request({"op": "run_cell", "source": source}, [], seconds)
        problem = msg.get("problem")
        self.spent(isinstance(problem, dict) and problem.get("kind") == "timeout")
        if "failed" in msg:
            return {"kind": "error", "message": f"the kernel failed: {clip(str(msg['failed']))}"}
        if problem is not None and not (isinstance(problem, dict) and isinstance(problem.get("message"), str)):
            raise self.gone("sent the grader a malformed reply: it was killed")
        return problem and {"kind": str(problem.get("kind")), "message": clip(problem["message"])}


class KernelCaller:
    """Calls the student's functions in a kernel (exercise.Caller): arguments out, data back."""

    def __init__(self, kernel: Kernel, seconds: float):
        self.kernel, self.seconds = kernel, seconds

    def call(self, name: str, cases: list[tuple], stand_ins: dict[str, str], watch: list[str] = (),
             echo: tuple[int, ...] = ()) -> Reply:
        enc = Encoder()
        trees = [enc.encode(tuple(args)) for args in cases]
        header = {"op": "call", "name": name, "cases": trees, "stand_ins": stand_ins, "watch": list(watch),
                  "echo": list(echo)}
        try:
            msg, buffers = self.kernel.request(header, enc.buffers, self.seconds)
            self.kernel.spent(isinstance(msg.get("stopped"), str) and msg["stopped"].startswith("timed out"))
        except KernelGone as exc:
            raise CallFailed(f"while this exercise was being checked, the kernel {exc}") from None
        try:
            return reply_of(msg, buffers)
        except (BadMessage, KeyError, TypeError, ValueError) as exc:
            raise CallFailed(f"the kernel sent an answer the grader cannot read ({clip(str(exc), 200)})") from None


def reply_of(msg: dict[str, Any], buffers: list[bytes]) -> Reply:
    """A kernel's reply to a call, every field checked: it comes from the student's process."""
    if "failed" in msg:
        raise CallFailed(f"the kernel failed while checking: {clip(str(msg['failed']))}")
    decode = Decoder(buffers).decode

    def text(x: Any) -> str | None:
        return x if isinstance(x, str) else None

    outcomes = []
    for item in msg["outcomes"]:
        if not (isinstance(item, dict) and len(item) == 1):
            raise BadMessage("a malformed outcome")
        (kind, body), = item.items()
        if kind == "value":
            outcomes.append(Outcome(value=decode(body)))
        elif kind == "raised" and isinstance(body, list) and len(body) == 2 and all(map(text, body)):
            outcomes.append(Outcome(raised=clip(body[1]), raised_type=body[0]))
        elif kind == "not_data" and text(body):
            outcomes.append(Outcome(not_data=clip(body, 200)))
        else:
            raise BadMessage("a malformed outcome")
    bound = [b for b in msg["bound"] if text(b)]
    return Reply(outcomes=outcomes, bound=bound, missing=msg["missing"] is True,
                 not_callable=text(msg["not_callable"]), stopped=text(msg["stopped"]),
                 reference_called=msg.get("reference_called") is True)  # only ever lowers a score
