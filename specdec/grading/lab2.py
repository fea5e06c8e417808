"""Lab 2's exercises (a static-k MTP decoder in PyTorch), declared as data: see exercise.py.

Each calls the student's function on synthetic tensors and compares with specdec: greedy_accept,
the KVCache's commit/rollback, AcceptanceStats, formulas and the drafters' training loss. No checkpoint is loaded: q8's verify step
runs on a tiny random-weight model (codec.Model), built alike in the grader and in the kernel; q9 and q10
check a draft tree's attention mask and its greedy walk against specdec.decoder.tree and verify.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specdec.decoder.draft_modules import chained_soft_ce, soft_ce
from specdec.decoder.kv_cache import KVCache
from specdec.decoder.tree import tree_mask
from specdec.decoder.verify import greedy_accept, tree_greedy_accept
from specdec.decoder.model import Transformer
from specdec.grading.answers import as_numpy, close, number, pair, short, vector, whole_in
from specdec.grading.codec import Model, build_model
from specdec.grading.exercise import Case, Exercise, Part, WrongShape
from specdec.sim import formulas, stats

# --- q1: greedy verification of a batch ------------------------------------------------------------


def verify_case(rng: np.random.Generator, B: int, k: int, V: int, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
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


def verify_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for kind in ["all", "none", "mixed", "k1"] + ["mixed"] * 8:
        B, V = int(rng.integers(1, 7)), int(rng.integers(5, 60))
        k = 1 if kind == "k1" else int(rng.integers(2, 7))
        cases.append(Case(verify_case(rng, B, k, V, kind), shown=f"B={B}, k={k}"))
    return cases


def accepted_and_next(case: Case, got: Any, name: str, B: int) -> tuple[np.ndarray, np.ndarray]:
    """The answer (accepted [B], next_token [B]) as two integer vectors; WrongShape, naming the case, if it is not."""
    answer = pair(got, name, "(accepted [B], next_token [B])")
    try:
        return vector(answer[0], B, "accepted", integer=True), vector(answer[1], B, "next_token", integer=True)
    except WrongShape as exc:
        raise WrongShape(f"{case.shown}: {exc}") from None


def judge_verify(case: Case, got: Any, want: tuple[torch.Tensor, torch.Tensor]) -> str | None:
    draft, logits = case.args
    B, k = draft.shape
    n, t = accepted_and_next(case, got, "greedy_verify_batch", B)
    want_n, want_t = (w.numpy() for w in want)
    if np.array_equal(n, want_n) and np.array_equal(t, want_t):
        return None
    b = int(np.flatnonzero((n != want_n) | (t != want_t))[0])
    hint = ""
    if n[b] != want_n[b] and n[b] == int((draft[b].numpy() == logits[b, :k].argmax(-1).numpy()).sum()):
        hint = " (only the leading matches count: a draft after a rejection was drafted after a wrong token)"
    elif n[b] == want_n[b] and want_n[b] == k:
        hint = " (all k accepted: the next token is the bonus, the argmax at position k + 1)"
    elif n[b] == want_n[b]:
        hint = " (after a rejection the next token is the target's argmax at the rejected position)"
    return (f"row {b}: drafts {draft[b].tolist()}, target argmax {logits[b].argmax(-1).tolist()}: expected "
            f"accepted={want_n[b]}, next_token={want_t[b]}; got {n[b]}, {t[b]}{hint}")


Q1 = Exercise(
    id="lab2.q1", points=2, title="greedy verification of a batch of blocks", reads="greedy_verify_batch",
    signature="(draft, target_logits)",
    parts=(Part(verify_cases, judge_verify, greedy_accept, what="batches"),),
    stand_in="specdec.decoder.verify:greedy_accept",
)


# --- q2: commit and rollback ------------------------------------------------------------------------


def reference_commit(lengths: torch.Tensor, accept: torch.Tensor, k: int, done: torch.Tensor):
    """What a real KVCache does: provisional writes at lengths + 0..k, commit of accepted + 1 for
    running rows; slots past the new length are rolled back (ignored, later overwritten)."""
    B = lengths.shape[0]
    cache = KVCache(1, B, 1, 1, int(lengths.max()) + k + 2)
    cache.lengths.copy_(lengths)
    pos = cache.positions(k + 1)  # [B, k+1]
    ones = torch.ones(B, 1, k + 1, 1)
    cache.write(0, ones, ones, pos)  # the verify step's provisional writes
    cache.commit(torch.where(done, 0, accept + 1))
    return cache.lengths.clone(), pos >= cache.lengths.unsqueeze(1)


def commit_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for i in range(12):
        B, k = int(rng.integers(1, 7)), int(rng.integers(1, 7))
        lengths = torch.as_tensor(rng.integers(1, 60, B), dtype=torch.long)
        accept = torch.as_tensor(rng.integers(0, k + 1, B), dtype=torch.long)
        done = torch.as_tensor(rng.random(B) < (0.0 if i == 0 else 0.3))
        if i == 1:
            accept.zero_()  # nothing accepted: the pending token's slot is still kept
        shown = f"lengths={lengths.tolist()}, accepted={accept.tolist()}, k={k}, done={done.int().tolist()}"
        cases.append(Case((lengths, accept, k, done), shown=shown))
    return cases


def judge_commit(case: Case, got: Any, want: tuple[torch.Tensor, torch.Tensor]) -> list[str | None]:
    lengths, accept, k, done = case.args
    B = len(lengths)
    answer = pair(got, "commit_step", "(new_lengths [B], rolled_back [B, k+1])")
    try:
        new = vector(answer[0], B, "new_lengths", integer=True)
    except WrongShape as exc:
        raise WrongShape(f"B={B}, k={k}: {exc}") from None
    rb = as_numpy(answer[1])
    if rb is None or rb.shape != (B, k + 1):
        raise WrongShape(f"B={B}, k={k}: rolled_back must be a boolean [B, k+1] = ({B}, {k + 1}) mask over the "
                         f"provisional slots, got shape {None if rb is None else tuple(rb.shape)}")
    want_len, want_rb = want
    len_why = rb_why = None
    if not np.array_equal(new, want_len.numpy()):
        hint = ""
        if np.array_equal(new, (lengths + torch.where(done, 0, accept)).numpy()):
            hint = " (the block started with the pending token: its slot is kept too, so accepted + 1)"
        elif np.array_equal(new, (lengths + accept + 1).numpy()):
            hint = " (a row that is done rides along: its length does not move)"
        len_why = f"new lengths expected {want_len.tolist()}, got {new.tolist()}{hint}"
    if not np.array_equal(rb.astype(bool), want_rb.numpy()):
        rb_why = f"rolled_back expected {want_rb.int().tolist()}, got {rb.astype(int).tolist()}"
    return [len_why, rb_why]


Q2 = Exercise(
    id="lab2.q2", points=2, title="KV-cache bookkeeping after a verify step: commit and rollback",
    reads="commit_step", signature="(lengths, accepted, k, done)",
    parts=(Part(commit_cases, judge_commit, reference_commit, what="batches"),),
)


# --- q3: statistics of a decode log -----------------------------------------------------------------


def random_log(rng: np.random.Generator, k: int, steps: int, B: int) -> np.ndarray:
    """An accept-length log [steps, B] as Decoder.generate returns it: -1 once a row has stopped."""
    alpha = rng.uniform(0.2, 0.95, B)
    log = np.cumprod(rng.random((steps, B, k)) < alpha[None, :, None], axis=2).sum(2)
    stop = rng.integers(1, steps + 1, B)
    stop[rng.integers(B)] = steps  # the batch ends when its last row stops
    log[np.arange(steps)[:, None] >= stop[None, :]] = -1
    return log.astype(np.int64)


def log_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for i in range(10):
        k, steps, B = int(rng.integers(1, 7)), int(rng.integers(3, 41)), int(rng.integers(1, 6))
        if i == 0:
            B = max(B, 3)
        cases.append(Case((random_log(rng, k, steps, B), k), shown=f"k={k}, {steps} steps x {B} rows"))
    return cases


def log_stats(log: np.ndarray, k: int) -> stats.AcceptanceStats:
    return stats.AcceptanceStats.from_accepted(log[log >= 0], k)


def judge_log(case: Case, got: Any, want: stats.AcceptanceStats) -> list[str | None]:
    log, k = case.args
    answer = pair(got, "acceptance_from_log", "(tau, by_position)")
    tau = number(answer[0])
    if tau is None:
        raise WrongShape(f"tau must be a number, got {short(answer[0])}")
    try:
        pos = vector(answer[1], k, "by_position").astype(float)
    except WrongShape as exc:
        raise WrongShape(f"k={k}: {exc} (one acceptance fraction per draft position 1..k)") from None
    valid = log[log >= 0]
    tau_why = pos_why = None
    if not close(tau, want.tau, abs_=1e-9):
        hint = ""
        if abs(tau - (want.tau - 1)) < 1e-9:
            hint = " (tau counts the bonus/correction token: mean accepted + 1)"
        elif abs(tau - (np.where(log >= 0, log, 0).mean() + 1)) < 1e-9 or abs(tau - (log.mean() + 1)) < 1e-9:
            hint = " (leave out the -1 entries: a stopped row took no verify step)"
        tau_why = f"tau expected {want.tau:.4f} over {valid.size} row-steps, got {tau:.4f}{hint}"
    if not np.allclose(pos, want.by_position, atol=1e-9):
        hint = ""
        if np.allclose(pos, np.bincount(valid, minlength=k + 1)[1:] / valid.size, atol=1e-9):
            hint = " (draft i is accepted whenever the accept length is >= i, not only when it is exactly i)"
        pos_why = (f"by_position expected {np.round(want.by_position, 4).tolist()}, "
                   f"got {np.round(pos, 4).tolist()}{hint}")
    return [tau_why, pos_why]


Q3 = Exercise(
    id="lab2.q3", points=2, title="tau and acceptance by position from a decode log", reads="acceptance_from_log",
    signature="(accept_log, k)",
    parts=(Part(log_cases, judge_log, log_stats, what="logs"),),
    answered_by=("specdec.sim.stats:AcceptanceStats.from_accepted",),  # what log_stats hands it to
)


# --- q4: tokens/s and speedup -----------------------------------------------------------------------


def run_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for _ in range(10):
        B = int(rng.integers(1, 6))
        spec = [rng.integers(0, 4096, int(rng.integers(1, 90))).tolist() for _ in range(B)]
        plain = [rng.integers(0, 4096, int(rng.integers(1, 90))).tolist() for _ in range(B)]
        ws, wp = float(rng.uniform(0.05, 5.0)), float(rng.uniform(0.05, 5.0))
        n_s, n_p = sum(map(len, spec)), sum(map(len, plain))
        cases.append(Case((spec, ws, plain, wp), shown=f"{n_s} tokens in {ws:.3f} s vs plain {n_p} tokens in {wp:.3f} s"))
    return cases


def reference_speedup(spec: list, ws: float, plain: list, wp: float) -> tuple[float, float]:
    tps = sum(map(len, spec)) / ws
    return tps, tps / (sum(map(len, plain)) / wp)


def judge_speedup(case: Case, got: Any, want: tuple[float, float]) -> str | None:
    spec, ws, plain, wp = case.args
    tps, sp = (number(x) for x in pair(got, "speedup_of", "(tokens_per_s, speedup)"))
    if tps is None or sp is None:
        raise WrongShape(f"speedup_of must return two numbers (tokens_per_s, speedup), got {short(got)}")
    want_tps, want_sp = want
    if abs(tps - want_tps) <= 1e-9 * want_tps and abs(sp - want_sp) <= 1e-9 * want_sp:
        return None
    hint = ""
    if abs(tps - len(spec) / ws) <= 1e-9 * len(spec) / ws:
        hint = " (count the generated tokens of every row, not the rows)"
    elif abs(sp - wp / ws) <= 1e-9 * wp / ws:
        hint = " (a ratio of wall times is a speedup only when both runs made the same number of tokens)"
    elif abs(sp - 1 / want_sp) <= 1e-9 / want_sp:
        hint = " (speedup = speculative tokens/s over plain tokens/s: > 1 means faster)"
    return f"expected ({want_tps:.3f}, {want_sp:.4f}), got ({tps:.3f}, {sp:.4f}){hint}"


Q4 = Exercise(
    id="lab2.q4", points=1, title="tokens per second and speedup from timings", reads="speedup_of",
    signature="(spec_tokens, spec_wall_s, plain_tokens, plain_wall_s)",
    parts=(Part(run_cases, judge_speedup, reference_speedup, what="pairs of runs"),),
)


# --- q5: the speedup predicted from costs -----------------------------------------------------------


def cost_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for i in range(12):
        k = int(rng.integers(1, 9))
        tau = float(rng.uniform(1, k + 1)) if i else 1.0
        t_plain = float(rng.uniform(1e-3, 3e-2))
        t_verify = t_plain * float(rng.uniform(1.0, 2.5))
        t_draft = 0.0 if i == 1 else t_plain * float(rng.uniform(0.01, 0.6))
        shown = (f"tau={tau:.3f}, k={k}, t_plain={t_plain * 1e3:.3f} ms, t_draft={t_draft * 1e3:.3f} ms, "
                 f"t_verify={t_verify * 1e3:.3f} ms")
        cases.append(Case((tau, k, t_plain, t_draft, t_verify), shown=shown))
    return cases


def reference_predicted(tau: float, k: int, t_plain: float, t_draft: float, t_verify: float) -> float:
    return formulas.speedup_from_costs(tau, t_plain, t_draft, t_verify, k)


def judge_predicted(case: Case, got: Any, want: float) -> str | None:
    tau, k, t_plain, t_draft, t_verify = case.args
    x = number(got)
    if x is None:
        raise WrongShape(f"predicted_speedup must return a number, got {short(got)}")
    if abs(x - want) <= 1e-9 * want:
        return None
    hint = ""
    if abs(x - tau * t_plain / (t_draft + t_verify)) <= 1e-9 * want:
        hint = " (t_draft is the cost of one draft token: a step pays k of them)"
    elif abs(x - tau * t_plain / (k * t_draft + t_plain)) <= 1e-9 * want:
        hint = " (a verify step costs t_verify, not t_plain: k + 1 positions cost more than one)"
    elif tau > 1 and abs(x - (tau - 1) * t_plain / (k * t_draft + t_verify)) <= 1e-9 * want:
        hint = " (tau already counts every token of a step, the bonus/correction included)"
    return f"expected {want:.4f}, got {x:.4f}{hint}"


Q5 = Exercise(
    id="lab2.q5", points=1, title="the speedup predicted from measured costs", reads="predicted_speedup",
    signature="(tau, k, t_plain, t_draft, t_verify)",
    parts=(Part(cost_cases, judge_predicted, reference_predicted, what="sets of costs"),),
    answered_by=("specdec.sim.formulas:speedup_from_costs",),
)


# --- q6: choosing k ---------------------------------------------------------------------------------


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


def rate_cases(rng: np.random.Generator) -> list[Case]:
    cases = [(0.0, int(rng.integers(2, 7)), 0.1, 8), (1.0, int(rng.integers(1, 7)), 0.05, 8),
             (None, 1, float(rng.uniform(0.02, 0.3)), 8), (None, int(rng.integers(2, 7)), 0.0, 6)]
    cases += [(None, int(rng.integers(2, 9)), float(rng.uniform(0.01, 0.5)), int(rng.choice([4, 6, 8, 12])))
              for _ in range(8)]
    out = []
    for rate, k, c, k_max in cases:
        if rate is None:  # a rate that an i.i.d. alpha in (0.1, 0.97) would give at k drafts
            rate = float((formulas.expected_tokens_per_step(float(rng.uniform(0.1, 0.97)), k) - 1) / k)
        out.append(Case((rate, k, c, k_max), shown=f"rate={rate:.4f} at k={k}, c={c:.3f}, k_max={k_max}"))
    return out


def reference_choice(rate: float, k: int, c: float, k_max: int) -> tuple[float, int, float]:
    alpha = alpha_from_rate(rate, k)
    return (alpha, *formulas.optimal_k(alpha, c, k_max))


def judge_choice(case: Case, got: Any, want: tuple[float, int, float]) -> list[str | None]:
    rate, k, c, k_max = case.args
    first, k_got = pair(got, "choose_k", "(alpha, k_best)")
    a_got = number(first)
    if a_got is None:
        raise WrongShape(f"alpha must be a number, got {short(first)}")
    alpha, want_k, best = want
    alpha_why = k_why = None
    if not close(a_got, alpha, abs_=1e-6):
        hint = ""
        if abs(a_got - rate) < 1e-9 and k > 1:
            hint = (" (the rate is not alpha: drafts after a rejection count as not accepted, so the rate "
                    "is (alpha + ... + alpha^k) / k; solve for alpha)")
        alpha_why = f"alpha expected {alpha:.6f}, got {a_got:.6f}{hint}"
    if not (whole_in(k_got, 1, k_max) and formulas.walltime_improvement(alpha, int(k_got), c) >= best * (1 - 1e-9)):
        k_why = f"expected k_best={want_k} ({best:.3f}x at alpha={alpha:.4f}), got {short(k_got)}"
    return [alpha_why, k_why]


Q6 = Exercise(
    id="lab2.q6", points=2, title="choosing k from a measured acceptance rate", reads="choose_k",
    signature="(rate, k, c, k_max=8)",
    parts=(Part(rate_cases, judge_choice, reference_choice, what="measurements"),),
)


# --- q7: the loss of a chained drafter ----------------------------------------------------------------


def chain_case(rng: np.random.Generator, D: int, kind: str) -> tuple[list[torch.Tensor], torch.Tensor, list[float]]:
    """Logits of D draft steps [B, T, V] each, the teacher's distributions [B, T, V] and D weights."""
    B, T, V = int(rng.integers(1, 4)), int(rng.integers(D + 1, D + 7)), int(rng.integers(4, 24))
    logits = [torch.as_tensor(rng.normal(0, 2, (B, T, V)), dtype=torch.float32) + float(rng.normal(0, 3))
              for _ in range(D)]  # the offset: logits are not log-probabilities
    sharp = {"onehot": 50.0, "flat": 0.3}.get(kind, float(rng.uniform(0.5, 2.0)))
    teacher = torch.as_tensor(rng.normal(0, sharp, (B, T, V)), dtype=torch.float32).softmax(-1)
    weights = [1.0] if D == 1 else [round(float(w), 3) for w in rng.uniform(0.1, 1.5, D)]
    if kind == "decay":
        weights = [round(0.7 ** d, 3) for d in range(D)]
    return logits, teacher, weights


def chain_cases(rng: np.random.Generator) -> list[Case]:
    kinds = [(1, "soft"), (4, "decay"), (3, "onehot"), (2, "flat")] + [(int(rng.integers(2, 6)), "soft") for _ in range(8)]
    cases = []
    for D, kind in kinds:
        logits, teacher, weights = chain_case(rng, D, kind)
        B, T, V = teacher.shape
        cases.append(Case((logits, teacher, weights), shown=f"D={D} steps, B={B}, T={T}, V={V}, weights={weights}"))
    return cases


def chain_mistakes(logits: list[torch.Tensor], teacher: torch.Tensor, weights: list[float]) -> dict[str, float]:
    """Losses that common mistakes give, with what each one forgot."""
    D = len(weights)
    plain = [soft_ce(x[:, d:], teacher[:, d:]).item() for d, x in enumerate(logits)]
    every = [soft_ce(x, teacher).item() for x in logits]
    hard = [torch.nn.functional.cross_entropy(x[:, d:].flatten(0, 1), teacher[:, d:].argmax(-1).flatten()).item()
            for d, x in enumerate(logits)]
    raw = [-(teacher[:, d:] * x[:, d:]).sum(-1).mean().item() for d, x in enumerate(logits)]
    summed = [plain[d] * teacher[:, d:, 0].numel() for d in range(D)]
    late = [soft_ce(x[:, d + 1:], teacher[:, d + 1:]).item() if d + 1 < x.shape[1] else 0.0 for d, x in enumerate(logits)]
    ahead = [soft_ce(x[:, : x.shape[1] - d], teacher[:, d:]).item() for d, x in enumerate(logits)]
    dot = lambda xs: sum(w * x for w, x in zip(weights, xs))  # noqa: E731
    return {
        "the weights multiply each step's loss: a plain sum drops them": sum(plain),
        "the weights already say how much each step counts: do not divide by the number of steps": dot(plain) / D,
        "the weights are used as given, not normalised to sum to 1": dot(plain) / sum(weights),
        "weights[0] belongs to step 1, the first draft": dot(plain[::-1]),
        "a position p < d - 1 has no anchor at step d: leave it out": dot(every),
        "step d has anchors from position d - 1 on (step 1 from position 0)": dot(late),
        "step d at position p predicts the same token as teacher[:, p]: no shift between them": dot(ahead),
        "the labels are the teacher's whole distributions (soft), not its argmax": dot(hard),
        "logits are not log-probabilities: normalise them (log-softmax) first": dot(raw),
        "average each step's loss over its positions, do not sum it": dot(summed),
    }


def judge_chain(case: Case, got: Any, want: torch.Tensor) -> str | None:
    if isinstance(got, torch.Tensor):
        got = got.detach()
    x = number(got)
    if x is None:
        raise WrongShape(f"chained_loss must return one number (a 0-d tensor or a float), got {short(got)}")
    w = float(want)
    if close(x, w, rel=1e-4, abs_=1e-5):
        return None
    hint = next((f" ({why})" for why, v in chain_mistakes(*case.args).items() if close(x, v, rel=1e-4, abs_=1e-5)), "")
    return f"expected {w:.5f}, got {x:.5f}{hint}"


Q7 = Exercise(
    id="lab2.q7", points=2, title="the loss of a drafter chained over several draft steps", reads="chained_loss",
    signature="(depth_logits, teacher_probs, weights)",
    parts=(Part(chain_cases, judge_chain, chained_soft_ce, what="chains"),),
    answered_by=("specdec.decoder.draft_modules:soft_ce",),  # the per-step loss is part of the answer
)

# --- q8: a verify step on a real KV cache -----------------------------------------------------------

TINY = (("vocab_size", 64), ("hidden_size", 32), ("intermediate_size", 64), ("num_hidden_layers", 2),
        ("num_attention_heads", 4), ("num_key_value_heads", 2), ("max_position_embeddings", 128))
CONTINUE = 4  # plain greedy steps after the step: from the student's cache and from a fresh one
SPARE = 3  # slots past what a right step needs, so that a step that keeps too much still fits


def one_thread(fn):
    """Run fn with torch on one thread: the tiny model's matrices are too small to share out, and on a busy
    machine threads that wait for each other cost seconds of CPU time per batch instead of milliseconds."""

    @functools.wraps(fn)
    def wrapped(*args, **kw):
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fn(*args, **kw)
        finally:
            torch.set_num_threads(before)

    return wrapped


@functools.lru_cache(maxsize=8)
def tiny_target(m: Model) -> Transformer:
    """The grader's copy of the model a case names (the kernel builds its own from the same seed)."""
    return build_model(m)


def clone_cache(cache: KVCache) -> KVCache:
    copy = cache.rows(0, cache.batch)
    copy.k, copy.v = [t.clone() for t in cache.k], [t.clone() for t in cache.v]
    copy.lengths = cache.lengths.clone()
    return copy


@torch.no_grad()
def greedy_run(model: Transformer, cache: KVCache, first: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain greedy decoding: feed each row's token first [B], then what it emits.
    -> n tokens [B, n] and the logits they were read from [B, n, V]."""
    out, seen, cur = [], [], first
    for _ in range(n):
        logits, _ = model(cur[:, None], cache.positions(1), cache)  # [B, 1, V]
        cache.commit(1, check=False)  # sized by the caller
        cur = logits[:, 0].argmax(-1)
        out.append(cur)
        seen.append(logits[:, 0])
    return torch.stack(out, 1), torch.stack(seen, 1)


@torch.no_grad()
def prefilled(model: Transformer, rows: list[list[int]], max_len: int) -> KVCache:
    """A fresh cache holding exactly the KV of each row's tokens (one forward per row, no padding)."""
    cache = KVCache.for_model(model, len(rows), max_len)
    for b, ids in enumerate(rows):
        row = cache.rows(b, b + 1)
        if ids:
            model(torch.tensor([ids]), torch.arange(len(ids))[None], row)
            row.commit(len(ids), check=False)
    return cache


@dataclass(frozen=True)
class StepCase(Case):
    prompts: tuple = ()  # each row's tokens in the cache: what a fresh cache is rebuilt from


def step_case(rng: np.random.Generator, m: Model, kind: str) -> StepCase:
    """A batch after its prefill: the prompts' KV committed, each row's pending token (the target's greedy
    next token), and k drafts per row that follow the target's own greedy text up to a planted mistake."""
    model = tiny_target(m)
    V = model.config.vocab_size
    B, k = int(rng.integers(2, 5)), int(rng.integers(1, 6))
    lens = rng.integers(2, 12, B)
    prompts = [rng.integers(0, V, int(n)).tolist() for n in lens]
    cache = prefilled(model, prompts, int(lens.max()) + k + 1 + CONTINUE + SPARE)
    with torch.no_grad():
        pending = torch.stack([model(torch.tensor([p]))[0][0, -1].argmax() for p in prompts])  # [B]
    truth, _ = greedy_run(model, clone_cache(cache), pending, k)  # [B, k]: what the target says after pending
    drafts = truth.clone()
    done = torch.zeros(B, dtype=torch.bool)
    for b in range(B):
        # mixed: row 0 rejects somewhere, so that no mixed batch is all-accepted by chance
        n = {"all": k, "none": 0}.get(kind, int(rng.integers(0, k if b == 0 else k + 1)))
        if n < k:
            drafts[b, n] = (truth[b, n] + int(rng.integers(1, V))) % V  # the first wrong draft
    if kind == "finished":
        done[int(rng.integers(B))] = True
    shown = f"B={B}, k={k}, cache lengths {lens.tolist()}, done={done.int().tolist()}"
    return StepCase((m, cache, pending, drafts, done), shown=shown, tag=kind, prompts=tuple(prompts))


@one_thread
def step_cases(rng: np.random.Generator) -> list[Case]:
    m = Model(TINY, int(rng.integers(2**31)))
    kinds = ["all", "none", "mixed", "finished", "mixed", "finished", "mixed", "all"]
    return [step_case(rng, m, kind) for kind in kinds]


@one_thread
@torch.no_grad()
def reference_verify_and_commit(target: Model, cache: KVCache, pending: torch.Tensor, drafts: torch.Tensor,
                                done: torch.Tensor):
    """One greedy verify step: [pending, d1..dk] at each row's next k+1 positions (provisional KV), then
    commit the pending token and the accepted drafts of running rows. -> (accepted, next_token, cache after)."""
    model, cache = tiny_target(target), clone_cache(cache)
    k = drafts.shape[1]
    logits, _ = model(torch.cat([pending[:, None], drafts], 1), cache.positions(k + 1), cache)
    accepted, next_token = greedy_accept(drafts, logits)
    cache.commit(torch.where(done, 0, accepted + 1), check=False)
    return accepted, next_token, cache


def cache_after(case: StepCase, echoed: Any) -> KVCache:
    """The student's cache as it came back, checked to be the cache it was given (same tensors' shapes)."""
    given = case.args[1]
    cache = echoed[0] if isinstance(echoed, tuple) and len(echoed) == 1 else None
    if not isinstance(cache, KVCache):
        raise WrongShape("the cache did not come back as a KVCache")
    what = "the cache's k and v must stay lists of one tensor per layer, each of shape [B, nkv, S, D] = "
    shape = tuple(given.k[0].shape)
    for name in ("k", "v"):
        ts = getattr(cache, name)
        if not (isinstance(ts, list) and len(ts) == len(given.k)
                and all(isinstance(t, torch.Tensor) and tuple(t.shape) == shape and t.is_floating_point() for t in ts)):
            raise WrongShape(f"{what}{shape}: change them only through the model's forward (it writes there)")
    lengths = cache.lengths
    if not (isinstance(lengths, torch.Tensor) and tuple(lengths.shape) == (given.batch,)
            and not lengths.is_floating_point() and lengths.dtype != torch.bool):
        raise WrongShape(f"cache.lengths must stay an integer tensor of shape [B] = ({given.batch},), got "
                         f"{short(lengths)}: move it with cache.commit / cache.rollback")
    cache.lengths, cache.max_len = lengths.long(), given.max_len
    cache.k, cache.v = [t.float() for t in cache.k], [t.float() for t in cache.v]
    return cache


def length_hint(new: np.ndarray, old: np.ndarray, accepted: np.ndarray, k: int, done: np.ndarray) -> str:
    """What a row's wrong length after the step says about the mistake (lengths [B] before and after)."""
    running = ~done
    if np.array_equal(new[running], (old + k + 1)[running]) and not (accepted[running] == k).all():
        return " (every slot of the block was kept: roll back what was not accepted)"
    if np.array_equal(new[running], (old + accepted + 2)[running]):
        return (" (one slot too many: the target's own next token has no KV in the cache yet, it is the next step's "
                "pending token)")
    if np.array_equal(new[running], (old + accepted)[running]):
        return " (the block starts with the pending token: its slot is kept too, so accepted + 1)"
    if np.array_equal(new[running], (old + accepted + 1)[running]) and not np.array_equal(new[done], old[done]):
        return " (a finished row rides along: its length does not move)"
    return ""


@one_thread
def judge_step(case: StepCase, got: Any, want: tuple) -> list[str | None]:
    m, given, pending, drafts, done = case.args
    B, k = drafts.shape
    if not (isinstance(got, tuple) and len(got) == 2):  # (the function's value, (the cache after,)): the echo
        raise WrongShape("the grader did not get the cache back")
    value, echoed = got
    n, t = accepted_and_next(case, value, "verify_and_commit", B)
    cache = cache_after(case, echoed)
    want_n, want_t, want_cache = want
    running = ~done.numpy()
    step_why = cache_why = lossless_why = None
    wn, wt = want_n.numpy(), want_t.numpy()
    if not (np.array_equal(n[running], wn[running]) and np.array_equal(t[running], wt[running])):
        b = int(np.flatnonzero(running & ((n != wn) | (t != wt)))[0])
        hint = ""
        if n[b] == wn[b] and wn[b] == k:
            hint = " (all k accepted: the next token is the bonus, the target's argmax at the block's last position)"
        elif n[b] == wn[b]:
            hint = " (the next token is the target's argmax at block position `accepted`, right after the kept drafts)"
        step_why = (f"row {b}: expected accepted={wn[b]}, next_token={wt[b]}; got {n[b]}, {t[b]}{hint}")
    # the cache: the same lengths as the reference's, and the KV of exactly the committed tokens
    old, new, want_len = given.lengths.numpy(), cache.lengths.numpy(), want_cache.lengths.numpy()
    kept = [list(case.prompts[b]) + ([int(pending[b])] + drafts[b, : wn[b]].tolist() if running[b] else [])
            for b in range(B)]
    fresh = prefilled(tiny_target(m), kept, given.max_len)
    if not np.array_equal(new, want_len):
        cache_why = (f"cache lengths after the step expected {want_len.tolist()} (were {old.tolist()}, accepted "
                     f"{wn.tolist()}), got {new.tolist()}{length_hint(new, old, wn, k, ~running)}")
    else:
        for b in range(B):
            L = int(want_len[b])
            same = all(torch.allclose(mine[b, :, :L], ref[b, :, :L], atol=1e-4, rtol=1e-4)
                       for mine, ref in zip(cache.k + cache.v, fresh.k + fresh.v))
            if not same:
                cache_why = (f"row {b}: the cache's keys and values in slots 0..{L - 1} differ from a fresh run "
                             "over the row's committed tokens (write the block at the row's next k + 1 positions, "
                             "cache.positions(k + 1), through the target's forward)")
                break
    # lossless: plain greedy decoding goes on from your cache exactly as from the fresh one
    first = torch.where(done, pending, want_t)  # a finished row still has its pending token
    if bool((cache.lengths < 0).any()) or int(cache.lengths.max()) + CONTINUE > given.max_len:
        lossless_why = f"decoding cannot go on from cache lengths {new.tolist()} (the cache holds {given.max_len} slots)"
    else:
        (mine, mine_logits), (ref, ref_logits) = (greedy_run(tiny_target(m), c, first, CONTINUE) for c in (cache, fresh))
        # the same tokens, read from the same logits: a tiny random model's argmax hardly looks at its context,
        # so stale keys in the cache may leave the tokens alone while they change the distribution
        differ = (mine != ref).any(1) | ~torch.isclose(mine_logits, ref_logits, atol=1e-3, rtol=1e-3).all(-1).all(-1)
        if bool(differ.any()):
            b = int(torch.nonzero(differ)[0, 0])
            lossless_why = (f"not lossless: plain decoding from your cache continues row {b} with {mine[b].tolist()}, "
                            f"from a cache of its committed tokens with {ref[b].tolist()}"
                            + (" (the same tokens, from other logits)" if torch.equal(mine[b], ref[b]) else ""))
    return [step_why, cache_why, lossless_why]


Q8 = Exercise(
    id="lab2.q8", points=3, title="a verify step on a real KV cache: verify, commit, roll back",
    reads="verify_and_commit",
    signature="(target, cache, pending, drafts, done)",
    parts=(Part(step_cases, judge_step, reference_verify_and_commit, what="batches on a tiny random model", echo=(1,)),),
    uses=(Q1,),  # step.verify is not named as an answer: the word `verify` in a student's code would look like one
)


# --- q9: the attention mask of a draft tree ----------------------------------------------------------


def random_tree_parents(rng: np.random.Generator, N: int, kind: str) -> list[int]:
    """A verify block's parents: node 0 is the root (the pending token, parent -1), node i's parent is in 0..i-1."""
    if kind == "chain":
        return [-1] + list(range(N - 1))
    if kind == "star":
        return [-1] + [0] * (N - 1)
    if kind == "deep":  # a chain with side branches
        parents = [-1]
        for i in range(1, N):
            parents.append(i - 1 if rng.random() < 0.6 else int(rng.integers(0, i)))
        return parents
    return [-1] + [int(rng.integers(0, i)) for i in range(1, N)]


def mask_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for kind in ["chain", "star", "empty prefix", "deep"] + ["random"] * 8:
        B, N = int(rng.integers(1, 5)), int(rng.integers(3, 10))
        lengths = rng.integers(0 if kind == "empty prefix" else 1, 16, B)
        if kind == "empty prefix":
            lengths[0] = 0
        span = int(lengths.max()) + N + int(rng.integers(0, 5))  # slots past the block: stale, never seen
        parents = [random_tree_parents(rng, N, kind) for _ in range(B)]
        cases.append(Case((torch.as_tensor(lengths, dtype=torch.long), torch.tensor(parents), span),
                          shown=f"lengths={lengths.tolist()}, parents={parents}, span={span}", tag=kind))
    return cases


def ancestor_matrix(parents: np.ndarray) -> np.ndarray:
    """[B, N] parents -> [B, N, N]: anc[b, i, j] when j is i or an ancestor of i (written out, no tricks)."""
    B, N = parents.shape
    anc = np.zeros((B, N, N), dtype=bool)
    for b in range(B):
        for i in range(N):
            node = i
            while node >= 0:
                anc[b, i, node] = True
                node = int(parents[b, node])
    return anc


def mask_mistakes(lengths: torch.Tensor, parents: torch.Tensor, span: int) -> dict[str, np.ndarray]:
    """Masks that common mistakes give, with what each one forgot."""
    L, P = lengths.numpy(), parents.numpy()
    B, N = P.shape
    rel = np.arange(span)[None, None, :] - L[:, None, None]  # [B, 1, S]: slot - lengths
    prefix, block = rel < 0, (rel >= 0) & (rel < N)
    idx = np.clip(rel, 0, N - 1)

    def tree_part(m: np.ndarray) -> np.ndarray:  # m [B, N, N] over the block -> [B, N, S]
        return block & np.take_along_axis(m, np.broadcast_to(idx, (B, N, span)), axis=2)

    anc = ancestor_matrix(P)
    eye = np.eye(N, dtype=bool)[None]
    causal = np.tril(np.ones((N, N), dtype=bool))[None]
    return {
        "a node sees its ancestors only, not every node written before it: a sibling is another guess for the same "
        "position, not part of this node's text": prefix | tree_part(np.broadcast_to(causal, (B, N, N))),
        "a node sees the committed prefix too: slots 0 .. lengths - 1 of its row": tree_part(anc),
        "a node sees itself, as a token does in causal attention": prefix | tree_part(anc & ~eye),
        "ancestors, not descendants: a node's children are guesses that come after it": prefix
        | tree_part(anc.transpose(0, 2, 1)),
        "only the node's own path: the rest of the tree is other guesses": prefix | block,
        "slots from lengths + N on hold stale keys from earlier steps: nothing sees them": prefix
        | tree_part(anc) | (rel >= N),
    }


def judge_mask(case: Case, got: Any, want: torch.Tensor) -> str | None:
    lengths, parents, span = case.args
    B, N = parents.shape
    m = as_numpy(got)
    if m is None or m.shape != (B, N, span):
        raise WrongShape(f"B={B}, N={N}, span={span}: the mask must be a boolean [B, N, span] = ({B}, {N}, {span}) "
                         f"array, got {short(got) if m is None else f'shape {tuple(m.shape)}'}")
    if m.dtype != bool and not (np.issubdtype(m.dtype, np.number) and np.isin(m, (0, 1)).all()):
        raise WrongShape("the mask must hold booleans (or 0/1): True where node i may read slot s")
    m, w = m.astype(bool), want.numpy()
    if np.array_equal(m, w):
        return None
    hint = next((f" ({why})" for why, v in mask_mistakes(lengths, parents, span).items() if np.array_equal(m, v)), "")
    b, i = (int(x) for x in np.argwhere((m != w).any(-1))[0])
    return (f"row {b} (lengths {int(lengths[b])}, parents {parents[b].tolist()}), node {i}: expected it to see slots "
            f"{np.flatnonzero(w[b, i]).tolist()}, got {np.flatnonzero(m[b, i]).tolist()}{hint}")


Q9 = Exercise(
    id="lab2.q9", points=2, title="the attention mask of a draft tree", reads="tree_attention_mask",
    signature="(lengths, parents, span)",
    parts=(Part(mask_cases, judge_mask, tree_mask, what="batches of trees"),),
)


# --- q10: the greedy walk down a verified tree -------------------------------------------------------


def depths_of(parents: torch.Tensor) -> torch.Tensor:
    """[B, N] parents (root: node 0, parent -1) -> each node's depth, the root 0."""
    depths = torch.zeros_like(parents)
    for i in range(1, parents.shape[1]):
        depths[:, i] = depths.gather(1, parents[:, i:i + 1].clamp(min=0))[:, 0] + 1
    return depths


def reference_walk(tokens: torch.Tensor, parents: torch.Tensor, target_logits: torch.Tensor):
    """The greedy walk (verify.tree_greedy_accept) -> (accepted [B], last [B], next_token [B])."""
    depths = depths_of(parents)
    return tree_greedy_accept(tokens, parents, depths, int(depths.max()), target_logits)


def walk_case(rng: np.random.Generator, kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batch of verified trees: tokens (siblings differ), parents, and target logits whose argmax at a node
    equals one of its children's tokens often enough that walks go deep; `kind` plants the case's point."""
    B, N, V = int(rng.integers(2, 6)), int(rng.integers(4, 11)), int(rng.integers(12, 40))
    tree_kind = {"deep": "deep", "second": "random"}.get(kind, str(rng.choice(["random", "deep", "star"])))
    parents = torch.tensor([random_tree_parents(rng, N, tree_kind) for _ in range(B)])
    tokens = torch.zeros(B, N, dtype=torch.long)
    tokens[:, 0] = torch.as_tensor(rng.integers(0, V, B))
    best = np.zeros((B, N), dtype=np.int64)
    for b in range(B):
        kids = [[c for c in range(N) if parents[b, c] == n] for n in range(N)]
        for n in range(N):
            tokens[b, kids[n]] = torch.as_tensor(rng.permutation(V)[: len(kids[n])], dtype=torch.long)
        for n in range(N):
            agree = {"none": 0.0 if n == 0 else 0.8, "deep": 1.0}.get(kind, 0.75)
            if kids[n] and rng.random() < agree:
                pick = kids[n][-1] if kind == "second" and len(kids[n]) > 1 else kids[n][int(rng.integers(len(kids[n])))]
                best[b, n] = int(tokens[b, pick])
            else:  # a token no child of this node carries
                best[b, n] = int(rng.choice(np.setdiff1d(np.arange(V), tokens[b, kids[n]].numpy())))
    logits = torch.as_tensor(rng.normal(0, 1, (B, N, V)), dtype=torch.float32)
    logits[torch.arange(B)[:, None], torch.arange(N)[None, :], torch.as_tensor(best)] = 10.0  # the argmax, no ties
    return tokens, parents, logits


def walk_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for kind in ["none", "deep", "second", "second"] + ["mixed"] * 8:
        tokens, parents, logits = walk_case(rng, kind)
        B, N = tokens.shape
        cases.append(Case((tokens, parents, logits), shown=f"B={B}, N={N} nodes", tag=kind))
    return cases


def walk_mistakes(tokens: torch.Tensor, parents: torch.Tensor, logits: torch.Tensor, want) -> dict[str, tuple]:
    """(accepted, last, next_token) that common mistakes give, with what each one forgot."""
    best, (acc, last, nxt) = logits.argmax(-1), (w.numpy() for w in want)
    B, N = tokens.shape
    depths = depths_of(parents).numpy()
    parent_of_last = np.array([max(int(parents[b, last[b]]), 0) for b in range(B)])

    def walk(first_only: bool, levels: int) -> np.ndarray:  # the last node of a walk with a mistake switched on
        ends = []
        for b in range(B):
            node, depth = 0, 0
            while depth < levels:
                kids = [c for c in range(N) if parents[b, c] == node][: 1 if first_only else N]
                step = [c for c in kids if int(tokens[b, c]) == int(best[b, node])]
                if not step:
                    break
                node, depth = step[0], depth + 1
            ends.append(node)
        return np.array(ends)

    first_child, early = walk(True, N), walk(False, int(depths.max()) - 1)
    agree = (tokens == best.gather(1, parents.clamp(min=0))).numpy() & (parents.numpy() >= 0)
    anywhere = np.where(agree, depths, 0).max(1)
    rows = np.arange(B)
    return {
        "the walk may go down to the deepest node: a path that agrees at every depth is accepted whole":
            (depths[rows, early], early, best.numpy()[rows, early]),
        "look at every child of the node, not only its first: siblings are the other guesses for the position":
            (depths[rows, first_child], first_child, best.numpy()[rows, first_child]),
        "in a tree the node at depth `accepted` is not node `accepted`: read the target's argmax at the last accepted "
        "node": (acc, last, best.numpy()[rows, np.minimum(acc, N - 1)]),
        "the next token is the target's argmax at the last accepted node, not at its parent":
            (acc, last, best.numpy()[rows, parent_of_last]),
        "a node counts only when its whole path from the root agrees, as a chain's draft counts only after "
        "the drafts before it": (anywhere, None, None),
    }


def judge_walk(case: Case, got: Any, want: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> list[str | None]:
    tokens, parents, logits = case.args
    B, N = tokens.shape
    if not (isinstance(got, (tuple, list)) and len(got) == 3):
        raise WrongShape(f"accepted_path must return three tensors (accepted [B], last [B], next_token [B]), "
                         f"got {short(got)}")
    try:
        values = [vector(x, B, name, integer=True) for x, name in zip(got, ("accepted", "last", "next_token"))]
    except WrongShape as exc:
        raise WrongShape(f"{case.shown}: {exc}") from None
    wants = [w.numpy() for w in want]
    wrong = [not np.array_equal(v, w) for v, w in zip(values, wants)]
    if not any(wrong):
        return [None, None, None]
    hint = ""
    for why, mistake in walk_mistakes(tokens, parents, logits, want).items():
        if all(m is None or np.array_equal(v, m) for v, m in zip(values, mistake)):
            hint = f" ({why})"
            break
    b = int(np.flatnonzero(np.any([v != w for v, w in zip(values, wants)], axis=0))[0])
    best = logits[b].argmax(-1).tolist()
    why = (f"row {b}: tokens {tokens[b].tolist()}, parents {parents[b].tolist()}, target argmax per node {best}: "
           f"expected accepted={wants[0][b]}, last={wants[1][b]}, next_token={wants[2][b]}; got {values[0][b]}, "
           f"{values[1][b]}, {values[2][b]}{hint}")
    return [why if w else None for w in wrong]


Q10 = Exercise(
    id="lab2.q10", points=2, title="the accepted path of a verified tree, greedily", reads="accepted_path",
    signature="(tokens, parents, target_logits)",
    parts=(Part(walk_cases, judge_walk, reference_walk, what="batches of verified trees"),),
    answered_by=("specdec.decoder.verify:tree_greedy_accept",),
)

EXERCISES = (Q1, Q2, Q3, Q4, Q5, Q6, Q7, Q8, Q9, Q10)
