"""Draft trees against the chain on the zoo: accept length (tau = accepted drafts + 1 per verify) of the EAGLE
head, the MTP layer and the parallel MTP heads (Medusa's tree), greedy, fp32 on the CPU, on the zoo figures' prompts of each category (specdec.zoo.evaluate),
for the chain of depth k and trees of the same depth, and for the chains that verify as many tokens as the
trees do (k = num_draft_tokens - 1), each run checked token for token against plain decoding.

usage: python benchmarks/cpu_tree_accept.py [--prompts 16] [--new-tokens 48] [--depth 4]
       (log: benchmarks/logs/cpu_tree_accept.log)
"""

from __future__ import annotations

import argparse
import datetime
import time

import torch

from specdec.decoder.engine import Engine
from specdec.zoo.corpus import CATEGORIES, build_corpus
from specdec.zoo.evaluate import category_prompts, load_zoo_bundle, tokenized_heldout, trained_tokenizer
from specdec.zoo.recipes import RECIPES
from specdec.zoo.registry import PACKAGE_DIR

SHAPES = ((1, None), (2, 5), (2, 8), (4, 8), (4, 16))  # (topk, num_draft_tokens); topk 1: the chain, k + 1
WIDE = (7, 15)  # chains as wide as the trees of 8 and 16 verified tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=16, help="per category")
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--depth", type=int, default=4, help="k = --num-steps, the same for the chain and the trees")
    args = p.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    root = PACKAGE_DIR / "tiny"
    bundle, meta = load_zoo_bundle(root)
    tok = trained_tokenizer(bundle.paths["target"])
    corpus = build_corpus(seed=RECIPES[meta["recipe"]].seed)
    prompts = category_prompts(tokenized_heldout(tok, corpus), args.prompts, args.new_tokens, bundle.eos_token_ids[0])
    max_len = max(len(x) for ps in prompts.values() for x in ps) + args.new_tokens + 4 * args.depth * 4 + max(WIDE)
    heads = bundle.heads.num_heads
    print(f"{datetime.date.today()}, tiny zoo, fp32 CPU, greedy, {args.prompts} prompts per category, "
          f"{args.new_tokens} new tokens, depth (num_steps) {args.depth}; tau = accepted drafts + 1 per verify step")
    print(f"{'method':6s} {'category':12s} " + " ".join(f"{'chain' if t == 1 else f'topk {t} ndt {n}':>14s}"
                                                    for t, n in SHAPES)
          + "".join(f"{f'chain k {k}':>14s}" for k in WIDE) + "  same as plain")
    for method in ("eagle", "mtp", "heads"):
        for c in CATEGORIES:
            def run(m, **kw):
                return Engine(bundle, m, max_batch=len(prompts[c]), max_len=max_len, cuda_graphs="off",
                              **kw).generate(prompts[c], max_new_tokens=args.new_tokens)

            plain = run("ar")
            res = [run(method, k=args.depth, topk=t, num_draft_tokens=n) for t, n in SHAPES]
            wide = [run(method, k=k) for k in WIDE if k <= heads or method != "heads"]  # heads: no deeper chain
            same = all(r.tokens == plain.tokens for r in res + wide)
            print(f"{method:6s} {c:12s} " + " ".join(f"{r.stats.tau:8.2f} ± {r.stats.tau_stderr:.2f}" for r in res)
                  + "".join(f"{r.stats.tau:8.2f} ± {r.stats.tau_stderr:.2f}" for r in wide)
                  + " " * 14 * (len(WIDE) - len(wide)) + f"  {same}", flush=True)
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
