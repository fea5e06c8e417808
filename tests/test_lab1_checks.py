"""Lab 1's checks: the reference passes, a planted wrong answer loses points, a missing name scores 0.

check() draws fresh inputs from os.urandom; here the cases' seeds are fixed so that the tests are
deterministic (q3's chi-square would otherwise fail a correct answer about 3 times in 10,000).
"""

import numpy as np
import pytest
from notebook_tools import assert_check_contract

from specdec.grading import check, exercises_for_lab, lab1
from specdec.grading.registry import get_exercise, run_check
from specdec.sim import formulas, stats, verify
from specdec.sim.tree import DraftTree

from quick import SEEDS


# --- reference answers, written the way a student would call specdec ------------------------------


def residual(p, q):
    return verify.residual_distribution(p, q)


def accept_draft(x, p, q, u):
    return verify.accept_reject_step(x, p, q, u)


def speculative_step(p_rows, q_rows, draft_tokens, rng):
    return verify.speculative_sample(p_rows, q_rows, draft_tokens, rng)


def alpha_of(p, q):
    return formulas.acceptance_alpha(p, q)


def tokens_per_step(alpha, k):
    return formulas.expected_tokens_per_step(alpha, k)


def best_k(alpha, c, k_max=32):
    return formulas.optimal_k(alpha, c, k_max)[0]


def acceptance_summary(accepted, k):
    s = stats.AcceptanceStats.from_accepted(accepted, k)
    return s.tau, s.acceptance_rate


def tau_from_positions(alphas):
    return formulas.tau_from_positions(alphas)


def alpha_at_temperature(target_logits, draft_logits, temperature):
    return formulas.alpha_at_temperature(target_logits, draft_logits, temperature)


def first_biased_position(sampler, p_rows, q_rows):
    """From the distributions the grader computes exactly, as a student who worked them out would."""
    return lab1.reference_first_biased_position(sampler, p_rows, q_rows)


def tree_accept_length(parents, accept):
    return DraftTree(tuple(parents), tuple(accept)).expected_accepted()


def multi_draft_verify(p, q, candidates, u):
    return verify.multi_draft_verify(p, q, candidates, u)


REFERENCE = {
    "lab1.q1": ("residual", residual),
    "lab1.q2": ("accept_draft", accept_draft),
    "lab1.q3": ("speculative_step", speculative_step),
    "lab1.q4": ("alpha_of", alpha_of),
    "lab1.q5": ("tokens_per_step", tokens_per_step),
    "lab1.q6": ("best_k", best_k),
    "lab1.q7": ("acceptance_summary", acceptance_summary),
    "lab1.q8": ("tau_from_positions", tau_from_positions),
    "lab1.q9": ("alpha_at_temperature", alpha_at_temperature),
    "lab1.q10": ("first_biased_position", first_biased_position),
    "lab1.q11": ("tree_accept_length", tree_accept_length),
    "lab1.q12": ("multi_draft_verify", multi_draft_verify),
}


# --- planted mistakes, the common ones ------------------------------------------------------------


def residual_unnormalised(p, q):
    return np.maximum(p - q, 0)


def accept_draft_inverted(x, p, q, u):
    return u < q[x] / p[x] if p[x] > 0 else True


def speculative_step_resamples_q(p_rows, q_rows, draft_tokens, rng):
    for i, x in enumerate(draft_tokens):
        if rng.random() >= min(1, p_rows[i][x] / q_rows[i][x]):
            return i, list(draft_tokens[:i]) + [rng.choice(len(q_rows[i]), p=q_rows[i])]
    return len(draft_tokens), list(draft_tokens) + [rng.choice(len(p_rows[-1]), p=p_rows[-1])]


def speculative_step_no_bonus(p_rows, q_rows, draft_tokens, rng):
    for i, x in enumerate(draft_tokens):
        if rng.random() >= min(1, p_rows[i][x] / q_rows[i][x]):
            return i, list(draft_tokens[:i]) + [rng.choice(len(p_rows[i]), p=residual(p_rows[i], q_rows[i]))]
    return len(draft_tokens), list(draft_tokens)


def alpha_of_max(p, q):
    return float(np.maximum(p, q).sum())


def alpha_of_one_minus_l1(p, q):
    return float(1 - np.abs(p - q).sum())


def tokens_per_step_off_by_one(alpha, k):
    return (1 - alpha**k) / (1 - alpha) if alpha < 1 else k


def tokens_per_step_naive(alpha, k):
    return (1 - alpha ** (k + 1)) / (1 - alpha)  # ZeroDivisionError at alpha = 1


def best_k_ignores_cost(alpha, c, k_max=32):
    return k_max


def best_k_off_by_one(alpha, c, k_max=32):
    return int(np.argmax([formulas.walltime_improvement(alpha, k, c) for k in range(1, k_max + 1)]))


def summary_counts_drafts_only(accepted, k):  # the gpt-fast / HF convention
    return float(np.mean(accepted)), float(np.mean(accepted) / k)


def summary_rate_over_k_plus_1(accepted, k):
    return float(np.mean(accepted) + 1), float(np.mean(accepted) / (k + 1))


def tau_from_positions_sum(alphas):  # each draft on its own, as if the ones before it did not matter
    return 1 + float(np.sum(alphas))


def tau_from_positions_mean(alphas):  # the mean acceptance in the i.i.d. formula
    return formulas.expected_tokens_per_step(float(np.mean(alphas)), len(alphas))


def tau_from_positions_no_bonus(alphas):
    return float(np.cumprod(alphas).sum())


def alpha_at_temperature_ignores_t(target_logits, draft_logits, temperature):
    return alpha_at_temperature(target_logits, draft_logits, 1.0)


def alpha_at_temperature_overflows(target_logits, draft_logits, temperature):  # no greedy case, no shift
    with np.errstate(over="ignore", invalid="ignore"):
        p, q = (np.exp(np.asarray(z) / max(temperature, 1e-3)) for z in (target_logits, draft_logits))
        return float(np.minimum(p / p.sum(), q / q.sum()).sum())


def alpha_at_temperature_multiplies(target_logits, draft_logits, temperature):  # logits * T
    return alpha_at_temperature(np.asarray(target_logits) * temperature, np.asarray(draft_logits) * temperature, 1.0)


def first_biased_position_generic(sampler, p_rows, q_rows):  # where each bug acts on random rows, ignoring p == q
    return {"A": 2, "B": 0, "C": 1, "D": len(q_rows) + 1}[sampler]


def first_biased_position_lossless_a(sampler, p_rows, q_rows):  # the shared uniform taken for harmless
    return 0 if sampler == "A" else first_biased_position(sampler, p_rows, q_rows)


def first_biased_position_bonus_c(sampler, p_rows, q_rows):  # the resample-from-q bug put at the bonus position
    return len(q_rows) + 1 if sampler == "C" else first_biased_position(sampler, p_rows, q_rows)


def tree_accept_length_tau(parents, accept):  # tau, not the accept length
    return tree_accept_length(parents, accept) + 1


def tree_accept_length_no_path(parents, accept):  # each node on its own, as if its parent did not matter
    return float(np.sum(accept))


def tree_accept_length_independent_siblings(parents, accept):  # per depth, P(some child) = 1 - prod(1 - a)
    depths = DraftTree(tuple(parents), tuple(accept)).depths()
    a = np.asarray(accept)
    reach = np.cumprod([1 - np.prod(1 - a[depths == d]) for d in range(1, depths.max() + 1)])
    return float(reach.sum())


def tree_accept_length_first_candidates(parents, accept):  # only the first child of each node
    path, node = [], -1
    while node in parents:
        node = parents.index(node)
        path.append(accept[node])
    return float(np.cumprod(path).sum())


def multi_draft_verify_no_update(p, q, candidates, u):  # every sibling judged against p itself
    for i, x in enumerate(candidates):
        if u[i] < p[x] / q[x]:
            return i, p
    return -1, residual(p, q)


def multi_draft_verify_unnormalised(p, q, candidates, u):
    r = np.asarray(p, dtype=float)
    for i, x in enumerate(candidates):
        if u[i] < r[x] / q[x]:
            return i, r
        r = np.maximum(r - q, 0.0)
    return -1, r


def multi_draft_verify_falls_back_to_q(p, q, candidates, u):  # all rejected: sample the draft again
    i, r = multi_draft_verify(p, q, candidates, u)
    return i, (r if i >= 0 else q)


PLANTED = [
    ("lab1.q1", "residual", residual_unnormalised),
    ("lab1.q2", "accept_draft", accept_draft_inverted),
    ("lab1.q3", "speculative_step", speculative_step_resamples_q),
    ("lab1.q3", "speculative_step", speculative_step_no_bonus),
    ("lab1.q4", "alpha_of", alpha_of_max),
    ("lab1.q4", "alpha_of", alpha_of_one_minus_l1),
    ("lab1.q5", "tokens_per_step", tokens_per_step_off_by_one),
    ("lab1.q5", "tokens_per_step", tokens_per_step_naive),
    ("lab1.q6", "best_k", best_k_ignores_cost),
    ("lab1.q6", "best_k", best_k_off_by_one),
    ("lab1.q7", "acceptance_summary", summary_counts_drafts_only),
    ("lab1.q7", "acceptance_summary", summary_rate_over_k_plus_1),
    ("lab1.q8", "tau_from_positions", tau_from_positions_sum),
    ("lab1.q8", "tau_from_positions", tau_from_positions_mean),
    ("lab1.q8", "tau_from_positions", tau_from_positions_no_bonus),
    ("lab1.q9", "alpha_at_temperature", alpha_at_temperature_ignores_t),
    ("lab1.q9", "alpha_at_temperature", alpha_at_temperature_overflows),
    ("lab1.q9", "alpha_at_temperature", alpha_at_temperature_multiplies),
    ("lab1.q10", "first_biased_position", first_biased_position_generic),
    ("lab1.q10", "first_biased_position", first_biased_position_lossless_a),
    ("lab1.q10", "first_biased_position", first_biased_position_bonus_c),
    ("lab1.q11", "tree_accept_length", tree_accept_length_tau),
    ("lab1.q11", "tree_accept_length", tree_accept_length_no_path),
    ("lab1.q11", "tree_accept_length", tree_accept_length_independent_siblings),
    ("lab1.q11", "tree_accept_length", tree_accept_length_first_candidates),
    ("lab1.q12", "multi_draft_verify", multi_draft_verify_no_update),
    ("lab1.q12", "multi_draft_verify", multi_draft_verify_unnormalised),
    ("lab1.q12", "multi_draft_verify", multi_draft_verify_falls_back_to_q),
]


@pytest.fixture(params=SEEDS)
def seeded(request):
    return request.param


def test_exercise_list():
    ids = [e.id for e in exercises_for_lab(1)]
    assert ids == [f"lab1.q{i}" for i in range(1, 13)]
    assert sum(e.points for e in exercises_for_lab(1)) == 20
    # issue 23: at least 60% of the points on exercises whose answer is not printed above them
    understanding = {"lab1.q3", "lab1.q8", "lab1.q9", "lab1.q10", "lab1.q11", "lab1.q12"}
    points = {e.id: e.points for e in exercises_for_lab(1)}
    assert sum(points[i] for i in understanding) / sum(points.values()) >= 0.6


@pytest.mark.parametrize("ex_id", sorted(REFERENCE))
def test_reference_scores_full(ex_id, seeded):
    name, fn = REFERENCE[ex_id]
    res = run_check(get_exercise(ex_id), {name: fn}, seed=seeded)
    assert res.score == 1.0, res.message


@pytest.mark.parametrize("ex_id,name,fn", PLANTED, ids=[f.__name__ for _, _, f in PLANTED])
def test_planted_mistake_loses_points(ex_id, name, fn, seeded):
    res = run_check(get_exercise(ex_id), {"residual": residual, name: fn}, seed=seeded)  # q3 may call residual
    assert res.score < 1.0, res.message
    assert res.message


@pytest.mark.parametrize("ex_id", sorted(set(REFERENCE) - {"lab1.q3"}))
def test_unseeded_reference_passes(ex_id):
    """The real thing, os.urandom seeds (q3 is statistical: only with fixed seeds above)."""
    name, fn = REFERENCE[ex_id]
    assert run_check(get_exercise(ex_id), {name: fn}).score == 1.0


@pytest.mark.parametrize("ex_id", sorted(REFERENCE))
def test_missing_name_stub_and_non_function_score_zero(ex_id):
    assert_check_contract(ex_id, REFERENCE[ex_id][0])


def test_partial_credit_and_hints(seeded):
    res = run_check(get_exercise("lab1.q7"), {"acceptance_summary": summary_counts_drafts_only}, seed=seeded)
    assert res.score == 0.5 and "bonus" in res.message  # rate right, tau off by the bonus token
    res = run_check(get_exercise("lab1.q5"), {"tokens_per_step": tokens_per_step_naive}, seed=seeded)
    assert res.score == pytest.approx(11 / 12) and "ZeroDivisionError" in res.message
    res = run_check(get_exercise("lab1.q3"), {"speculative_step": speculative_step_resamples_q, "residual": residual},
                    seed=seeded)
    assert 0 < res.score < 1 and "residual" in res.message


def test_wrong_return_types_get_clear_messages(seeded):
    res = run_check(get_exercise("lab1.q2"), {"accept_draft": lambda x, p, q, u: min(1, p[x] / q[x])}, seed=seeded)
    assert res.score == 0.0 and "True or False" in res.message
    res = run_check(get_exercise("lab1.q6"), {"best_k": lambda a, c, k_max: formulas.optimal_k(a, c, k_max)}, seed=seeded)
    assert res.score == 0.0 and "just the integer k" in res.message
    res = run_check(get_exercise("lab1.q7"), {"acceptance_summary": lambda log, k: 2.0}, seed=seeded)
    assert res.score == 0.0 and "(tau, acceptance_rate)" in res.message


def test_odd_answers_score_zero_and_never_break_the_grader(seeded):
    res = run_check(get_exercise("lab1.q6"), {"best_k": lambda a, c, k_max: 10**400}, seed=seeded)
    assert res.score == 0.0 and res.message
    res = run_check(get_exercise("lab1.q3"), {"speculative_step": lambda p, q, d, rng: (0, [-1])}, seed=seeded)
    assert res.score == 0.0 and "ids in 0.." in res.message  # -1 would index p's last token
    res = run_check(get_exercise("lab1.q7"), {"acceptance_summary": lambda log, k: (float("nan"), None)}, seed=seeded)
    assert res.score == 0.0 and "two numbers" in res.message


def test_check_in_a_notebook_namespace(capsys):
    res = check("lab1.q4", {"alpha_of": alpha_of})
    assert res.score == 1.0
    assert "lab1.q4 [PASS] 1/1" in capsys.readouterr().out


@pytest.mark.parametrize("fn", [speculative_step_resamples_q, speculative_step_no_bonus], ids=lambda f: f.__name__)
def test_the_classic_sampling_bugs_earn_well_under_half(fn, seeded):
    """Output that does not follow p is a wrong sampler, whatever its mechanics get right."""
    res = run_check(get_exercise("lab1.q3"), {"speculative_step": fn}, seed=seeded)
    assert res.score < 0.4, res.message


def test_hints_for_the_new_exercises(seeded):
    res = run_check(get_exercise("lab1.q8"), {"tau_from_positions": tau_from_positions_no_bonus}, seed=seeded)
    assert res.score == 0.0 and "bonus" in res.message
    res = run_check(get_exercise("lab1.q8"), {"tau_from_positions": tau_from_positions_sum}, seed=seeded)
    assert res.score < 0.5 and "product" in res.message, res.message
    res = run_check(get_exercise("lab1.q9"), {"alpha_at_temperature": alpha_at_temperature_overflows}, seed=seeded)
    assert res.score < 1.0 and "T=0" in res.message
    res = run_check(get_exercise("lab1.q10"), {"first_biased_position": lambda s, p, q: "A"}, seed=seeded)
    assert res.score == 0.0 and "integer in 0..k+1" in res.message


def test_q10_mistakes_each_cost_a_share(seeded):
    """Each planted misreading of one sampler loses the cases of that sampler where it matters, and no more."""
    for fn in (first_biased_position_lossless_a, first_biased_position_bonus_c, first_biased_position_generic):
        res = run_check(get_exercise("lab1.q10"), {"first_biased_position": fn}, seed=seeded)
        assert 0.0 < res.score < 1.0, (fn.__name__, res.message)


def test_q10_the_rule_of_the_solution_matches_the_exact_distributions():
    """The solution reasons about where each change acts; the grader computes the distributions. They agree."""
    import nbformat
    from notebook_tools import REPO

    cells = nbformat.read(REPO / "solutions" / "01_simulated_loop.ipynb", as_version=4).cells
    ns: dict = {"np": np}
    exec(next(c.source for c in cells if c.source.startswith("def first_biased_position")), ns)
    for seed in range(40):
        for case in lab1.sampler_cases(np.random.default_rng(seed)):
            assert ns["first_biased_position"](*case.args) == lab1.reference_first_biased_position(*case.args), case.shown


def test_q10_exact_distributions_match_the_notebooks_samplers():
    """The notebook's sampler_A .. sampler_D, run: every position follows the distribution the grader computes
    (chi-square), and where it differs from the target a test sees that too."""
    import nbformat
    from notebook_tools import REPO

    cells = nbformat.read(REPO / "solutions" / "01_simulated_loop.ipynb", as_version=4).cells
    ns: dict = {"np": np, "verify": verify}
    exec(next(c.source for c in cells if c.source.startswith("def sampler_A")), ns)
    rng = np.random.default_rng(5)
    v, k, n = 3, 2, 6000
    p_rows, q_rows = lab1.random_step(rng, v, k, (0.45, 0.6))
    for name, sampler in ns["SAMPLERS"].items():
        exact = lab1.emitted_distributions(name, p_rows, q_rows)
        emitted = [sampler(p_rows, q_rows, [int(rng.choice(v, p=q)) for q in q_rows], rng)[1] for _ in range(n)]
        for j in range(k + 1):
            tokens = [int(e[j]) for e in emitted if len(e) > j]
            assert stats.chi_square_test(tokens, exact[j]).pvalue > 1e-4, (name, j + 1)
            if 0.5 * np.abs(exact[j] - p_rows[j]).sum() > 0.03:
                assert stats.chi_square_test(tokens, p_rows[j]).pvalue < 1e-4, (name, j + 1)
        assert lab1.reference_first_biased_position(name, p_rows, q_rows) == {"A": 2, "B": 0, "C": 1, "D": 3}[name]


def test_hints_for_the_tree_exercises(seeded):
    res = run_check(get_exercise("lab1.q11"), {"tree_accept_length": tree_accept_length_tau}, seed=seeded)
    assert res.score == 0.0 and "not the target's own token" in res.message
    res = run_check(get_exercise("lab1.q11"), {"tree_accept_length": tree_accept_length_no_path}, seed=seeded)
    assert res.score < 0.5 and "parent" in res.message, res.message
    res = run_check(get_exercise("lab1.q12"), {"multi_draft_verify": lambda p, q, c, u: -1}, seed=seeded)
    assert res.score == 0.0 and "(index, distribution)" in res.message
    res = run_check(get_exercise("lab1.q12"), {"multi_draft_verify": multi_draft_verify_falls_back_to_q}, seed=seeded)
    assert 0 < res.score < 1 and "all rejected" in res.message


def test_q11_cases_are_valid_trees_of_every_kind():
    for seed in range(20):
        cases = lab1.tree_cases(np.random.default_rng(seed))
        assert {c.tag for c in cases} == {"chain", "star", "any", "a zero", "sure"}
        for c in cases:
            DraftTree(tuple(c.args[0]), tuple(c.args[1]))  # raises if a node's children sum past 1


def test_q12_cases_judge_later_siblings():
    """A third reject the first candidate, a sixth reject them all: the updated target decides there."""
    for seed in range(10):
        wants = [verify.multi_draft_verify(*c.args)[0] for c in lab1.multi_draft_cases(np.random.default_rng(seed))]
        assert sum(w >= 1 for w in wants) >= 2 and sum(w == -1 for w in wants) >= 4



@pytest.mark.parametrize("ex_id, source", [
    ("lab1.q11", "def tree_accept_length(parents, accept):\n    return DraftTree(parents, accept).expected_accepted()"),
    ("lab1.q12", "def multi_draft_verify(p, q, candidates, u):\n    return verify.multi_draft_verify(p, q, candidates, u)"),
])
def test_q11_q12_wrappers_of_the_reference_are_seen_in_the_source(ex_id, source):
    """Handing the exercise to specdec's answer scores 0 (the grader reads the source); the solution's own does not."""
    from specdec.grading.tampering import calls_reference

    ex = get_exercise(ex_id)
    assert calls_reference([source], ex.reads, ex.references()) is not None
    honest = "def tree_accept_length(parents, accept):\n    reach = [a for a in accept]\n    return sum(reach)"
    assert calls_reference([honest], "tree_accept_length", get_exercise("lab1.q11").references()) is None
