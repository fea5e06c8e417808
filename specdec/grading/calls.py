"""Calling a student's function on a batch of cases, in the process that holds the student's code.

The kernel does this for the grader (on arguments that came as data); check() in a notebook does
it in place. Each result leaves as data (codec.Encoder) or as the exception it raised; earlier
exercises' functions can be replaced by the reference for the duration (`stand_ins`).
"""

from __future__ import annotations

import importlib
import sys
import types
from dataclasses import dataclass, field
from typing import Any

from specdec.grading.codec import Decoder, Encoder, NotData, type_name
from specdec.grading.limits import ProcessExitBlocked, TimeLimitExceeded

MESSAGE_CHARS = 1000  # a student's exception message can be megabytes


@dataclass
class Outcome:
    """One call: its value, or the exception it raised ("ValueError: ..."), or why it is not data."""

    value: Any = None
    raised: str | None = None
    raised_type: str | None = None
    not_data: str | None = None


@dataclass
class Reply:
    """What calling the student's function on every case gave."""

    outcomes: list[Outcome] = field(default_factory=list)
    bound: list[str] = field(default_factory=list)  # stand-ins the function's code refers to
    missing: bool = False  # the name is not defined
    not_callable: str | None = None  # the type of what the name holds instead of a function
    stopped: str | None = None  # why the batch stopped early (a time limit, an exit): a zero
    reference_called: bool = False  # the function ran the course's own answer (`watch`): a zero, never more


class CallFailed(Exception):
    """The student's function could not be checked at all (its kernel died, hung, or spoke nonsense)."""


def clip(text: str, limit: int = MESSAGE_CHARS) -> str:
    """Keep the start and the end of a long text."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]} [... {len(text) - 2 * half} characters cut ...] {text[-half:]}"


def describe(exc: BaseException) -> str:
    """`ValueError: message`, safe against a broken or huge __str__."""
    try:
        # a SyntaxError's str() names IPython's internal file name for the cell
        msg = str(exc.msg) if isinstance(exc, SyntaxError) else str(exc)
    except Exception:
        msg = "<the exception's message could not be printed>"
    name = type(exc).__name__
    return clip(f"{name}: {msg}" if msg else name)


def why_stopped(exc: BaseException) -> str:
    if isinstance(exc, TimeLimitExceeded):
        if exc.clock == "CPU":
            return f"timed out: checking took longer than {exc.seconds:g}s of CPU time (an infinite loop in your code?)"
        return (f"timed out: checking was still going after {exc.seconds:g}s on the wall clock, short of its CPU-time "
                "limit (is your code waiting for something?)")
    if isinstance(exc, ProcessExitBlocked):
        return "your code called os._exit() while being checked"
    if isinstance(exc, SystemExit):
        return "your code called sys.exit() (or raised SystemExit) while being checked"
    return f"your code raised {describe(exc)} while being checked"


def wrapper_note(name: str, how: str) -> str:
    """The feedback of a function that hands the exercise to the course's own answer."""
    return (f"no credit: `{name}` calls the course's own answer to this exercise ({how}); write the computation "
            "yourself (specdec's other functions, and your own earlier answers, are fine to use)")


def names_in(code: types.CodeType) -> set[str]:
    """Global names a function's code (nested functions included) refers to."""
    found = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found |= names_in(const)
    return found


def resolve(path: str) -> Any:
    """"specdec.sim.verify:residual_distribution" (or "module:Class.method") -> that function."""
    module, _, attr = path.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class Watch:
    """Notes whether any of the functions `paths` runs while active (sys.setprofile, this thread).

    How the grader tells a wrapper of the reference from a solution, whatever path reached the
    reference (an alias, importlib, getattr): the same code object runs. It can only lower a score:
    code that turns the profiler off hides only its own wrapper from this check."""

    def __init__(self, paths: list[str]):
        self.codes = set()
        for path in paths:
            try:
                fn = resolve(path)
            except Exception:  # the student broke specdec in their own process
                continue
            code = getattr(getattr(fn, "__func__", fn), "__code__", None)
            if isinstance(code, types.CodeType):
                self.codes.add(code)
        self.called = False

    def profile(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code in self.codes:
            self.called = True

    def __enter__(self) -> Watch:
        self.before = sys.getprofile()
        if self.codes:
            sys.setprofile(self.profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(self.before)


class StandIns:
    """Replace names in a function's globals by reference functions, and put them back."""

    def __init__(self, fn: Any, stand_ins: dict[str, str]):
        self.globals = getattr(fn, "__globals__", None)
        code = getattr(fn, "__code__", None)
        used = names_in(code) if isinstance(code, types.CodeType) else set()
        self.bound = sorted(name for name in stand_ins if name in used)
        self.stand_ins = stand_ins if isinstance(self.globals, dict) else {}
        self.saved: dict[str, Any] = {}

    def __enter__(self) -> StandIns:
        for name, path in self.stand_ins.items():
            try:
                ref = resolve(path)
            except Exception:  # the student broke specdec in their own process: their loss only
                continue
            self.saved[name] = self.globals.get(name, self)  # self marks "was not defined"
            self.globals[name] = ref
        return self

    def __exit__(self, *exc: object) -> None:
        for name, old in self.saved.items():
            if old is self:
                self.globals.pop(name, None)
            else:
                self.globals[name] = old


def call_student(ns: dict[str, Any], name: str, cases: list[tuple], stand_ins: dict[str, str],
                 enc: Encoder, watch: list[str] = (), echo: tuple[int, ...] = ()) -> tuple[Reply, list[Any]]:
    """Call ns[name](*args) for each case; return the reply and each result's encoded tree; note
    whether the functions `watch` (the reference of the exercise) ran during the calls. With `echo`
    (indices of arguments), a result is (value, (args[i] after the call, ...)): what a function that
    works in place (a KV cache's commit) left in its arguments.

    Stops at the first BaseException that is not an Exception (a time limit, an exit): the
    caller's time limit has to reach out of here."""
    if name not in ns:
        return Reply(missing=True), []
    fn = ns[name]
    if not callable(fn):
        return Reply(not_callable=type_name(fn)), []
    trees: list[Any] = []
    reply = Reply()
    watching = Watch(list(watch))
    with StandIns(fn, stand_ins) as bound:
        reply.bound = bound.bound
        for args in cases:
            outcome = Outcome()
            try:
                with watching:
                    result = fn(*args)
                if echo:
                    result = (result, tuple(args[i] for i in echo if 0 <= i < len(args)))
                trees.append(encode_result(enc, result, outcome))
            except Exception as exc:  # the student's code failed on this case
                outcome.raised, outcome.raised_type = describe(exc), type(exc).__name__
                trees.append(None)
            except BaseException as exc:
                reply.stopped = why_stopped(exc)
                break
            reply.outcomes.append(outcome)
    reply.reference_called = watching.called
    return reply, trees


def encode_result(enc: Encoder, result: Any, outcome: Outcome) -> Any:
    try:
        return enc.encode(result)
    except NotData as exc:
        outcome.not_data = str(exc)
    except Exception as exc:  # a tensor subclass whose methods fail, say
        outcome.not_data = f"a {type_name(result)} object ({describe(exc)})"
    return None


class LocalCaller:
    """check() in a notebook: the student's functions are called in this process, on copies of the
    arguments, and their results pass through the codec so that they are judged as the grader does."""

    def __init__(self, ns: dict[str, Any]):
        self.ns = ns

    def call(self, name: str, cases: list[tuple], stand_ins: dict[str, str], watch: list[str] = (),
             echo: tuple[int, ...] = ()) -> Reply:
        """`watch` is left out: check() in a notebook does not look for wrappers of the reference (the grade does)."""
        copies: list[tuple] = []
        for args in cases:
            enc = Encoder()
            tree = enc.encode(tuple(args))
            copies.append(Decoder(enc.buffers, models=True).decode(tree))
        enc = Encoder()
        reply, trees = call_student(self.ns, name, copies, stand_ins, enc, echo=echo)
        decode = Decoder(enc.buffers).decode
        for outcome, tree in zip(reply.outcomes, trees):
            if outcome.raised is None and outcome.not_data is None:
                outcome.value = decode(tree)
        return reply

