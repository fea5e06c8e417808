"""Lab 3's checks: the reference answers score full marks, the common mistakes lose points (with a
hint that names them), a missing name or a stub scores zero; q2 is checked with the reference in
place of a wrong q1 (one mistake costs once)."""

import numpy as np
import pytest
from notebook_tools import assert_check_contract

from specdec.grading import exercises_for_lab, lab3
from specdec.grading.registry import get_exercise, run_check
from specdec.serving.measure import records

from quick import SEEDS


# --- reference answers, written the way a student would ---------------------------------------------


def accept_length_of(meta):
    return records.tau(meta["completion_tokens"], meta["spec_verify_ct"]) if meta.get("spec_verify_ct") else None


def overall_accept_length(metas):
    spec = [m for m in metas if m.get("spec_verify_ct")]
    if not spec:
        return None
    return sum(accept_length_of(m) * m["spec_verify_ct"] for m in spec) / sum(m["spec_verify_ct"] for m in spec)


def acceptance_by_position(histogram):
    return records.acceptance_by_position(histogram)


def speedup_by_category(plain_runs, spec_runs):
    tps = lambda r: r["output_tokens"] / r["wall_s"]  # noqa: E731
    return {c: tps(spec_runs[c]) / tps(plain_runs[c]) for c in plain_runs if c in spec_runs}


def crossover_concurrency(levels, plain_tok_s, spec_tok_s):
    return next((c for c, p, s in zip(levels, plain_tok_s, spec_tok_s) if not s > p), None)


def launch_flags(algorithm, num_steps, draft=None):
    flags = {"speculative_algorithm": algorithm, "speculative_num_draft_tokens": num_steps + 1}
    if algorithm != "NGRAM":
        flags.update(speculative_num_steps=num_steps, speculative_eagle_topk=1)
    if draft is not None:
        flags["speculative_draft_model_path"] = draft
    return flags


def best_config(results, baseline_outputs, itl_p95_limit_ms):
    lossless = {r["config"] for r in results} - {r["config"] for r in results if r["outputs"] != baseline_outputs}
    fits = sorted((r for r in results if r["itl_p95_ms"] <= itl_p95_limit_ms and r["config"] in lossless),
                  key=lambda r: -r["tokens_per_s"])  # sorted is stable: the first of equals stays first
    return (fits[0]["config"], fits[0]["concurrency"]) if fits else None


def predicted_crossover(levels, tau, k, plain_step_s, verify_step_s, draft_step_s):
    speedups = [tau * p / (v + k * d) for p, v, d in zip(plain_step_s, verify_step_s, draft_step_s)]
    return speedups, next((c for c, s in zip(levels, speedups) if not s > 1), None)


def tau_at_k(histogram, new_k):
    reach = acceptance_by_position(histogram)
    rates = [r / prev if prev else 0.0 for r, prev in zip(reach, [1.0] + reach)]
    rates += [rates[-1]] * (new_k - len(rates))
    return 1 + float(np.cumprod(rates[:new_k]).sum())


REFERENCE = {"lab3.q1": accept_length_of, "lab3.q2": overall_accept_length, "lab3.q3": acceptance_by_position,
             "lab3.q4": speedup_by_category, "lab3.q5": crossover_concurrency, "lab3.q6": launch_flags,
             "lab3.q7": best_config, "lab3.q8": predicted_crossover, "lab3.q9": tau_at_k}


# --- the common mistakes --------------------------------------------------------------------------


def accept_length_counts_prefill(meta):
    return meta["completion_tokens"] / meta["spec_verify_ct"] if meta.get("spec_verify_ct") else None


def accept_length_crashes_on_plain(meta):
    return (meta["completion_tokens"] - 1) / meta["spec_verify_ct"]


def overall_is_a_mean(metas):
    spec = [m for m in metas if m.get("spec_verify_ct")]
    return float(np.mean([accept_length_of(m) for m in spec])) if spec else None


def by_position_exactly_i(histogram):
    return [h / sum(histogram) for h in histogram[1:]]


def speedup_inverted(plain_runs, spec_runs):
    return {c: 1 / v for c, v in speedup_by_category(plain_runs, spec_runs).items()}


def crossover_strict(levels, plain_tok_s, spec_tok_s):
    return next((c for c, p, s in zip(levels, plain_tok_s, spec_tok_s) if s < p), None)


def flags_wrong_width(algorithm, num_steps, draft=None):
    flags = launch_flags(algorithm, num_steps, draft)
    flags["speculative_num_draft_tokens"] = num_steps
    return flags


def flags_draft_for_nextn(algorithm, num_steps, draft=None):
    return {**launch_flags(algorithm, num_steps, draft), "speculative_draft_model_path": draft or "/models/target"}


def best_ignores_limit(results, baseline_outputs, itl_p95_limit_ms):
    return best_config([{**r, "itl_p95_ms": 0.0} for r in results], baseline_outputs, itl_p95_limit_ms)


def best_strict(results, baseline_outputs, itl_p95_limit_ms):
    return best_config(results, baseline_outputs, itl_p95_limit_ms - 1e-9)


def best_ignores_outputs(results, baseline_outputs, itl_p95_limit_ms):
    return best_config([{**r, "outputs": baseline_outputs} for r in results], baseline_outputs, itl_p95_limit_ms)


def best_checks_parity_per_point(results, baseline_outputs, itl_p95_limit_ms):
    same = [r for r in results if r["outputs"] == baseline_outputs]
    return best_config(same, baseline_outputs, itl_p95_limit_ms)


def crossover_without_draft(levels, tau, k, plain_step_s, verify_step_s, draft_step_s):
    return predicted_crossover(levels, tau, k, plain_step_s, verify_step_s, [0.0] * len(levels))


def crossover_tau_minus_one(levels, tau, k, plain_step_s, verify_step_s, draft_step_s):
    speedups, _ = predicted_crossover(levels, tau, k, plain_step_s, verify_step_s, draft_step_s)
    speedups = [s * (tau - 1) / tau for s in speedups]
    return speedups, next((c for c, s in zip(levels, speedups) if s <= 1), None)


def crossover_interpolated(levels, tau, k, plain_step_s, verify_step_s, draft_step_s):
    speedups, _ = predicted_crossover(levels, tau, k, plain_step_s, verify_step_s, draft_step_s)
    for (c0, s0), (c1, s1) in zip(zip(levels, speedups), zip(levels[1:], speedups[1:])):
        if s0 > 1 >= s1:
            return speedups, float(np.exp(np.log(c0) + (s0 - 1) / (s0 - s1) * (np.log(c1) - np.log(c0))))
    return speedups, (levels[0] if speedups[0] <= 1 else None)


def crossover_strictly_below(levels, tau, k, plain_step_s, verify_step_s, draft_step_s):
    speedups, _ = predicted_crossover(levels, tau, k, plain_step_s, verify_step_s, draft_step_s)
    return speedups, next((c for c, s in zip(levels, speedups) if s < 1), None)


def tau_without_bonus(histogram, new_k):
    return tau_at_k(histogram, new_k) - 1


def tau_iid_mean_rate(histogram, new_k):
    k, steps = len(histogram) - 1, sum(histogram)
    rate = sum(i * h for i, h in enumerate(histogram)) / (k * steps)
    return sum(rate ** i for i in range(new_k + 1))


def tau_measured_whatever_k(histogram, new_k):
    return records.tau_from_histogram(histogram)


PLANTED = [
    ("lab3.q1", accept_length_counts_prefill, "prefill"), ("lab3.q1", accept_length_crashes_on_plain, None),
    ("lab3.q2", overall_is_a_mean, "weight by tokens"), ("lab3.q3", by_position_exactly_i, "exactly i"),
    ("lab3.q4", speedup_inverted, "speculative over plain"), ("lab3.q5", crossover_strict, None),
    ("lab3.q6", flags_wrong_width, "topk 1 forces"), ("lab3.q6", flags_draft_for_nextn, "not for this algorithm"),
    ("lab3.q7", best_ignores_limit, "is over the limit"), ("lab3.q7", best_strict, "means <="),
    ("lab3.q7", best_ignores_outputs, "changes the outputs"),
    ("lab3.q7", best_checks_parity_per_point, "out at every concurrency"),
    ("lab3.q8", crossover_without_draft, "drafter's time is missing"), ("lab3.q8", crossover_tau_minus_one, "tau - 1"),
    ("lab3.q8", crossover_interpolated, "interpolated"), ("lab3.q8", crossover_strictly_below, "exactly 1"),
    ("lab3.q9", tau_without_bonus, "bonus"), ("lab3.q9", tau_iid_mean_rate, "i.i.d."),
    ("lab3.q9", tau_measured_whatever_k, "measured tau"),
]


def test_exercise_list():
    exs = exercises_for_lab(3)
    assert [e.id for e in exs] == [f"lab3.q{i}" for i in range(1, 10)]
    assert all(e.points == 1 for e in exs[:6])  # bookkeeping: one point each


def test_most_points_are_on_understanding():
    """Issue 23: at least 60% of the lab's points on exercises whose answer is not printed above them."""
    understanding = {"lab3.q7", "lab3.q8", "lab3.q9"}
    points = {e.id: e.points for e in exercises_for_lab(3)}
    assert sum(points[i] for i in understanding) / sum(points.values()) >= 0.6


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("ex_id", sorted(REFERENCE))
def test_reference_scores_full(ex_id, seed):
    res = run_check(get_exercise(ex_id), {get_exercise(ex_id).reads: REFERENCE[ex_id]}, seed=seed)
    assert res.score == 1.0, res.message


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("ex_id,fn,hint", PLANTED, ids=[f.__name__ for _, f, _ in PLANTED])
def test_planted_mistake_loses_points(ex_id, fn, hint, seed):
    res = run_check(get_exercise(ex_id), {get_exercise(ex_id).reads: fn}, seed=seed)
    assert res.score < 1.0, res.message
    if hint:
        assert hint in res.message, res.message


@pytest.mark.parametrize("ex_id", sorted(REFERENCE))
def test_missing_name_stub_and_non_function_score_zero(ex_id):
    assert_check_contract(ex_id, get_exercise(ex_id).reads)


def test_a_wrong_q1_does_not_cost_q2(seed=0):
    """q2 written on top of the student's q1: q1's mistake costs q1's point only."""
    ns = {"accept_length_of": accept_length_counts_prefill, "overall_accept_length": overall_accept_length}
    assert run_check(get_exercise("lab3.q1"), ns, seed=seed).score < 1
    res = run_check(get_exercise("lab3.q2"), ns, seed=seed)
    assert res.score == 1.0, res.message


def test_cases_look_like_real_sglang_records():
    """The random responses carry the same fields, with consistent counters, as SGLang 0.5.16 sent
    on an H200 (tests/fixtures/sglang)."""
    import json
    from pathlib import Path

    real = [json.loads(p.read_text()) for p in sorted((Path(__file__).parent / "fixtures" / "sglang").glob("*.json"))]
    metas = [m for r in real for m in _metas(r) if m.get("spec_verify_ct")]
    assert metas, "no speculative record among the fixtures"
    rng = np.random.default_rng(0)
    fake = lab3.spec_meta(rng)
    for m in metas:
        assert set(m) >= {"completion_tokens", "spec_verify_ct", "spec_accept_length"}
        assert {"completion_tokens", "spec_verify_ct", "spec_accept_length"} <= set(fake)
        hist_key = "spec_correct_drafts_histogram" if "spec_correct_drafts_histogram" in m else "spec_accept_histogram"
        if hist_key in m:
            assert sum(m[hist_key]) == m["spec_verify_ct"]
    assert sum(fake["spec_correct_drafts_histogram"]) == fake["spec_verify_ct"]
    assert fake["spec_accept_length"] == fake["completion_tokens"] / fake["spec_verify_ct"]


def _metas(obj):
    """Every meta_info dict inside a recorded response (streamed chunks, lists, nested records)."""
    if isinstance(obj, dict):
        if "meta_info" in obj and isinstance(obj["meta_info"], dict):
            yield obj["meta_info"]
        for v in obj.values():
            yield from _metas(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _metas(v)


def test_feedback_names_the_case_once(seed=0):
    res = run_check(get_exercise("lab3.q1"), {"accept_length_of": accept_length_counts_prefill}, seed=seed)
    shown = res.message.split("first failure: ")[1].split(": ")[0]
    assert shown.startswith("completion_tokens=") and res.message.count(shown) == 1, res.message


@pytest.mark.parametrize("seed", SEEDS)
def test_a_wrong_formula_earns_nothing_for_its_none_cases(seed):
    """Returning None without counters is right whatever the formula: alone it earns nothing."""
    for ex_id, fn in (("lab3.q1", accept_length_counts_prefill), ("lab3.q2", overall_is_a_mean)):
        res = run_check(get_exercise(ex_id), {get_exercise(ex_id).reads: fn}, seed=seed)
        assert res.score == 0.0, (ex_id, res.message)
