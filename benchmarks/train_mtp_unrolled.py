"""Retrain only the shipped zoo's MTP layer, chained over k = 4 draft steps as decoding uses it.

The target body, the draft, the heads and the EAGLE head are read, never trained or written.

  train (GPU machine): rebuild the recipe's self-distillation data from the shipped target, train
      the MTP layer unrolled (specdec.zoo.train.mtp_unrolled) from the shipped weights and from
      scratch, compare them and the shipped weights on held-out text the target wrote itself, and
      write each candidate (a target model.safetensors) and a JSON record under --out.
  install (here): put one candidate's MTP tensors into the zoo's target/model.safetensors, check that
      every other tensor kept its bytes, and store the record, with the MTP figures measured before,
      in zoo.json under "mtp_unrolled" (docs/zoo.md shows it after `specdec zoo eval tiny --write`).

usage: PYTHONPATH=. python3 benchmarks/train_mtp_unrolled.py train --out DIR --device cuda
       python benchmarks/train_mtp_unrolled.py install DIR [--candidate NAME] [--zoo specdec/zoo/tiny]
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from specdec.decoder.checkpoint import MTP_PREFIX, load_transformer, save_transformer
from specdec.decoder.draft_modules import MTPLayer
from specdec.zoo.corpus import build_corpus
from specdec.zoo.recipes import RECIPES
from specdec.zoo.registry import PACKAGE_DIR
from specdec.zoo.train import MixedBatches, chain_acceptance, generate_self_data, token_stream, train_draft_modules

SCRIPT, LOG = "benchmarks/train_mtp_unrolled.py", "benchmarks/logs/train_mtp_unrolled.log"


def summary(acc: list[float]) -> dict:
    return {"acceptance_by_position": acc, "tau_estimate": round(1 + sum(acc), 4)}


def train(args) -> None:
    t_start = time.time()
    zoo = Path(args.zoo)
    meta = json.loads((zoo / "zoo.json").read_text())
    recipe = RECIPES[meta["recipe"]]
    device = args.device
    target, shipped = load_transformer(zoo / "target", dtype=torch.float32, device=device)
    target.requires_grad_(False)
    tok = Tokenizer.from_file(str(zoo / "target" / "tokenizer.json"))  # the tokenizer the target was trained with
    corpus = build_corpus(seed=recipe.seed, max_code_bytes=recipe.max_code_bytes)
    same = corpus.summary() == meta["corpus"]
    print(f"corpus: {corpus.summary()}; {'the same as' if same else 'DIFFERENT from'} the zoo's training corpus")
    train_stream = token_stream(tok, corpus.train, recipe.seed)
    heldout = token_stream(tok, corpus.heldout["code"], recipe.seed)
    stage = recipe.heads_stage
    new = recipe.self_data_new_tokens
    t0 = time.time()
    seqs = args.self_seqs or recipe.self_data_seqs
    generated = generate_self_data(target, train_stream, seqs, stage.seq_len + 1 - new, new,
                                   min(seqs, recipe.self_data_batch), device, recipe.seed, progress=False)
    # Held-out rows the target writes itself: where the chain's acceptance equals greedy decoding's.
    first = stage.seq_len + 1 - new
    held_rows = generate_self_data(target, heldout, args.heldout_rows, first, new, min(args.heldout_rows, 256),
                                   device, recipe.seed + 5, progress=False)
    data = {"sequences": len(generated), "tokens": generated.numel(), "seconds": round(time.time() - t0, 1),
            "heldout_rows": len(held_rows)}
    print(f"self-distillation data (as the recipe makes it): {data}")
    depths = len(recipe.mtp_weights)
    record = {"script": SCRIPT, "log": LOG, "recipe": recipe.name, "mtp_weights": list(recipe.mtp_weights),
              "device": torch.cuda.get_device_name() if device.startswith("cuda") else device,
              "torch": torch.__version__, "python": sys.version.split()[0], "platform": platform.platform(),
              "corpus_same_as_training": same, "self_distillation_data": data,
              "heldout_metric": f"greedy acceptance by position of the chained MTP layer at k={depths} over every "
                                f"anchor of {len(held_rows)} continuations the target wrote greedily from held-out "
                                "code windows (bf16 autocast)", "candidates": {}}
    before = summary(chain_acceptance(target, shipped, held_rows, first, depths, device))
    record["candidates"]["shipped"] = {"init": "the shipped weights, not retrained", **before}
    print(f"shipped MTP layer: {before}")
    for init in args.inits.split(","):
        torch.manual_seed(recipe.seed)
        mtp = copy.deepcopy(shipped) if init == "current" else MTPLayer(target.config).to(device)
        lr = args.lr_current if init == "current" else stage.lr
        st = type(stage)(**{**stage.__dict__, "steps": args.steps, "lr": lr, "eval_every": args.eval_every})
        batches = MixedBatches(train_stream, generated, st.seq_len, recipe.generated_fraction, recipe.seed + 1)
        log = train_draft_modules(target, mtp, None, None, batches, heldout, st, device, recipe.seed,
                                  progress=not args.quiet, mtp_weights=recipe.mtp_weights)
        for step, loss, ev in log.curve:
            print(f"  {init} step {step}: train loss {loss}, held-out top-1 agreement {ev}")
        res = summary(chain_acceptance(target, mtp, held_rows, first, depths, device))
        print(f"{init}: {st.steps} steps at lr {lr} in {log.seconds} s ({log.seconds / st.steps * 1000:.0f} ms/step); "
              f"best {log.best}; held-out chain {res}")
        record["candidates"][init] = {"init": "the shipped weights" if init == "current" else "random (seeded)",
                                      "steps": st.steps, "batch": st.batch, "seq_len": st.seq_len, "lr": lr,
                                      "seconds": log.seconds, "best": log.best, **res}
        save_transformer(Path(args.out) / init, target.float(), mtp.float())
        trained = {k: v for k, v in record["candidates"].items() if k != "shipped"}
        record["chosen"] = max(trained, key=lambda k: trained[k]["tau_estimate"])
        record["seconds"] = round(time.time() - t_start, 1)
        (Path(args.out) / "mtp_unrolled.json").write_text(json.dumps(record, indent=2) + "\n")  # after each: a timeout keeps it
    print(f"chosen: {record['chosen']} (the best held-out tau estimate); total {record['seconds']} s")


def install(args) -> None:
    zoo, out = Path(args.zoo), Path(args.dir)
    record = json.loads((out / "mtp_unrolled.json").read_text())
    name = args.candidate or record["chosen"]
    f = zoo / "target" / "model.safetensors"
    shipped, new = load_file(str(f)), load_file(str(out / name / "model.safetensors"))
    with tempfile.TemporaryDirectory() as tmp:  # the file must come out of a re-save unchanged
        save_file(shipped, f"{tmp}/again.safetensors", metadata={"format": "pt"})
        if Path(f"{tmp}/again.safetensors").read_bytes() != f.read_bytes():
            sys.exit(f"{f} does not re-save to the same bytes; not touching it")
    if set(new) != set(shipped) or any(new[k].dtype != v.dtype or new[k].shape != v.shape for k, v in shipped.items()):
        sys.exit(f"{out / name} has other tensors, dtypes or shapes than {f}")
    changed = [k for k in shipped if not torch.equal(new[k], shipped[k])]
    if any(not k.startswith(MTP_PREFIX) for k in changed):
        sys.exit(f"{out / name} changes tensors outside the MTP layer: {[k for k in changed if not k.startswith(MTP_PREFIX)][:4]}")
    merged = {k: (new[k] if k.startswith(MTP_PREFIX) else v) for k, v in shipped.items()}
    save_file(merged, str(f), metadata={"format": "pt"})
    meta = json.loads((zoo / "zoo.json").read_text())
    fig = meta.get("figures", {})
    record["installed"] = name
    record["before"] = {"command": fig.get("measured", {}).get("command"), "date": fig.get("measured", {}).get("date"),
                        "log": args.before_log, "acceptance": fig.get("acceptance", {}).get("mtp")}
    meta["mtp_unrolled"] = record
    (zoo / "zoo.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"installed {name}: {len(changed)} MTP tensors changed in {f}; every other tensor kept its bytes; "
          f"record in {zoo / 'zoo.json'}; now run `specdec zoo eval tiny --prompts 128 --new-tokens 64 --write`")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--out", required=True)
    t.add_argument("--zoo", default=str(PACKAGE_DIR / "tiny"))
    t.add_argument("--device", default="cuda")
    t.add_argument("--inits", default="current,scratch", help="comma-separated: current (the shipped weights), scratch")
    t.add_argument("--steps", type=int, default=2000)
    t.add_argument("--eval-every", type=int, default=250)
    t.add_argument("--lr-current", type=float, default=1e-3, help="peak lr when starting from the shipped weights")
    t.add_argument("--self-seqs", type=int, default=0, help="self-distillation rows (default: the recipe's)")
    t.add_argument("--heldout-rows", type=int, default=256)
    t.add_argument("--quiet", action="store_true")
    i = sub.add_parser("install")
    i.add_argument("dir")
    i.add_argument("--candidate", default=None, help="default: the one the record chose")
    i.add_argument("--zoo", default=str(PACKAGE_DIR / "tiny"))
    i.add_argument("--before-log", default="benchmarks/logs/zoo_eval_tiny_mtp_before.log",
                   help="the console log of the figures zoo.json holds now (the shipped MTP layer's)")
    args = p.parse_args()
    Path(getattr(args, "out", ".")).mkdir(parents=True, exist_ok=True)
    (train if args.cmd == "train" else install)(args)


if __name__ == "__main__":
    main()
