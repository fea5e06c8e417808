"""Checks of Lab 2 (a minimal static-k MTP decoder in PyTorch).

Each check finds the student's function by name in the notebook's namespace, calls it on fresh
random inputs (seeded from os.urandom: every grading run differs) and compares with specdec:
verify_batch.greedy_accept, the KVCache's commit/rollback, stats.AcceptanceStats and formulas.
No model is loaded: every check runs on synthetic tensors in a few milliseconds.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from specdec.decoder.kv_cache import KVCache
from specdec.decoder.verify import greedy_accept
from specdec.grading.lab1 import _call, _Failed, _lookup, _score
from specdec.grading.registry import CheckResult, exercise
from specdec.sim import formulas, stats


def _rng() -> np.random.Generator:
    return np.random.default_rng(int.from_bytes(os.urandom(8), "little"))


def _numpy(x: Any) -> np.ndarray | None:
    """A student's array-like (torch tensor, numpy array, list) as numpy; None if it is not one."""
    try:
        if torch.is_tensor(x):
            return x.detach().cpu().numpy()
        return np.asarray(x)
    except (TypeError, ValueError, RuntimeError):
        return None


def _pair(got: Any, fn_name: str, what: str) -> tuple[Any, Any] | CheckResult:
    """The two values of a returned pair, or a zero saying what shape the answer must have."""
    if isinstance(got, (tuple, list)) and len(got) == 2:
        return got[0], got[1]
    return CheckResult(0.0, f"{fn_name} must return a pair {what}, got {_short(got)}")


def _short(x: Any, limit: int = 120) -> str:
    s = repr(x)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _vector(x: Any, n: int, name: str, integer: bool = False) -> np.ndarray | str:
    """x as a numpy vector of length n, or the reason it is not one (shape, type, non-integers)."""
    a = _numpy(x)
    if a is None or a.dtype == object:
        return f"{name} should be a tensor or array, got {type(x).__name__}"
    if a.shape != (n,):
        return f"{name} must have shape ({n},), one value per row, got shape {tuple(a.shape)}"
    if integer:
        if a.dtype == bool or not np.issubdtype(a.dtype, np.number) or not np.all(a == np.round(a)):
            return f"{name} must hold integers (token ids / counts), got {a.tolist()}"
        return a.astype(np.int64)
    return a


def _number(x: Any) -> float | None:
    if isinstance(x, (bool, np.bool_)):
        return None
    try:
        if torch.is_tensor(x):
            return float(x.item()) if x.numel() == 1 else None
        return float(x)
    except (TypeError, ValueError):
        return None


# --- q1 ----------------------------------------------------------------------------------------


def _verify_case(rng: np.random.Generator, B: int, k: int, V: int, kind: str):
    """Random target logits [B, k+1, V] and drafts [B, k] whose accepted prefix lengths are known."""
    logits = torch.as_tensor(rng.normal(0, 3, (B, k + 1, V)), dtype=torch.float32)
    best = logits.argmax(-1).numpy()  # [B, k+1], distinct values: no ties
    draft = rng.integers(0, V, (B, k))
    for b in range(B):
        n = {"all": k, "none": 0}.get(kind, int(rng.integers(0, k + 1)))
        draft[b, :n] = best[b, :n]
        if n < k:
            draft[b, n] = (best[b, n] + rng.integers(1, V)) % V  # the first mismatch
            later = np.arange(n + 1, k)
            same = later[rng.random(len(later)) < 0.6]  # matches after a mismatch must not count
            draft[b, same] = best[b, same]
    return torch.as_tensor(draft, dtype=torch.long), logits


@exercise("lab2.q1", points=2, title="greedy verification of a batch of blocks")
def check_greedy_verify_batch(ns: dict[str, Any]) -> CheckResult:
    fn = _lookup(ns, "greedy_verify_batch", "(draft, target_logits)")
    if isinstance(fn, CheckResult):
        return fn
    rng = _rng()
    kinds = ["all", "none", "mixed", "k1"] + ["mixed"] * 8
    passed, failures = [], []
    for kind in kinds:
        B, V = int(rng.integers(1, 7)), int(rng.integers(5, 60))
        k = 1 if kind == "k1" else int(rng.integers(2, 7))
        draft, logits = _verify_case(rng, B, k, V, kind)
        want_n, want_t = (t.numpy() for t in greedy_accept(draft, logits))
        got = _call(fn, draft.clone(), logits.clone())
        if isinstance(got, _Failed):
            passed.append(False)
            failures.append(f"B={B}, k={k}: {got}")
            continue
        pair = _pair(got, "greedy_verify_batch", "(accept_length [B], next_token [B])")
        if isinstance(pair, CheckResult):
            return pair
        n = _vector(pair[0], B, "accept_length", integer=True)
        t = _vector(pair[1], B, "next_token", integer=True)
        for bad in (n, t):
            if isinstance(bad, str):
                return CheckResult(0.0, f"B={B}, k={k}: {bad}")
        ok = np.array_equal(n, want_n) and np.array_equal(t, want_t)
        passed.append(bool(ok))
        if not ok:
            b = int(np.flatnonzero((n != want_n) | (t != want_t))[0])
            hint = ""
            if n[b] != want_n[b] and n[b] == int((draft[b].numpy() == logits[b, :k].argmax(-1).numpy()).sum()):
                hint = " (only the leading matches count: a draft after a rejection was drafted after a wrong token)"
            elif n[b] == want_n[b] and want_n[b] == k:
                hint = " (all k accepted: the next token is the bonus, the argmax at position k + 1)"
            elif n[b] == want_n[b]:
                hint = " (after a rejection the next token is the target's argmax at the rejected position)"
            failures.append(f"B={B}, k={k}, row {b}: drafts {draft[b].tolist()}, target argmax "
                            f"{logits[b].argmax(-1).tolist()}: expected accept_length={want_n[b]}, "
                            f"next_token={want_t[b]}; got {n[b]}, {t[b]}{hint}")
    return _score(passed, failures, "batches")


# --- q2 ----------------------------------------------------------------------------------------


def _reference_commit(lengths: torch.Tensor, accept: torch.Tensor, k: int, done: torch.Tensor):
    """What a real KVCache does: provisional writes at lengths + 0..k, commit of accepted + 1 for
    running rows; slots past the new length are rolled back (ignored, later overwritten)."""
    B = lengths.shape[0]
    max_len = int(lengths.max()) + k + 2
    cache = KVCache(1, B, 1, 1, max_len)
    cache.lengths.copy_(lengths)
    pos = cache.positions(k + 1)  # [B, k+1]
    ones = torch.ones(B, 1, k + 1, 1)
    cache.write(0, ones, ones, pos)  # the verify step's provisional writes
    cache.commit(torch.where(done, 0, accept + 1))
    return cache.lengths.clone(), pos >= cache.lengths.unsqueeze(1)


@exercise("lab2.q2", points=2, title="KV-cache bookkeeping after a verify step: commit and rollback")
def check_commit_step(ns: dict[str, Any]) -> CheckResult:
    fn = _lookup(ns, "commit_step", "(lengths, accept_length, k, done)")
    if isinstance(fn, CheckResult):
        return fn
    rng = _rng()
    points, failures = [], []
    for case in range(12):
        B, k = int(rng.integers(1, 7)), int(rng.integers(1, 7))
        lengths = torch.as_tensor(rng.integers(1, 60, B), dtype=torch.long)
        accept = torch.as_tensor(rng.integers(0, k + 1, B), dtype=torch.long)
        done = torch.as_tensor(rng.random(B) < (0.0 if case == 0 else 0.3))
        if case == 1:
            accept.zero_()  # nothing accepted: the pending token's slot is still kept
        want_len, want_rb = _reference_commit(lengths, accept, k, done)
        got = _call(fn, lengths.clone(), accept.clone(), k, done.clone())
        if isinstance(got, _Failed):
            points.append(0.0)
            failures.append(f"B={B}, k={k}: {got}")
            continue
        pair = _pair(got, "commit_step", "(new_lengths [B], rolled_back [B, k+1])")
        if isinstance(pair, CheckResult):
            return pair
        new = _vector(pair[0], B, "new_lengths", integer=True)
        if isinstance(new, str):
            return CheckResult(0.0, f"B={B}, k={k}: {new}")
        rb = _numpy(pair[1])
        if rb is None or rb.shape != (B, k + 1):
            shape = None if rb is None else tuple(rb.shape)
            return CheckResult(0.0, f"B={B}, k={k}: rolled_back must be a boolean [B, k+1] = ({B}, {k + 1}) "
                                    f"mask over the provisional slots, got shape {shape}")
        len_ok = np.array_equal(new, want_len.numpy())
        rb_ok = rb.dtype != object and np.array_equal(rb.astype(bool), want_rb.numpy())
        points.append((len_ok + rb_ok) / 2)
        where = (f"lengths={lengths.tolist()}, accept_length={accept.tolist()}, k={k}, "
                 f"done={done.int().tolist()}")
        if not len_ok:
            hint = ""
            if np.array_equal(new, (lengths + torch.where(done, 0, accept)).numpy()):
                hint = " (the block started with the pending token: its slot is kept too, so accepted + 1)"
            elif np.array_equal(new, (lengths + accept + 1).numpy()):
                hint = " (a row that is done rides along: its length does not move)"
            failures.append(f"{where}: new lengths expected {want_len.tolist()}, got {new.tolist()}{hint}")
        if not rb_ok:
            failures.append(f"{where}: rolled_back expected {want_rb.int().tolist()}, "
                            f"got {rb.astype(int).tolist() if rb.dtype != object else rb}")
    score = sum(points) / len(points)
    if score == 1.0:
        return CheckResult(1.0, f"new lengths and rolled-back slots correct on all {len(points)} random batches")
    return CheckResult(score, f"{score:.0%} of the values right over {len(points)} random batches; "
                              f"first failure: {failures[0]}")


# --- q3 ----------------------------------------------------------------------------------------


def _random_log(rng: np.random.Generator, k: int, steps: int, B: int) -> np.ndarray:
    """An accept-length log [steps, B] as Decoder.generate returns it: -1 once a row has stopped."""
    alpha = rng.uniform(0.2, 0.95, B)
    log = np.cumprod(rng.random((steps, B, k)) < alpha[None, :, None], axis=2).sum(2)
    stop = rng.integers(1, steps + 1, B)
    stop[rng.integers(B)] = steps  # the batch ends when its last row stops
    log[np.arange(steps)[:, None] >= stop[None, :]] = -1
    return log.astype(np.int64)


@exercise("lab2.q3", points=2, title="tau and acceptance by position from a decode log")
def check_acceptance_from_log(ns: dict[str, Any]) -> CheckResult:
    fn = _lookup(ns, "acceptance_from_log", "(accept_log, k)")
    if isinstance(fn, CheckResult):
        return fn
    rng = _rng()
    points, failures = [], []
    for case in range(10):
        k, steps, B = int(rng.integers(1, 7)), int(rng.integers(3, 41)), int(rng.integers(1, 6))
        if case == 0:
            B = max(B, 3)
        log = _random_log(rng, k, steps, B)
        s = stats.AcceptanceStats.from_accept_lengths(log[log >= 0], k)
        got = _call(fn, log.copy(), k)
        if isinstance(got, _Failed):
            points.append(0.0)
            failures.append(f"k={k}, log of {steps} steps x {B} rows: {got}")
            continue
        pair = _pair(got, "acceptance_from_log", "(tau, by_position)")
        if isinstance(pair, CheckResult):
            return pair
        tau = _number(pair[0])
        if tau is None:
            return CheckResult(0.0, f"tau must be a number, got {_short(pair[0])}")
        pos = _vector(pair[1], k, "by_position")
        if isinstance(pos, str):
            return CheckResult(0.0, f"k={k}: {pos} (one acceptance fraction per draft position 1..k)")
        tau_ok = abs(tau - s.tau) < 1e-9
        pos_ok = pos.dtype != object and np.allclose(pos.astype(float), s.by_position, atol=1e-9)
        points.append((tau_ok + pos_ok) / 2)
        where = f"k={k}, {steps} steps x {B} rows"
        if not tau_ok:
            valid = log[log >= 0]
            hint = ""
            if abs(tau - (s.tau - 1)) < 1e-9:
                hint = " (tau counts the bonus/correction token: mean accepted + 1)"
            elif abs(tau - (np.where(log >= 0, log, 0).mean() + 1)) < 1e-9 or abs(tau - (log.mean() + 1)) < 1e-9:
                hint = " (leave out the -1 entries: a stopped row took no verify step)"
            failures.append(f"{where}: tau expected {s.tau:.4f} over {valid.size} row-steps, got {tau:.4f}{hint}")
        if not pos_ok:
            valid = log[log >= 0]
            hint = ""
            if np.allclose(pos.astype(float), np.bincount(valid, minlength=k + 1)[1:] / valid.size, atol=1e-9):
                hint = (" (draft i is accepted whenever the accept length is >= i, not only when it is exactly i)")
            failures.append(f"{where}: by_position expected {np.round(s.by_position, 4).tolist()}, "
                            f"got {np.round(pos.astype(float), 4).tolist()}{hint}")
    score = sum(points) / len(points)
    if score == 1.0:
        return CheckResult(1.0, f"tau and acceptance by position correct on all {len(points)} random logs")
    return CheckResult(score, f"{score:.0%} of the values right over {len(points)} random logs; "
                              f"first failure: {failures[0]}")


# --- q4 ----------------------------------------------------------------------------------------


@exercise("lab2.q4", points=1, title="tokens per second and speedup from timings")
def check_speedup_of(ns: dict[str, Any]) -> CheckResult:
    fn = _lookup(ns, "speedup_of", "(spec_tokens, spec_wall_s, plain_tokens, plain_wall_s)")
    if isinstance(fn, CheckResult):
        return fn
    rng = _rng()
    passed, failures = [], []
    for _ in range(10):
        B = int(rng.integers(1, 6))
        spec = [rng.integers(0, 4096, int(rng.integers(1, 90))).tolist() for _ in range(B)]
        plain = [rng.integers(0, 4096, int(rng.integers(1, 90))).tolist() for _ in range(B)]
        ws, wp = float(rng.uniform(0.05, 5.0)), float(rng.uniform(0.05, 5.0))
        n_s, n_p = sum(map(len, spec)), sum(map(len, plain))
        want_tps = n_s / ws
        want_speedup = want_tps / (n_p / wp)
        got = _call(fn, [list(r) for r in spec], ws, [list(r) for r in plain], wp)
        if isinstance(got, _Failed):
            passed.append(False)
            failures.append(f"{B} rows: {got}")
            continue
        pair = _pair(got, "speedup_of", "(tokens_per_s, speedup)")
        if isinstance(pair, CheckResult):
            return pair
        tps, sp = _number(pair[0]), _number(pair[1])
        if tps is None or sp is None:
            return CheckResult(0.0, f"speedup_of must return two numbers (tokens_per_s, speedup), got {_short(got)}")
        ok = abs(tps - want_tps) <= 1e-9 * want_tps and abs(sp - want_speedup) <= 1e-9 * want_speedup
        passed.append(ok)
        if not ok:
            hint = ""
            if abs(tps - B / ws) <= 1e-9 * B / ws:
                hint = " (count the generated tokens of every row, not the rows)"
            elif abs(sp - wp / ws) <= 1e-9 * wp / ws:
                hint = " (a ratio of wall times is a speedup only when both runs made the same number of tokens)"
            elif abs(sp - 1 / want_speedup) <= 1e-9 / want_speedup:
                hint = " (speedup = speculative tokens/s over plain tokens/s: > 1 means faster)"
            failures.append(f"{n_s} tokens in {ws:.3f} s vs plain {n_p} tokens in {wp:.3f} s: expected "
                            f"({want_tps:.3f}, {want_speedup:.4f}), got ({tps:.3f}, {sp:.4f}){hint}")
    return _score(passed, failures, "pairs of runs")


# --- q5 ----------------------------------------------------------------------------------------


@exercise("lab2.q5", points=1, title="the speedup predicted from measured costs")
def check_predicted_speedup(ns: dict[str, Any]) -> CheckResult:
    fn = _lookup(ns, "predicted_speedup", "(tau, k, t_plain, t_draft, t_verify)")
    if isinstance(fn, CheckResult):
        return fn
    rng = _rng()
    passed, failures = [], []
    for case in range(12):
        k = int(rng.integers(1, 9))
        tau = float(rng.uniform(1, k + 1)) if case else 1.0
        t_plain = float(rng.uniform(1e-3, 3e-2))
        t_verify = t_plain * float(rng.uniform(1.0, 2.5))
        t_draft = 0.0 if case == 1 else t_plain * float(rng.uniform(0.01, 0.6))
        want = formulas.speedup_from_costs(tau, t_plain, t_draft, t_verify, k)
        got = _call(fn, tau, k, t_plain, t_draft, t_verify)
        if isinstance(got, _Failed):
            passed.append(False)
            failures.append(f"tau={tau:.3f}, k={k}: {got}")
            continue
        x = _number(got)
        if x is None:
            return CheckResult(0.0, f"predicted_speedup must return a number, got {_short(got)}")
        ok = abs(x - want) <= 1e-9 * want
        passed.append(ok)
        if not ok:
            hint = ""
            if abs(x - tau * t_plain / (t_draft + t_verify)) <= 1e-9 * want:
                hint = " (t_draft is the cost of one draft token: a step pays k of them)"
            elif abs(x - tau * t_plain / (k * t_draft + t_plain)) <= 1e-9 * want:
                hint = " (a verify step costs t_verify, not t_plain: k + 1 positions cost more than one)"
            elif tau > 1 and abs(x - (tau - 1) * t_plain / (k * t_draft + t_verify)) <= 1e-9 * want:
                hint = " (tau already counts every token of a step, the bonus/correction included)"
            failures.append(f"tau={tau:.3f}, k={k}, t_plain={t_plain * 1e3:.3f} ms, t_draft={t_draft * 1e3:.3f} ms, "
                            f"t_verify={t_verify * 1e3:.3f} ms: expected {want:.4f}, got {x:.4f}{hint}")
    return _score(passed, failures, "sets of costs")


# --- q6 ----------------------------------------------------------------------------------------


def alpha_from_rate(rate: float, k: int) -> float:
    """The i.i.d. alpha whose per-draft acceptance rate at k drafts, (tau(alpha, k) - 1) / k, is rate."""
    lo, hi = 0.0, 1.0
    for _ in range(60):  # the rate grows strictly with alpha
        mid = (lo + hi) / 2
        if (formulas.expected_tokens_per_step(mid, k) - 1) / k < rate:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@exercise("lab2.q6", points=2, title="choosing k from a measured acceptance rate")
def check_choose_k(ns: dict[str, Any]) -> CheckResult:
    fn = _lookup(ns, "choose_k", "(rate, k, c, k_max=8)")
    if isinstance(fn, CheckResult):
        return fn
    rng = _rng()
    cases = [(0.0, int(rng.integers(2, 7)), 0.1, 8), (1.0, int(rng.integers(1, 7)), 0.05, 8),
             (None, 1, float(rng.uniform(0.02, 0.3)), 8), (None, int(rng.integers(2, 7)), 0.0, 6)]
    cases += [(None, int(rng.integers(2, 9)), float(rng.uniform(0.01, 0.5)), int(rng.choice([4, 6, 8, 12])))
              for _ in range(8)]
    points, failures = [], []
    for rate, k, c, k_max in cases:
        if rate is None:  # a rate that an i.i.d. alpha in (0.1, 0.97) would give at k drafts
            a = float(rng.uniform(0.1, 0.97))
            rate = float((formulas.expected_tokens_per_step(a, k) - 1) / k)
        alpha = alpha_from_rate(rate, k)
        want_k, best = formulas.optimal_k(alpha, c, k_max)
        got = _call(fn, rate, k, c, k_max)
        where = f"rate={rate:.4f} at k={k}, c={c:.3f}, k_max={k_max}"
        if isinstance(got, _Failed):
            points.append(0.0)
            failures.append(f"{where}: {got}")
            continue
        pair = _pair(got, "choose_k", "(alpha, k_best)")
        if isinstance(pair, CheckResult):
            return pair
        a_got, k_got = _number(pair[0]), pair[1]
        if a_got is None:
            return CheckResult(0.0, f"alpha must be a number, got {_short(pair[0])}")
        alpha_ok = abs(a_got - alpha) < 1e-6
        k_ok = (isinstance(k_got, (int, np.integer, float, np.floating)) and not isinstance(k_got, bool)
                and np.isfinite(k_got) and k_got == int(k_got) and 1 <= k_got <= k_max
                and formulas.walltime_improvement(alpha, int(k_got), c) >= best * (1 - 1e-9))
        points.append((alpha_ok + k_ok) / 2)
        if not alpha_ok:
            hint = ""
            if abs(a_got - rate) < 1e-9 and k > 1:
                hint = (" (the rate is not alpha: drafts after a rejection count as not accepted, so the rate "
                        "is (alpha + ... + alpha^k) / k; solve for alpha)")
            failures.append(f"{where}: alpha expected {alpha:.6f}, got {a_got:.6f}{hint}")
        if not k_ok:
            failures.append(f"{where}: expected k_best={want_k} ({best:.3f}x at alpha={alpha:.4f}), got {k_got!r}")
    score = sum(points) / len(points)
    if score == 1.0:
        return CheckResult(1.0, f"alpha and the best k correct on all {len(points)} random measurements")
    return CheckResult(score, f"{score:.0%} of the values right over {len(points)} random measurements; "
                              f"first failure: {failures[0]}")
