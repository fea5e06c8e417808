"""`specdec decode`: generate with one proposer and print what happened (text, tau, acceptance, speed)."""

from __future__ import annotations

import argparse
import json
import os

import torch

from specdec.cli import fast, fast_flags
from specdec.cli.common import UsageError, add_threads, threads
from specdec.decoder.engine import Engine
from specdec.decoder.methods import METHODS
from specdec.serving.measure.machine import busy_warning, machine_line
from specdec.zoo import ModelNotFound

DEFAULT_PROMPT = "import os\nimport sys\n\n\ndef main(argv):\n"


def positive_int(s: str) -> int:
    v = int(s)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny", help="zoo name, local Hugging Face directory, or hub id (online)")
    p.add_argument("--draft", default=None, help="draft model for --method draft when the model has none beside it")
    p.add_argument("--prompt", action="append", default=None, help="prompt text (repeat for several rows)")
    p.add_argument("--method", default="mtp", choices=METHODS,
                   help="ar (plain), mtp (the MTP layer), heads (parallel MTP heads), draft, eagle, ngram")
    p.add_argument("--k", type=int, default=None, help="drafts per verify step (static k, default 4): a tree's depth")
    p.add_argument("--num-steps", type=int, default=None, help="SGLang's name for --k (draft depth)")
    fast_flags.add_tree_arguments(p)
    p.add_argument("--batch", type=int, default=1, help="rows decoded together (prompts are cycled)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cuda-graphs", default="auto", choices=["auto", "on", "off"])
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="default: float32 on CPU, bfloat16 on CUDA")
    p.add_argument("--compare", action="store_true", help="also run plain decoding and report the speedup")
    p.add_argument("--profile", action="store_true",
                   help="split the time into prefill/draft/verify/host (synchronises the device around each phase)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    fast_flags.add_arguments(p)
    add_threads(p)


def build(args, methods: tuple[str, ...]):
    """The bundle (loaded fast: fused, compiled where --compile says), the prompts' token ids, and an Engine for each
    method, as `specdec decode` runs them (benchmarks/gpu_decode_gap.py times the same)."""
    shape = fast_flags.tree_shape(args)
    device, dtype_name = fast.device_and_dtype(args)
    bundle = fast.load(args, METHODS[args.method].parts, device, getattr(torch, dtype_name), draft=args.draft)
    texts = args.prompt or [DEFAULT_PROMPT]
    prompts = [bundle.tokenizer(texts[i % len(texts)])["input_ids"] for i in range(args.batch)]
    max_len = max(map(len, prompts)) + args.max_new_tokens + max(args.k + 2, shape.slots + 1)
    tree = dict(topk=args.topk, num_draft_tokens=shape.num_draft_tokens)
    compiled = fast.setup_compile(args, bundle, device)
    engines = {m: Engine(bundle, m, k=args.k, max_batch=args.batch, max_len=max_len, cuda_graphs=args.cuda_graphs,
                         compile=compiled, adaptive=args.adaptive_k,
                         **(dict(tree, simulate=args.simulate_accept_length) if m == args.method else {}))
               for m in methods}
    return bundle, prompts, engines


def main(args) -> int:
    if None not in (args.num_steps, args.k) and args.num_steps != args.k:
        raise UsageError(f"--num-steps {args.num_steps} and --k {args.k} disagree: give one")
    args.k = next(v for v in (args.num_steps, args.k, 4) if v is not None)
    for name, low in (("k", 1), ("batch", 1), ("max_new_tokens", 1), ("temperature", 0)):
        if getattr(args, name) < low:
            raise UsageError(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(args, name)}")
    torch.set_num_threads(threads(args))
    device, dtype_name = fast.device_and_dtype(args)
    dtype = getattr(torch, dtype_name)
    shape, texts = fast_flags.tree_shape(args), args.prompt or [DEFAULT_PROMPT]
    methods = (args.method, "ar") if args.compare and args.method != "ar" else (args.method,)
    try:
        bundle, prompts, engines = build(args, methods)
        compiled = engines[args.method].graphs.scope or False  # "step", "layers", or not compiled

        def run(method: str, n: int):
            return engines[method].generate(prompts, n, args.temperature, seed=args.seed, profile=args.profile)

        if engines[args.method].graph_mode:  # capture (and compile) the graphs before timing anything
            fast.compiling(args, engines[args.method], lambda: [run(m, min(8, args.max_new_tokens)) for m in methods])
        res = run(args.method, args.max_new_tokens)
        base = run("ar", args.max_new_tokens) if args.compare else None
    except (ModelNotFound, ValueError) as exc:
        raise UsageError(str(exc)) from None
    out = res.as_dict()
    out["model"] = bundle.name if args.random_weights else args.model
    out["device"] = str(device)
    out["fused"], out["compiled"] = not args.no_fuse, bool(compiled)
    out["compile_scope"] = engines[args.method].graphs.scope  # None: not compiled
    out["text"] = [bundle.tokenizer.decode(t) for t in res.tokens]
    out["threads"], out["load_average"] = torch.get_num_threads(), os.getloadavg()[0]
    out["prompt_tokens"] = [len(p) for p in prompts]
    # the prefill gives each row its first token (admit reads it back, so its time includes the device's);
    # what follows is the time per output token of the longest row
    out["ttft_s"] = engines[args.method].times["prefill"]
    longest = max(map(len, res.tokens))
    out["tpot_s"] = (res.wall_s - out["ttft_s"]) / (longest - 1) if longest > 1 else None
    if base is not None:
        out["plain_tokens_per_s"] = base.tokens_per_s
        out["speedup"] = res.tokens_per_s / base.tokens_per_s
        out["same_as_plain"] = res.tokens == base.tokens if args.temperature == 0 else None
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"model {out['model']} on {device} ({str(dtype).removeprefix('torch.')}), method {args.method}"
          + (f", k={args.k}" if args.method != "ar" else "")
          + (f", topk={args.topk}, num_draft_tokens={shape.num_draft_tokens}" if args.topk > 1 else "")
          + f", batch {args.batch}, T={args.temperature}" + ("" if args.no_fuse else ", fused")
          + (f", compiled ({compiled})" if compiled else ""))
    for i, t in enumerate(out["text"][: min(args.batch, 4)]):
        print(f"--- row {i}: {texts[i % len(texts)]!r} +")
        print(t)
    print("---")
    print(f"{out['new_tokens']} tokens in {out['steps']} steps, {out['wall_s']:.3f} s: {out['tokens_per_s']:.1f} tokens/s")
    if args.method != "ar":
        pos = " ".join(f"{x:.2f}" for x in out["acceptance_by_position"])
        print(f"tau {out['tau']:.2f} tokens/step, per-draft acceptance {out['acceptance_rate']:.2f}, by position [{pos}]")
    if args.profile:
        print("time: " + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in out["times"].items()))
    if base is not None:
        print(f"plain decoding {base.tokens_per_s:.1f} tokens/s -> speedup {out['speedup']:.2f}x"
              + (f"; identical output: {out['same_as_plain']}" if args.temperature == 0 else ""))
    print(f"timed on {device}: {machine_line(torch.get_num_threads())}")
    if (warn := busy_warning()) and not device.startswith("cuda"):
        print(warn)
    return 0
