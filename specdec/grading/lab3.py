"""Lab 3's exercises (live speculative servers), declared as data: see exercise.py.

The cases are response records in SGLang's real shapes (0.5.16 names with their aliases, or 0.5.23's
names only, at random), sweep results, launch scenarios, step times and histograms; the references are
specdec.serving.measure's. q1 to q6 are bookkeeping (1 point each); q7 to q9 (10 of the 16 points) ask for what
is not printed above them: what to serve without changing the answers, the crossover predicted from step times,
and the accept length at another k.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from specdec.grading.answers import close, number, short
from specdec.grading.exercise import Case, Exercise, Part, WrongShape
from specdec.serving.measure import compare, records
from specdec.sim import formulas
from specdec.serving.ops.launch import LaunchConfig, LaunchConfigError

# --- response records ----------------------------------------------------------------------------


def spec_meta(rng: np.random.Generator, k: int | None = None) -> dict:
    """A speculative /generate meta_info as SGLang writes it: counters consistent with each other."""
    k = k or int(rng.integers(1, 8))
    steps = int(rng.integers(1, 40))
    alpha = rng.uniform(0.2, 0.95)
    accepted = np.cumprod(rng.random((steps, k)) < alpha, 1).sum(1)
    completion = 1 + int((accepted + 1).sum())  # the first token from the prefill, then accepted + 1 per step
    hist = np.bincount(accepted, minlength=k + 1).tolist()
    correct, proposed = int(accepted.sum()), steps * k
    meta = {"id": f"{int(rng.integers(1 << 30)):x}", "finish_reason": {"type": "length", "length": completion},
            "prompt_tokens": int(rng.integers(3, 200)), "completion_tokens": completion, "cached_tokens": 0,
            "e2e_latency": float(rng.uniform(0.05, 5)), "spec_verify_ct": steps,
            "spec_accept_length": completion / steps, "spec_accept_rate": correct / proposed,
            "spec_num_correct_drafts": correct, "spec_num_proposed_drafts": proposed,
            "spec_correct_drafts_histogram": hist}
    if rng.random() < 0.5:  # 0.5.16 also sends the older names of the same numbers (gone in 0.5.23)
        meta.update(spec_accepted_drafts=correct, spec_proposed_drafts=proposed, spec_accept_histogram=hist)
    return meta


# Real answers of SGLang 0.5.16 (NEXTN, EAGLE and plain on the tiny zoo, recorded on an H200): every
# check also runs on a few of these, so a definition that only fits made-up counters cannot pass.
RECORDED = json.loads((Path(__file__).with_name("sglang_0516_metas.json")).read_text())["metas"]


def recorded_metas(rng: np.random.Generator, n: int) -> list[dict]:
    return [dict(RECORDED[i]) for i in rng.choice(len(RECORDED), size=n, replace=False)]


def plain_meta(rng: np.random.Generator) -> dict:
    """A plain server's meta_info: no speculative counters."""
    n = int(rng.integers(1, 200))
    return {"id": "0", "finish_reason": {"type": "length", "length": n}, "prompt_tokens": int(rng.integers(3, 200)),
            "completion_tokens": n, "cached_tokens": 0, "e2e_latency": float(rng.uniform(0.05, 5))}


def reference_accept_length_of(meta: dict) -> float | None:
    """(completion_tokens - 1) / spec_verify_ct, or None without counters."""
    if not meta.get("spec_verify_ct"):
        return None
    return records.tau(meta["completion_tokens"], meta["spec_verify_ct"])


def judge_maybe_number(name: str):
    def judge(case: Case, got: Any, want: float | None) -> str | None:
        if want is None:
            return None if got is None else f"no speculative counters here: expected None, got {short(got)}"
        x = number(got)
        if x is None:
            raise WrongShape(f"{name} must return a number (or None), got {short(got)}")
        if close(x, want, rel=1e-9, abs_=1e-12):
            return None
        meta = case.args[0] if isinstance(case.args[0], dict) else None
        if meta and close(x, meta["completion_tokens"] / meta["spec_verify_ct"], rel=1e-9):
            return (f"{case.shown}: got {x:.4f} = completion_tokens / spec_verify_ct; the first token came from the "
                    f"prefill, not from a verify step (expected {want:.4f})")
        return f"{case.shown}: expected {want:.4f}, got {x:.4f}"
    return judge


def one_meta_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for i in range(10):
        meta = plain_meta(rng) if i == 3 else spec_meta(rng)
        cases.append(Case((meta,), shown=f"completion_tokens={meta['completion_tokens']}, "
                                         f"spec_verify_ct={meta.get('spec_verify_ct')}", free=not meta.get("spec_verify_ct")))
    for meta in recorded_metas(rng, 3):
        cases.append(Case((meta,), shown=f"a real SGLang answer: completion_tokens={meta['completion_tokens']}, "
                                         f"spec_verify_ct={meta.get('spec_verify_ct')}", free=not meta.get("spec_verify_ct")))
    return cases


Q1 = Exercise(
    id="lab3.q1", points=1, title="accept length of one request", reads="accept_length_of", signature="(meta)",
    parts=(Part(one_meta_cases, judge_maybe_number("accept_length_of"), reference_accept_length_of,
                what="responses"),),
    stand_in="specdec.grading.lab3:reference_accept_length_of",
    answered_by=("specdec.serving.measure.records:tau",),  # what the reference hands it to
)


def reference_overall_accept_length(metas: list[dict]) -> float | None:
    return records.pooled_tau((m["completion_tokens"], 1, m.get("spec_verify_ct")) for m in metas)


def many_meta_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for i in range(8):
        n = int(rng.integers(2, 9))
        metas = [spec_meta(rng) for _ in range(n)]
        if i % 3 == 1:
            metas.insert(int(rng.integers(0, n)), plain_meta(rng))
        if i == 7:
            metas = [plain_meta(rng) for _ in range(3)]
        cases.append(Case((metas,), shown=f"{len(metas)} responses (verify steps "
                                          f"{[m.get('spec_verify_ct') for m in metas]})", free=i == 7))
    metas = recorded_metas(rng, 5)
    cases.append(Case((metas,), shown=f"{len(metas)} real SGLang answers (verify steps "
                                      f"{[m.get('spec_verify_ct') for m in metas]})"))
    return cases


def judge_overall(case: Case, got: Any, want: float | None) -> str | None:
    why = judge_maybe_number("overall_accept_length")(case, got, want)
    if why is None or want is None:
        return why
    x = number(got)
    spec = [m for m in case.args[0] if m.get("spec_verify_ct")]
    mean = float(np.mean([(m["completion_tokens"] - 1) / m["spec_verify_ct"] for m in spec]))
    if x is not None and close(x, mean, rel=1e-9):
        return f"{case.shown}: got the mean of per-request values ({x:.4f}); weight by tokens instead (expected {want:.4f})"
    return why


Q2 = Exercise(
    id="lab3.q2", points=1, title="accept length across requests, weighted by tokens", reads="overall_accept_length",
    signature="(metas)", parts=(Part(many_meta_cases, judge_overall, reference_overall_accept_length,
                                     what="sets of responses"),),
    uses=(Q1,),
)


# --- q3: acceptance by position ----------------------------------------------------------------------


def histogram_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for i in range(10):
        hist = spec_meta(rng)["spec_correct_drafts_histogram"]
        if i == 0:
            hist = [0] * (len(hist) - 1) + [7]  # every draft accepted
        cases.append(Case((hist,), shown=f"histogram {hist}"))
    return cases


def judge_by_position(case: Case, got: Any, want: list[float]) -> str | None:
    try:
        a = np.asarray(got, dtype=float).ravel()
    except (TypeError, ValueError):
        raise WrongShape(f"acceptance_by_position must return a list of numbers, got {short(got)}") from None
    if a.shape != (len(want),):
        raise WrongShape(f"{case.shown}: k = {len(want)} positions expected, got {a.size} values "
                         "(position 1..k: histogram[0] counts steps with no draft accepted)")
    if np.allclose(a, want, atol=1e-9):
        return None
    hist = np.asarray(case.args[0], dtype=float)
    if np.allclose(a, hist[1:] / hist.sum(), atol=1e-9):
        return f"{case.shown}: that is P(exactly i accepted); draft i is accepted in every step that accepted i or more"
    return f"{case.shown}: expected {np.round(want, 4).tolist()}, got {np.round(a, 4).tolist()}"


Q3 = Exercise(
    id="lab3.q3", points=1, title="acceptance by position from the histogram", reads="acceptance_by_position",
    signature="(histogram)", parts=(Part(histogram_cases, judge_by_position, records.acceptance_by_position,
                                         what="histograms"),),
    stand_in="specdec.serving.measure.records:acceptance_by_position",  # for q9, which may call it
)


# --- q4: speedup per category ------------------------------------------------------------------------
CATEGORIES = ("predictable", "code", "open")


def runs(rng: np.random.Generator, cats) -> dict:
    return {c: {"output_tokens": int(rng.integers(50, 5000)), "wall_s": float(rng.uniform(0.2, 30))} for c in cats}


def speedup_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for i in range(8):
        cats = [str(c) for c in rng.permutation(CATEGORIES)[: int(rng.integers(1, 4))]]
        plain, spec = runs(rng, cats), runs(rng, cats)
        if i == 2:
            spec[cats[0]]["output_tokens"] = plain[cats[0]]["output_tokens"]  # same tokens, different times
        cases.append(Case((plain, spec), shown=f"categories {cats}"))
    return cases


def reference_speedups(plain: dict, spec: dict) -> dict:
    return {c: (spec[c]["output_tokens"] / spec[c]["wall_s"]) / (plain[c]["output_tokens"] / plain[c]["wall_s"])
            for c in plain if c in spec}


def judge_speedups(case: Case, got: Any, want: dict) -> list[str | None]:
    if not isinstance(got, dict) or set(got) != set(want):
        raise WrongShape(f"speedup_by_category must return a dict with the categories {sorted(want)}, got {short(got)}")
    out = []
    for c, w in want.items():
        x = number(got[c])
        if x is not None and close(x, w, rel=1e-9):
            out.append(None)
        elif x is not None and close(x, 1 / w, rel=1e-9):
            out.append(f"{c}: got plain over speculative ({x:.3f}); the speedup is speculative over plain ({w:.3f})")
        else:
            out.append(f"{c}: expected {w:.4f}, got {short(got[c])}")
    return out


Q4 = Exercise(
    id="lab3.q4", points=1, title="speedup per prompt category", reads="speedup_by_category",
    signature="(plain_runs, spec_runs)", parts=(Part(speedup_cases, judge_speedups, reference_speedups,
                                                     what="pairs of runs"),),
)


# --- q5: the crossover -----------------------------------------------------------------------------


def reference_first_level_not_paying(levels, plain, spec):
    """q5's answer (the exercise's crossover_concurrency): compare.first_level_not_paying, the course's one
    rule for the crossover (the first level, ascending, where spec <= plain tok/s; None if it always pays),
    on the measured speedups. compare.crossover reports the same level, with the runs' intervals."""
    return compare.first_level_not_paying(levels, [s / p for p, s in zip(plain, spec)])


def crossover_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for i in range(10):
        levels = [int(c) for c in 2 ** np.arange(int(rng.integers(2, 8)))]
        plain = np.cumsum(rng.uniform(50, 500, len(levels)))
        gain = np.linspace(rng.uniform(1.2, 2.5), rng.uniform(0.4, 1.1), len(levels))  # speculation's edge shrinks
        kind = ("crosses", "always pays", "never pays", "equal")[i % 4]
        if kind == "always pays":
            gain = np.maximum(gain, 1.05)
        elif kind == "never pays":
            gain = np.minimum(gain, 0.95)
        spec = plain * gain
        if kind == "equal":  # exactly equal throughput: no longer pays
            j = int(rng.integers(0, len(levels)))
            spec[j] = plain[j]
            spec[:j] = np.maximum(spec[:j], plain[:j] * 1.05)
        cases.append(Case((levels, [float(x) for x in plain], [float(x) for x in spec]), shown=f"levels {levels}",
                          tag=kind))
    return cases


def judge_crossover(case: Case, got: Any, want) -> str | None:
    if want is None:
        return None if got is None else f"{case.shown}: speculation pays at every level: expected None, got {short(got)}"
    if got is None or number(got) is None or number(got) != want:
        return f"{case.shown} ({case.tag}): expected {want}, got {short(got)}"
    return None


Q5 = Exercise(
    id="lab3.q5", points=1, title="where speculation stops paying", reads="crossover_concurrency",
    signature="(levels, plain_tok_s, spec_tok_s)",
    parts=(Part(crossover_cases, judge_crossover, reference_first_level_not_paying, what="sweeps"),),
    answered_by=("specdec.serving.measure.compare:first_level_not_paying",),
)


# --- q6: a launch configuration --------------------------------------------------------------------


def reference_flags(algorithm: str, num_steps: int, draft: str | None = None) -> dict:
    if algorithm == "NGRAM":
        return {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": num_steps + 1}
    flags = {"speculative_algorithm": algorithm, "speculative_num_steps": num_steps, "speculative_eagle_topk": 1,
             "speculative_num_draft_tokens": num_steps + 1}
    if algorithm in ("EAGLE", "STANDALONE"):
        flags["speculative_draft_model_path"] = draft
    return flags


def flag_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for algorithm in ("EAGLE", "NEXTN", "STANDALONE", "NGRAM", "EAGLE", "NEXTN"):
        steps = int(rng.integers(1, 8))
        draft = f"/models/draft-{int(rng.integers(100))}" if algorithm in ("EAGLE", "STANDALONE") else None
        cases.append(Case((algorithm, steps, draft), shown=f"{algorithm}, {steps} steps" + (f", draft {draft}" if draft else "")))
    return cases


def judge_flags(case: Case, got: Any, want: dict) -> str | None:
    if not isinstance(got, dict):
        raise WrongShape(f"launch_flags must return a dict of flags, got {short(got)}")
    if got == want:
        return None
    try:  # what the launcher makes of it: SGLang's rules, as the course checks them before a start
        LaunchConfig("/models/target", got.get("speculative_algorithm", "?"),
                     draft=got.get("speculative_draft_model_path"), num_steps=got.get("speculative_num_steps"),
                     topk=got.get("speculative_eagle_topk"), num_draft_tokens=got.get("speculative_num_draft_tokens"),
                     backend="sglang")
        rule = ""
    except LaunchConfigError as exc:
        rule = f" (the launcher refuses it: {exc})"
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    wrong = sorted(k for k in set(want) & set(got) if got[k] != want[k])
    parts = ([f"missing {missing}"] if missing else []) + ([f"not for this algorithm: {extra}"] if extra else []) + \
            [f"{k}={short(got[k])} should be {short(want[k])}" for k in wrong]
    return f"{case.shown}: " + "; ".join(parts) + rule


Q6 = Exercise(
    id="lab3.q6", points=1, title="a valid speculative launch configuration", reads="launch_flags",
    signature="(algorithm, num_steps, draft=None)", parts=(Part(flag_cases, judge_flags, reference_flags,
                                                                what="scenarios"),),
)


# --- q7: the configuration to serve: a latency target and the baseline's outputs ---------------------

# Lossy configurations carry SGLang's --speculative-accept-threshold-single/acc below 1, which accept drafts the
# target would not have chosen: faster, and different text. specdec serve has no such threshold, so the cases
# carry them synthetically (the notebook checks parity on what its servers send back).
CONFIGS = ("plain", "EAGLE k=3", "NEXTN k=4", "NGRAM k=4", "EAGLE k=3, accept threshold 0.7",
           "NEXTN k=4, accept threshold 0.5")
WORDS = "the cache holds each layer's keys and values for every token seen so far".split()


def lossy(config: str) -> bool:
    return "threshold" in config


def changed(outputs: list[str], rng: np.random.Generator) -> list[str]:
    """The same outputs but one, of which one word differs: what a lossy acceptance rule does."""
    out, j = list(outputs), int(rng.integers(len(outputs)))
    words = out[j].split()
    w = int(rng.integers(len(words)))
    words[w] = "values" if words[w] != "values" else "keys"
    out[j] = " ".join(words)
    return out


def differs_at(results: list[dict], baseline: list[str], config: str) -> list[int]:
    """The concurrencies at which `config`'s outputs are not the baseline's."""
    return [r["concurrency"] for r in results if r["config"] == config and r["outputs"] != baseline]


def reference_best(results: list[dict], baseline_outputs: list[str], limit: float):
    """The most tokens/s among points within the p95 ITL limit (<=) of configurations whose outputs equal the
    baseline's at every concurrency measured; the first in `results` order on a tie; None if none qualifies."""
    lossless = {r["config"] for r in results} - {r["config"] for r in results if r["outputs"] != baseline_outputs}
    ok = [r for r in results if r["itl_p95_ms"] <= limit and r["config"] in lossless]
    if not ok:
        return None
    best = max(ok, key=lambda r: r["tokens_per_s"])  # max keeps the first of equals
    return best["config"], best["concurrency"]


def best_sweep(rng: np.random.Generator) -> tuple[list[dict], list[str]]:
    baseline = [" ".join(rng.choice(WORDS, int(rng.integers(4, 9)))) for _ in range(int(rng.integers(2, 5)))]
    configs = ["plain"] + [str(c) for c in rng.permutation(CONFIGS[1:])[: int(rng.integers(3, 6))]]
    if not any(lossy(c) for c in configs):
        configs[-1] = CONFIGS[-1]
    results = []
    for config in configs:
        bad = set(rng.choice((1, 2, 4, 8, 16), int(rng.integers(1, 4)), replace=False).tolist()) if lossy(config) else set()
        for c in (1, 2, 4, 8, 16):
            gain = 1.6 if lossy(config) else 1.0  # lossy configurations are the fast ones
            results.append({"config": config, "concurrency": c, "tokens_per_s": float(rng.uniform(100, 3000) * gain),
                            "itl_p95_ms": float(rng.uniform(2, 60)),
                            "outputs": changed(baseline, rng) if c in bad else list(baseline)})
    return results, baseline


def best_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for i in range(10):
        results, baseline = best_sweep(rng)
        itl = sorted(r["itl_p95_ms"] for r in results)
        limit = itl[int(rng.integers(len(itl) // 3, len(itl)))]
        top = max(r["tokens_per_s"] for r in results) + 1
        lossy_config = next(r["config"] for r in results if lossy(r["config"]))
        mine = [r for r in results if r["config"] == lossy_config]
        kind = ("differs here", "differs elsewhere", "at the limit", "nothing fits", "just over", "random")[min(i, 5)]
        if kind in ("differs here", "differs elsewhere"):  # the fastest within the limit is a lossy point
            here, there = mine[1], mine[3]
            here.update(tokens_per_s=top, itl_p95_ms=limit * 0.9)
            if kind == "differs here":
                here["outputs"] = changed(baseline, rng)
            else:  # equal text at this concurrency, different at another: the configuration is still lossy
                here["outputs"], there["outputs"] = list(baseline), changed(baseline, rng)
        elif kind in ("at the limit", "just over"):  # the fastest lossless point sits at the limit
            point = max((r for r in results if not lossy(r["config"])), key=lambda r: r["tokens_per_s"])
            limit = point["itl_p95_ms"] if kind == "at the limit" else point["itl_p95_ms"] - 0.01
        elif kind == "nothing fits":
            limit = itl[0] / 2
        cases.append(Case((results, baseline, limit), shown=f"limit {limit:.2f} ms over {len(results)} points of "
                                                            f"{len({r['config'] for r in results})} configurations",
                          tag=kind))
    return cases


def judge_best(case: Case, got: Any, want) -> str | None:
    if got is not None and not (isinstance(got, (list, tuple)) and len(got) == 2):
        raise WrongShape(f"best_config must return (config, concurrency) or None, got {short(got)}")
    if want is None:
        return None if got is None else f"{case.shown}: nothing qualifies: expected None, got {short(got)}" + \
            why_not_best(case, got)
    if got is not None and got[0] == want[0] and number(got[1]) == want[1]:
        return None
    return f"{case.shown}: expected {want}, got {short(got)}" + why_not_best(case, got)


def why_not_best(case: Case, got: Any) -> str:
    """The likely mistake behind a wrong choice, when one explains it."""
    results, baseline, limit = case.args
    point = next((r for r in results if got is not None and (r["config"], r["concurrency"]) == (got[0], number(got[1]))),
                 None)
    at_limit = [r for r in results if r["itl_p95_ms"] == limit and not differs_at(results, baseline, r["config"])]
    strict = reference_best(results, baseline, float(np.nextafter(limit, -np.inf)))  # "<" where "<=" is asked
    if at_limit and (got is None and strict is None or point is not None and tuple(got) == strict):
        best = max(at_limit, key=lambda r: r["tokens_per_s"])
        return (f" ({best['config']!r} at concurrency {best['concurrency']} has a p95 ITL of exactly the limit: "
                "within the limit means <=, so it counts)")
    if point is None:
        return ""
    if point["itl_p95_ms"] > limit:
        return f" (its p95 ITL, {point['itl_p95_ms']:.2f} ms, is over the limit)"
    bad = differs_at(results, baseline, point["config"])
    if point["outputs"] != baseline:
        return (f" ({point['config']!r} changes the outputs: at concurrency {point['concurrency']} its text is not the "
                "baseline's, so it does not serve the same answers)")
    if bad:
        return (f" ({point['config']!r} matches the baseline here but not at concurrency {bad[0]}: its acceptance rule "
                "changes outputs, so it is out at every concurrency)")
    return " (it qualifies, but another qualifying point has more tokens/s)"


Q7 = Exercise(
    id="lab3.q7", points=3, title="the configuration to serve: a latency target and the baseline's outputs",
    reads="best_config", signature="(results, baseline_outputs, itl_p95_limit_ms)",
    parts=(Part(best_cases, judge_best, reference_best, what="sweeps"),),
)


# --- q8: the crossover predicted from measured step times ------------------------------------------


def step_time_cases(rng: np.random.Generator) -> list[Case]:
    """Step times shaped like a roofline: a floor (reading the weights) and a part that grows with the batch,
    k + 1 positions per request in a verify step; the drafter's time per drafted token grows too."""
    cases = []
    for i in range(9):
        levels = [int(c) for c in 2 ** np.arange(int(rng.integers(4, 8)))]
        k = int(rng.integers(2, 7))
        tau = float(rng.uniform(1.6, min(k + 0.9, 4.5)))
        floor = float(rng.uniform(4e-3, 2e-2))
        grow = floor * float(rng.uniform(0.02, 0.3)) * (0.05 if i == 1 else 1)  # i == 1: never compute bound
        draft = floor * float(rng.uniform(0.03, 0.12))
        b = np.asarray(levels, dtype=float)
        plain = floor + grow * b
        verify = 1.05 * floor + grow * b * (k + 1)
        per_draft = draft * (1 + 0.02 * b)
        if i == 2:  # the drafts cost more than they save even at batch 1
            tau, per_draft = 1.2, per_draft * 6
        cases.append(Case((levels, tau, k, plain.tolist(), verify.tolist(), per_draft.tolist()),
                          shown=f"levels {levels}, tau {tau:.3f}, k {k}", tag="step times"))
    # dyadic times: the speedup at concurrency 4 is exactly 1 (no rounding), where speculation no longer pays
    cases.append(Case(([1, 2, 4, 8], 2.5, 2, [2 ** -8] * 4, [4 / 1024, 6 / 1024, 9 / 1024, 12 / 1024], [2 ** -11] * 4),
                      shown="levels [1, 2, 4, 8], tau 2.5, k 2, a speedup of exactly 1 at 4", tag="exactly 1"))
    return cases


def judge_predicted_crossover(case: Case, got: Any, want) -> list[str | None]:
    if not (isinstance(got, (list, tuple)) and len(got) == 2):
        raise WrongShape(f"predicted_crossover must return (speedups, crossover), got {short(got)}")
    levels, tau, k, tp, tv, td = case.args
    want_s, want_c = want
    try:
        got_s = np.asarray(got[0], dtype=float).ravel()
    except (TypeError, ValueError):
        raise WrongShape(f"the speedups must be a list of numbers, one per level, got {short(got[0])}") from None
    if got_s.shape != (len(levels),):
        raise WrongShape(f"{case.shown}: one speedup per level ({len(levels)}), got {got_s.size}")
    tp, tv, td = (np.asarray(x, dtype=float) for x in (tp, tv, td))
    mistakes = {"the drafter's time is missing: each verify step also waits for k drafted tokens":
                tau * tp / tv,
                "with tau - 1: tau already counts every token a verify step emits, the bonus included":
                (tau - 1) * tp / (k * td + tv),
                "one drafted token per step: a verify step waits for k of them": tau * tp / (td + tv),
                "plain over speculative: the speedup is the speculative throughput over the plain one":
                (k * td + tv) / (tau * tp)}
    speed_why = None
    if not np.allclose(got_s, want_s, rtol=1e-6, atol=0):
        speed_why = next((f"{case.shown}: {why}" for why, alt in mistakes.items() if np.allclose(got_s, alt, rtol=1e-6)),
                         f"{case.shown}: expected speedups {np.round(want_s, 4).tolist()}, got {np.round(got_s, 4).tolist()}")
    c = got[1]
    if c is None and want_c is None or c is not None and number(c) == want_c:
        return [speed_why, None]
    paid = [lv for lv, s in zip(levels, want_s) if s > 1]
    if want_c is not None and number(c) is not None and levels[0] < number(c) < want_c and number(c) not in levels:
        why = "interpolated between levels; the crossover is the first level measured at or below 1"
    elif paid and number(c) == paid[-1] and want_c is not None:
        why = f"{c} is the last level that pays; the crossover is the first that does not"
    elif case.tag == "exactly 1":
        why = "a speedup of exactly 1 means speculation no longer pays there"
    else:
        why = "the first level, ascending, whose predicted speedup is at or below 1; None if none is"
    return [speed_why, f"{case.shown}: crossover {short(c)}, expected {want_c}: {why}"]


Q8 = Exercise(
    id="lab3.q8", points=4, title="the crossover predicted from measured step times", reads="predicted_crossover",
    signature="(levels, tau, k, plain_step_s, verify_step_s, draft_step_s)",
    parts=(Part(step_time_cases, judge_predicted_crossover, compare.predicted_crossover, what="sets of step times"),),
    answered_by=("specdec.serving.measure.compare:predicted_crossover", "specdec.sim.formulas:speedup_from_costs",
                 "specdec.serving.measure.compare:first_level_not_paying"),
)


# --- q9: accept length at another k, from one server's histogram -----------------------------------


def falling_histogram(rng: np.random.Generator, k: int, steps: int) -> list[int]:
    """A chain's histogram of accepted drafts whose acceptance falls with the position, as real drafters' does."""
    start, fall = rng.uniform(0.55, 0.95), rng.uniform(0.02, 0.12)
    alphas = np.clip(start - fall * np.arange(k), 0.05, 1)
    accepted = np.cumprod(rng.random((steps, k)) < alphas, 1).sum(1)
    return np.bincount(accepted, minlength=k + 1).tolist()


def tau_at_k_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for i in range(10):
        k = int(rng.integers(2, 7))
        hist = falling_histogram(rng, k, int(rng.integers(200, 3000)))
        new_k = (k + int(rng.integers(1, 4)), max(1, k - int(rng.integers(1, k))), k)[i % 3] if i < 9 else k + 2
        if i == 9:  # every draft accepted: the chain goes on
            hist = [0] * k + [50]
        cases.append(Case((hist, new_k), shown=f"histogram {hist} (k = {k}), new k {new_k}"))
    cases.append(Case(([40, 0, 0], 4), shown="histogram [40, 0, 0] (k = 2), new k 4: no draft ever accepted"))
    return cases


def judge_tau_at_k(case: Case, got: Any, want: float) -> str | None:
    x = number(got)
    if x is None:
        raise WrongShape(f"tau_at_k must return a number, got {short(got)}")
    if close(x, want, rel=1e-9, abs_=1e-12):
        return None
    hist, new_k = case.args
    k, steps = len(hist) - 1, sum(hist)
    reach = records.acceptance_by_position(hist)
    rate = sum(i * h for i, h in enumerate(hist)) / (k * steps)
    alts = [(want - 1, "without the bonus token: a verify step emits accepted drafts + 1"),
            (records.tau_from_histogram(hist), f"that is the measured tau at k = {k}; with {new_k} drafts the chain "
                                               f"{'stops earlier' if new_k < k else 'can go further'}"),
            (float(formulas.expected_tokens_per_step(rate, new_k)) if 0 < rate < 1 else None,
             "the i.i.d. formula with the mean acceptance rate: acceptance falls with the position, so use each "
             "position's own"),
            (1 + sum(h / steps for h in hist[1:new_k + 1]), "P(exactly i accepted) is not P(draft i accepted)")]
    why = next((w for a, w in alts if a is not None and close(x, a, rel=1e-9)), None)
    return f"{case.shown}: expected {want:.4f}, got {x:.4f}" + (f" ({why})" if why else "")


Q9 = Exercise(
    id="lab3.q9", points=3, title="accept length at another k, from one server's histogram", reads="tau_at_k",
    signature="(histogram, new_k)", parts=(Part(tau_at_k_cases, judge_tau_at_k, records.tau_at_k, what="histograms"),),
    uses=(Q3,), answered_by=("specdec.sim.formulas:tau_from_positions",),
)

EXERCISES = (Q1, Q2, Q3, Q4, Q5, Q6, Q7, Q8, Q9)
