"""Guards for running a student's code in its kernel: a time limit, exits that return, a memory cap.

Unix only (SIGALRM, rlimits); the kernel runs the student's code in its main thread.
"""

from __future__ import annotations

import os
import resource
import signal
from collections.abc import Iterator
from contextlib import contextmanager

# After the first alarm, raise again this often: a student's `except:` may swallow one raise.
REPEAT_S = 1.0

_REAL_EXIT = os._exit  # taken at import, before any student code runs
_armed = False  # the alarm raises only inside a time_limit block
_limit = 0.0


class TimeLimitExceeded(BaseException):
    """A cell or a check ran past its limit (a BaseException: `except Exception` cannot hide it)."""

    def __init__(self, seconds: float):
        super().__init__(f"ran longer than {seconds:g}s")
        self.seconds = seconds


class ProcessExitBlocked(SystemExit):
    """os._exit() was called in the kernel; raised instead so that grading goes on."""


def _on_alarm(signum: int, frame: object) -> None:
    if _armed:
        raise TimeLimitExceeded(_limit)


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise TimeLimitExceeded in the main thread once `seconds` have passed inside the block."""
    global _armed, _limit
    signal.signal(signal.SIGALRM, _on_alarm)  # again each time: the student may have replaced it
    _limit, _armed = seconds, True
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001), REPEAT_S)
    try:
        yield
    finally:
        disarm()


def disarm() -> None:
    """Stop the alarm; callers also call it after catching TimeLimitExceeded (it may land late)."""
    global _armed
    _armed = False  # first: an alarm landing from here on is ignored
    signal.setitimer(signal.ITIMER_REAL, 0)


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
