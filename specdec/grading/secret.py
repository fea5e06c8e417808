"""The grading secret, mixed into the cases' seeds: read once, then kept from the notebook's code.

It comes from the file named by SPECDEC_GRADING_SECRET_FILE (best: a pipe such as /dev/stdin, which
is empty once read) or from SPECDEC_GRADING_SECRET. The kernel's environment never holds it
(session.kernel_env), and once read it is removed from this process's environment and wiped from
the block that /proc/<grader pid>/environ shows, which a kernel of the same user can read.
What stays out of reach of this module: a copy of that block elsewhere (a shell's, a parent's), a
secret file the kernel's user can read, and the grader's memory to a process that may trace it.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

SECRET_ENV = "SPECDEC_GRADING_SECRET"
SECRET_FILE_ENV = "SPECDEC_GRADING_SECRET_FILE"

_lock = threading.Lock()
_secret: str | None = None


class SecretError(Exception):
    """The secret file named could not be read: grading without it would make the cases public."""


def grading_secret() -> str:
    """The secret ("" when none is set): the same for every notebook of a run."""
    global _secret
    with _lock:
        if _secret is None:
            _secret = read_secret()
        return _secret


def read_secret() -> str:
    path = os.environ.get(SECRET_FILE_ENV, "")
    secret = os.environ.get(SECRET_ENV, "")
    forget(SECRET_ENV)
    if path:
        try:
            secret = Path(path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise SecretError(f"{SECRET_FILE_ENV}={path}: the secret could not be read ({exc})") from None
    return secret


def forget(name: str) -> None:
    """Remove `name` from the environment, its value wiped where /proc/self/environ reads it."""
    if name in os.environ:
        wipe(name)
        del os.environ[name]


def wipe(name: str) -> None:
    """Overwrite the value of `name` in the C environment's strings (the initial block among them)."""
    try:
        libc = ctypes.CDLL(None)
        environ = ctypes.POINTER(ctypes.c_void_p).in_dll(libc, "environ")
    except (OSError, ValueError, AttributeError):  # not glibc-like: the value stays in /proc/self/environ
        return
    prefix = name.encode() + b"="
    i = 0
    while environ[i]:
        entry = ctypes.string_at(environ[i])
        if entry.startswith(prefix):
            ctypes.memset(environ[i] + len(prefix), ord("*"), len(entry) - len(prefix))
        i += 1
