"""Lab 1's tree formula against the Lab 2 decoder: tau predicted from the measured per-depth acceptance, and measured.

The zoo's EAGLE head and MTP layer, greedy, fp32 on the CPU, on the zoo figures' prompts of each category
(specdec.zoo.evaluate, as benchmarks/cpu_tree_accept.py), chains and trees of SGLang's three numbers. For a tree,
`TreeRecorder` (specdec/decoder/tree_accept.py) records every step's tree and accepted path; its table of acceptance
by depth, number of siblings and sibling rank is fed to Lab 1's `DraftTree` on each step's own tree. For a chain the
table is the acceptance by position of the steps that drafted all k. Beside it: the formula fed the table with its
depths in reverse order, and the trees' steps grouped by how many children the root got.

usage: python benchmarks/cpu_tree_formula.py [--prompts 8] [--new-tokens 48]
       (log: benchmarks/logs/cpu_tree_formula.log, results: benchmarks/results/cpu_tree_formula.json)
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from pathlib import Path

import numpy as np
import torch

from specdec.decoder.engine import Engine
from specdec.decoder.tree_accept import DepthAcceptance, TreeRecorder
from specdec.zoo.corpus import CATEGORIES, build_corpus
from specdec.zoo.evaluate import category_prompts, load_zoo_bundle, tokenized_heldout, trained_tokenizer
from specdec.zoo.recipes import RECIPES
from specdec.zoo.registry import PACKAGE_DIR

SHAPES = [(3, 1, 4), (7, 1, 8), (15, 1, 16), (3, 2, 4), (4, 2, 8), (4, 4, 8), (5, 4, 16), (5, 8, 16)]
OUT = Path(__file__).resolve().parent / "results" / "cpu_tree_formula.json"


def error(predicted: float, measured: float) -> float:
    """The formula's relative error; 0 where it is 0 but for rounding (a chain's)."""
    e = predicted / measured - 1
    return 0.0 if abs(e) < 1e-12 else e


def reversed_depths(table: DepthAcceptance) -> DepthAcceptance:
    return DepthAcceptance(table.hits[::-1], table.offered[::-1])


def measure(bundle, method: str, prompts: list[list[int]], new_tokens: int, shape: tuple[int, int, int]) -> dict:
    """One shape: P(at least d drafts accepted) measured and predicted (and from the reversed table), and for a tree
    the steps grouped by the root's children (measured and predicted tau per group)."""
    steps, topk, ndt = shape
    eng = Engine(bundle, method, k=steps, topk=topk, num_draft_tokens=ndt if topk > 1 else None,
                 max_batch=len(prompts), cuda_graphs="off")
    rec = TreeRecorder().attach(eng) if topk > 1 else None
    r = eng.generate(prompts, max_new_tokens=new_tokens, stop_at_eos=False)
    out: dict = {"tau_engine": r.stats.tau}
    if rec is None:  # the steps that drafted all k (a row's last step may draft fewer)
        acc = r.accepted[(r.proposed == steps) & (r.accepted >= 0)]
        table = DepthAcceptance.from_chain(acc, steps)
        out.update(measured=(acc[:, None] >= np.arange(1, steps + 1)).mean(0), predicted=table.chain().reach(),
                   backwards=reversed_depths(table).chain().reach(), steps=len(acc))
    else:
        table = rec.table()
        out.update(measured=rec.measured_by_depth(), predicted=rec.predicted_by_depth(table),
                   backwards=rec.predicted_by_depth(reversed_depths(table)), steps=len(rec.steps))
        per_step = np.array([table.tree(s.parents, s.widths, s.ranks, s.depths).tau() for s in rec.steps])
        tau = np.array([len(s.path) + 1 for s in rec.steps])
        roots = np.array([int((s.parents == -1).sum()) for s in rec.steps])
        out["by_root_children"] = {int(w): [int((roots == w).sum()), float(tau[roots == w].mean()),
                                            float(per_step[roots == w].mean())] for w in np.unique(roots)}
    for key in ("measured", "predicted", "backwards"):
        out[key] = [float(x) for x in out[key]]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=8, help="per category")
    p.add_argument("--new-tokens", type=int, default=48)
    args = p.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    bundle, meta = load_zoo_bundle(PACKAGE_DIR / "tiny")
    tok = trained_tokenizer(bundle.paths["target"])
    corpus = build_corpus(seed=RECIPES[meta["recipe"]].seed)
    by_cat = category_prompts(tokenized_heldout(tok, corpus), args.prompts, args.new_tokens, bundle.eos_token_ids[0])
    prompts = [x for c in CATEGORIES for x in by_cat[c]]
    print(f"{datetime.date.today()}, tiny zoo, fp32 CPU, greedy, {args.prompts} prompts per category "
          f"({', '.join(CATEGORIES)}), {args.new_tokens} new tokens; tau = 1 + sum over d of P(at least d accepted)")
    results: dict = {"date": str(datetime.date.today()), "prompts_per_category": args.prompts,
                     "new_tokens": args.new_tokens, "runs": {}}
    print(f"{'method':6s} {'shape':10s} {'steps':>6s} {'measured':>9s} {'formula':>8s} {'error':>7s} {'reversed':>9s}"
          "   P(at least d accepted): measured | formula")
    for method in ("eagle", "mtp"):  # json's keys are strings: by_root_children's too
        for shape in SHAPES:
            o = measure(bundle, method, prompts, args.new_tokens, shape)
            results["runs"][f"{method} {','.join(map(str, shape))}"] = o
            m, f, b = (1 + sum(o[k]) for k in ("measured", "predicted", "backwards"))
            print(f"{method:6s} {','.join(map(str, shape)):10s} {o['steps']:6d} {m:9.3f} {f:8.3f} {error(f, m):+7.1%} "
                  f"{b:9.3f}   {np.round(o['measured'], 3).tolist()} | {np.round(o['predicted'], 3).tolist()}",
                  flush=True)
            for w, (n, tm, tf) in o.get("by_root_children", {}).items():
                print(f"{'':17s} root with {w} {'child' if w == 1 else 'children'}: {n:4d} steps, measured tau {tm:.2f}, formula {tf:.2f}")
    OUT.write_text(json.dumps(results, indent=1))
    print(f"({time.time() - t0:.0f} s)")


# --- docs/results.md: this script's section (benchmarks/report.py stitches the sections) ----------------------

def render() -> str:
    from page import load, provenance, table

    data = load("cpu_tree_formula.json")
    if not data:
        return ""
    rows, errors = [], []
    for key, o in data["runs"].items():
        method, shape = key.split()
        m, f, b = (1 + sum(o[k]) for k in ("measured", "predicted", "backwards"))
        if shape.split(",")[1] != "1":
            errors.append(error(f, m))
        rows.append([method, shape, o["steps"], m, f, f"{error(f, m):+.1%}", b])
    narrow = [(o["by_root_children"]["1"], max(o["by_root_children"], key=int), o["by_root_children"], k)
              for k, o in data["runs"].items() if "1" in o.get("by_root_children", {})]
    one, most, groups, key = max(narrow, key=lambda x: x[0][1] - x[0][2])  # the widest miss on the narrow steps
    bushy = groups[most]
    return f"""### Lab 1's tree formula against the decoder

{provenance(["benchmarks/results/cpu_tree_formula.json"], "the 2-core development CPU", "`benchmarks/cpu_tree_formula.py`",
            ["benchmarks/logs/cpu_tree_formula.log"], ["benchmarks/results/cpu_tree_formula.json"])}

The zoo's EAGLE head and MTP layer, greedy, fp32, {data['prompts_per_category']} prompts per category, {data['new_tokens']}
new tokens. The acceptance of each node given its parent's, measured per depth, number of siblings and sibling rank
(`specdec/decoder/tree_accept.py`), fed to Lab 1's `DraftTree` on each step's own tree, against the measured tau
(accepted + 1 per verify); "reversed": the same table with its depths in reverse order. For chains the formula is
exact (the per-depth acceptances telescope); for trees it is {min(errors):+.1%} to {max(errors):+.1%}, under, because the
rerank makes the tree deep and narrow where the drafter is sure, and acceptance is higher there than its average at
each depth: for {key}, the steps whose root got one child accepted tau {one[1]:.2f} against the formula's {one[2]:.2f}
({one[0]} steps), those whose root got {most} children {bushy[1]:.2f} against {bushy[2]:.2f} ({bushy[0]} steps).

{table(["drafter", "num_steps,topk,num_draft_tokens", "steps", "measured tau", "Lab 1 formula", "error",
        "reversed depths"], rows)}
"""


if __name__ == "__main__":
    main()
