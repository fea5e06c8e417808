"""Helpers for judges: read a student's answer as a vector, a number or a pair, and show values.

Answers arrive as data (see codec.py): numbers, lists, tuples, numpy arrays, torch tensors.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from specdec.grading.exercise import WrongShape


def fmt(a: Any) -> str:
    return np.array2string(np.asarray(a), precision=3, suppress_small=True)


def short(x: Any, limit: int = 120) -> str:
    s = repr(x)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def as_numpy(x: Any) -> np.ndarray | None:
    """A tensor, array or (nested) list as numpy; None if it is not array-like."""
    torch = sys.modules.get("torch")  # a tensor answer can only have been decoded with torch loaded
    try:
        if torch is not None and isinstance(x, torch.Tensor):
            return x.numpy()
        a = np.asarray(x)
    except (TypeError, ValueError, RuntimeError):
        return None
    return None if a.dtype == object else a


def vector(x: Any, n: int, name: str, integer: bool = False) -> np.ndarray:
    """x as a numpy vector of length n, or WrongShape saying why it is not one."""
    a = as_numpy(x)
    if a is None:
        raise WrongShape(f"{name} should be a tensor or array, got {type(x).__name__}")
    if a.shape != (n,):
        raise WrongShape(f"{name} must have shape ({n},), one value per row, got shape {tuple(a.shape)}")
    if integer:
        if a.dtype == bool or not np.issubdtype(a.dtype, np.number) or not np.all(a == np.round(a)):
            raise WrongShape(f"{name} must hold integers (token ids / counts), got {a.tolist()}")
        return a.astype(np.int64)
    return a


def number(x: Any) -> float | None:
    """A real number (a Python or numpy scalar, a 0-d array, a one-element tensor), else None."""
    if isinstance(x, (bool, np.bool_)):
        return None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        x = x.numpy()
        if x.size != 1:
            return None
        x = x.reshape(())
    if isinstance(x, np.ndarray):
        real = x.ndim == 0 and (np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating))
        return float(x) if real else None
    return float(x) if isinstance(x, (int, float, np.integer, np.floating)) else None


def pair(got: Any, fn: str, what: str) -> tuple[Any, Any]:
    """The two values of a returned pair (a tuple, a list or a vector of two)."""
    if isinstance(got, (tuple, list)) and len(got) == 2:
        return got[0], got[1]
    a = as_numpy(got) if not isinstance(got, (str, dict)) else None
    if a is not None and a.shape == (2,):
        return a[0], a[1]
    raise WrongShape(f"{fn} must return a pair {what}, got {short(got)}")


def whole_in(x: Any, lo: int, hi: int) -> bool:
    """x is an integer value (int, numpy integer, or a float like 3.0) in lo..hi."""
    if not isinstance(x, (int, np.integer, float, np.floating)) or isinstance(x, (bool, np.bool_)):
        return False
    if isinstance(x, (int, np.integer)):
        return bool(lo <= x <= hi)
    return bool(np.isfinite(x)) and x == int(x) and lo <= x <= hi


def close(got: float, want: float, rel: float = 0.0, abs_: float = 0.0) -> bool:
    """got is want within the tolerance. NaN is never close to anything, an infinity only to itself:
    write `not close(...)` for "wrong", never `abs(got - want) >= tol`, which NaN passes."""
    if not (math.isfinite(got) and math.isfinite(want)):
        return got == want
    return abs(got - want) <= max(rel * abs(want), abs_)
