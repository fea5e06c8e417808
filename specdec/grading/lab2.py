"""Lab 2's exercises (a static-k MTP decoder in PyTorch), declared as data: see exercise.py.

Each calls the student's function on synthetic tensors and compares with specdec: greedy_accept,
the KVCache's commit/rollback, AcceptanceStats, formulas and the drafters' training loss. No model is loaded.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from specdec.decoder.draft_modules import chained_soft_ce, soft_ce
from specdec.decoder.kv_cache import KVCache
from specdec.decoder.verify import greedy_accept
from specdec.grading.answers import as_numpy, close, number, pair, short, vector, whole_in
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


def judge_verify(case: Case, got: Any, want: tuple[torch.Tensor, torch.Tensor]) -> str | None:
    draft, logits = case.args
    B, k = draft.shape
    answer = pair(got, "greedy_verify_batch", "(accepted [B], next_token [B])")
    try:
        n = vector(answer[0], B, "accepted", integer=True)
        t = vector(answer[1], B, "next_token", integer=True)
    except WrongShape as exc:
        raise WrongShape(f"{case.shown}: {exc}") from None
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

EXERCISES = (Q1, Q2, Q3, Q4, Q5, Q6, Q7)
