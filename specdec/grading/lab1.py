"""Checks of Lab 1 (the simulated draft/verify loop).

Each check finds the student's function by name in the notebook's namespace, calls it on fresh
random inputs (seeded from os.urandom: every grading run differs) and compares with specdec.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

from specdec.grading.registry import CheckResult, exercise
from specdec.sim import formulas, stats, verify


class _Failed:
    """What a student's call gave instead of a value: the exception, kept for the feedback."""

    def __init__(self, exc: Exception):
        self.exc = exc

    def __str__(self) -> str:
        return f"raised {type(self.exc).__name__}: {self.exc}"


def _rng() -> np.random.Generator:
    return np.random.default_rng(int.from_bytes(os.urandom(8), "little"))


def _lookup(ns: dict[str, Any], name: str, signature: str) -> Callable | CheckResult:
    fn = ns.get(name)
    if fn is None:
        return CheckResult(0.0, f"define `{name}{signature}` in the notebook (not found)")
    if not callable(fn):
        return CheckResult(0.0, f"`{name}` should be a function `{name}{signature}`, got {type(fn).__name__}")
    return fn


def _call(fn: Callable, *args: Any) -> Any:
    """Call the student's function; an exception fails this case only (a stub still fails all)."""
    try:
        return fn(*args)
    except NotImplementedError:
        raise
    except Exception as exc:  # the student's code failed on this input
        return _Failed(exc)


def _score(passed: list[bool], failures: list[str], what: str) -> CheckResult:
    n = len(passed)
    score = sum(passed) / n
    if score == 1.0:
        return CheckResult(1.0, f"correct on all {n} random {what}")
    return CheckResult(score, f"correct on {sum(passed)}/{n} random {what}; first failure: {failures[0]}")


def _distributions(rng: np.random.Generator, v: int, alpha_range=(0.0, 1.0)) -> tuple[np.ndarray, np.ndarray]:
    """A random (p, q) pair whose overlap alpha lies in alpha_range."""
    while True:
        p, q = rng.dirichlet(np.full(v, 0.7), size=2)
        if alpha_range[0] <= np.minimum(p, q).sum() <= alpha_range[1]:
            return p, q


def _as_vector(x: Any, v: int) -> np.ndarray | None:
    try:
        a = np.asarray(x, dtype=float)
    except (TypeError, ValueError):
        return None
    return a if a.shape == (v,) else None


def _fmt(a: np.ndarray) -> str:
    return np.array2string(np.asarray(a), precision=3, suppress_small=True)


@exercise("lab1.q1", points=1, title="the residual distribution")
def check_residual(ns: dict[str, Any]) -> CheckResult:
    fn = _lookup(ns, "residual", "(p, q)")
    if isinstance(fn, CheckResult):
        return fn
    rng = _rng()
    passed, failures = [], []
    for case in range(10):
        v = int(rng.integers(2, 13))
        p, q = _distributions(rng, v)
        if case == 0:  # q has zeros: the residual keeps all of p there
            q[rng.permutation(v)[: v // 2]] = 0.0
            q /= q.sum()
        if case == 1:  # p == q: undefined and never sampled; any distribution will do, but no NaN
            got = _call(fn, p.copy(), p.copy())
            r = None if isinstance(got, _Failed) else _as_vector(got, v)
            ok = r is not None and np.all(np.isfinite(r)) and np.all(r >= 0) and abs(r.sum() - 1) < 1e-9
            passed.append(bool(ok))
            if not ok:
                failures.append(f"with p == q, max(0, p - q) is all zeros: return a valid distribution "
                                f"(for example p), not {got} (nothing is ever rejected then, so it is never used)")
            continue
        want = verify.residual_distribution(p, q)
        got = _call(fn, p.copy(), q.copy())
        r = None if isinstance(got, _Failed) else _as_vector(got, v)
        ok = r is not None and np.allclose(r, want, atol=1e-9)
        passed.append(bool(ok))
        if not ok:
            shown = got if isinstance(got, _Failed) or r is None else _fmt(r)
            failures.append(f"p={_fmt(p)} q={_fmt(q)}: expected {_fmt(want)}, got {shown}")
    return _score(passed, failures, "pairs (p, q)")


@exercise("lab1.q2", points=1, title="one accept/reject step")
def check_accept_draft(ns: dict[str, Any]) -> CheckResult:
    fn = _lookup(ns, "accept_draft", "(x, p, q, u)")
    if isinstance(fn, CheckResult):
        return fn
    rng = _rng()
    passed, failures = [], []
    for case in range(30):
        v = int(rng.integers(3, 11))
        p, q = _distributions(rng, v)
        x = int(rng.choice(v, p=q))
        if case % 5 == 0:
            p[x] = 0.0  # the target never says x: always reject
            p /= p.sum()
        ratio = p[x] / q[x]
        u = float(rng.random())
        while abs(u - ratio) < 1e-6:  # keep clear of ties between u < ratio and u <= ratio
            u = float(rng.random())
        want = verify.accept_reject_step(x, p, q, u)
        got = _call(fn, x, p.copy(), q.copy(), u)
        if isinstance(got, _Failed):
            passed.append(False)
            failures.append(f"x={x}, p={_fmt(p)}, q={_fmt(q)}, u={u:.3f}: {got}")
            continue
        if not isinstance(got, (bool, np.bool_)) and not (isinstance(got, (int, np.integer)) and got in (0, 1)):
            return CheckResult(0.0, f"accept_draft must return True or False, got {got!r}")
        ok = bool(got) == want
        passed.append(ok)
        if not ok:
            failures.append(f"x={x}, p(x)={p[x]:.3f}, q(x)={q[x]:.3f}, u={u:.3f}: expected {want}, got {bool(got)}")
    return _score(passed, failures, "draws (x, p, q, u)")


def _check_step_once(fn: Callable, p_rows, q_rows, drafts, rng) -> tuple[int, np.ndarray] | str:
    """Call speculative_step once; return (accept_length, emitted) or what is wrong with the answer."""
    got = _call(fn, p_rows.copy(), q_rows.copy(), drafts.copy(), rng)
    if isinstance(got, _Failed):
        return str(got)
    try:
        n, emitted = got
        n, emitted = int(n), np.asarray(emitted).astype(np.int64).ravel()
    except (TypeError, ValueError):
        return f"speculative_step must return (accept_length, emitted_tokens), got {got!r}"
    k = len(drafts)
    if not 0 <= n <= k:
        return f"accept_length must be in 0..k={k}, got {n}"
    if len(emitted) != n + 1:
        return f"with accept_length={n} it must emit {n + 1} tokens (the accepted drafts + 1), got {len(emitted)}"
    if not np.array_equal(emitted[:n], drafts[:n]):
        return f"the first accept_length emitted tokens must be the accepted drafts {drafts[:n]}, got {emitted[:n]}"
    return n, emitted


@exercise("lab1.q3", points=2, title="a full speculative sampling step")
def check_speculative_step(ns: dict[str, Any]) -> CheckResult:
    fn = _lookup(ns, "speculative_step", "(p_rows, q_rows, draft_tokens, rng)")
    if isinstance(fn, CheckResult):
        return fn
    rng = _rng()
    # 1. structure: cases whose outcome is certain
    passed, failures = [], []
    for case in range(12):
        v, k = int(rng.integers(3, 9)), int(rng.integers(1, 5))
        rows = [_distributions(rng, v, (0.3, 0.8)) for _ in range(k + 1)]
        p_rows, q_rows = np.array([r[0] for r in rows]), np.array([r[1] for r in rows[:k]])
        drafts = np.array([rng.choice(v, p=q) for q in q_rows], dtype=np.int64)
        kind = case % 3
        if kind == 0:  # the target likes every draft at least as much as the draft did: accept all
            q_rows = p_rows[:k].copy()
        elif kind == 1:  # the target never says the first draft: reject at once
            p_rows[0, drafts[0]] = 0.0
            p_rows[0] /= p_rows[0].sum()
        res = _check_step_once(fn, p_rows, q_rows, drafts, rng)
        if isinstance(res, str):
            passed.append(False)
            failures.append(res)
            continue
        n, emitted = res
        if kind == 0:
            ok = n == k and p_rows[k, emitted[k]] > 0
            why = f"p == q at every position: all {k} drafts are accepted and a bonus token ~ p_rows[k] follows"
        elif kind == 1:
            resid = verify.residual_distribution(p_rows[0], q_rows[0])
            ok = n == 0 and resid[emitted[0]] > 0
            why = "p(x1) = 0: the first draft is rejected and the token comes from the residual max(0, p - q)"
        else:
            ok, why = True, ""
        passed.append(bool(ok))
        if not ok:
            failures.append(f"{why}; got accept_length={n}, emitted={emitted.tolist()}")
    structure = sum(passed) / len(passed)
    # 2. distribution: emitted token j must follow p_rows[j] (chi-square, level 1e-4 each)
    v, k, trials = 4, 2, 2000
    rows = [_distributions(rng, v, (0.4, 0.75)) for _ in range(k + 1)]
    p_rows, q_rows = np.array([r[0] for r in rows]), np.array([r[1] for r in rows[:k]])
    drafts = verify.sample_categorical(np.broadcast_to(q_rows, (trials, k, v)), rng)
    emitted = np.full((trials, k + 1), -1)
    for t in range(trials):
        res = _check_step_once(fn, p_rows, q_rows, drafts[t], rng)
        if isinstance(res, str):
            return CheckResult(0.5 * structure, f"on a random step: {res}")
        emitted[t, : len(res[1])] = res[1]
    pvalues = []
    for j in range(k + 1):
        tokens = emitted[:, j][emitted[:, j] >= 0]
        pvalues.append(stats.chi_square_test(tokens, p_rows[j]).pvalue if len(tokens) > 50 else 0.0)
    dist_ok = [pv >= 1e-4 for pv in pvalues]
    score = 0.5 * structure + 0.5 * sum(dist_ok) / len(dist_ok)
    msgs = []
    if structure < 1:
        msgs.append(f"certain cases: {sum(passed)}/{len(passed)} right (first failure: {failures[0]})")
    if not all(dist_ok):
        bad = [j + 1 for j, ok in enumerate(dist_ok) if not ok]
        msgs.append(f"over {trials} steps the emitted token(s) at position {bad} do not follow the target p "
                    f"(chi-square p-values {[f'{pv:.2g}' for pv in pvalues]}); after a rejection sample the "
                    "residual, after k acceptances a bonus token from p_rows[k]")
    if not msgs:
        return CheckResult(1.0, f"correct on certain cases, and over {trials} steps every emitted position "
                                f"follows the target (chi-square p-values {[f'{pv:.2g}' for pv in pvalues]})")
    return CheckResult(score, "; ".join(msgs))


@exercise("lab1.q4", points=1, title="alpha of two distributions")
def check_alpha_of(ns: dict[str, Any]) -> CheckResult:
    fn = _lookup(ns, "alpha_of", "(p, q)")
    if isinstance(fn, CheckResult):
        return fn
    rng = _rng()
    passed, failures = [], []
    for case in range(10):
        v = int(rng.integers(2, 20))
        p, q = _distributions(rng, v)
        if case == 0:
            q = p.copy()  # identical: alpha = 1
        elif case == 1:  # disjoint supports: alpha = 0
            p = np.r_[np.ones(1), np.zeros(v - 1)]
            q = np.r_[np.zeros(1), np.full(v - 1, 1 / (v - 1))]
        want = formulas.acceptance_alpha(p, q)
        got = _call(fn, p.copy(), q.copy())
        try:
            ok = not isinstance(got, _Failed) and abs(float(got) - want) < 1e-9
        except (TypeError, ValueError):
            return CheckResult(0.0, f"alpha_of must return a number, got {got!r}")
        passed.append(ok)
        if not ok:
            failures.append(f"p={_fmt(p)} q={_fmt(q)}: expected {want:.6f}, got {got}")
    return _score(passed, failures, "pairs (p, q)")


@exercise("lab1.q5", points=1, title="expected tokens per step")
def check_tokens_per_step(ns: dict[str, Any]) -> CheckResult:
    fn = _lookup(ns, "tokens_per_step", "(alpha, k)")
    if isinstance(fn, CheckResult):
        return fn
    rng = _rng()
    cases = [(0.0, int(rng.integers(1, 9))), (1.0, int(rng.integers(1, 9)))]
    cases += [(float(rng.uniform(0.01, 0.99)), int(rng.integers(1, 13))) for _ in range(10)]
    rng.shuffle(cases)
    passed, failures = [], []
    for alpha, k in cases:
        want = formulas.expected_tokens_per_step(alpha, k)
        got = _call(fn, alpha, k)
        try:
            ok = not isinstance(got, _Failed) and abs(float(got) - want) <= 1e-8 * want
        except (TypeError, ValueError):
            return CheckResult(0.0, f"tokens_per_step must return a number, got {got!r}")
        passed.append(ok)
        if not ok:
            hint = " (alpha = 1 is the limit k + 1: no division by zero)" if alpha == 1 else ""
            failures.append(f"alpha={alpha:.4f}, k={k}: expected {want:.6f}, got {got}{hint}")
    return _score(passed, failures, "(alpha, k)")


@exercise("lab1.q6", points=2, title="the optimal number of drafts k")
def check_best_k(ns: dict[str, Any]) -> CheckResult:
    fn = _lookup(ns, "best_k", "(alpha, c, k_max)")
    if isinstance(fn, CheckResult):
        return fn
    rng = _rng()
    cases = [(float(rng.uniform(0.85, 0.97)), 0.0, int(rng.integers(5, 20)))]  # a free draft: k_max
    cases += [(float(rng.uniform(0.3, 0.97)), float(rng.uniform(0.005, 0.3)), int(rng.choice([8, 16, 32])))
              for _ in range(9)]
    passed, failures = [], []
    for alpha, c, k_max in cases:
        want, best = formulas.optimal_k(alpha, c, k_max)
        got = _call(fn, alpha, c, k_max)
        if isinstance(got, (tuple, list)):
            return CheckResult(0.0, f"best_k must return just the integer k, got {got!r}")
        ok = (isinstance(got, (int, np.integer, float, np.floating)) and not isinstance(got, bool)
              and np.isfinite(got) and got == int(got) and 1 <= got <= k_max
              and formulas.walltime_improvement(alpha, int(got), c) >= best * (1 - 1e-9))
        passed.append(bool(ok))
        if not ok:
            failures.append(f"alpha={alpha:.3f}, c={c:.3f}, k_max={k_max}: expected k={want} "
                            f"({best:.3f}x), got {got}")
    return _score(passed, failures, "(alpha, c, k_max)")


@exercise("lab1.q7", points=1, title="tau and acceptance rate from a log of verify steps")
def check_acceptance_summary(ns: dict[str, Any]) -> CheckResult:
    fn = _lookup(ns, "acceptance_summary", "(accept_lengths, k)")
    if isinstance(fn, CheckResult):
        return fn
    rng = _rng()
    points, failures = [], []
    for _ in range(10):
        k, steps = int(rng.integers(1, 9)), int(rng.integers(5, 61))
        alpha = rng.uniform(0.3, 0.95)
        log = [int(n) for n in np.cumprod(rng.random((steps, k)) < alpha, 1).sum(1)]
        s = stats.AcceptanceStats.from_accept_lengths(log, k)
        got = _call(fn, list(log), k)
        if isinstance(got, _Failed):
            points.append(0.0)
            failures.append(f"k={k}, log={log[:6]}...: {got}")
            continue
        try:
            tau, rate = (float(x) for x in got)
        except (TypeError, ValueError):
            return CheckResult(0.0, f"acceptance_summary must return (tau, acceptance_rate), got {got}")
        tau_ok, rate_ok = abs(tau - s.tau) < 1e-9, abs(rate - s.acceptance_rate) < 1e-9
        points.append((tau_ok + rate_ok) / 2)
        if not tau_ok:
            hint = (" : tau counts the bonus/correction token, tau = mean accepted + 1"
                    if abs(tau - (s.tau - 1)) < 1e-9 else "")
            failures.append(f"k={k}, log={log[:6]}...: tau expected {s.tau:.4f}, got {tau:.4f}{hint}")
        if not rate_ok:
            failures.append(f"k={k}, log={log[:6]}...: acceptance rate (accepted / (k * steps)) expected "
                            f"{s.acceptance_rate:.4f}, got {rate:.4f}")
    score = sum(points) / len(points)
    if score == 1.0:
        return CheckResult(1.0, f"tau and acceptance rate correct on all {len(points)} random logs")
    return CheckResult(score, f"{score:.0%} of the values right over {len(points)} random logs; "
                              f"first failure: {failures[0]}")
