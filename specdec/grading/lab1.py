"""Lab 1's exercises (the simulated draft/verify loop), declared as data: see exercise.py.

Each calls the student's function on random distributions and compares with specdec.sim.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.special  # noqa: F401  stats.chi_square_test's, imported before any notebook runs (see exercise.py)

from specdec.grading.answers import as_numpy, close, fmt, number, pair, short, whole_in
from specdec.grading.calls import Outcome
from specdec.grading.codec import Rng
from specdec.grading.exercise import Case, Exercise, Part, WrongShape
from specdec.sim import formulas, stats, verify


def distributions(rng: np.random.Generator, v: int, alpha_range=(0.0, 1.0)) -> tuple[np.ndarray, np.ndarray]:
    """A random (p, q) pair whose overlap alpha lies in alpha_range."""
    while True:
        p, q = rng.dirichlet(np.full(v, 0.7), size=2)
        if alpha_range[0] <= np.minimum(p, q).sum() <= alpha_range[1]:
            return p, q


def seed_of(rng: np.random.Generator) -> Rng:
    """A fresh generator for the student's function, drawn from the cases' own."""
    return Rng(int(rng.integers(2**63)))


def distribution_of(got: Any, v: int) -> np.ndarray | None:
    a = as_numpy(got)
    if a is None or a.shape != (v,) or not np.issubdtype(a.dtype, np.number):
        return None
    return a.astype(float)


# --- q1: the residual ------------------------------------------------------------------------------


def residual_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for i in range(10):
        v = int(rng.integers(2, 13))
        p, q = distributions(rng, v)
        if i == 0:  # q has zeros: the residual keeps all of p there
            q[rng.permutation(v)[: v // 2]] = 0.0
            q /= q.sum()
        if i == 1:  # p == q: undefined and never sampled; any distribution will do, but no NaN
            cases.append(Case((p, p.copy()), shown="p == q", tag="p == q", free=True))
        else:
            cases.append(Case((p, q), shown=f"p={fmt(p)} q={fmt(q)}"))
    return cases


def judge_residual(case: Case, got: Any, want: np.ndarray) -> str | None:
    r = distribution_of(got, len(want))
    if case.tag == "p == q":
        if r is not None and np.all(np.isfinite(r)) and np.all(r >= 0) and abs(r.sum() - 1) < 1e-9:
            return None
        return (f"max(0, p - q) is all zeros: return a valid distribution (for example p), not {short(got)} "
                "(nothing is ever rejected then, so it is never used)")
    if r is not None and np.allclose(r, want, atol=1e-9):
        return None
    return f"expected {fmt(want)}, got {short(got) if r is None else fmt(r)}"


Q1 = Exercise(
    id="lab1.q1", points=1, title="the residual distribution", reads="residual", signature="(p, q)",
    parts=(Part(residual_cases, judge_residual, verify.residual_distribution, what="pairs (p, q)"),),
    stand_in="specdec.sim.verify:residual_distribution",
)


# --- q2: one accept/reject step --------------------------------------------------------------------


def accept_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for i in range(30):
        v = int(rng.integers(3, 11))
        p, q = distributions(rng, v)
        x = int(rng.choice(v, p=q))
        if i % 5 == 0:
            p[x] = 0.0  # the target never says x: always reject
            p /= p.sum()
        ratio = p[x] / q[x]
        u = float(rng.random())
        while abs(u - ratio) < 1e-6:  # keep clear of ties between u < ratio and u <= ratio
            u = float(rng.random())
        cases.append(Case((x, p, q, u), shown=f"x={x}, p(x)={p[x]:.3f}, q(x)={q[x]:.3f}, u={u:.3f}"))
    return cases


def judge_accept(case: Case, got: Any, want: bool) -> str | None:
    if not isinstance(got, (bool, np.bool_)) and not (isinstance(got, (int, np.integer)) and got in (0, 1)):
        raise WrongShape(f"accept_draft must return True or False, got {short(got)}")
    return None if bool(got) == want else f"expected {want}, got {bool(got)}"


Q2 = Exercise(
    id="lab1.q2", points=1, title="one accept/reject step", reads="accept_draft", signature="(x, p, q, u)",
    parts=(Part(accept_cases, judge_accept, verify.accept_reject_step, what="draws (x, p, q, u)"),),
    stand_in="specdec.sim.verify:accept_reject_step",
)


# --- q3: a full step: certain outcomes, then the distribution of what it emits ----------------------


def random_step(rng: np.random.Generator, v: int, k: int, alpha_range) -> tuple[np.ndarray, np.ndarray]:
    rows = [distributions(rng, v, alpha_range) for _ in range(k + 1)]
    return np.array([r[0] for r in rows]), np.array([r[1] for r in rows[:k]])


def certain_steps(rng: np.random.Generator) -> list[Case]:
    cases = []
    for i in range(12):
        v, k = int(rng.integers(3, 9)), int(rng.integers(1, 5))
        p_rows, q_rows = random_step(rng, v, k, (0.3, 0.8))
        drafts = np.array([rng.choice(v, p=q) for q in q_rows], dtype=np.int64)
        kind = ("accept all", "reject first")[i % 2]  # no case that any well-formed answer passes
        if kind == "accept all":  # the target likes every draft at least as much as the draft did
            q_rows = p_rows[:k].copy()
        elif kind == "reject first":  # the target never says the first draft
            p_rows[0, drafts[0]] = 0.0
            p_rows[0] /= p_rows[0].sum()
        cases.append(Case((p_rows, q_rows, drafts, seed_of(rng)), tag=kind))
    return cases


def step_answer(case: Case, got: Any) -> tuple[int, np.ndarray] | str:
    """(accepted, emitted) from speculative_step's answer, or what is wrong with its form."""
    drafts = case.args[2]
    try:
        n, emitted = got
        emitted = as_numpy(emitted)
        n, emitted = int(n), emitted.astype(np.int64).ravel()
    except (TypeError, ValueError, AttributeError):
        return f"speculative_step must return (accepted, emitted_tokens), got {short(got)}"
    k, v = len(drafts), case.args[0].shape[-1]
    if not 0 <= n <= k:
        return f"accepted must be in 0..k={k}, got {n}"
    if len(emitted) and not (0 <= emitted.min() and emitted.max() < v):
        return f"emitted tokens must be ids in 0..{v - 1}, got {emitted.tolist()}"
    if len(emitted) != n + 1:
        return f"with accepted={n} it must emit {n + 1} tokens (the accepted drafts + 1), got {len(emitted)}"
    if not np.array_equal(emitted[:n], drafts[:n]):
        return f"the first {n} emitted tokens must be the accepted drafts {drafts[:n]}, got {emitted[:n]}"
    return n, emitted


def judge_certain_step(case: Case, got: Any, want: None) -> str | None:
    res = step_answer(case, got)
    if isinstance(res, str):
        return res
    (n, emitted), (p_rows, q_rows, drafts, _) = res, case.args
    k = len(drafts)
    if case.tag == "accept all" and not (n == k and p_rows[k, emitted[k]] > 0):
        why = f"p == q at every position: all {k} drafts are accepted and a bonus token ~ p_rows[k] follows"
    elif case.tag == "reject first" and not (n == 0 and verify.residual_distribution(p_rows[0], q_rows[0])[emitted[0]] > 0):
        why = "p(x1) = 0: the first draft is rejected and the token comes from the residual max(0, p - q)"
    else:
        return None
    return f"{why}; got accepted={n}, emitted={emitted.tolist()}"


TRIALS = 2000


def repeated_step(rng: np.random.Generator) -> list[Case]:
    """The same step TRIALS times, drafts drawn from q: what it emits must follow p."""
    v, k = 4, 2
    p_rows, q_rows = random_step(rng, v, k, (0.4, 0.75))
    drafts = verify.sample_categorical(np.broadcast_to(q_rows, (TRIALS, k, v)), rng)
    return [Case((p_rows, q_rows, drafts[t], seed_of(rng))) for t in range(TRIALS)]


def judge_distribution(cases: list[Case], outcomes: list[Outcome]) -> tuple[float, str]:
    p_rows = cases[0].args[0]
    k = len(p_rows) - 1
    emitted = np.full((len(cases), k + 1), -1)
    for t, (case, out) in enumerate(zip(cases, outcomes)):
        res = f"raised {out.raised}" if out.raised is not None else step_answer(case, out.value)
        if isinstance(res, str):
            return 0.0, f"on a random step: {res}"
        emitted[t, : len(res[1])] = res[1]
    pvalues = []
    for j in range(k + 1):
        tokens = emitted[:, j][emitted[:, j] >= 0]
        pvalues.append(stats.chi_square_test(tokens, p_rows[j]).pvalue if len(tokens) > 50 else 0.0)
    shown = [f"{pv:.2g}" for pv in pvalues]
    # Level 1e-6 each: a right answer fails about once in 100,000 notebooks, while the classic bugs give
    # p-values below 1e-20 over these steps. A sampler whose output does not follow p is wrong as a whole:
    # no credit for the positions that happen to come out right.
    ok = [pv >= 1e-6 for pv in pvalues]
    if all(ok):
        return 1.0, f"every emitted position follows the target (chi-square p-values {shown})"
    bad = [j + 1 for j, good in enumerate(ok) if not good]
    return 0.0, (f"the emitted token(s) at position {bad} do not follow the target p (chi-square "
                               f"p-values {shown}); after a rejection sample the residual, after k acceptances a "
                               "bonus token from p_rows[k]")


Q3 = Exercise(
    id="lab1.q3", points=2, title="a full speculative sampling step", reads="speculative_step",
    signature="(p_rows, q_rows, draft_tokens, rng)",
    # The distribution is the point of the exercise: a step that gets the mechanics right but samples the
    # wrong token after a rejection (the classic bug: from q, not the residual) must earn well under half.
    parts=(Part(certain_steps, judge_certain_step, what="steps", name="certain cases"),
           Part(repeated_step, judge_all=judge_distribution, name=f"over {TRIALS} steps", weight=3.0)),
    uses=(Q1, Q2), answered_by=("specdec.sim.verify:speculative_sample",),
)


# --- q4, q5, q6: alpha, tau and the best k --------------------------------------------------------


def alpha_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for i in range(10):
        v = int(rng.integers(2, 20))
        p, q = distributions(rng, v)
        if i == 0:
            q = p.copy()  # identical: alpha = 1
        elif i == 1:  # disjoint supports: alpha = 0
            p = np.r_[np.ones(1), np.zeros(v - 1)]
            q = np.r_[np.zeros(1), np.full(v - 1, 1 / (v - 1))]
        cases.append(Case((p, q), shown=f"p={fmt(p)} q={fmt(q)}"))
    return cases


def judge_alpha(case: Case, got: Any, want: float) -> str | None:
    x = number(got)
    if x is None:
        raise WrongShape(f"alpha_of must return a number, got {short(got)}")
    return None if abs(x - want) < 1e-9 else f"expected {want:.6f}, got {x}"


Q4 = Exercise(
    id="lab1.q4", points=1, title="alpha of two distributions", reads="alpha_of", signature="(p, q)",
    parts=(Part(alpha_cases, judge_alpha, formulas.acceptance_alpha, what="pairs (p, q)"),),
    stand_in="specdec.sim.formulas:acceptance_alpha",
)


def tau_cases(rng: np.random.Generator) -> list[Case]:
    cases = [(0.0, int(rng.integers(1, 9))), (1.0, int(rng.integers(1, 9)))]
    cases += [(float(rng.uniform(0.01, 0.99)), int(rng.integers(1, 13))) for _ in range(10)]
    rng.shuffle(cases)
    return [Case((a, k), shown=f"alpha={a:.4f}, k={k}") for a, k in cases]


def judge_tau(case: Case, got: Any, want: float) -> str | None:
    x = number(got)
    if x is None:
        raise WrongShape(f"tokens_per_step must return a number, got {short(got)}")
    if abs(x - want) <= 1e-8 * want:
        return None
    hint = " (alpha = 1 is the limit k + 1: no division by zero)" if case.args[0] == 1 else ""
    return f"expected {want:.6f}, got {x}{hint}"


def stand_in_tokens_per_step(alpha: Any, k: Any) -> Any:
    """formulas.expected_tokens_per_step, for every k the stub allows: k = 0 drafts too (1 token a step).

    It stands in for the student's tokens_per_step in best_k, which may well call it with k = 0."""
    kk = np.asarray(k)
    tau = np.where(kk == 0, 1.0, formulas.expected_tokens_per_step(alpha, np.where(kk == 0, 1, kk)))
    return float(tau) if tau.ndim == 0 else tau


Q5 = Exercise(
    id="lab1.q5", points=1, title="expected tokens per step", reads="tokens_per_step", signature="(alpha, k)",
    parts=(Part(tau_cases, judge_tau, formulas.expected_tokens_per_step, what="(alpha, k)"),),
    stand_in="specdec.grading.lab1:stand_in_tokens_per_step",
)


def best_k_cases(rng: np.random.Generator) -> list[Case]:
    cases = [(float(rng.uniform(0.85, 0.97)), 0.0, int(rng.integers(5, 20)))]  # a free draft: k_max
    cases += [(float(rng.uniform(0.3, 0.97)), float(rng.uniform(0.005, 0.3)), int(rng.choice([8, 16, 32])))
              for _ in range(9)]
    return [Case((a, c, k_max), shown=f"alpha={a:.3f}, c={c:.3f}, k_max={k_max}") for a, c, k_max in cases]


def judge_best_k(case: Case, got: Any, want: tuple[int, float]) -> str | None:
    alpha, c, k_max = case.args
    if isinstance(got, (tuple, list)):
        raise WrongShape(f"best_k must return just the integer k, got {short(got)}")
    k_best, best = want
    if whole_in(got, 1, k_max) and formulas.walltime_improvement(alpha, int(got), c) >= best * (1 - 1e-9):
        return None
    return f"expected k={k_best} ({best:.3f}x), got {short(got)}"


Q6 = Exercise(
    id="lab1.q6", points=2, title="the optimal number of drafts k", reads="best_k", signature="(alpha, c, k_max)",
    parts=(Part(best_k_cases, judge_best_k, formulas.optimal_k, what="(alpha, c, k_max)"),),
    uses=(Q5,),
)


# --- q7: statistics of a log ------------------------------------------------------------------------


def log_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for _ in range(10):
        k, steps = int(rng.integers(1, 9)), int(rng.integers(5, 61))
        alpha = rng.uniform(0.3, 0.95)
        log = [int(n) for n in np.cumprod(rng.random((steps, k)) < alpha, 1).sum(1)]
        cases.append(Case((log, k), shown=f"k={k}, log={log[:6]}..."))
    return cases


def judge_summary(case: Case, got: Any, want: stats.AcceptanceStats) -> list[str | None]:
    tau, rate = (number(x) for x in pair(got, "acceptance_summary", "(tau, acceptance_rate)"))
    if tau is None or rate is None:
        raise WrongShape(f"acceptance_summary must return two numbers (tau, acceptance_rate), got {short(got)}")
    tau_why = rate_why = None
    if not close(tau, want.tau, abs_=1e-9):
        hint = " : tau counts the bonus/correction token, tau = mean accepted + 1" if abs(tau - (want.tau - 1)) < 1e-9 else ""
        tau_why = f"tau expected {want.tau:.4f}, got {tau:.4f}{hint}"
    if not close(rate, want.acceptance_rate, abs_=1e-9):
        rate_why = f"acceptance rate (accepted / (k * steps)) expected {want.acceptance_rate:.4f}, got {rate:.4f}"
    return [tau_why, rate_why]


Q7 = Exercise(
    id="lab1.q7", points=1, title="tau and acceptance rate from a log of verify steps", reads="acceptance_summary",
    signature="(accepted, k)",
    parts=(Part(log_cases, judge_summary, stats.AcceptanceStats.from_accepted, what="logs"),),
)

EXERCISES = (Q1, Q2, Q3, Q4, Q5, Q6, Q7)
