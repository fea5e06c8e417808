"""Serve the shipped tiny zoo with real SGLang (0.5.16, offline pack) and record what the server says.

For each mode (plain, NEXTN = the target's own MTP layer, EAGLE = the zoo's EAGLE head, STANDALONE =
the zoo's draft model): launch, wait for /health, send greedy /generate requests on fixed code
prompts, read the server's own token and acceptance counters, stop the server's process group.
usage (GPU node, after `PACK=.sglang-pack . .sglang-pack/setup.sh`):
    python3 benchmarks/sglang_zoo_check.py --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ZOO = Path(__file__).resolve().parents[1] / "specdec" / "zoo" / "tiny"
PROMPTS = ["import os\nimport sys\n\n\ndef main(argv):\n    ", "class Queue:\n    def __init__(self, maxsize=0):\n        self.",
           "Monday, Tuesday, Wednesday, Thursday,", "def read_config(path):\n    \"\"\"Read a config file.\"\"\"\n"]
SPEC = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


def post(url: str, body: dict, timeout: float = 120) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def get(url: str, timeout: float = 5) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except Exception as exc:  # 503 while starting, refused before the port opens
        return getattr(exc, "code", 0), str(exc)


def run_mode(name: str, extra: list[str], port: int, log) -> dict:
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(ZOO / "target"), "--host", "127.0.0.1",
           "--port", str(port), "--attention-backend", "triton", "--cuda-graph-max-bs-decode", "8",
           "--mem-fraction-static", "0.3", "--disable-radix-cache", "--enable-metrics"] + extra
    log.write(f"\n===== {name}: {' '.join(cmd)}\n")
    log.flush()
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    res: dict = {"mode": name, "args": extra}
    try:
        while time.time() - t0 < 300:
            if proc.poll() is not None:
                res["error"] = f"server exited with {proc.returncode} before it was healthy"
                return res
            if get(base + "/health")[0] == 200:
                break
            time.sleep(2)
        else:
            res["error"] = "not healthy after 300 s"
            return res
        res["startup_s"] = round(time.time() - t0, 1)
        res["requests"] = []
        for p in PROMPTS:
            out = post(base + "/generate", {"text": p, "sampling_params": {"temperature": 0, "max_new_tokens": 128,
                                                                            "ignore_eos": True}})
            m = out["meta_info"]
            res["requests"].append({"prompt": p, "text": out["text"], "output_ids": out.get("output_ids"),
                                    **{k: v for k, v in m.items() if k in ("completion_tokens", "prompt_tokens", "e2e_latency")
                                       or k.startswith("spec_")}})
        info = json.loads(get(base + "/server_info")[1])
        res["server"] = {k: info.get(k) for k in ("version", "speculative_algorithm", "speculative_draft_model_path")}
        res["avg_spec_accept_length"] = [s.get("avg_spec_accept_length") for s in info.get("internal_states", [])]
        ct = sum(r.get("spec_verify_ct", 0) or 0 for r in res["requests"])
        if ct:
            res["accept_length_weighted"] = sum(r["completion_tokens"] for r in res["requests"]) / ct
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the whole process group: no scheduler left behind
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--modes", default="plain,nextn,eagle,standalone")
    args = ap.parse_args()
    eagle_dir = Path("/tmp/zoo-eagle-with-tokenizer")  # fallback if the tokenizer-less EAGLE dir is refused
    shutil.rmtree(eagle_dir, ignore_errors=True)
    shutil.copytree(ZOO / "eagle", eagle_dir)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ZOO / "target" / f, eagle_dir / f)
    modes = {"plain": [], "nextn": ["--speculative-algorithm", "NEXTN"] + SPEC,
             "eagle": ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", str(ZOO / "eagle")] + SPEC,
             "standalone": ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", str(ZOO / "draft")] + SPEC}
    results = []
    with open(Path(args.out).with_suffix(".log"), "w") as log:
        for i, name in enumerate(args.modes.split(",")):
            r = run_mode(name, modes[name], 30000 + i, log)
            if name == "eagle" and "error" in r:
                r2 = run_mode("eagle+tokenizer", ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path",
                                                  str(eagle_dir)] + SPEC, 30010, log)
                results.append(r)
                r = r2
            results.append(r)
            brief = {k: r.get(k) for k in ("mode", "startup_s", "error", "accept_length_weighted", "avg_spec_accept_length")}
            print(json.dumps(brief), flush=True)
            with open(args.out, "w") as f:
                json.dump(results, f, indent=2)
    compare_with_specdec(results, args.out)
    return 0


def compare_with_specdec(results: list[dict], out: str) -> None:
    """Our decoder's greedy tokens on the same prompts (bf16 and fp32) against SGLang's plain server."""
    plain = next((r for r in results if r["mode"] == "plain" and "requests" in r), None)
    if plain is None:
        return
    import torch

    sys.path.insert(0, str(ZOO.parents[2]))
    from specdec.decoder.engine import Engine
    from specdec.zoo import load_bundle

    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        b = load_bundle("tiny", parts=(), device="cuda", dtype=dtype)
        dec = Engine(b, "ar", max_batch=1, cuda_graphs="off")
        for req in plain["requests"]:
            ids = b.tokenizer(req["prompt"])["input_ids"]
            ours = dec.generate([ids], max_new_tokens=128, stop_at_eos=False).tokens[0]
            theirs = req.get("output_ids") or b.tokenizer(req["text"])["input_ids"]
            same = next((i for i, (a, c) in enumerate(zip(ours, theirs)) if a != c), min(len(ours), len(theirs)))
            rows.append({"dtype": str(dtype), "prompt_tokens_ours": len(ids), "prompt_tokens_sglang": req.get("prompt_tokens"),
                         "identical_prefix_tokens": same, "of": len(theirs)})
    print(json.dumps(rows), flush=True)
    results.append({"mode": "specdec vs sglang plain (greedy tokens)", "rows": rows})
    with open(out, "w") as f:
        json.dump(results, f, indent=2)


def render() -> str:
    """docs/results.md's section on this script's run (benchmarks/report.py stitches the sections)."""
    from page import load, provenance, table

    s = load("sglang_zoo.json")
    if not s:
        return ""
    rows = []
    for m in s:
        if "requests" not in m:
            continue
        req = m["requests"]
        rows.append([m["mode"], (m.get("server") or {}).get("speculative_algorithm") or "-", m.get("startup_s"),
                     sum(r["completion_tokens"] for r in req), m.get("accept_length_weighted"),
                     (m.get("avg_spec_accept_length") or [None])[0]])
    cmp_rows = next((m["rows"] for m in s if m["mode"].startswith("specdec vs")), [])
    same = [f"{r['identical_prefix_tokens']}/{r['of']}" for r in cmp_rows if "float32" in r["dtype"]]
    return f"""### The shipped zoo served by real SGLang

{provenance(["benchmarks/results/sglang_zoo.json"], "NVIDIA H200", "`benchmarks/sglang_zoo_check.py`",
            ["benchmarks/logs/sglang_zoo.log"], ["benchmarks/results/sglang_zoo.json"])}

SGLang 0.5.16 from the offline pack (`../shared/sglang-offline`), triton attention, radix cache off, 3 draft steps, top-k 1,
4 draft tokens; 4 code/predictable prompts, 128 new tokens each, greedy, EOS ignored. Accept length = completion tokens /
verify passes, from the server's own per-request counters; the server-wide average from `/server_info`.

{table(["mode", "server's algorithm", "startup s", "completion tokens", "accept length (requests)", "avg_spec_accept_length (server)"], rows)}

NEXTN loads the target's own MTP layer (`model.mtp_layers.0.*`, MiMo layout) with no draft path and reports its algorithm as
EAGLE; EAGLE loads the zoo's `LlamaForCausalLMEagle` directory (no tokenizer files needed); STANDALONE the draft Llama.
specdec's greedy tokens (same prompts, same token ids) against SGLang's plain server: identical for {', '.join(same)} tokens
per prompt (SGLang computes in bf16 with its own kernels; where a near-tie flips, the sequences part).
"""


if __name__ == "__main__":
    sys.exit(main())
