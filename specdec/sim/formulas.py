"""The i.i.d. speedup model of speculative decoding (Leviathan et al. 2023, section 3).

Every draft is accepted independently with probability alpha. Convention of the course:
tau = tokens emitted per verify step = accepted drafts + 1 (the bonus/correction token counts).
Scalars give floats; numpy arrays broadcast and give arrays.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

# optimal_k treats improvements this close (relative) as ties, so rounding cannot pick a larger k.
TIE_RTOL = 1e-12


def _out(x: np.ndarray) -> float | np.ndarray:
    return float(x) if np.ndim(x) == 0 else x


def _check_alpha(alpha: ArrayLike) -> np.ndarray:
    a = np.asarray(alpha, dtype=float)
    if not np.all((a >= 0) & (a <= 1)):  # also catches NaN
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    return a


def _check_k(k: ArrayLike, name: str = "k") -> np.ndarray:
    kk = np.asarray(k)
    if kk.dtype == bool or not np.issubdtype(kk.dtype, np.number):
        raise ValueError(f"{name} must be an integer >= 1, got {k!r}")
    if not np.all(np.isfinite(kk)) or not np.all(kk == np.floor(kk)) or not np.all(kk >= 1):
        raise ValueError(f"{name} must be an integer >= 1, got {k!r}")
    return kk.astype(np.int64)


def _check_c(c: ArrayLike) -> np.ndarray:
    cc = np.asarray(c, dtype=float)
    if not np.all((cc >= 0) & np.isfinite(cc)):
        raise ValueError(f"c (draft cost / target cost) must be >= 0, got {c!r}")
    return cc


def acceptance_alpha(p: ArrayLike, q: ArrayLike) -> float | np.ndarray:
    """alpha = sum_x min(p(x), q(x)) over the last axis = 1 - TV(p, q): the chance a draft x ~ q is accepted."""
    p = np.asarray(p, dtype=float)
    q = np.asarray(q, dtype=float)
    if p.shape[-1:] != q.shape[-1:]:
        raise ValueError(f"p and q need the same vocabulary (last axis): {p.shape} vs {q.shape}")
    if np.any(p < 0) or np.any(q < 0):
        raise ValueError("p and q must be probability distributions (non-negative)")
    for name, d in (("p", p), ("q", q)):
        if not np.allclose(d.sum(-1), 1.0, atol=1e-4):
            raise ValueError(f"{name} must sum to 1 over the last axis")
    return _out(np.minimum(p, q).sum(-1))


def expected_tokens_per_step(alpha: ArrayLike, k: ArrayLike) -> float | np.ndarray:
    """tau = 1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha); exactly k+1 at alpha=1, 1 at alpha=0."""
    a, kk = _check_alpha(alpha), _check_k(k)
    with np.errstate(divide="ignore", invalid="ignore"):
        # expm1/log keep full precision when alpha is close to 1 (1 - alpha^(k+1) would cancel)
        closed = -np.expm1((kk + 1) * np.log(a)) / (1.0 - a)
    return _out(np.where(a == 1, kk + 1.0, np.where(a == 0, 1.0, closed)))


def tau_from_positions(alphas: ArrayLike) -> float:
    """Expected tokens per verify step when acceptance varies by position.

    alphas[i] = P(draft i+1 accepted | drafts 1..i accepted), i = 0..k-1. Draft i+1 and all before it
    are accepted with probability alphas[0] * ... * alphas[i], so
    tau = 1 + a1 + a1 a2 + ... + a1 a2 ... ak (the + 1 is the bonus/correction token).
    With every alphas[i] = alpha this is expected_tokens_per_step(alpha, k).
    """
    a = _check_alpha(alphas)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"alphas must be a non-empty 1-D sequence (one per draft position), got {alphas!r}")
    return float(1.0 + np.cumprod(a).sum())


def temperature_probs(logits: ArrayLike, temperature: float) -> np.ndarray:
    """softmax(logits / T) over the last axis; at T = 0 all mass on the argmax (the first one on a tie)."""
    z = np.asarray(logits, dtype=float)
    if not (np.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if temperature == 0:
        return (np.arange(z.shape[-1]) == z.argmax(-1)[..., None]).astype(float)
    e = np.exp((z - z.max(-1, keepdims=True)) / temperature)  # the largest logit gives exp(0): no overflow
    return e / e.sum(-1, keepdims=True)


def alpha_at_temperature(target_logits: ArrayLike, draft_logits: ArrayLike, temperature: float) -> float | np.ndarray:
    """The chance that a draft is accepted when target and draft both sample at this temperature.

    T > 0: acceptance_alpha of the two softmax(logits / T). T = 0: greedy decoding, where the draft's argmax
    is accepted exactly when it is the target's (1.0 or 0.0): the same acceptance_alpha of two one-hot rows.
    """
    return acceptance_alpha(temperature_probs(target_logits, temperature), temperature_probs(draft_logits, temperature))


def walltime_improvement(alpha: ArrayLike, k: ArrayLike, c: ArrayLike) -> float | np.ndarray:
    """Speedup over plain decoding when a draft step costs c target steps: tau / (k c + 1)."""
    cc = _check_c(c)
    return _out(np.asarray(expected_tokens_per_step(alpha, k)) / (np.asarray(k) * cc + 1.0))


def optimal_k(alpha: ArrayLike, c: ArrayLike, k_max: int = 32) -> tuple:
    """The integer k in 1..k_max with the largest walltime_improvement; ties go to the smaller k.

    Returns (k, improvement): (int, float) for scalars, arrays for array inputs.
    """
    a, cc = _check_alpha(alpha), _check_c(c)
    km = int(_check_k(k_max, "k_max"))
    ks = np.arange(1, km + 1)
    a, cc = np.broadcast_arrays(a, cc)
    imp = np.asarray(walltime_improvement(a[..., None], ks, cc[..., None]))
    best = imp.max(-1, keepdims=True)
    # first k within rounding of the best: the smaller k wins a tie
    idx = np.argmax(imp >= best * (1 - TIE_RTOL), axis=-1)
    k_best = ks[idx]
    value = np.take_along_axis(imp, idx[..., None], -1)[..., 0]
    if k_best.ndim == 0:
        return int(k_best), float(value)
    return k_best, value


def speedup_from_costs(
    tau: ArrayLike, t_plain: ArrayLike, t_draft: ArrayLike, t_verify: ArrayLike, k: ArrayLike
) -> float | np.ndarray:
    """Measured speedup: tau tokens per (k drafts + 1 verify) against t_plain per plain token.

    walltime_improvement is the case t_verify = t_plain, t_draft = c * t_plain.
    """
    kk = _check_k(k)
    t = np.asarray(tau, dtype=float)
    if not np.all((t >= 1) & (t <= kk + 1 + 1e-9)):
        raise ValueError(f"tau (tokens per verify step, accepted + 1) must be in [1, k+1], got {tau!r}")
    tp, td, tv = (np.asarray(x, dtype=float) for x in (t_plain, t_draft, t_verify))
    if not (np.all(tp > 0) and np.all(td >= 0) and np.all(tv > 0)):
        raise ValueError("times must be positive (t_draft may be 0)")
    return _out(t * tp / (kk * td + tv))
