"""The fast path's flags, shared by `specdec decode` and `specdec serve` (fast.py runs what they choose): a draft
tree's shape, the fused layout, torch.compile and its cache, adaptive k, a simulated acceptance, random weights.
No torch here: `specdec serve`'s HTTP process builds its parser and checks the tree without importing it."""

from __future__ import annotations

import argparse

from specdec.cli.common import UsageError
from specdec.decoder import compile_cache
from specdec.decoder.params import DEFAULT_SCOPE, SCOPES, TreeShape


def add_tree_arguments(p: argparse.ArgumentParser) -> None:
    """A draft tree's flags, as SGLang names them (its long spellings too); the depth is the verb's --k."""
    p.add_argument("--topk", "--speculative-eagle-topk", dest="topk", type=int, default=1,
                   help="candidates per node: > 1 drafts a tree (mtp, eagle, heads), in CUDA graphs as the chain")
    p.add_argument("--num-draft-tokens", "--speculative-num-draft-tokens", dest="num_draft_tokens", type=int,
                   default=None, help="tokens a verify step checks, the root included (SGLang's); default k + 1 at "
                                      "topk 1, else k x topk + 1")


def tree_shape(args: argparse.Namespace) -> TreeShape:
    """The checked tree (topk 1: the chain of args.k drafts); a shape SGLang would refuse is a one-line error."""
    try:
        return TreeShape.make(args.k, args.topk, args.num_draft_tokens)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def add_arguments(p: argparse.ArgumentParser, scope: str = DEFAULT_SCOPE) -> None:
    """The fast path's flags; `scope` is --compile-scope's default (serve.py's is "layers": see there)."""
    p.add_argument("--no-fuse", action="store_true",
                   help="keep q/k/v and gate/up as separate matmuls (default: fused, exact and faster)")
    p.add_argument("--compile", default="auto", choices=["auto", "on", "off"],
                   help="torch.compile the decode step inside its CUDA graph (auto: on a GPU where an earlier "
                        "--compile on start left this model's kernels in the compile cache)")
    p.add_argument("--compile-scope", default=scope, choices=SCOPES,
                   help="what --compile compiles: step, each captured step whole (every layer inlined: the fastest "
                        "step, minutes to compile a large model); layers, one decoder layer compiled once for all "
                        f"layers and the LM head (the rest of the step eager in the CUDA graph). Default: {scope}")
    p.add_argument("--compile-cache", default=None, metavar="DIR",
                   help=f"where compiled kernels are kept between starts (default: ${compile_cache.CACHE_ENV}, else "
                        "~/.cache/specdec/compile); 'none': no cache, so auto does not compile")
    p.add_argument("--adaptive-k", action="store_true",
                   help="draft 0..k per step, chosen from the batch size and the measured acceptance "
                        "(specdec/decoder/adaptive.py), instead of k every step")
    p.add_argument("--simulate-accept-length", type=float, default=None, metavar="L",
                   help="an oracle's acceptance, for measuring speed (SGLang's SGLANG_SIMULATE_ACC_LEN): each verify "
                        "step keeps floor or ceil of L - 1 drafts whatever the target says, then the target's own token, "
                        "a mean of L tokens per step (1..k + 1). The output is then NOT the target's: use it to see "
                        "what a step costs and pays at that acceptance (e.g. with --random-weights, whose drafts never match)")
    p.add_argument("--random-weights", default=None, metavar="SHAPE",
                   help="random weights instead of a checkpoint, to measure speed: 8b (Llama 3.1 8B's shape), 1b "
                        "(Llama 3.2 1B's), or a zoo name or directory whose config.json gives the shape")
    p.add_argument("--load-format", default="auto", choices=["auto", "dummy"],
                   help="dummy: random weights in --model's shape (SGLang's name for --random-weights MODEL)")
