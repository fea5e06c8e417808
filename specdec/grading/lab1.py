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
from specdec.sim.tree import DraftTree


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


def a_number(got: Any, fn: str) -> float:
    """The answer as a float, or WrongShape: fn must return a number."""
    x = number(got)
    if x is None:
        raise WrongShape(f"{fn} must return a number, got {short(got)}")
    return x


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
    id="lab1.q3", points=3, title="a full speculative sampling step", reads="speculative_step",
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
    x = a_number(got, "alpha_of")
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
    x = a_number(got, "tokens_per_step")
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
    id="lab1.q6", points=1, title="the optimal number of drafts k", reads="best_k", signature="(alpha, c, k_max)",
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

# --- q8: tau when acceptance varies by position ---------------------------------------------------


def positions_cases(rng: np.random.Generator) -> list[Case]:
    kinds = ["decreasing", "decreasing", "decreasing", "any order", "any order", "any order", "a zero",
             "all ones", "all zeros", "one draft", "one draft", "decreasing"]
    cases = []
    for kind in kinds:
        k = 1 if kind == "one draft" else int(rng.integers(2, 9))
        a = rng.uniform(0.2, 0.98, k)
        if kind == "decreasing":
            a = -np.sort(-a)
        elif kind == "a zero":  # nothing after a sure rejection counts
            a[int(rng.integers(0, k - 1))] = 0.0
        elif kind in ("all ones", "all zeros"):
            a[:] = 1.0 if kind == "all ones" else 0.0
        cases.append(Case((a,), shown=f"alphas={fmt(a)}", tag=kind))
    return cases


def judge_positions(case: Case, got: Any, want: float) -> str | None:
    x = a_number(got, "tau_from_positions")
    if abs(x - want) <= 1e-9 * want:
        return None
    a = case.args[0]
    hints = [(want - 1, "tau counts the bonus/correction token: one more than the expected accepted drafts"),
             (1 + a.sum(), "draft i is accepted only if every draft before it was: its chance is a product"),
             (formulas.expected_tokens_per_step(a.mean(), len(a)), "the mean alpha loses the order of the positions")]
    hint = next((f" ({why})" for value, why in hints if abs(x - value) <= 1e-9 * want), "")
    return f"expected {want:.6f}, got {x}{hint}"


Q8 = Exercise(
    id="lab1.q8", points=2, title="tokens per step when acceptance varies by position", reads="tau_from_positions",
    signature="(alphas)",
    parts=(Part(positions_cases, judge_positions, formulas.tau_from_positions, what="acceptance vectors"),),
)


# --- q9: alpha and temperature ---------------------------------------------------------------------


def temperature_cases(rng: np.random.Generator) -> list[Case]:
    temps = [0.0, 0.0, 0.0, 0.0, 0.05, 0.3, 0.7, 1.0, 1.0, 1.5, 3.0, 10.0, 100.0]
    cases = []
    for i, t in enumerate(temps):
        v = int(rng.integers(3, 40))
        while True:
            target = rng.normal(0, rng.uniform(1, 4), v)
            draft = target + rng.normal(0, rng.uniform(0.5, 3), v)
            if t == 0 and i % 2:  # half of the greedy cases: the draft's argmax is the target's
                draft[target.argmax()] = draft.max() + rng.uniform(0.1, 1)
            gaps = [np.diff(np.sort(z)[-2:])[0] for z in (target, draft)]
            if min(gaps) > 1e-3:  # no ties at the top: the argmax is unambiguous
                break
        if t == 0.05:  # sharp: logits / T beyond exp's range (subtract the largest logit first)
            target, draft = target * 40 / np.abs(target).max(), draft * 40 / np.abs(draft).max()
        cases.append(Case((target, draft, t), shown=f"V={v}, T={t:g}", tag="greedy" if t == 0 else "sampled"))
    order = rng.permutation(len(cases))
    return [cases[i] for i in order]


def judge_temperature(case: Case, got: Any, want: float) -> str | None:
    x = a_number(got, "alpha_at_temperature")
    if abs(x - want) < 1e-9:
        return None
    if case.tag == "greedy":
        return f"expected {want:g}, got {x} (at T = 0 both models decode greedily: one token each, no sampling)"
    hint = " (exp overflowed: shift the logits by their largest value first)" if not np.isfinite(x) else ""
    return f"expected {want:.6f}, got {x}{hint}"


Q9 = Exercise(
    id="lab1.q9", points=2, title="alpha at a temperature", reads="alpha_at_temperature",
    signature="(target_logits, draft_logits, temperature)",
    parts=(Part(temperature_cases, judge_temperature, formulas.alpha_at_temperature, what="logit pairs"),),
    uses=(Q4,), answered_by=("specdec.sim.formulas:temperature_probs",),
)


# --- q10: which sampler keeps the target, and where a test can see it ------------------------------

# The four samplers of the notebook (its code defines them as sampler_A .. sampler_D): what each does wrong.
SAMPLER_BUGS = {
    "A": "one uniform u for all the accept tests of a step",
    "B": "none: speculative sampling",
    "C": "after a rejection, a token from q instead of the residual",
    "D": "the bonus token from the last draft position's row p_rows[k - 1] instead of p_rows[k]",
}


def shared_uniform_position(p: np.ndarray, q: np.ndarray, earlier_p: np.ndarray, earlier_q: np.ndarray) -> np.ndarray:
    """The distribution of the token emitted at a position (p, q) after the positions earlier_p/q accepted, when
    one u decides every test: the step reaches it when u < m = min over earlier positions of min(1, p(x)/q(x))."""
    ratios = [np.minimum(1.0, np.divide(pe, qe, out=np.ones_like(pe), where=qe > 0)) for pe, qe in zip(earlier_p, earlier_q)]
    values = np.unique(np.concatenate([r[qe > 0] for r, qe in zip(ratios, earlier_q)]))
    survival = np.array([np.prod([qe[r >= v].sum() for r, qe in zip(ratios, earlier_q)]) for v in values])
    pmf = survival - np.r_[survival[1:], 0.0]  # P(m = v)
    r_here = np.minimum(1.0, np.divide(p, q, out=np.ones_like(p), where=q > 0))
    res = verify.residual_distribution(p, q)
    joint = np.zeros_like(p)
    for m, w in zip(values, pmf):
        accepted = q * np.minimum(m, r_here)  # P(u < m and u < r(x), x drafted)
        joint += w * (accepted + (m - accepted.sum()) * res)
    return joint / joint.sum()


def emitted_distributions(sampler: str, p_rows: np.ndarray, q_rows: np.ndarray) -> list[np.ndarray]:
    """For each emitted position j = 1..k+1: the exact distribution of its token, given that the step emits one there."""
    k = len(q_rows)
    out = []
    for j in range(k):
        p, q = p_rows[j], q_rows[j]
        alpha = np.minimum(p, q).sum()
        if sampler == "C":
            out.append(np.minimum(p, q) + (1 - alpha) * q)
        elif sampler == "A" and j > 0:
            out.append(shared_uniform_position(p, q, p_rows[:j], q_rows[:j]))
        else:
            out.append(np.minimum(p, q) + (1 - alpha) * verify.residual_distribution(p, q))
    out.append(p_rows[k - 1] if sampler == "D" else p_rows[k])
    return out


def reference_first_biased_position(sampler: str, p_rows: np.ndarray, q_rows: np.ndarray) -> int:
    """The first emitted position (1..k+1) whose token does not follow the target's row there; 0 if none."""
    dists = emitted_distributions(sampler, p_rows, q_rows)
    return next((j + 1 for j, d in enumerate(dists) if 0.5 * np.abs(d - p_rows[j]).sum() > 1e-9), 0)


SHAPES = ("random", "first row agrees", "first rows agree", "all rows agree", "bonus row repeats")


def sampler_cases(rng: np.random.Generator) -> list[Case]:
    """Each sampler on each shape of step; where a bug acts, it moves the distribution by at least 0.01 (TV)."""
    cases = []
    for sampler in SAMPLER_BUGS:
        for shape in SHAPES:
            while True:
                v, k = int(rng.integers(3, 7)), int(rng.integers(2, 5))
                p_rows, q_rows = random_step(rng, v, k, (0.3, 0.85))
                same = {"first row agrees": 1, "first rows agree": k - 1, "all rows agree": k}.get(shape, 0)
                q_rows[:same] = p_rows[:same]
                if shape == "bonus row repeats":
                    p_rows[k] = p_rows[k - 1]
                tv = [0.5 * np.abs(d - p).sum() for d, p in zip(emitted_distributions(sampler, p_rows, q_rows), p_rows)]
                if all(t < 1e-12 or t > 0.01 for t in tv):
                    break
            cases.append(Case((sampler, p_rows, q_rows), shown=f"sampler {sampler}, k={k}, {shape}", tag=sampler))
    return [cases[i] for i in rng.permutation(len(cases))]


def judge_sampler(case: Case, got: Any, want: int) -> str | None:
    k = len(case.args[2])
    if isinstance(got, (bool, np.bool_)) or not whole_in(got, 0, k + 1):
        raise WrongShape(f"first_biased_position must return an integer in 0..k+1 (0: follows the target), got {short(got)}")
    if int(got) == want:
        return None
    return f"expected {want}, got {int(got)}" + (" (it follows the target at every position)" if want == 0 else "")


Q10 = Exercise(
    id="lab1.q10", points=3, title="which sampler keeps the target, and where a test sees it",
    reads="first_biased_position", signature="(sampler, p_rows, q_rows)",
    parts=(Part(sampler_cases, judge_sampler, reference_first_biased_position, what="steps"),),
    uses=(Q1, Q4), answered_by=("specdec.grading.lab1:emitted_distributions",),
)


# --- q11: the expected accept length of a draft tree -----------------------------------------------


def random_tree(rng: np.random.Generator, n: int, kind: str) -> DraftTree:
    """A tree of n nodes of this kind; each node's children share at most all of its acceptance."""
    if kind == "chain":
        parents = list(range(-1, n - 1))
    elif kind == "star":
        parents = [-1] * n
    else:  # any shape: each node hangs below a random earlier one
        parents = [int(rng.integers(-1, i)) for i in range(n)]
    accept = np.zeros(n)
    for parent in set(parents):
        kids = [i for i, p in enumerate(parents) if p == parent]
        share = rng.dirichlet(np.ones(len(kids) + 1))[:-1]  # the share left over: no child matches
        accept[kids] = share / share.sum() if kind == "sure" else share
    if kind == "a zero":  # a node the target never takes: nothing below it counts
        accept[int(rng.integers(0, n))] = 0.0
    return DraftTree(tuple(parents), tuple(accept))


def tree_cases(rng: np.random.Generator) -> list[Case]:
    kinds = ["chain", "star", "star", "any", "any", "any", "any", "any", "a zero", "sure", "any", "chain"]
    cases = []
    for kind in kinds:
        n = int(rng.integers(2, 13))
        tree = random_tree(rng, n, kind)
        cases.append(Case((list(tree.parents), list(tree.accept)), shown=f"parents={list(tree.parents)}, "
                          f"accept={fmt(tree.accept)}", tag=kind))
    return [cases[i] for i in rng.permutation(len(cases))]


def reference_tree_accept_length(parents: list[int], accept: list[float]) -> float:
    """The expected number of accepted drafts of the tree (DraftTree's)."""
    return DraftTree(tuple(parents), tuple(accept)).expected_accepted()


def judge_tree(case: Case, got: Any, want: float) -> str | None:
    x = a_number(got, "tree_accept_length")
    if close(x, want, rel=1e-9, abs_=1e-12):
        return None
    parents, accept = case.args
    path, node = [], -1  # the first child of the root, its first child, ...
    while node in parents:
        node = parents.index(node)
        path.append(accept[node])
    hints = [(want + 1, "the accept length counts accepted drafts, not the target's own token (that is tau)"),
             (sum(accept), "a node is accepted only when its parent was"),
             (DraftTree.chain(path).expected_accepted(), "every candidate counts, not only the first")]
    hint = next((f" ({why})" for value, why in hints if close(x, value, rel=1e-9, abs_=1e-12)), "")
    return f"expected {want:.6f}, got {x}{hint}"


Q11 = Exercise(
    id="lab1.q11", points=2, title="the expected accept length of a draft tree", reads="tree_accept_length",
    signature="(parents, accept)",
    parts=(Part(tree_cases, judge_tree, reference_tree_accept_length, what="trees"),),
    answered_by=("specdec.sim.tree:DraftTree.expected_accepted",),
)


# --- q12: several candidates at one position --------------------------------------------------------


def multi_draft_cases(rng: np.random.Generator) -> list[Case]:
    """Candidates drawn from q; a third of the cases reject the first candidate, so that the next one is judged
    against the updated target. No u within 1e-6 of a threshold the reference compares it with."""
    cases = []
    for i in range(24):
        while True:
            v, m = int(rng.integers(3, 9)), int(rng.integers(2, 5))
            p, q = distributions(rng, v, (0.2, 0.8))
            cand = rng.choice(v, size=m, p=q)
            if i % 6 == 0:  # the target never says any candidate: all rejected
                p[cand] = 0.0
                if p.sum() == 0:
                    continue
                p /= p.sum()
            u = rng.random(m)
            if i % 3 == 1:  # the first rejected
                ratio = p[cand[0]] / q[cand[0]]
                if ratio >= 0.95:
                    continue
                u[0] = rng.uniform(ratio + 0.01, 1.0)
            r, margins = p, []
            for x, ux in zip(cand, u):
                margins.append(abs(ux * q[x] - r[x]))
                if ux * q[x] < r[x]:
                    break
                r = verify.residual_distribution(r, q)
            if min(margins) > 1e-6:
                break
        cases.append(Case((p, q, cand, u), shown=f"p={fmt(p)} q={fmt(q)} candidates={cand.tolist()} u={fmt(u)}",
                          tag="all rejected" if i % 6 == 0 else ""))
    return cases


def judge_multi_draft(case: Case, got: Any, want: tuple[int, np.ndarray]) -> str | None:
    index, dist = pair(got, "multi_draft_verify", "(index, distribution)")
    m = len(case.args[2])
    if isinstance(index, (bool, np.bool_)) or not whole_in(index, -1, m - 1):
        raise WrongShape(f"multi_draft_verify must return (index, distribution), index in -1..{m - 1}, got {short(got)}")
    want_index, want_dist = want
    if int(index) != want_index:
        return f"expected index {want_index}, got {int(index)}"
    if want_index >= 0:
        return None
    r = distribution_of(dist, len(want_dist))
    if r is not None and np.allclose(r, want_dist, atol=1e-9):
        return None
    return f"all rejected: expected the distribution {fmt(want_dist)}, got {short(dist) if r is None else fmt(r)}"


Q12 = Exercise(
    id="lab1.q12", points=2, title="several candidates at one position", reads="multi_draft_verify",
    signature="(p, q, candidates, u)",
    parts=(Part(multi_draft_cases, judge_multi_draft, verify.multi_draft_verify, what="positions"),),
    uses=(Q1,), answered_by=("specdec.sim.verify:multi_draft_verify_batch",),
)

EXERCISES = (Q1, Q2, Q3, Q4, Q5, Q6, Q7, Q8, Q9, Q10, Q11, Q12)
