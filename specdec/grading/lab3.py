"""Lab 3's exercises (live speculative servers), declared as data: see exercise.py.

The cases are response records in SGLang's real shapes (0.5.16 names with their aliases, or 0.5.23's
names only, at random), sweep results and launch scenarios; the references are specdec.serving.measure's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from specdec.grading.answers import close, number, short
from specdec.grading.exercise import Case, Exercise, Part, WrongShape
from specdec.serving.measure import records
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
    """q5's answer (the exercise's crossover_concurrency): the first level, ascending, where speculation no
    longer pays (spec <= plain tok/s); None if it always pays. A plain reading of one sweep: no interpolation
    and no intervals. What the course reports as the crossover is specdec.serving.measure.compare.crossover:
    interpolated in log(concurrency) between the levels either side of 1, named only where the intervals
    clear 1."""
    return next((c for c, p, s in zip(levels, plain, spec) if s <= p), None)


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


# --- q7: choosing a configuration under a latency target -------------------------------------------


def reference_best(results: list[dict], limit: float):
    ok = [r for r in results if r["itl_p95_ms"] <= limit]
    if not ok:
        return None
    best = max(ok, key=lambda r: r["tokens_per_s"])
    return best["config"], best["concurrency"]


def best_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for i in range(8):
        results = []
        for config in ("plain", "EAGLE k=3", "NEXTN k=4")[: int(rng.integers(2, 4))]:
            for c in (1, 2, 4, 8, 16, 32):
                results.append({"config": config, "concurrency": c, "tokens_per_s": float(rng.uniform(100, 5000)),
                                "itl_p95_ms": float(rng.uniform(2, 60))})
        itl = sorted(r["itl_p95_ms"] for r in results)
        limit = itl[int(rng.integers(0, len(itl)))] if i != 5 else itl[0] / 2  # case 5: nothing fits
        top = max(results, key=lambda r: r["tokens_per_s"])
        if i == 2:  # the fastest overall is just over the limit
            limit = top["itl_p95_ms"] - 0.01
        elif i == 3:  # ... or exactly at it: within the limit
            limit = top["itl_p95_ms"]
        cases.append(Case((results, limit), shown=f"limit {limit:.2f} ms over {len(results)} points"))
    return cases


def judge_best(case: Case, got: Any, want) -> str | None:
    if want is None:
        return None if got is None else f"{case.shown}: nothing meets the limit: expected None, got {short(got)}"
    if isinstance(got, (list, tuple)) and len(got) == 2 and got[0] == want[0] and number(got[1]) == want[1]:
        return None
    return f"{case.shown}: expected {want}, got {short(got)}" + why_not_best(case, got, want)


def why_not_best(case: Case, got: Any, want) -> str:
    """The likely mistake behind a wrong choice, when one explains it."""
    results, limit = case.args
    point = next((r for r in results if isinstance(got, (list, tuple)) and len(got) == 2
                  and (r["config"], r["concurrency"]) == (got[0], number(got[1]))), None)
    at_limit = [r for r in results if r["itl_p95_ms"] == limit]
    strict = reference_best([r for r in results if r["itl_p95_ms"] < limit], limit)
    if at_limit and (got is None and strict is None or point is not None and tuple(got) == strict):
        best = max(at_limit, key=lambda r: r["tokens_per_s"])
        return (f" ({best['config']!r} at concurrency {best['concurrency']} has a p95 ITL of exactly the limit: "
                "within the limit means <=, so it counts)")
    if point is None:
        return ""
    if point["itl_p95_ms"] > limit:
        return f" (its p95 ITL, {point['itl_p95_ms']:.2f} ms, is over the limit)"
    if point["tokens_per_s"] < max(r["tokens_per_s"] for r in results if r["itl_p95_ms"] <= limit):
        return f" (within the limit, but {point['tokens_per_s']:.0f} tokens/s is not the most among those that are)"
    return ""


Q7 = Exercise(
    id="lab3.q7", points=1, title="the configuration to serve under a latency target", reads="best_config",
    signature="(results, itl_p95_limit_ms)", parts=(Part(best_cases, judge_best, reference_best, what="sweeps"),),
)

EXERCISES = (Q1, Q2, Q3, Q4, Q5, Q6, Q7)
