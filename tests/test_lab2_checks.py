"""Lab 2's checks: the reference passes, a planted wrong answer loses points, a missing name scores 0.

check() draws fresh inputs from os.urandom; here the cases' seeds are fixed so that the tests are
deterministic, and one test runs every reference answer on os.urandom seeds as well.
"""

import numpy as np
import pytest
import torch
from cpu_clock import timed
from notebook_tools import assert_check_contract

from specdec.decoder.kv_cache import KVCache
from specdec.decoder.tree import ancestors, tree_mask
from specdec.decoder.verify import greedy_accept, tree_greedy_accept
from specdec.grading import check, exercises_for_lab, lab2
from specdec.grading.registry import get_exercise, run_check
from specdec.sim import formulas, stats

from quick import SEEDS


# --- reference answers, written the way a student would call specdec ------------------------------


def greedy_verify_batch(draft, target_logits):
    return greedy_accept(draft, target_logits)


def commit_step(lengths, accepted, k, done):
    cache = KVCache(1, len(lengths), 1, 1, int(lengths.max()) + k + 1)
    cache.lengths.copy_(lengths)
    provisional = cache.positions(k + 1)
    cache.commit(torch.where(done, 0, accepted + 1))
    return cache.lengths, provisional >= cache.lengths.unsqueeze(1)


def acceptance_from_log(accept_log, k):
    s = stats.AcceptanceStats.from_accepted(accept_log[accept_log >= 0], k)
    return s.tau, s.by_position


def speedup_of(spec_tokens, spec_wall_s, plain_tokens, plain_wall_s):
    tps = sum(map(len, spec_tokens)) / spec_wall_s
    return tps, tps / (sum(map(len, plain_tokens)) / plain_wall_s)


def predicted_speedup(tau, k, t_plain, t_draft, t_verify):
    return formulas.speedup_from_costs(tau, t_plain, t_draft, t_verify, k)


def choose_k(rate, k, c, k_max=8):
    alpha = lab2.alpha_from_rate(rate, k)
    return alpha, formulas.optimal_k(alpha, c, k_max)[0]


def chained_loss(depth_logits, teacher_probs, weights):
    total = torch.zeros(())
    for d, (logits, w) in enumerate(zip(depth_logits, weights)):
        total = total + w * -(teacher_probs[:, d:] * logits[:, d:].log_softmax(-1)).sum(-1).mean()
    return total
def verify_step(kept, shift: int = 0, name: str = "verify_and_commit"):
    """A greedy verify step on a real cache that commits kept(accepted, k, done) slots per row, its block written
    `shift` positions past each row's next ones (0 is right, and kept = pending + accepted drafts of running rows)."""

    def step(target, cache, pending, drafts, done):
        k = drafts.shape[1]
        with torch.no_grad():
            logits, _ = target(torch.cat([pending[:, None], drafts], 1), cache.positions(k + 1) + shift, cache)
        accepted, next_token = greedy_accept(drafts, logits)
        cache.commit(kept(accepted, k, done))
        return accepted, next_token

    step.__name__ = name
    return step


verify_and_commit = verify_step(lambda accepted, k, done: torch.where(done, 0, accepted + 1))


def tree_attention_mask(lengths, parents, span):
    return tree_mask(lengths, parents, span)


def accepted_path(tokens, parents, target_logits):
    depths = lab2.depths_of(parents)
    return tree_greedy_accept(tokens, parents, depths, int(depths.max()), target_logits)


def accepted_path_loop(tokens, parents, target_logits):
    """The walk written out row by row, as a student might: from the root, the child equal to the argmax."""
    best = target_logits.argmax(-1)
    out = []
    for b in range(tokens.shape[0]):
        node, depth = 0, 0
        while True:
            nxt = [c for c in range(tokens.shape[1]) if parents[b, c] == node and tokens[b, c] == best[b, node]]
            if not nxt:
                break
            node, depth = nxt[0], depth + 1
        out.append((depth, node, int(best[b, node])))
    return tuple(torch.tensor(x) for x in zip(*out))


REFERENCE = {
    "lab2.q1": ("greedy_verify_batch", greedy_verify_batch),
    "lab2.q2": ("commit_step", commit_step),
    "lab2.q3": ("acceptance_from_log", acceptance_from_log),
    "lab2.q4": ("speedup_of", speedup_of),
    "lab2.q5": ("predicted_speedup", predicted_speedup),
    "lab2.q6": ("choose_k", choose_k),
    "lab2.q7": ("chained_loss", chained_loss),
    "lab2.q8": ("verify_and_commit", verify_and_commit),
    "lab2.q9": ("tree_attention_mask", tree_attention_mask),
    "lab2.q10": ("accepted_path", accepted_path),
}


# --- planted mistakes, the common ones ------------------------------------------------------------


def greedy_counts_every_match(draft, target_logits):
    t = target_logits.argmax(-1)
    n = (draft == t[:, :-1]).sum(1)
    return n, t.gather(1, n.unsqueeze(1)).squeeze(1)


def greedy_no_bonus(draft, target_logits):
    t = target_logits.argmax(-1)
    n = (draft == t[:, :-1]).int().cumprod(1).sum(1)
    return n, t[:, :-1].gather(1, n.clamp(max=draft.shape[1] - 1).unsqueeze(1)).squeeze(1)


def greedy_next_from_draft_row(draft, target_logits):  # off by one: the token before the rejection
    t = target_logits.argmax(-1)
    n = (draft == t[:, :-1]).int().cumprod(1).sum(1)
    return n, t.gather(1, (n - 1).clamp(min=0).unsqueeze(1)).squeeze(1)


def commit_forgets_pending(lengths, accepted, k, done):
    new = lengths + torch.where(done, 0, accepted)
    return new, torch.arange(k + 1) >= (new - lengths).unsqueeze(1)


def commit_ignores_done(lengths, accepted, k, done):
    return lengths + accepted + 1, torch.arange(k + 1) > accepted.unsqueeze(1)


def log_counts_stopped_rows(accept_log, k):
    a = np.where(accept_log >= 0, accept_log, 0)
    return a.mean() + 1, (a[..., None] >= np.arange(1, k + 1)).reshape(-1, k).mean(0)


def log_position_is_histogram(accept_log, k):
    a = accept_log[accept_log >= 0]
    return a.mean() + 1, np.bincount(a, minlength=k + 1)[1:] / a.size


def speedup_counts_rows(spec_tokens, spec_wall_s, plain_tokens, plain_wall_s):
    return len(spec_tokens) / spec_wall_s, (len(spec_tokens) / spec_wall_s) / (len(plain_tokens) / plain_wall_s)


def speedup_wall_ratio(spec_tokens, spec_wall_s, plain_tokens, plain_wall_s):
    return sum(map(len, spec_tokens)) / spec_wall_s, plain_wall_s / spec_wall_s


def predicted_per_step_draft(tau, k, t_plain, t_draft, t_verify):
    return tau * t_plain / (t_draft + t_verify)


def predicted_lab1_verify(tau, k, t_plain, t_draft, t_verify):
    return tau * t_plain / (k * t_draft + t_plain)


def choose_k_rate_is_alpha(rate, k, c, k_max=8):
    return rate, formulas.optimal_k(rate, c, k_max)[0]


def choose_k_ignores_cost(rate, k, c, k_max=8):
    return lab2.alpha_from_rate(rate, k), k_max


def step_losses(depth_logits, teacher_probs, anchored=True, hard=False, normalised=True, mean=True):
    """Each step's loss, with one of the common mistakes switched on."""
    out = []
    for d, logits in enumerate(depth_logits):
        start = d if anchored else 0
        p, x = teacher_probs[:, start:], logits[:, start:]
        if hard:
            p = torch.nn.functional.one_hot(p.argmax(-1), p.shape[-1]).float()
        ce = -(p * (x.log_softmax(-1) if normalised else x)).sum(-1)
        out.append(ce.mean() if mean else ce.sum())
    return out


def chained_unweighted(depth_logits, teacher_probs, weights):
    return sum(step_losses(depth_logits, teacher_probs))


def chained_mean_over_steps(depth_logits, teacher_probs, weights):
    return sum(w * x for w, x in zip(weights, step_losses(depth_logits, teacher_probs))) / len(weights)


def chained_every_position(depth_logits, teacher_probs, weights):
    return sum(w * x for w, x in zip(weights, step_losses(depth_logits, teacher_probs, anchored=False)))


def chained_hard_labels(depth_logits, teacher_probs, weights):
    return sum(w * x for w, x in zip(weights, step_losses(depth_logits, teacher_probs, hard=True)))


def chained_raw_logits(depth_logits, teacher_probs, weights):
    return sum(w * x for w, x in zip(weights, step_losses(depth_logits, teacher_probs, normalised=False)))


def chained_summed_positions(depth_logits, teacher_probs, weights):
    return sum(w * x for w, x in zip(weights, step_losses(depth_logits, teacher_probs, mean=False)))
# keeps the whole block: the rejected drafts' keys and values stay in the cache
step_without_rollback = verify_step(lambda a, k, done: torch.where(done, 0, k + 1), name="step_without_rollback")
# counts the next token as if it were in the cache already
step_commits_one_too_many = verify_step(lambda a, k, done: torch.where(done, 0, a + 2), name="step_commits_one_too_many")
# writes the block one position late, as if the pending token were in the cache already
step_positions_one_late = verify_step(lambda a, k, done: torch.where(done, 0, a + 1), shift=1,
                                      name="step_positions_one_late")
step_moves_finished_rows = verify_step(lambda a, k, done: a + 1, name="step_moves_finished_rows")


def step_bonus_one_early(target, cache, pending, drafts, done):
    """Off by one at the bonus: after k acceptances, the argmax at block position k - 1 instead of k."""
    k = drafts.shape[1]
    logits, _ = target(torch.cat([pending[:, None], drafts], 1), cache.positions(k + 1), cache)
    best = logits.argmax(-1)  # [B, k+1]
    accepted = (drafts == best[:, :k]).int().cumprod(1).sum(1)
    cache.commit(torch.where(done, 0, accepted + 1))
    return accepted, best.gather(1, accepted.clamp(max=k - 1)[:, None])[:, 0]


# --- draft trees: the mask (q9) and the greedy walk (q10) ------------------------------------------


def block_part(lengths, parents, span, m):
    """m [B, N, N] over the block's nodes -> [B, N, span] at slots lengths + j."""
    N = parents.shape[1]
    rel = torch.arange(span) - lengths.view(-1, 1, 1)
    return (rel >= 0) & (rel < N) & m.gather(2, rel.clamp(0, N - 1).expand(-1, N, -1))


def prefix_of(lengths, span):
    return torch.arange(span) < lengths.view(-1, 1, 1)


def mask_sees_siblings(lengths, parents, span):  # the causal mask over the block: every node written before
    B, N = parents.shape
    return prefix_of(lengths, span) | block_part(lengths, parents, span, torch.ones(B, N, N, dtype=torch.bool).tril())


def mask_misses_prefix(lengths, parents, span):
    return block_part(lengths, parents, span, ancestors(parents))


def mask_misses_itself(lengths, parents, span):
    eye = torch.eye(parents.shape[1], dtype=torch.bool)
    return prefix_of(lengths, span) | block_part(lengths, parents, span, ancestors(parents) & ~eye)


def mask_sees_descendants(lengths, parents, span):
    return prefix_of(lengths, span) | block_part(lengths, parents, span, ancestors(parents).transpose(1, 2))


def walk(tokens, parents, target_logits, first_child_only=False, levels=None):
    """The greedy walk with a mistake switched on: only the first child looked at, or `levels` levels at most."""
    best = target_logits.argmax(-1)
    B, N = tokens.shape
    acc, last = torch.zeros(B, dtype=torch.long), torch.zeros(B, dtype=torch.long)
    for b in range(B):
        node, depth = 0, 0
        while levels is None or depth < levels:
            kids = [c for c in range(N) if parents[b, c] == node]
            if first_child_only:
                kids = kids[:1]
            nxt = [c for c in kids if tokens[b, c] == best[b, node]]
            if not nxt:
                break
            node, depth = nxt[0], depth + 1
        acc[b], last[b] = depth, node
    return acc, last, best, B


def path_first_child_always(tokens, parents, target_logits):
    acc, last, best, B = walk(tokens, parents, target_logits, first_child_only=True)
    return acc, last, best[torch.arange(B), last]


def path_stops_one_early(tokens, parents, target_logits):  # the loop runs depth - 1 levels
    depth = int(lab2.depths_of(parents).max())
    acc, last, best, B = walk(tokens, parents, target_logits, levels=depth - 1)
    return acc, last, best[torch.arange(B), last]


def path_bonus_at_chain_index(tokens, parents, target_logits):  # a chain's habit: the argmax at node `accepted`
    acc, last, best, B = walk(tokens, parents, target_logits)
    return acc, last, best[torch.arange(B), acc]


def path_bonus_at_parent(tokens, parents, target_logits):
    acc, last, best, B = walk(tokens, parents, target_logits)
    return acc, last, best[torch.arange(B), parents[torch.arange(B), last].clamp(min=0)]


PLANTED = [
    ("lab2.q1", "greedy_verify_batch", greedy_counts_every_match),
    ("lab2.q1", "greedy_verify_batch", greedy_no_bonus),
    ("lab2.q1", "greedy_verify_batch", greedy_next_from_draft_row),
    ("lab2.q2", "commit_step", commit_forgets_pending),
    ("lab2.q2", "commit_step", commit_ignores_done),
    ("lab2.q3", "acceptance_from_log", log_counts_stopped_rows),
    ("lab2.q3", "acceptance_from_log", log_position_is_histogram),
    ("lab2.q4", "speedup_of", speedup_counts_rows),
    ("lab2.q4", "speedup_of", speedup_wall_ratio),
    ("lab2.q5", "predicted_speedup", predicted_per_step_draft),
    ("lab2.q5", "predicted_speedup", predicted_lab1_verify),
    ("lab2.q6", "choose_k", choose_k_rate_is_alpha),
    ("lab2.q6", "choose_k", choose_k_ignores_cost),
    ("lab2.q7", "chained_loss", chained_unweighted),
    ("lab2.q7", "chained_loss", chained_mean_over_steps),
    ("lab2.q7", "chained_loss", chained_every_position),
    ("lab2.q7", "chained_loss", chained_hard_labels),
    ("lab2.q7", "chained_loss", chained_raw_logits),
    ("lab2.q7", "chained_loss", chained_summed_positions),
    ("lab2.q8", "verify_and_commit", step_without_rollback),
    ("lab2.q8", "verify_and_commit", step_commits_one_too_many),
    ("lab2.q8", "verify_and_commit", step_bonus_one_early),
    ("lab2.q8", "verify_and_commit", step_positions_one_late),
    ("lab2.q8", "verify_and_commit", step_moves_finished_rows),
    ("lab2.q9", "tree_attention_mask", mask_sees_siblings),
    ("lab2.q9", "tree_attention_mask", mask_misses_prefix),
    ("lab2.q9", "tree_attention_mask", mask_misses_itself),
    ("lab2.q9", "tree_attention_mask", mask_sees_descendants),
    ("lab2.q10", "accepted_path", path_first_child_always),
    ("lab2.q10", "accepted_path", path_stops_one_early),
    ("lab2.q10", "accepted_path", path_bonus_at_chain_index),
    ("lab2.q10", "accepted_path", path_bonus_at_parent),
]


@pytest.fixture(params=SEEDS)
def seeded(request):
    return request.param


def test_exercise_list():
    exs = exercises_for_lab(2)
    assert [e.id for e in exs] == [f"lab2.q{i}" for i in range(1, 11)]
    assert [e.points for e in exs] == [2, 2, 2, 1, 1, 2, 2, 3, 2, 2]


@pytest.mark.parametrize("ex_id", sorted(REFERENCE))
def test_reference_scores_full(ex_id, seeded):
    name, fn = REFERENCE[ex_id]
    res = run_check(get_exercise(ex_id), {name: fn}, seed=seeded)
    assert res.score == 1.0, res.message


@pytest.mark.parametrize("ex_id", sorted(REFERENCE))
def test_unseeded_reference_passes_quickly(ex_id):
    """The real thing, os.urandom seeds; and each check is cheap (no model): the fastest of three under 0.5 s of
    CPU time. (The fastest, as a timing is taken: the same check's CPU time grows by up to 1.7x while the other
    worker and its servers share the two cores, 2026-11-29: three took 1.67 s where alone they take 0.78 s.)"""
    name, fn = REFERENCE[ex_id]
    took = []
    for _ in range(3):
        with timed() as one:
            assert run_check(get_exercise(ex_id), {name: fn}).score == 1.0
        took.append(one)
    assert min(took, key=lambda t: t.cpu).within(0.5), took  # 0.5 s of CPU time a check


@pytest.mark.parametrize("ex_id,name,fn", PLANTED, ids=[f.__name__ for _, _, f in PLANTED])
def test_planted_mistake_loses_points(ex_id, name, fn, seeded):
    res = run_check(get_exercise(ex_id), {name: fn}, seed=seeded)
    assert res.score < 1.0, res.message
    assert "first failure" in res.message


@pytest.mark.parametrize("ex_id", sorted(REFERENCE))
def test_missing_name_stub_and_non_function_score_zero(ex_id):
    assert_check_contract(ex_id, REFERENCE[ex_id][0])


def test_partial_credit_and_hints(seeded):
    res = run_check(get_exercise("lab2.q1"), {"greedy_verify_batch": greedy_counts_every_match}, seed=seeded)
    assert 0 < res.score < 1 and "leading matches" in res.message
    res = run_check(get_exercise("lab2.q1"), {"greedy_verify_batch": greedy_no_bonus}, seed=seeded)
    assert 0 < res.score < 1 and "bonus" in res.message
    res = run_check(get_exercise("lab2.q2"), {"commit_step": commit_forgets_pending}, seed=seeded)
    assert res.score < 0.5 and "pending token" in res.message  # both halves wrong unless every row is done
    res = run_check(get_exercise("lab2.q2"), {"commit_step": commit_ignores_done}, seed=seeded)
    assert 0 < res.score < 1 and "rides along" in res.message
    res = run_check(get_exercise("lab2.q3"), {"acceptance_from_log": log_counts_stopped_rows}, seed=seeded)
    assert 0 <= res.score < 1 and "-1" in res.message
    res = run_check(get_exercise("lab2.q3"), {"acceptance_from_log": log_position_is_histogram}, seed=seeded)
    assert 0.5 <= res.score < 1 and ">= i" in res.message  # tau right; by position right only at k = 1
    res = run_check(get_exercise("lab2.q4"), {"speedup_of": speedup_counts_rows}, seed=seeded)
    assert res.score == 0.0 and "not the rows" in res.message
    res = run_check(get_exercise("lab2.q4"), {"speedup_of": speedup_wall_ratio}, seed=seeded)
    assert res.score < 1 and "same number of tokens" in res.message
    res = run_check(get_exercise("lab2.q5"), {"predicted_speedup": predicted_per_step_draft}, seed=seeded)
    assert res.score < 1 and "k of them" in res.message
    res = run_check(get_exercise("lab2.q5"), {"predicted_speedup": predicted_lab1_verify}, seed=seeded)
    assert res.score < 1 and "t_verify" in res.message
    res = run_check(get_exercise("lab2.q6"), {"choose_k": choose_k_rate_is_alpha}, seed=seeded)
    assert 0 < res.score < 1 and "solve for alpha" in res.message
    res = run_check(get_exercise("lab2.q6"), {"choose_k": choose_k_ignores_cost}, seed=seeded)
    assert 0.5 <= res.score < 1 and "k_best" in res.message


HINTS_Q7 = [  # (planted mistake, what the feedback names); each loses (almost) every chain
    (chained_unweighted, "a plain sum drops them"),
    (chained_mean_over_steps, "do not divide by the number of steps"),
    (chained_every_position, "no anchor"),
    (chained_hard_labels, "not its argmax"),
    (chained_raw_logits, "log-softmax"),
    (chained_summed_positions, "do not sum it"),
]


@pytest.mark.parametrize("fn,hint", HINTS_Q7, ids=[f.__name__ for f, _ in HINTS_Q7])
def test_chained_loss_mistakes_are_named(fn, hint, seeded):
    res = run_check(get_exercise("lab2.q7"), {"chained_loss": fn}, seed=seeded)
    assert res.score <= 0.25 and hint in res.message, res.message


def test_chained_loss_may_not_call_the_library():
    """The reference lives where a student looks (specdec.chained_soft_ce): calling it, or its per-step
    soft_ce, is no answer; the grader sees the call in the source."""
    from specdec.grading.tampering import calls_reference

    refs = get_exercise("lab2.q7").references()
    assert {"specdec.decoder.draft_modules:chained_soft_ce", "specdec.decoder.draft_modules:soft_ce"} <= set(refs)
    for body in ("return chained_soft_ce(depth_logits, teacher_probs, weights)",
                 "return sum(w * soft_ce(x[:, d:], teacher_probs[:, d:]) for d, (x, w) in enumerate(zip(depth_logits, weights)))"):
        cells = ["from specdec import chained_soft_ce, soft_ce", f"def chained_loss(depth_logits, teacher_probs, weights):\n    {body}"]
        assert calls_reference(cells, "chained_loss", refs) is not None, body
def test_verify_step_hints_name_the_mistake(seeded):
    """Each planted q8 mistake loses points on the cache (or the values), and the feedback says which."""
    ex = get_exercise("lab2.q8")
    res = run_check(ex, {"verify_and_commit": step_without_rollback}, seed=seeded)
    assert 0 < res.score < 1 and "roll back" in res.message, res.message
    res = run_check(ex, {"verify_and_commit": step_commits_one_too_many}, seed=seeded)
    assert res.score <= 1 / 3 + 1e-9 and "one slot too many" in res.message, res.message  # values right, cache wrong
    res = run_check(ex, {"verify_and_commit": step_bonus_one_early}, seed=seeded)
    assert 0 < res.score < 1 and "bonus" in res.message, res.message  # only rows that accept all k go wrong
    res = run_check(ex, {"verify_and_commit": step_moves_finished_rows}, seed=seeded)
    assert 0 < res.score < 1 and "rides along" in res.message, res.message
    res = run_check(ex, {"verify_and_commit": step_positions_one_late}, seed=seeded)
    assert res.score < 0.5, res.message


def test_verify_step_checks_the_cache_itself():
    """Right values with a cache left alone, or one whose kept slots hold other keys, lose the cache's points;
    a step that raises, or answers in the wrong shape, scores 0 with a message that says what was expected."""
    ex = get_exercise("lab2.q8")

    def values_only(target, cache, pending, drafts, done):
        k = drafts.shape[1]
        probe = KVCache.for_model(target, len(pending), cache.max_len)  # a copy of its own: the real one stays put
        probe.k, probe.v = [t.clone() for t in cache.k], [t.clone() for t in cache.v]
        probe.lengths.copy_(cache.lengths)
        logits, _ = target(torch.cat([pending[:, None], drafts], 1), probe.positions(k + 1), probe)
        return greedy_accept(drafts, logits)

    res = run_check(ex, {"verify_and_commit": values_only}, seed=0)
    assert res.score < 0.5 and "cache lengths after the step" in res.message, res.message

    def scribbles(target, cache, pending, drafts, done):
        out = verify_and_commit(target, cache, pending, drafts, done)
        cache.k[0][:, :, 0] += 1.0  # slot 0 is committed in every row
        return out

    res = run_check(ex, {"verify_and_commit": scribbles}, seed=0)
    assert res.score < 1 and "differ from a fresh run" in res.message, res.message

    def raises(target, cache, pending, drafts, done):
        raise ValueError("shapes do not match")

    res = run_check(ex, {"verify_and_commit": raises}, seed=0)
    assert res.score == 0.0 and "raised ValueError: shapes do not match" in res.message
    res = run_check(ex, {"verify_and_commit": lambda t, c, p, d, done: greedy_accept(d, torch.zeros(len(p), 3, 9))[0]},
                    seed=0)
    assert res.score == 0.0 and "(accepted [B], next_token [B])" in res.message, res.message

    def rebuilt(target, cache, pending, drafts, done):
        out = verify_and_commit(target, cache, pending, drafts, done)
        cache.k = [t[:, :, :1] for t in cache.k]  # not the cache it was given any more
        return out

    res = run_check(ex, {"verify_and_commit": rebuilt}, seed=0)
    assert res.score == 0.0 and "one tensor per layer" in res.message, res.message


HINTS_TREES = [  # (exercise, its function, planted mistake, what the feedback names, the most it may score)
    ("lab2.q9", "tree_attention_mask", mask_sees_siblings, "not every node written before it", 0.5),
    ("lab2.q9", "tree_attention_mask", mask_misses_prefix, "committed prefix", 0.0),
    ("lab2.q9", "tree_attention_mask", mask_misses_itself, "sees itself", 0.0),
    ("lab2.q9", "tree_attention_mask", mask_sees_descendants, "not descendants", 0.0),
    ("lab2.q10", "accepted_path", path_first_child_always, "not only its first", 0.9),
    ("lab2.q10", "accepted_path", path_stops_one_early, "down to the deepest node", 0.9),
    ("lab2.q10", "accepted_path", path_bonus_at_chain_index, "not node `accepted`", 0.95),
    ("lab2.q10", "accepted_path", path_bonus_at_parent, "not at its parent", 0.95),
]


@pytest.mark.parametrize("ex_id,name,fn,hint,most", HINTS_TREES, ids=[f.__name__ for _, _, f, _, _ in HINTS_TREES])
def test_tree_mistakes_lose_points_and_are_named(ex_id, name, fn, hint, most, seeded):
    res = run_check(get_exercise(ex_id), {name: fn}, seed=seeded)
    assert res.score <= most and res.score < 1 and hint in res.message, res.message


def test_tree_answers_written_out_score_full(seeded):
    """A row-by-row walk, and a mask of 0/1 integers built with Python loops, are right answers too."""
    assert run_check(get_exercise("lab2.q10"), {"accepted_path": accepted_path_loop}, seed=seeded).score == 1.0

    def mask_loops(lengths, parents, span):
        B, N = parents.shape
        m = np.zeros((B, N, span), dtype=np.int64)
        for b in range(B):
            for i in range(N):
                m[b, i, : int(lengths[b])] = 1
                node = i
                while node >= 0:
                    m[b, i, int(lengths[b]) + node] = 1
                    node = int(parents[b, node])
        return m

    assert run_check(get_exercise("lab2.q9"), {"tree_attention_mask": mask_loops}, seed=seeded).score == 1.0


def test_tree_exercises_may_not_call_the_library():
    from specdec.grading.tampering import calls_reference

    for ex_id, name, body in (
        ("lab2.q9", "tree_attention_mask(lengths, parents, span)", "return tree_mask(lengths, parents, span)"),
        ("lab2.q10", "accepted_path(tokens, parents, target_logits)",
         "return tree_greedy_accept(tokens, parents, parents * 0, 9, target_logits)"),
    ):
        refs = get_exercise(ex_id).references()
        cells = ["from specdec import tree_mask, tree_greedy_accept", f"def {name}:\n    {body}"]
        assert calls_reference(cells, name.split("(")[0], refs) is not None, ex_id
    res = run_check(get_exercise("lab2.q9"), {"tree_attention_mask": lambda lengths, parents, span: parents}, seed=0)
    assert res.score == 0.0 and "[B, N, span]" in res.message, res.message
    res = run_check(get_exercise("lab2.q10"), {"accepted_path": lambda t, p, lg: greedy_accept(t[:, 1:], lg)}, seed=0)
    assert res.score == 0.0 and "three tensors" in res.message, res.message


def test_wrong_return_types_get_clear_messages(seeded):
    res = run_check(get_exercise("lab2.q1"), {"greedy_verify_batch": lambda d, lg: lg.argmax(-1)}, seed=seeded)
    assert res.score == 0.0 and "(accepted [B], next_token [B])" in res.message
    res = run_check(get_exercise("lab2.q1"),
                    {"greedy_verify_batch": lambda d, lg: tuple(x.unsqueeze(1) for x in greedy_accept(d, lg))})
    assert res.score == 0.0 and "must have shape" in res.message
    res = run_check(get_exercise("lab2.q2"), {"commit_step": lambda ln, a, k, d: (ln + a + 1, None)}, seed=seeded)
    assert res.score == 0.0 and "[B, k+1]" in res.message
    res = run_check(get_exercise("lab2.q3"), {"acceptance_from_log": lambda log, k: 2.0}, seed=seeded)
    assert res.score == 0.0 and "(tau, by_position)" in res.message
    res = run_check(get_exercise("lab2.q5"), {"predicted_speedup": lambda *a: "fast"}, seed=seeded)
    assert res.score == 0.0 and "must return a number" in res.message
    res = run_check(get_exercise("lab2.q6"), {"choose_k": lambda rate, k, c, k_max=8: 3}, seed=seeded)
    assert res.score == 0.0 and "(alpha, k_best)" in res.message
    res = run_check(get_exercise("lab2.q7"), {"chained_loss": lambda lg, p, w: [x.mean() for x in lg]}, seed=seeded)
    assert res.score == 0.0 and "one number" in res.message


def test_numpy_and_list_answers_are_accepted(seeded):
    """A correct answer in numpy or plain lists earns full marks too (only torch is not required)."""
    def greedy_numpy(draft, target_logits):
        n, t = greedy_accept(draft, target_logits)
        return n.numpy(), t.tolist()

    assert run_check(get_exercise("lab2.q1"), {"greedy_verify_batch": greedy_numpy}, seed=seeded).score == 1.0


def test_alpha_from_rate_inverts_the_rate():
    for alpha, k in [(0.0, 3), (0.37, 1), (0.8, 4), (0.95, 8), (1.0, 5)]:
        rate = (formulas.expected_tokens_per_step(alpha, k) - 1) / k
        assert lab2.alpha_from_rate(rate, k) == pytest.approx(alpha, abs=1e-12)


def test_check_in_a_notebook_namespace(capsys):
    res = check("lab2.q4", {"speedup_of": speedup_of})
    assert res.score == 1.0
    assert "lab2.q4 [PASS] 1/1" in capsys.readouterr().out


def test_checks_need_no_model():
    """In a fresh process, grading every exercise with the reference answers loads neither the zoo
    nor transformers: the checks work on synthetic tensors."""
    import subprocess
    import sys
    from pathlib import Path

    script = (
        "import sys, test_lab2_checks as t\n"
        "from specdec.grading.registry import get_exercise, run_check\n"
        "for ex, (name, fn) in t.REFERENCE.items():\n"
        "    assert run_check(get_exercise(ex), {name: fn}).score == 1.0, ex\n"
        "heavy = ('specdec.decoder.bundle', 'specdec.zoo', 'specdec.decoder.engine', 'transformers')\n"
        "loaded = [m for m in heavy if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parent, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
