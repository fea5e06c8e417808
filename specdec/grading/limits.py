"""Guards for running a student's code in its kernel: time limits, exits that return, a memory cap.

Time limits count the main thread's CPU time, so that a loaded machine (other kernels, other work)
does not cost an honest notebook its points; a wall-clock limit, several times longer, stops code
that waits instead of computing.

Unix only (SIGALRM, rlimits); the kernel runs the student's code in its main thread.
"""

from __future__ import annotations

import os
import resource
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# After the first alarm, raise again this often: a student's `except:` may swallow one raise.
REPEAT_S = 1.0
# How often, in the process's CPU time, SIGPROF looks at the main thread's clock.
TICK_S = 0.05

_REAL_EXIT = os._exit  # taken at import, before any student code runs
_armed = False  # the alarms raise only inside a time_limit block
_limit = 0.0  # seconds of the main thread's CPU time
_wall = 0.0  # seconds on the wall clock: the backstop for code that waits instead of computing
_cpu_deadline = 0.0
_clock: Callable[[], float] = time.process_time


class TimeLimitExceeded(BaseException):
    """A cell or a check ran past its limit (a BaseException: `except Exception` cannot hide it)."""

    def __init__(self, seconds: float, clock: str = "CPU"):
        what = f"{seconds:g}s of CPU time" if clock == "CPU" else f"{seconds:g}s on the wall clock"
        super().__init__(f"ran longer than {what}")
        self.seconds, self.clock = seconds, clock


class ProcessExitBlocked(SystemExit):
    """os._exit() was called in the kernel; raised instead so that grading goes on."""


def main_thread_clock() -> Callable[[], float]:
    """The CPU time of the calling (main) thread: what the student's code computed, whatever else ran on
    the machine meanwhile. Work in other threads (torch's) and waiting do not count; the wall backstop
    covers those. The whole process's CPU time where a thread's clock cannot be read (not Linux)."""
    try:
        clock_id = time.pthread_getcpuclockid(threading.get_ident())
        time.clock_gettime(clock_id)
    except (AttributeError, OSError):
        return time.process_time
    return lambda: time.clock_gettime(clock_id)


def _on_prof(signum: int, frame: object) -> None:
    global _cpu_deadline
    if _armed and _clock() >= _cpu_deadline:
        _cpu_deadline = _clock() + REPEAT_S
        raise TimeLimitExceeded(_limit, "CPU")


def _on_alarm(signum: int, frame: object) -> None:
    if _armed:
        raise TimeLimitExceeded(_wall, "wall")


@contextmanager
def time_limit(seconds: float, wall: float | None = None) -> Iterator[None]:
    """Raise TimeLimitExceeded in the main thread once it has run `seconds` of CPU time inside the block,
    or once `wall` seconds (default: `seconds`) have passed on the wall clock, whichever comes first."""
    global _armed, _limit, _wall, _cpu_deadline, _clock
    wall = seconds if wall is None else wall
    # the handlers again each time: the student may have replaced them
    signal.signal(signal.SIGPROF, _on_prof)
    signal.signal(signal.SIGALRM, _on_alarm)
    _clock = main_thread_clock()
    _limit, _wall, _cpu_deadline = seconds, wall, _clock() + seconds
    _armed = True
    signal.setitimer(signal.ITIMER_PROF, TICK_S, TICK_S)
    signal.setitimer(signal.ITIMER_REAL, max(wall, 0.001), REPEAT_S)
    try:
        yield
    finally:
        disarm()


def disarm() -> None:
    """Stop the alarms; callers also call it after catching TimeLimitExceeded (it may land late)."""
    global _armed
    _armed = False  # first: an alarm landing from here on is ignored
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.setitimer(signal.ITIMER_PROF, 0)


def guard_exits() -> None:
    """Make os._exit raise ProcessExitBlocked in this process (forked children still exit)."""
    owner = os.getpid()

    def _exit(status: int = 0) -> None:
        if os.getpid() != owner:  # a fork (multiprocessing) must really exit
            _REAL_EXIT(status)
        raise ProcessExitBlocked(status)

    os._exit = _exit


def real_exit(status: int) -> None:
    """Leave the process now, whatever the student's code patched or registered (atexit)."""
    _REAL_EXIT(status)


def limit_memory(max_bytes: int) -> None:
    """Cap this process's data (heap and anonymous mappings): past it allocations fail with
    MemoryError instead of the machine running out. RLIMIT_DATA, not RLIMIT_AS: address space that
    libraries only reserve (thread stacks aside) does not count. Both limits, so it stays."""
    if max_bytes > 0:
        resource.setrlimit(resource.RLIMIT_DATA, (max_bytes, max_bytes))
