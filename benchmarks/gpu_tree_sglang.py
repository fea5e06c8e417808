"""Issue 22, step 3's first measure: draft trees in real SGLang 0.5.16 and in the Lab 2 decoder, on the same head.

The zoo's EAGLE head, greedy, 128 tokens on the zoo-check prompts (benchmarks/sglang_zoo_check.py), for chains and
trees of SGLang's three numbers (num_steps, topk, num_draft_tokens): SGLang's accept length per request and
token-weighted (completion_tokens / spec_verify_ct) and its batch-1 tokens/s; the Lab 2 decoder's on the same
prompts with the same shapes (`Engine(bundle, "eagle", k=num_steps, topk=..., num_draft_tokens=...)`, bf16 and
fp32), counted SGLang's way (new tokens / verify steps), and whether its output equals plain decoding.

usage (GPU node): PACK=.sglang-pack . .sglang-pack/setup.sh; PYTHONPATH=$PWD:$PYTHONPATH python3 benchmarks/gpu_tree_sglang.py --out $OUT/tree
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_lab3 import ZOO, check_prompts, env_report, measure_one_by_one, say, start_all  # noqa: E402
from sglang_zoo_check import PROMPTS  # noqa: E402

from specdec.serving.ops.launch import LaunchConfig  # noqa: E402
from specdec.serving.ops.lifecycle import brief  # noqa: E402

# (num_steps, topk, num_draft_tokens): chains and trees with as many verified tokens (4, 8, 16)
SHAPES = [(3, 1, 4), (3, 2, 4), (7, 1, 8), (4, 2, 8), (4, 4, 8), (15, 1, 16), (5, 4, 16), (5, 8, 16)]


def ours(shapes, new_tokens: int = 128) -> dict:
    """The Lab 2 decoder on the same prompts and shapes: SGLang's accept length, and output == plain."""
    import torch

    from specdec.decoder.engine import Engine
    from specdec.zoo import load_bundle

    out = {}
    for dtype in (torch.bfloat16, torch.float32):
        b = load_bundle("tiny", device="cuda", dtype=dtype)
        ids = [b.tokenizer(p)["input_ids"] for p in PROMPTS]
        plain = Engine(b, "ar", max_batch=1)
        ref = [plain.generate([x], max_new_tokens=new_tokens, stop_at_eos=False).tokens[0] for x in ids]
        for steps, topk, ndt in shapes:
            t = time.time()
            eng = Engine(b, "eagle", k=steps, topk=topk, num_draft_tokens=ndt if topk > 1 else None, max_batch=1)
            runs = [eng.generate([x], max_new_tokens=new_tokens, stop_at_eos=False) for x in ids]
            tokens, verify = sum(r.new_tokens for r in runs), sum(r.steps for r in runs)
            key = f"{steps},{topk},{ndt} {str(dtype).removeprefix('torch.')}"
            out[key] = {"accept_length_weighted": tokens / verify,
                        "accept_length_per_request": [r.new_tokens / r.steps for r in runs],
                        "same_as_plain": all(r.tokens[0] == t_ for r, t_ in zip(runs, ref)), "seconds": time.time() - t}
            say(f"ours {key}: accept length {tokens / verify:.2f}, same as plain {out[key]['same_as_plain']}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("SPECDEC_RUN_DIR", str(out / "run"))
    env_report(out)
    common = dict(backend="sglang", attention_backend="triton", cuda_graph_max_bs=4, mem_fraction_static=0.6,
                  disable_radix_cache=True, max_running_requests=4, extra_args=("--max-total-tokens", "20000"))
    configs = {f"{s},{k},{n}": (LaunchConfig(str(ZOO / "target"), "EAGLE", draft=str(ZOO / "eagle"), num_steps=s,
                                             topk=k, num_draft_tokens=n, **common), {}) for s, k, n in SHAPES}
    summary: dict = {"sglang": {}, "errors": {}, "startup_s": {}}
    servers = start_all(configs, out / "logs")

    def measure(name, srv):
        summary["startup_s"][name] = srv.startup_s
        t = time.time()
        res = check_prompts(srv.url)
        tokens = sum(r["completion_tokens"] for r in res["requests"])
        res["tokens_per_s"] = tokens / sum(r["e2e_latency"] for r in res["requests"])
        res["seconds"] = time.time() - t
        summary["sglang"][name] = res
        say(f"sglang {name}: accept length {res.get('accept_length_weighted')}, batch-1 {res['tokens_per_s']:.0f} tok/s")

    measure_one_by_one(servers, measure, lambda n, e: summary["errors"].update({n: e}),
                       lambda: (out / "summary.json").write_text(json.dumps(summary, indent=1)))
    for n, s in servers.items():
        if isinstance(s, str):
            summary["errors"][n] = brief(s)
    try:
        summary["ours"] = ours(SHAPES)
    except Exception as exc:  # keep SGLang's numbers
        summary["errors"]["ours"] = brief(repr(exc))
        say(f"ours: ERROR {exc!r}")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    say("shape (steps,topk,ndt) | SGLang accept length | ours bf16 | ours fp32")
    for s, k, n in SHAPES:
        key = f"{s},{k},{n}"
        g = summary["sglang"].get(key, {}).get("accept_length_weighted")
        o = [summary.get("ours", {}).get(f"{key} {d}", {}).get("accept_length_weighted") for d in ("bfloat16", "float32")]
        say(f"{key:10s} | {g if g is None else round(g, 3)} | {[x if x is None else round(x, 3) for x in o]}")
    say("done")
    return 0


# --- docs/results.md: this script's section (benchmarks/report.py stitches the sections) ----------------------

def render() -> str:
    from page import load, provenance, table

    data = load("gpu_tree_sglang/summary.json")
    if not data:
        return ""
    rows = []
    for s, k, n in SHAPES:
        key = f"{s},{k},{n}"
        g = data["sglang"].get(key, {})
        o = {d: data.get("ours", {}).get(f"{key} {d}", {}) for d in ("bfloat16", "float32")}
        rows.append([s, k, n, g.get("accept_length_weighted"), g.get("tokens_per_s"),
                     o["bfloat16"].get("accept_length_weighted"), o["float32"].get("accept_length_weighted"),
                     o["bfloat16"].get("same_as_plain") and o["float32"].get("same_as_plain")])
    return f"""### Draft trees: SGLang and the Lab 2 decoder on the zoo's EAGLE head

{provenance(["benchmarks/results/gpu_tree_sglang/summary.json"], "NVIDIA H200", "`benchmarks/gpu_tree_sglang.py`",
            ["benchmarks/logs/gpu_tree_sglang.log"], ["benchmarks/results/gpu_tree_sglang/summary.json"])}

Greedy, {len(PROMPTS)} zoo-check prompts, 128 tokens each; accept length = completion tokens / verify steps over all of them
(SGLang's `spec_verify_ct`; ours counted the same way). Chains (topk 1) and trees with as many verified tokens
(num_draft_tokens 4, 8, 16). The Lab 2 decoder verifies trees eagerly (no CUDA graph), so only its accept length is compared here.
SGLang's is lower on some prompts because its bf16 target writes a different greedy text there, not because it drafts
differently: on its text the Lab 2 decoder reproduces its accept length (the next section).

{table(["num_steps", "topk", "num_draft_tokens", "SGLang accept length", "SGLang batch-1 tok/s", "ours (bf16)", "ours (fp32)",
        "ours identical to plain"], rows)}
"""


if __name__ == "__main__":
    raise SystemExit(main())
