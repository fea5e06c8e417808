"""Acceptance statistics shared by all labs, and the chi-square test of sampled tokens.

Input: the number of accepted drafts at each verify step (a flat array; one entry per step and
per sequence row). Convention: tau = tokens per verify step = accepted drafts + 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike


def _check_accepted(accepted: ArrayLike, k: int) -> np.ndarray:
    if isinstance(k, bool) or int(k) != k or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    a = np.asarray(accepted).ravel()
    if a.size == 0:
        raise ValueError("no verify steps")
    if not np.all(a == np.floor(a)) or a.min() < 0 or a.max() > k:
        raise ValueError(f"accepted counts must be integers in 0..k={k}")
    return a.astype(np.int64)


def tau_of(accepted: ArrayLike, k: int) -> float:
    """Mean tokens emitted per verify step: mean accepted drafts + 1."""
    return float(_check_accepted(accepted, k).mean() + 1)


def acceptance_rate(accepted: ArrayLike, k: int) -> float:
    """Per-draft acceptance rate: accepted drafts / proposed drafts (k per step)."""
    a = _check_accepted(accepted, k)
    return float(a.sum() / (k * a.size))


def acceptance_by_position(accepted: ArrayLike, k: int) -> np.ndarray:
    """Fraction of steps whose draft at position i = 1..k was accepted (after a rejection: not)."""
    a = _check_accepted(accepted, k)
    return (a[:, None] >= np.arange(1, k + 1)).mean(0)


def accepted_histogram(accepted: ArrayLike, k: int) -> np.ndarray:
    """Number of steps that accepted 0, 1, ..., k drafts."""
    return np.bincount(_check_accepted(accepted, k), minlength=k + 1)


@dataclass(frozen=True)
class AcceptanceStats:
    """Summary of a run of verify steps, k drafts proposed per step (fewer where given)."""

    k: int
    steps: int
    accepted: int  # accepted drafts, all steps
    proposed: int  # drafts the target judged, all steps
    tau: float  # tokens per verify step = accepted / steps + 1
    tau_stderr: float  # standard error of tau
    acceptance_rate: float  # accepted / proposed
    by_position: np.ndarray  # (k,) P(draft i accepted | it was proposed), i = 1..k
    histogram: np.ndarray  # (k+1,) steps with 0..k drafts accepted

    @classmethod
    def from_accepted(cls, accepted: ArrayLike, k: int, proposed: ArrayLike | None = None) -> "AcceptanceStats":
        """`proposed`: drafts judged at each step, when some steps proposed fewer than k (a row's
        last step, cut at its budget, needs fewer: the drafts past it were never candidates)."""
        a = _check_accepted(accepted, k)
        n = a.size
        prop = np.full(n, k) if proposed is None else np.asarray(proposed).ravel().astype(np.int64)
        if prop.shape != a.shape or (prop > k).any() or (a > prop).any():
            raise ValueError("proposed needs one count per step, with accepted <= proposed <= k")
        positions = np.arange(1, k + 1)
        asked = (prop[:, None] >= positions).sum(0)
        return cls(
            k=int(k),
            steps=n,
            accepted=int(a.sum()),
            proposed=int(prop.sum()),
            tau=float(a.mean() + 1),
            tau_stderr=float(a.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan"),
            acceptance_rate=float(a.sum() / prop.sum()) if prop.sum() else float("nan"),
            by_position=np.where(asked > 0, (a[:, None] >= positions).sum(0) / np.maximum(asked, 1), np.nan),
            histogram=accepted_histogram(a, k),
        )

    @property
    def tokens(self) -> int:
        """Tokens emitted: accepted drafts plus one bonus/correction token per step."""
        return self.accepted + self.steps

    def as_dict(self) -> dict:
        return {
            "k": self.k,
            "steps": self.steps,
            "tokens": self.tokens,
            "accepted": self.accepted,
            "proposed": self.proposed,
            "tau": self.tau,
            "tau_stderr": self.tau_stderr,
            "acceptance_rate": self.acceptance_rate,
            "by_position": [float(x) for x in self.by_position],
            "histogram": [int(x) for x in self.histogram],
        }


@dataclass(frozen=True)
class ChiSquareResult:
    statistic: float
    dof: int
    pvalue: float  # small: the samples do not come from probs


def chi_square_test(samples: ArrayLike, probs: ArrayLike, min_expected: float = 5.0) -> ChiSquareResult:
    """Pearson's goodness-of-fit test that integer samples were drawn from probs.

    Cells expected to get fewer than min_expected samples are pooled (the chi-square
    approximation needs it). A sample in a zero-probability cell gives p-value 0.
    """
    # scipy is slow to import; only this function needs it. scipy.special's chdtrc is what scipy.stats.chi2.sf
    # computes, without the second of CPU time scipy.stats takes to import (every process that grades Lab 1)
    from scipy.special import chdtrc

    probs = np.asarray(probs, dtype=float).ravel()
    probs = probs / probs.sum()
    samples = np.asarray(samples, dtype=np.int64).ravel()
    if samples.min() < 0 or samples.max() >= probs.size:
        raise ValueError(f"samples must be in 0..{probs.size - 1}")
    observed = np.bincount(samples, minlength=probs.size).astype(float)
    if np.any(observed[probs == 0] > 0):
        return ChiSquareResult(float("inf"), 0, 0.0)
    expected = samples.size * probs
    keep = expected >= min_expected
    obs, exp = list(observed[keep]), list(expected[keep])
    small_obs, small_exp = observed[~keep & (probs > 0)].sum(), expected[~keep & (probs > 0)].sum()
    if small_exp > 0:
        if small_exp < min_expected and exp:
            j = int(np.argmin(exp))  # still too small: fold it into the smallest cell
            obs[j] += small_obs
            exp[j] += small_exp
        else:
            obs.append(small_obs)
            exp.append(small_exp)
    obs_a, exp_a = np.array(obs), np.array(exp)
    dof = len(obs_a) - 1
    if dof < 1:
        return ChiSquareResult(0.0, 0, 1.0)
    stat = float(((obs_a - exp_a) ** 2 / exp_a).sum())
    return ChiSquareResult(stat, dof, float(chdtrc(dof, stat)))
