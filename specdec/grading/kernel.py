"""The student's kernel: runs a notebook's cells, and calls its functions when the grader asks.

Started by session.py as `python -P -m specdec.grading.kernel REQUEST_FD REPLY_FD MEMORY_BYTES`, a
child of the grading process in a session of its own. It holds no exercise, no reference, no
expected value and no score: it answers requests (run this cell; call this function on these
arguments) with data, through two pipes that are not its stdout. Whatever the student's code
does to this process can change only what it answers.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from specdec.grading import limits
from specdec.grading.calls import call_student, describe
from specdec.grading.codec import Decoder, Encoder, read_message, write_message
from specdec.grading.limits import ProcessExitBlocked, TimeLimitExceeded, time_limit
from specdec.grading.registry import set_autograding

CELL_FILE_PREFIX = "<ipython-input-"  # how IPython names the code of a cell in tracebacks
GO_ON = "ignored: the following cells still ran"


def cell_line(exc: BaseException) -> int | None:
    """The line of the cell where the exception came from, when the traceback shows it."""
    if isinstance(exc, SyntaxError) and str(exc.filename or "").startswith(CELL_FILE_PREFIX):
        return exc.lineno
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(CELL_FILE_PREFIX):
            return tb.tb_lineno
        tb = tb.tb_next
    return None


def make_shell() -> Any:
    """An IPython shell (magics, display()) that ignores exit() instead of failing on it."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    class GradingShell(InteractiveShell):
        exit_requested = False

        def ask_exit(self) -> None:  # what exit() and quit() call
            self.exit_requested = True

        def enable_gui(self, gui: str | None = None) -> None:  # %matplotlib inline: no event loop
            pass

    cfg = Config()
    cfg.HistoryManager.enabled = False  # no sqlite file in $HOME, no contention between kernels
    cfg.InteractiveShell.colors = "nocolor"
    return GradingShell.instance(config=cfg)


def restore_stdio() -> None:
    """Undo a student's redirection (or closing) of sys.stdout and sys.stderr."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, f"__{name}__")
        if stream is None or stream.closed:
            try:
                stream = open(fd, "w", encoding="utf-8", errors="replace", closefd=False)
            except OSError:
                stream = open(os.devnull, "w")
            setattr(sys, f"__{name}__", stream)
        setattr(sys, name, stream)


def out_of_memory(exc: BaseException) -> bool:
    """MemoryError, or torch's allocator failing at the kernel's memory limit."""
    return isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc))


def run_cell(shell: Any, source: str, seconds: float, wall: float | None = None) -> dict[str, Any] | None:
    """Run one cell under a time limit (CPU, and `wall` on the wall clock); its problem {kind, message} or None."""
    shell.exit_requested = False
    restore_stdio()
    error: BaseException | None = None
    try:
        with time_limit(seconds, wall):
            result = shell.run_cell(source, store_history=True)
        error = result.error_before_exec or result.error_in_exec
    except BaseException as exc:  # the alarm, or the student's code broke IPython itself
        error = exc
    finally:
        limits.disarm()
    if isinstance(error, TimeLimitExceeded):
        line = cell_line(error)
        where = f" at line {line}" if line else ""
        if error.clock == "CPU":
            return {"kind": "timeout", "message": f"timed out after {seconds:g}s of CPU time{where} (an infinite loop?): "
                    "stopped there"}
        return {"kind": "timeout", "message": f"was still running after {error.seconds:g}s on the wall clock{where}, having "
                f"used less than its {seconds:g}s of CPU time (waiting for something?): stopped there"}
    if isinstance(error, ProcessExitBlocked):
        return {"kind": "exit", "message": f"called os._exit(), {GO_ON}"}
    if isinstance(error, SystemExit):
        return {"kind": "exit", "message": f"called sys.exit() or raised SystemExit, {GO_ON}"}
    if error is not None:
        line = cell_line(error)
        kind = "memory" if out_of_memory(error) else "error"
        return {"kind": kind, "message": (f"line {line}: " if line else "") + describe(error)}
    if shell.exit_requested:
        return {"kind": "exit", "message": f"called exit(), {GO_ON}"}
    return None


def call(shell: Any, msg: dict[str, Any], buffers: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
    """Call the student's function on each case of the request, under the request's time limit."""
    decode = Decoder(buffers, models=True).decode  # the grader's arguments: a Model is built here
    cases = [decode(tree) for tree in msg["cases"]]
    echo = tuple(i for i in msg.get("echo", []) if type(i) is int)
    enc = Encoder()
    restore_stdio()
    try:
        with time_limit(msg["timeout"], msg.get("wall")):
            reply, trees = call_student(shell.user_ns, msg["name"], cases, msg["stand_ins"], enc, msg.get("watch", []),
                                        echo)
    finally:
        limits.disarm()
    outcomes = []
    for out, tree in zip(reply.outcomes, trees):
        if out.raised is not None:
            outcomes.append({"raised": [out.raised_type, out.raised]})
        elif out.not_data is not None:
            outcomes.append({"not_data": out.not_data})
        else:
            outcomes.append({"value": tree})
    return {"outcomes": outcomes, "bound": reply.bound, "missing": reply.missing, "not_callable": reply.not_callable,
            "stopped": reply.stopped, "reference_called": reply.reference_called}, enc.buffers


def serve(shell: Any, requests: int, replies: int) -> None:
    """Answer requests until the grader closes the channel."""
    while True:
        try:
            msg, buffers = read_message(requests)
        except EOFError:
            return
        try:
            if msg["op"] == "run_cell":
                header, out = {"problem": run_cell(shell, msg["source"], msg["timeout"], msg.get("wall"))}, []
            else:
                header, out = call(shell, msg, buffers)
        except BaseException as exc:  # a late alarm, or the student's code broke the kernel's own code
            header, out = {"failed": describe(exc)}, []
        write_message(replies, {"id": msg["id"], **header}, out)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    requests, replies, memory = int(args[0]), int(args[1]), int(args[2])
    sys.argv = [""]  # what the student's code sees: no file names of the grader's
    limits.limit_memory(memory)
    limits.guard_exits()
    set_autograding(True)
    shell = make_shell()
    sys.path.insert(0, os.getcwd())  # as in Jupyter: the notebook imports modules beside it
    write_message(replies, {"id": 0, "ready": True})
    serve(shell, requests, replies)
    limits.real_exit(0)  # skip the student's atexit handlers and lingering threads


if __name__ == "__main__":
    main()
