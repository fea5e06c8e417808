"""The MTP layer before its unrolled retraining, measured by today's decoder on the zoo figures' prompts,
so that docs/zoo.md's before/after table compares the two layers under one accounting.

The old layer's weights are read from git (the commit before the retraining); everything else of the zoo
is today's. Stores the figures in zoo.json under mtp_unrolled.before and regenerates docs/zoo.md.

usage: python benchmarks/zoo_mtp_before.py [--rev d9b4678]   (log: benchmarks/logs/zoo_eval_tiny_mtp_before.log)
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from specdec.decoder.bundle import load_bundle
from specdec.decoder.engine import Engine
from specdec.zoo import report
from specdec.zoo.corpus import CATEGORIES, build_corpus
from specdec.zoo.evaluate import KS, acceptance_row, category_prompts, tokenized_heldout, trained_tokenizer
from specdec.zoo.recipes import RECIPES
from specdec.zoo.registry import PACKAGE_DIR, read_meta

WEIGHTS = "specdec/zoo/tiny/target/model.safetensors"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rev", default="d9b4678", help="the commit whose target holds the old MTP layer")
    p.add_argument("--prompts", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=64)
    args = p.parse_args()
    torch.set_num_threads(1)
    root = PACKAGE_DIR / "tiny"
    meta = read_meta(root)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "target"
        shutil.copytree(root / "target", old)
        blob = subprocess.run(["git", "show", f"{args.rev}:{WEIGHTS}"], capture_output=True, check=True).stdout
        (old / "model.safetensors").write_bytes(blob)
        bundle = load_bundle(old, parts=("mtp",))
        tok = trained_tokenizer(root / "target")
        corpus = build_corpus(seed=RECIPES[meta["recipe"]].seed)
        prompts = category_prompts(tokenized_heldout(tok, corpus), args.prompts, args.new_tokens, bundle.eos_token_ids[0])
        max_len = max(len(x) for ps in prompts.values() for x in ps) + args.new_tokens + max(KS) + 2
        acceptance = {}
        for c in CATEGORIES:
            run = lambda method, k=1: Engine(bundle, method, k=k, max_batch=len(prompts[c]), max_len=max_len,  # noqa: E731
                                             cuda_graphs="off").generate(prompts[c], max_new_tokens=args.new_tokens)
            plain = run("ar")
            acceptance[c] = [acceptance_row(run("mtp", k), plain, k) for k in KS]
            last = acceptance[c][-1]
            print(f"{c:12s} k={last['k']}: tau {last['tau']:.2f} ± {last['tau_stderr']:.2f}, by position "
                  f"{' '.join(f'{x:.2f}' for x in last['by_position'])}, same as plain: {last['identical_to_plain']}",
                  flush=True)
    u = meta["mtp_unrolled"]
    u["before"] = {"command": "python benchmarks/zoo_mtp_before.py", "weights": f"git {args.rev}:{WEIGHTS}",
                   "date": datetime.date.today().isoformat(), "log": "benchmarks/logs/zoo_eval_tiny_mtp_before.log",
                   "seconds": round(time.time() - t0, 1), "acceptance": acceptance}
    (root / "zoo.json").write_text(json.dumps(meta, indent=2) + "\n")
    doc = report.REPO_ROOT / "docs" / "zoo.md"
    doc.write_text(report.zoo_markdown(report.zoo_info(root)))
    print(f"wrote {root / 'zoo.json'} and {doc} ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
