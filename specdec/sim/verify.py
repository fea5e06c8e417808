"""Verification rules of the draft/verify loop on explicit distributions (numpy).

p is the target's distribution, q the draft's, both over the same vocabulary (last axis).
A verify step checks k draft tokens; the target's k+1 rows cover the k draft positions and the bonus.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from numpy.typing import ArrayLike


def greedy_verify_batch(draft_tokens: ArrayLike, target_argmax: ArrayLike) -> np.ndarray:
    """accepted (n,): per row, how many leading drafts (n, k) equal the target's argmax at their
    position (n, >= k); a match after a mismatch does not count."""
    d, t = np.atleast_2d(draft_tokens), np.atleast_2d(target_argmax)
    k = d.shape[1]
    if t.shape[1] < k:
        raise ValueError(f"need a target argmax for each of the {k} draft positions, got {t.shape[1]}")
    return np.cumprod(d == t[:, :k], axis=1).sum(1)


def greedy_verify(draft_tokens: ArrayLike, target_argmax: ArrayLike) -> int:
    """accepted: how many leading draft tokens equal the target's argmax at their position."""
    return int(greedy_verify_batch(np.ravel(draft_tokens)[None], np.ravel(target_argmax)[None])[0])


def residual_distribution(p: ArrayLike, q: ArrayLike) -> np.ndarray:
    """The normalised residual max(0, p - q): where to sample after a rejection.

    Its mass is 1 - alpha. When p == q that is 0 and the residual is undefined; we return p,
    which never matters: with p == q nothing is ever rejected, so the residual is never sampled.
    """
    p = np.asarray(p, dtype=float)
    q = np.asarray(q, dtype=float)
    r = np.maximum(p - q, 0.0)
    mass = r.sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(mass > 0, r / mass, p)


def accept_reject_step(x: int, p: ArrayLike, q: ArrayLike, u: float) -> bool:
    """Accept the draft token x ~ q with probability min(1, p(x)/q(x)), given u ~ Uniform[0, 1)."""
    px, qx = float(np.asarray(p)[x]), float(np.asarray(q)[x])
    if qx <= 0:
        raise ValueError(f"q({x}) = 0: the draft cannot have proposed token {x}")
    return bool(u * qx < px)  # u < p/q without dividing; always true when p(x) >= q(x)


def threshold_verify(
    p: ArrayLike, q: ArrayLike, threshold_single: float = 1.0, threshold_acc: float = 1.0
) -> tuple[float, np.ndarray]:
    """SGLang's verify of one sampled draft position (tree_speculative_sampling_target_only, a chain), exactly.

    The draft x ~ q is accepted when coin <= p(x) / threshold_acc or p(x) >= threshold_single, coin uniform;
    q itself is not read (the draft token counts as certain, one-hot). After a rejection the token comes from
    max(0, p - p(x) e_x), normalised: p without x. Returns (P(accept), distribution of the emitted token).
    With both thresholds 1 the emitted token follows p exactly (accept probability sum q p); below 1 it does not.
    """
    p, q = np.asarray(p, dtype=float), np.asarray(q, dtype=float)
    if not (0 < threshold_single <= 1 and 0 < threshold_acc <= 1):
        raise ValueError(f"thresholds must be in (0, 1], got {threshold_single!r}, {threshold_acc!r}")
    accept = np.where(p >= threshold_single, 1.0, np.minimum(1.0, p / threshold_acc))
    with np.errstate(divide="ignore", invalid="ignore"):
        # per draft x: q(x) P(reject x) / (1 - p(x)), the weight of "p without x"; 0 where x is always accepted
        w = np.where(accept < 1, q * (1 - accept) / (1 - p), 0.0)
    emitted = q * accept + p * (w.sum() - w)
    return float((q * accept).sum()), emitted


def sample_categorical(probs: ArrayLike, rng: np.random.Generator) -> np.ndarray | int:
    """One token from each distribution on the last axis (inverse CDF, vectorised)."""
    probs = np.asarray(probs, dtype=float)
    cdf = np.cumsum(probs, axis=-1)
    u = rng.random(probs.shape[:-1] + (1,)) * cdf[..., -1:]
    # token j is chosen when cdf[j-1] <= u < cdf[j]: zero-probability tokens are never chosen
    idx = np.minimum((cdf <= u).sum(-1), probs.shape[-1] - 1)
    return int(idx) if idx.ndim == 0 else idx


def speculative_sample(
    p_rows: ArrayLike, q_rows: ArrayLike, draft_tokens: ArrayLike, rng: np.random.Generator
) -> tuple[int, np.ndarray]:
    """One verify step of speculative sampling for one sequence.

    p_rows: (k+1, V) target rows (k draft positions + bonus); q_rows: (k, V); draft_tokens: k tokens
    drawn from q_rows. Returns (accepted, emitted_tokens) with accepted + 1 tokens emitted.
    """
    p_rows, q_rows = np.asarray(p_rows, dtype=float), np.asarray(q_rows, dtype=float)
    draft_tokens = np.asarray(draft_tokens, dtype=np.int64).ravel()
    k = len(draft_tokens)
    if p_rows.shape[0] != k + 1 or q_rows.shape[0] != k:
        raise ValueError(f"k={k} drafts need k+1 target rows and k draft rows, got {p_rows.shape}, {q_rows.shape}")
    if np.any(q_rows[np.arange(k), draft_tokens] <= 0):
        raise ValueError("a draft token has q = 0: the draft cannot have proposed it")
    lengths, emitted = speculative_sample_batch(p_rows[None], q_rows[None], draft_tokens[None], rng)
    n = int(lengths[0])
    return n, emitted[0, : n + 1]


def speculative_sample_batch(
    p_rows: ArrayLike,
    q_rows: ArrayLike,
    draft_tokens: ArrayLike,
    rng: np.random.Generator,
    on_reject: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """speculative_sample for n independent trials at once.

    p_rows (n, k+1, V), q_rows (n, k, V), draft_tokens (n, k). Returns accepted (n,) and
    emitted (n, k+1), padded with -1 after the accepted + 1 emitted tokens.
    on_reject(p, q) -> distribution to sample after a rejection (default: the residual); only for
    experiments that plant a bug.
    """
    p_rows, q_rows = np.asarray(p_rows, dtype=float), np.asarray(q_rows, dtype=float)
    drafts = np.asarray(draft_tokens, dtype=np.int64)
    n, k = drafts.shape
    if p_rows.shape[:2] != (n, k + 1) or q_rows.shape[:2] != (n, k):
        raise ValueError(f"shapes disagree: p {p_rows.shape}, q {q_rows.shape}, drafts {drafts.shape}")
    rows = np.arange(n)
    if k == 0:
        return np.zeros(n, dtype=np.int64), sample_categorical(p_rows[:, 0], rng)[:, None]
    px = np.take_along_axis(p_rows[:, :k], drafts[..., None], -1)[..., 0]
    qx = np.take_along_axis(q_rows, drafts[..., None], -1)[..., 0]
    agree = rng.random((n, k)) * qx < px  # per draft: u q(d) < p(d)
    accepted = np.cumprod(agree, axis=1).sum(1)  # leading run of acceptances
    stop = np.minimum(accepted, k - 1)
    reject = on_reject or residual_distribution
    fix_dist = np.where(
        (accepted < k)[:, None], reject(p_rows[rows, stop], q_rows[rows, stop]), p_rows[:, k]
    )
    last = sample_categorical(fix_dist, rng)
    emitted = np.where(np.arange(k) < accepted[:, None], drafts, -1)
    emitted = np.concatenate([emitted, np.full((n, 1), -1)], axis=1)
    emitted[rows, accepted] = last
    return accepted, emitted


def multi_draft_verify_batch(
    p: ArrayLike,
    q: ArrayLike,
    candidates: ArrayLike,
    u: ArrayLike,
    on_reject: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Several candidates for one position, drawn i.i.d. (with replacement) from q (SpecInfer's multi-step
    speculative sampling). Candidate i is accepted with probability min(1, r(x_i) / q(x_i)), r the target,
    starting at p; after each rejection r becomes the residual of r against q. n trials at once:
    p, q (V,) or (n, V), candidates (n, m), u (n, m) uniforms. Returns (index (n,) of the accepted candidate,
    -1 where all were rejected; r (n, V), the target after the last update: sample it where index is -1).
    q may also be (n, m, V), a distribution per candidate: one-hot on each gives distinct deterministic
    candidates (a draft tree's top-k children), accepted w.p. r(x_i), after a rejection r without x_i.
    on_reject(r, q) replaces the residual, to plant a bug."""
    cand = np.asarray(candidates, dtype=np.int64)
    u = np.asarray(u, dtype=float)
    n, m = cand.shape
    r = np.array(np.broadcast_to(np.asarray(p, dtype=float), (n, np.shape(p)[-1])))
    q = np.asarray(q, dtype=float)
    q = np.broadcast_to(q if q.ndim == 3 else q.reshape(-1, 1, r.shape[-1]), (n, m, r.shape[-1]))  # (n, m, V)
    rows = np.arange(n)
    if np.any(q[rows[:, None], np.arange(m), cand] <= 0):
        raise ValueError("a candidate has q = 0: the draft cannot have proposed it")
    reject = on_reject or residual_distribution
    index = np.full(n, -1)
    for i in range(m):
        open_ = index < 0
        ok = open_ & (u[:, i] * q[rows, i, cand[:, i]] < r[rows, cand[:, i]])
        index[ok] = i
        rejected = open_ & ~ok
        r[rejected] = reject(r[rejected], q[rejected, i])
    return index, r


def multi_draft_verify(p: ArrayLike, q: ArrayLike, candidates: ArrayLike, u: ArrayLike) -> tuple[int, np.ndarray]:
    """multi_draft_verify_batch for one trial: (index of the accepted candidate or -1, the target r then)."""
    index, r = multi_draft_verify_batch(p, q, np.ravel(candidates)[None], np.ravel(u)[None])
    return int(index[0]), r[0]


def multi_draft_sample(
    p: ArrayLike,
    q: ArrayLike,
    n: int,
    m: int,
    rng: np.random.Generator,
    on_reject: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """n trials of m candidates drawn from q, verified: (the emitted token (n,), index of the accepted candidate)."""
    q = np.asarray(q, dtype=float)
    cand = sample_categorical(np.broadcast_to(q, (n, m, q.shape[-1])), rng)
    index, r = multi_draft_verify_batch(p, q, cand, rng.random((n, m)), on_reject)
    fallback = sample_categorical(r, rng)
    return np.where(index >= 0, cand[np.arange(n), np.maximum(index, 0)], fallback), index


def multi_draft_rank_accept(p: ArrayLike, q: ArrayLike, m: int) -> np.ndarray:
    """P(candidate i is the one accepted), i = 0..m-1, for m i.i.d. candidates: round i is reached when
    rounds before it rejected, and accepts with alpha(r_i, q) = sum min(r_i, q). They sum to P(some accepted)."""
    r, reach, out = np.asarray(p, dtype=float), 1.0, []
    for _ in range(m):
        a = float(np.minimum(r, q).sum())
        out.append(reach * a)
        reach *= 1.0 - a
        r = residual_distribution(r, q)
    return np.array(out)
