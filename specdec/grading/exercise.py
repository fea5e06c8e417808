"""Exercises as data, and the one harness that checks them all.

An exercise is declared once, in specdec/grading/labN.py, and the same declaration serves the
official grade (`specdec grade`: the student's function runs in its kernel, everything else here,
in the grading process) and check("labN.qM") in a notebook (everything in the notebook's process).

How to add an exercise to lab N:

1. In the solution notebook, write the stub between `### BEGIN SOLUTION` / `### END SOLUTION`
   and a cell `check("labN.qM")` after it; name labN.qM in the markdown before it.
2. In specdec/grading/labN.py, declare it and add it to EXERCISES:

       Q4 = Exercise(
           id="lab3.q4", points=1, title="tokens per second from a response",
           reads="tokens_per_s", signature="(response)",  # the student's function, as the stub has it
           parts=(Part(
               cases=response_cases,         # rng -> [Case(args=(...), shown="how feedback names it")]
               reference=reference_tps,      # *args -> the expected value (computed in the grader)
               judge=same_number,            # (case, got, want) -> None | "why wrong" | [per-value]
               what="responses",             # "correct on 9/10 random responses"
           ),),
       )

   `cases` gets a numpy Generator seeded from the exercise id and the notebook's code, so that one
   notebook always gets the same grade. Arguments must be data: None, bools, numbers, strings,
   lists, tuples, dicts (a /generate response record is one), numpy arrays, torch tensors,
   Rng(seed) for a fresh np.random.Generator, Model(config, seed) for a tiny random-weight
   Transformer (built alike in the kernel) and a KVCache. The reference is called after the student's
   answers are in, on the grader's own copies of the arguments. A function that works in place
   (a verify step that commits into its cache) declares Part(echo=(index,)): its judge then gets
   (value, (that argument as the function left it,)).
   A judge returns None when the answer is right, a string saying what is wrong, or a list with
   one entry per value it checks (None or a string each: partial credit). It raises WrongShape
   when the answer has the wrong type or shape: the exercise then scores zero with that message.
   Helpers for judges are in specdec/grading/answers.py. Import at the top of labN.py everything
   the cases, references and judges use, even what specdec imports lazily (scipy): the grading
   process imports it before any notebook runs, and never later, when a notebook's code may have
   written files where Python looks for modules.
3. If the student's function may call an earlier exercise's function, give the earlier one a
   `stand_in` ("module:function" of the reference with the same signature) and the later one
   `uses=(Q1,)`: while the later one is checked, the reference replaces the student's earlier
   function, so that one mistake costs points once; the feedback says so.
4. tests/test_labN_checks.py: the reference answer scores 1, planted mistakes score less.

A part may instead judge all its results at once (`judge_all(cases, outcomes) -> (fraction, message)`,
e.g. a chi-square test over many calls). Anything the student's function raises fails that case;
NotImplementedError (the stub) zeroes the exercise as "not implemented yet".
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from specdec.grading.calls import CallFailed, LocalCaller, Outcome, Reply, clip, describe, wrapper_note
from specdec.grading.codec import Encoder
from specdec.grading.registry import CheckResult


class WrongShape(Exception):
    """The answer is not of the form asked for: the exercise scores zero with this message."""


@dataclass(frozen=True)
class Case:
    """One call of the student's function: its arguments, and how the feedback names the case."""

    args: tuple
    shown: str = ""  # "p=[0.2 0.8] q=[0.5 0.5]"; the feedback reads "{shown}: {what is wrong}"
    tag: str = ""  # a kind of case, for judges that treat some kinds differently
    # earns nothing on its own, can only lose points: any well-formed answer is right here (p == q's residual),
    # or it checks only an edge (None without counters), which a wrong formula handles as well as a right one
    free: bool = False


@dataclass(frozen=True)
class Part:
    """A batch of cases and how to judge the answers to them."""

    cases: Callable[[np.random.Generator], list[Case]]
    judge: Callable[[Case, Any, Any], Any] | None = None  # (case, got, want) -> None | "why" | [None | "why", ...]
    reference: Callable[..., Any] | None = None  # want = reference(*case.args)
    what: str = "cases"  # what the cases are, in the feedback: "random pairs (p, q)"
    judge_all: Callable[[list[Case], list[Outcome]], tuple[float, str]] | None = None
    weight: float = 1.0
    name: str = ""  # prefix of its feedback when the exercise has several parts
    reads: str | None = None  # another of the student's functions than the exercise's
    # indices of arguments the function changes in place (a KVCache): the judge gets (value, (those args after,))
    echo: tuple[int, ...] = ()


class Caller(Protocol):
    def call(self, name: str, cases: list[tuple], stand_ins: dict[str, str], watch: list[str] = (),
             echo: tuple[int, ...] = ()) -> Reply: ...


def path_of(fn: Any) -> str | None:
    """"module:qualname" of a module-level function or method, which the kernel can import; else None."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    return f"{module}:{qualname}" if module and qualname and "<" not in qualname else None


@dataclass(frozen=True, eq=False)
class Exercise:
    """One graded exercise: what it reads from the notebook, its cases, how answers are judged."""

    id: str  # "lab1.q3"
    points: float
    title: str
    reads: str  # the student's function the parts call
    signature: str  # its parameters as the stub writes them: "(p, q)"
    parts: tuple[Part, ...]
    stand_in: str | None = None  # "module:function": the reference that replaces it for later exercises
    uses: tuple[Exercise, ...] = ()  # earlier exercises whose functions the student's may call
    answered_by: tuple[str, ...] = ()  # "module:function"s of the course's that answer it, besides the references

    def references(self) -> list[str]:
        """The course's own answers to this exercise: a student's function that calls one scores 0."""
        paths = [self.stand_in, *(path_of(p.reference) for p in self.parts if p.reference), *self.answered_by]
        return list(dict.fromkeys(p for p in paths if p))

    def grade(self, caller: Caller, seed: int) -> CheckResult:
        """Check the student's function through `caller`; every failure becomes a reason."""
        return grade(self, caller, seed)

    def check(self, ns: dict[str, Any], seed: int | None = None) -> CheckResult:
        """check() in a notebook: the same cases and judges, on the notebook's own objects."""
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little")
        return grade(self, LocalCaller(ns), seed)


def verdict(v: Any) -> tuple[float, list[str]]:
    """A judge's answer as (fraction right, reasons)."""
    if v is None:
        return 1.0, []
    if isinstance(v, str):
        return 0.0, [v]
    reasons = [r for r in v if r is not None]
    return (len(v) - len(reasons)) / len(v), reasons


def refusal(name: str, signature: str, reply: Reply) -> str | None:
    """Why the whole batch counts for nothing, or None."""
    if reply.missing:
        return f"define `{name}`: it is not defined in the notebook (keep the stub's name: {name}{signature})"
    if reply.not_callable:
        t = reply.not_callable
        return (f"`{name}` should be a function `{name}{signature}`, got {t} "
                f"(calling it raises TypeError: '{t}' object is not callable)")
    if reply.stopped:
        return clip(reply.stopped)
    if any(o.raised_type == "NotImplementedError" for o in reply.outcomes):
        return "not implemented yet (the stub still raises NotImplementedError)"
    bad = next((o.not_data for o in reply.outcomes if o.not_data), None)
    if bad:
        return (f"{name} returned {clip(bad, 200)}, which is not data: return numbers, strings, lists, tuples, "
                "dicts, numpy arrays or torch tensors")
    return None


def key(x: Any) -> str:
    """Equal for equal data (arrays by their bytes), to tell a constant answer."""
    try:
        enc = Encoder()
        tree = enc.encode(x)
    except Exception:  # an expected value that is not data (a dataclass of the reference's): its repr
        return repr(x)
    return json.dumps(tree) + hashlib.sha256(b"".join(enc.buffers)).hexdigest()


def constant(answered: list[tuple[Case, Any, Any]], fractions: list[float]) -> str | None:
    """Why the answers count for nothing, when one answer was given to cases that expect different ones
    and it is not right on all of them: an answer that does not depend on the input is no work."""
    if len(answered) < 2 or len({key(got) for _, got, _ in answered}) > 1 or min(fractions, default=1.0) == 1.0:
        return None
    if len({(case.tag, key(want)) for case, _, want in answered}) < 2:
        return None
    return (f"the same answer, {clip(repr(answered[0][1]), 120)}, for all {len(answered)} cases, whose expected "
            "answers differ: an answer has to be computed from its input (no credit for the cases it happens to match)")


def judge_cases(part: Part, cases: Sequence[Case], outcomes: list[Outcome]) -> tuple[float, str]:
    """Judge each answer; the feedback counts the right ones and shows the first failure."""
    fractions, failures, answered = [], [], []
    for case, out in zip(cases, outcomes):
        if out.raised is not None:
            right, why = 0.0, [f"raised {out.raised}"]
        else:
            want = part.reference(*case.args) if part.reference else None
            right, why = verdict(part.judge(case, out.value, want))
            answered.append((case, out.value, want))
        # many judges name the case themselves: name it once
        failures += [f"{case.shown}: {w}" if case.shown and not w.startswith(case.shown) else w for w in why]
        if not (case.free and right == 1.0):  # right where anything well-formed is: no credit of its own
            fractions.append(right)
    same = constant(answered, fractions)
    if same or not fractions:
        return 0.0, same or f"no credit: every one of the {len(cases)} {part.what} accepts any answer"
    n, score = len(fractions), sum(fractions) / len(fractions)
    if score == 1.0:
        return 1.0, f"correct on all {n} random {part.what}"
    if all(f in (0.0, 1.0) for f in fractions):
        return score, f"correct on {int(sum(fractions))}/{n} random {part.what}; first failure: {clip(failures[0])}"
    return score, f"{score:.0%} of the values right over {n} random {part.what}; first failure: {clip(failures[0])}"


def grade(ex: Exercise, caller: Caller, seed: int) -> CheckResult:
    """Every part: make its cases, have the student's function answer them, judge; a score and why."""
    rng = np.random.default_rng(seed)
    stand_ins = {u.reads: u.stand_in for u in ex.uses if u.stand_in}
    total, weights, messages, bound = 0.0, 0.0, [], set()
    try:
        for part in ex.parts:
            name = part.reads or ex.reads
            signature = ex.signature if name == ex.reads else "(...)"
            cases = part.cases(rng)
            echo = {"echo": part.echo} if part.echo else {}  # callers that never echo need not know the word
            reply = caller.call(name, [c.args for c in cases], stand_ins, ex.references(), **echo)
            refused = refusal(name, signature, reply)
            if refused:
                return CheckResult(0.0, refused)
            if reply.reference_called:
                return CheckResult(0.0, wrapper_note(name, "when called"))
            if len(reply.outcomes) != len(cases):
                raise CallFailed(f"the kernel answered {len(reply.outcomes)} of the {len(cases)} calls (was the grader's "
                                 "code in it changed?)")
            bound |= set(reply.bound) & set(stand_ins)  # the kernel's word: only names this exercise stands in
            judge = part.judge_all or (lambda c, o, p=part: judge_cases(p, c, o))
            try:
                fraction, message = judge(cases, reply.outcomes)
            except WrongShape:
                raise
            except Exception as exc:  # an answer so odd that judging it failed: a zero that says so
                return CheckResult(0.0, f"the answer could not be judged ({describe(exc)})")
            total += part.weight * fraction
            weights += part.weight
            messages.append(f"{part.name}: {message}" if part.name and len(ex.parts) > 1 else message)
    except (CallFailed, WrongShape) as exc:
        return CheckResult(0.0, clip(str(exc), 2000))
    message = "; ".join(messages)
    if bound:
        owners = {u.reads: u.id for u in ex.uses}
        names = " and ".join(f"`{n}` ({owners[n]})" for n in sorted(bound))
        message += (f" [checked with the reference {names} in place of yours, so that a mistake there costs "
                    "points only once]")
    return CheckResult(min(1.0, max(0.0, total / weights)), message)
