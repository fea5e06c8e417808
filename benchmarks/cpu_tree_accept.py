"""Draft trees against the chain on the zoo: accept length (tau = accepted drafts + 1 per verify) of the EAGLE
head, the MTP layer and the parallel MTP heads (Medusa's tree), greedy, fp32 on the CPU, on the zoo figures' prompts
of each category (specdec.zoo.evaluate), each run checked token for token against plain decoding.

Default: the chain of depth k and trees of the same depth, and the chains that verify as many tokens as the trees do
(k = num_draft_tokens - 1). With --shapes, any list of SGLang shapes (num_steps,topk,num_draft_tokens); then the end of
the log compares, for each number of verified tokens, the best tree with the chain of that many (per category, and
over the three categories together, token-weighted), and --json writes every figure.

usage: python benchmarks/cpu_tree_accept.py [--prompts 16] [--new-tokens 48] [--depth 4]
       (log: benchmarks/logs/cpu_tree_accept.log)
       python benchmarks/cpu_tree_accept.py --methods eagle,mtp --json benchmarks/results/cpu_tree_deep.json \
           --shapes "7,1,8;7,2,8;7,4,8;4,4,8;15,1,16;15,2,16;15,4,16;8,4,16;4,4,16"
       (log: benchmarks/logs/cpu_tree_deep.log)
"""

from __future__ import annotations

import argparse
import datetime
import json
import time

import numpy as np
import torch

from specdec.decoder.engine import Engine
from specdec.zoo.corpus import CATEGORIES, build_corpus
from specdec.zoo.evaluate import category_prompts, load_zoo_bundle, tokenized_heldout, trained_tokenizer
from specdec.zoo.recipes import RECIPES
from specdec.zoo.registry import PACKAGE_DIR


def default_shapes(depth: int) -> list[tuple[int, int, int]]:
    """The chain of depth k, trees of depth k, and the chains as wide as those trees."""
    trees = [(depth, 1, depth + 1), (depth, 2, 5), (depth, 2, 8), (depth, 4, 8), (depth, 4, 16)]
    return trees + [(7, 1, 8), (15, 1, 16)]


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    shapes = [tuple(int(v) for v in s.split(",")) for s in text.split(";") if s.strip()]
    if not shapes or any(len(s) != 3 for s in shapes):
        raise SystemExit(f"--shapes: 'num_steps,topk,num_draft_tokens;...', got {text!r}")
    return shapes


def taus(accepted: np.ndarray) -> np.ndarray:
    """Tokens per verify step of every (step, row) that ran."""
    a = np.asarray(accepted)
    return (a[a >= 0] + 1).astype(float)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=16, help="per category")
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--depth", type=int, default=4, help="k = --num-steps of the default shapes")
    p.add_argument("--shapes", help="'num_steps,topk,num_draft_tokens;...' instead of the default shapes")
    p.add_argument("--methods", default="eagle,mtp,heads")
    p.add_argument("--json", help="write every figure here")
    args = p.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    shapes = parse_shapes(args.shapes) if args.shapes else default_shapes(args.depth)
    root = PACKAGE_DIR / "tiny"
    bundle, meta = load_zoo_bundle(root)
    tok = trained_tokenizer(bundle.paths["target"])
    corpus = build_corpus(seed=RECIPES[meta["recipe"]].seed)
    prompts = category_prompts(tokenized_heldout(tok, corpus), args.prompts, args.new_tokens, bundle.eos_token_ids[0])
    deepest = max(n for n, _, _ in shapes)
    max_len = max(len(x) for ps in prompts.values() for x in ps) + args.new_tokens + 4 * deepest * 4 + 16
    heads = bundle.heads.num_heads
    print(f"{datetime.date.today()}, tiny zoo, fp32 CPU, greedy, {args.prompts} prompts per category, "
          f"{args.new_tokens} new tokens; tau = accepted drafts + 1 per verify step; columns: num_steps/topk/num_draft_tokens")
    print(f"{'method':6s} {'category':12s} " + " ".join(f"{'/'.join(map(str, s)):>14s}" for s in shapes)
          + "  same as plain", flush=True)
    found: dict = {}  # method -> category -> shape -> list of per-step taus
    for method in args.methods.split(","):
        for c in CATEGORIES:
            def run(m, **kw):
                return Engine(bundle, m, max_batch=len(prompts[c]), max_len=max_len, cuda_graphs="off",
                              **kw).generate(prompts[c], max_new_tokens=args.new_tokens)

            plain = run("ar")
            cells, same = [], True
            for n, t, d in shapes:
                if method == "heads" and n > heads:  # parallel heads: no deeper draft than the heads it has
                    cells.append(" " * 14)
                    continue
                r = run(method, k=n, topk=t, num_draft_tokens=d)
                same &= r.tokens == plain.tokens
                found.setdefault(method, {}).setdefault(c, {})[(n, t, d)] = taus(r.accepted)
                cells.append(f"{r.stats.tau:8.2f} ± {r.stats.tau_stderr:.2f}")
            print(f"{method:6s} {c:12s} " + " ".join(cells) + f"  {same}", flush=True)
            if not same:
                raise SystemExit("a speculative run differs from plain decoding")
    figures = {"date": str(datetime.date.today()), "prompts_per_category": args.prompts, "new_tokens": args.new_tokens,
               "tau": {m: {c: {"/".join(map(str, s)): float(v.mean()) for s, v in by.items()} for c, by in cs.items()}
                       for m, cs in found.items()},
               "pooled": {m: {"/".join(map(str, s)): float(np.concatenate([cs[c][s] for c in cs]).mean())
                              for s in next(iter(cs.values()))} for m, cs in found.items()}}
    if args.shapes:
        print("\nbest tree against the chain of as many verified tokens (tau; pooled: token-weighted)")
        print("\n".join(tree_vs_chain(figures)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    print(f"({time.time() - t0:.0f} s)")


def tree_vs_chain(figures: dict) -> list[str]:
    """For each method and number of verified tokens with a chain among the shapes: the best tree (pooled) against
    that chain, pooled and by category. figures: what --json writes."""
    lines = []
    for m, by in figures["pooled"].items():
        for n in sorted({int(s.split("/")[2]) for s in by}):
            chain = f"{n - 1}/1/{n}"
            trees = [s for s in by if s.endswith(f"/{n}") and s.split("/")[1] != "1"]
            if chain in by and trees:
                best = max(trees, key=by.get)
                per = ", ".join(f"{c} {cs[best] - cs[chain]:+.2f}" for c, cs in figures["tau"][m].items())
                lines.append(f"- {m}, {n} verified tokens: best tree {best} {by[best]:.2f} against the chain {chain} "
                             f"{by[chain]:.2f} ({by[best] - by[chain]:+.2f} pooled; by category {per})")
    return lines


# --- docs/results.md: this script's section (benchmarks/report.py stitches the sections) ----------------------

def render() -> str:
    from page import load, provenance, table

    data = load("cpu_tree_deep.json")
    if not data:
        return ""
    shapes = list(next(iter(data["pooled"].values())))
    rows = [[m, c] + [by.get(s) for s in shapes] for m, cs in data["tau"].items() for c, by in cs.items()]
    rows += [[m, "pooled"] + [by.get(s) for s in shapes] for m, by in data["pooled"].items()]
    lines = tree_vs_chain(data)
    return f"""### Deep trees against the chain on the CPU

{provenance(["benchmarks/results/cpu_tree_deep.json"], "the 2-core development CPU", "`benchmarks/cpu_tree_accept.py --shapes`",
            ["benchmarks/logs/cpu_tree_deep.log"], ["benchmarks/results/cpu_tree_deep.json"])}

The Lab 2 decoder, fp32, greedy, {data["prompts_per_category"]} zoo prompts per category, {data["new_tokens"]} new tokens;
tau = accepted drafts + 1 per verify step (pooled: over the three categories' steps). Columns: num_steps/topk/num_draft_tokens.
Every run is identical to plain decoding.

{table(["method", "category"] + shapes, rows)}

{chr(10).join(lines)}
"""


if __name__ == "__main__":
    main()
