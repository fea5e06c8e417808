"""Monte Carlo of the draft/verify loop on a toy language.

The target is a Markov chain over a small vocabulary; the draft is a cheaper, noisier chain.
Half of the vocabulary is "easy" (after these tokens the draft agrees with the target) and half
"hard". `stickiness` sets whether easy and hard contexts come in runs (> 0.5), independently
(0.5) or alternate (< 0.5): this is what makes the i.i.d. formula wrong in either direction.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np
from tqdm import tqdm

from specdec.sim import formulas, verify
from specdec.sim.stats import AcceptanceStats


@dataclass(frozen=True)
class ToyLanguageConfig:
    vocab: int = 32
    sharpness: float = 4.0  # scale of the target's logits: higher = lower entropy
    easy_quality: float = 0.98  # correlation of draft and target logits after an easy token
    hard_quality: float = 0.1  # the same after a hard token
    stickiness: float = 0.9  # P(next token is of the same kind, easy/hard, as the current one)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.vocab < 4 or self.vocab % 2:
            raise ValueError(f"vocab must be an even number >= 4, got {self.vocab}")
        if self.sharpness < 0:
            raise ValueError(f"sharpness must be >= 0, got {self.sharpness}")
        for name in ("easy_quality", "hard_quality"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if not 0 <= self.stickiness < 1:
            raise ValueError(f"stickiness must be in [0, 1), got {self.stickiness}")


def _softmax(logits: np.ndarray) -> np.ndarray:
    return formulas.temperature_probs(logits, 1.0)


def _rows(logits: np.ndarray, easy: np.ndarray, stickiness: float) -> np.ndarray:
    """Transition rows: mass `stickiness` on tokens of the current token's kind, softmax within a kind."""
    rows = np.zeros_like(logits)
    for kind in (True, False):
        cols = easy == kind  # next tokens of this kind
        row_is_kind = (easy == kind)[:, None]  # current tokens of this kind
        rows[:, cols] = _softmax(logits[:, cols]) * np.where(row_is_kind, stickiness, 1 - stickiness)
    return rows


@dataclass
class ToyLanguage:
    """A target chain and a draft chain: row s is the next-token distribution after token s."""

    target: np.ndarray  # (V, V)
    draft: np.ndarray  # (V, V)
    easy: np.ndarray  # (V,) bool: the draft is good after these tokens
    config: ToyLanguageConfig = field(default_factory=ToyLanguageConfig)

    @classmethod
    def make(cls, config: ToyLanguageConfig | None = None, **overrides) -> "ToyLanguage":
        cfg = replace(config, **overrides) if config else ToyLanguageConfig(**overrides)
        rng = np.random.default_rng(cfg.seed)
        v = cfg.vocab
        easy = np.arange(v) < v // 2
        z = rng.standard_normal((v, v))
        noise = rng.standard_normal((v, v))
        rho = np.where(easy, cfg.easy_quality, cfg.hard_quality)[:, None]
        # the draft sees the target's logits through noise: correlation rho with them
        draft_logits = rho * z + np.sqrt(1 - rho**2) * noise
        return cls(
            target=_rows(cfg.sharpness * z, easy, cfg.stickiness),
            draft=_rows(cfg.sharpness * draft_logits, easy, cfg.stickiness),
            easy=easy,
            config=cfg,
        )

    @property
    def vocab(self) -> int:
        return self.target.shape[0]

    def alpha_by_context(self) -> np.ndarray:
        """alpha(s) = sum_x min(p(x|s), q(x|s)) for every context token s."""
        return formulas.acceptance_alpha(self.target, self.draft)

    def greedy_agreement(self) -> np.ndarray:
        """1 where the draft's argmax equals the target's: greedy acceptance after token s."""
        return (self.target.argmax(1) == self.draft.argmax(1)).astype(float)

    def entropy_by_context(self) -> np.ndarray:
        """Entropy of the target's next-token distribution, in bits."""
        p = self.target
        return -(p * np.log2(np.where(p > 0, p, 1))).sum(1)

    def stationary(self) -> np.ndarray:
        """The target chain's stationary distribution over tokens."""
        w, vecs = np.linalg.eig(self.target.T)
        pi = np.real(vecs[:, np.argmin(np.abs(w - 1))])
        return pi / pi.sum()

    def mean_alpha(self, where: np.ndarray | None = None) -> float:
        """E[alpha] over the contexts of the target's text (its stationary distribution).

        where: a (V,) mask to average over some contexts only, e.g. lang.easy.
        """
        pi = self.stationary()
        if where is not None:
            pi = np.where(where, pi, 0.0)
        return float(pi @ self.alpha_by_context() / pi.sum())

    def propose(self, context: int, k: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """The draft chain continues the context by k tokens: (draft_tokens, q_rows (k, V))."""
        tokens, rows = [], []
        for _ in range(k):
            rows.append(self.draft[context])
            context = verify.sample_categorical(rows[-1], rng)
            tokens.append(context)
        return np.array(tokens, dtype=np.int64), np.array(rows).reshape(k, self.vocab)

    def target_rows(self, context: int, draft_tokens: np.ndarray) -> np.ndarray:
        """The target's rows at the k draft positions and the bonus position: (k+1, V)."""
        return self.target[np.concatenate([[context], draft_tokens]).astype(np.int64)]


@dataclass
class MonteCarloResult:
    """Per-step record of a simulated run and what the i.i.d. formula predicts from it."""

    k: int
    mode: str  # "sample", "greedy" or "iid"
    accepted: np.ndarray  # (steps * sequences,) accepted drafts per verify step
    alpha_text: float  # mean acceptance probability over the contexts of the emitted text
    step_context: np.ndarray | None = None  # (steps * sequences,) the token each verify step starts after
    step_alpha: np.ndarray | None = None  # (steps * sequences,) alpha of that context
    emitted: np.ndarray | None = None  # (steps, sequences, k+1), -1 padded, when recorded
    sequences: int = 1  # independent sequences; accepted is step-major: (steps, sequences) flattened

    @property
    def stats(self) -> AcceptanceStats:
        return AcceptanceStats.from_accepted(self.accepted, self.k)

    @property
    def tau_stderr_sequences(self) -> float:
        """Standard error of tau from the spread of the independent sequences' means. The steps of one
        sequence are correlated (runs of easy or hard contexts), so stats.tau_stderr, which treats
        every step as independent, understates it; with one sequence that is all there is."""
        if self.sequences < 2:
            return self.stats.tau_stderr
        per_sequence = self.accepted.reshape(-1, self.sequences).mean(0)
        return float(per_sequence.std(ddof=1) / np.sqrt(self.sequences))

    @property
    def alpha_verified(self) -> float:
        """Accepted drafts / drafts actually verified (a draft after a rejection is never checked)."""
        verified = np.minimum(self.accepted + 1, self.k).sum()
        return float(self.accepted.sum() / verified)

    @property
    def tau_from_alpha_text(self) -> float:
        return float(formulas.expected_tokens_per_step(self.alpha_text, self.k))

    @property
    def tau_from_alpha_verified(self) -> float:
        return float(formulas.expected_tokens_per_step(self.alpha_verified, self.k))

    def first_tokens(self, length: int) -> np.ndarray:
        """The first `length` emitted tokens of every sequence: (sequences, length). Needs record=True."""
        if self.emitted is None:
            raise ValueError("run with record=True to keep the emitted tokens")
        seqs = self.emitted.transpose(1, 0, 2).reshape(self.emitted.shape[1], -1)
        # stable sort moves the real tokens to the front, in order, and the -1 padding behind
        order = np.argsort(seqs < 0, axis=1, kind="stable")
        seqs = np.take_along_axis(seqs, order, 1)
        if np.any(seqs[:, length - 1] < 0):
            raise ValueError(f"some sequence emitted fewer than {length} tokens: run more steps")
        return seqs[:, :length]

    def as_dict(self) -> dict:
        s = self.stats
        return {
            "mode": self.mode,
            **s.as_dict(),
            "alpha_text": self.alpha_text,
            "alpha_verified": self.alpha_verified,
            "alpha_step_start": float(self.step_alpha.mean()) if self.step_alpha is not None else None,
            "tau_from_alpha_text": self.tau_from_alpha_text,
            "tau_from_alpha_verified": self.tau_from_alpha_verified,
            "by_position_iid_from_alpha_verified": [self.alpha_verified**i for i in range(1, self.k + 1)],
        }


def run_iid(alpha: float, k: int, steps: int, seed: int = 0) -> MonteCarloResult:
    """The formula's own world: every position accepted independently with probability alpha."""
    formulas.expected_tokens_per_step(alpha, k)  # validates alpha and k
    rng = np.random.default_rng(seed)
    agree = rng.random((steps, k)) < alpha
    return MonteCarloResult(k=k, mode="iid", accepted=np.cumprod(agree, 1).sum(1), alpha_text=float(alpha))


def run_markov(
    lang: ToyLanguage,
    k: int,
    steps: int,
    sequences: int = 64,
    mode: str = "sample",
    seed: int = 0,
    start: int | None = None,
    record: bool = False,
    progress: bool = False,
    on_reject: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
) -> MonteCarloResult:
    """Run `sequences` independent draft/verify loops for `steps` verify steps each.

    mode "sample": drafts x ~ q, speculative sampling (the residual rule); "greedy": the draft's
    and the target's argmax, greedy verification. Sequences start from `start` or, by default, from
    the target's stationary distribution. on_reject plants a bug (see verify.speculative_sample_batch).
    """
    if mode not in ("sample", "greedy"):
        raise ValueError(f"mode must be 'sample' or 'greedy', got {mode!r}")
    if int(k) != k or k < 1 or steps < 1 or sequences < 1:
        raise ValueError("k, steps and sequences must be >= 1")
    rng = np.random.default_rng(seed)
    v = lang.vocab
    alpha_ctx = lang.alpha_by_context() if mode == "sample" else lang.greedy_agreement()
    if start is None:
        context = rng.choice(v, size=sequences, p=lang.stationary())
    else:
        context = np.full(sequences, int(start))
    all_lengths, step_context, emitted_log, alpha_sum, n_tokens = [], [], [], 0.0, 0
    loop = range(steps)
    if progress:

        loop = tqdm(loop, disable=None, desc=f"Monte Carlo k={k}", leave=False)  # None: terminals only
    for _ in loop:
        # propose: the draft chain runs k tokens ahead of each sequence
        contexts = np.empty((sequences, k + 1), dtype=np.int64)
        contexts[:, 0] = context
        for i in range(k):
            row = lang.draft[contexts[:, i]]
            contexts[:, i + 1] = row.argmax(1) if mode == "greedy" else verify.sample_categorical(row, rng)
        drafts = contexts[:, 1:]
        # verify: one target pass scores all k+1 positions
        p_rows = lang.target[contexts]
        if mode == "greedy":
            target_argmax = p_rows.argmax(-1)
            lengths = verify.greedy_verify_batch(drafts, target_argmax)
            emitted = np.where(np.arange(k + 1) <= lengths[:, None], target_argmax, -1)
        else:
            lengths, emitted = verify.speculative_sample_batch(
                p_rows, lang.draft[contexts[:, :k]], drafts, rng, on_reject=on_reject
            )
        # each emitted token was generated in the context at its position
        made = np.arange(k + 1) <= lengths[:, None]
        alpha_sum += alpha_ctx[contexts][made].sum()
        n_tokens += int(made.sum())
        context = emitted[np.arange(sequences), lengths]
        all_lengths.append(lengths)
        step_context.append(contexts[:, 0])
        if record:
            emitted_log.append(emitted)
    return MonteCarloResult(
        k=k,
        mode=mode,
        accepted=np.concatenate(all_lengths),
        alpha_text=alpha_sum / n_tokens,
        step_context=np.concatenate(step_context),
        step_alpha=alpha_ctx[np.concatenate(step_context)],
        emitted=np.stack(emitted_log) if record else None,
        sequences=sequences,
    )


def run_sequence(
    lang: ToyLanguage,
    steps: int,
    choose_k: Callable[[list[int], list[int]], int],
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """One sequence, one step at a time, with k chosen before each step.

    choose_k(ks_so_far, accepted_so_far) -> k for the next step (adaptive-k experiments).
    Returns (ks, accepted), one entry per verify step.
    """
    rng = np.random.default_rng(seed)
    context = int(rng.choice(lang.vocab, p=lang.stationary()))
    ks: list[int] = []
    lengths: list[int] = []
    for _ in range(steps):
        k = int(choose_k(ks, lengths))
        if k < 1:
            raise ValueError(f"choose_k returned k={k}; k must be >= 1")
        drafts, q_rows = lang.propose(context, k, rng)
        n, tokens = verify.speculative_sample(lang.target_rows(context, drafts), q_rows, drafts, rng)
        context = int(tokens[-1])
        ks.append(k)
        lengths.append(n)
    return np.array(ks), np.array(lengths)
