"""Lab 3 on a real GPU with real SGLang 0.5.16 (the offline pack), started and measured by the course's own
launcher, client and benchmark (specdec.serving). Two parts, one device call each:

  zoo    the shipped tiny target served plain, NGRAM, STANDALONE (zoo draft), EAGLE (zoo EAGLE head) and
         NEXTN (the target's own MTP layer): accept length per request and server-wide, acceptance per
         position, tokens/s at concurrency 1 and 16, TTFT/ITL/TPOT; real responses recorded as fixtures;
         the Lab 2 decoder's MTP accept length on the same prompts and k beside SGLang's NEXTN.
  where  a Llama-3.1-8B-shaped target (random weights) plain and EAGLE (random head) with
         SGLANG_SIMULATE_ACC_LEN 1.5, 2.5, 3.5 across concurrency 1..64; a Llama-3.2-1B-shaped target
         plain; batch-1 TPOT at 512 tokens of context for both shapes (the SGLang side of benchmarks/gpu_floor.py).
  tp2    (two GPUs, nvidia-h200-x2) the 8B shape plain and EAGLE (SGLANG_SIMULATE_ACC_LEN 2.5) under
         --tp-size 2, beside the same servers on one GPU: the launcher's rendered commands, accept length
         and tokens/s at concurrency 1..64, batch-1 TPOT.

usage (GPU node):  PACK=.sglang-pack . .sglang-pack/setup.sh; python3 benchmarks/gpu_lab3.py zoo --out $OUT/zoo
Servers are started together where their memory allows (a large --mem-fraction-static with the KV pool
capped by --max-total-tokens, so that a server finishing its start late still finds its pool), measured
one at a time, and stopped by the launcher (process group; nothing is left behind).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_zoo_check import PROMPTS as CHECK_PROMPTS  # noqa: E402  (benchmarks/ is this script's directory)

from specdec.serving.measure.bench import SweepConfig, format_sweep, run_sweep  # noqa: E402
from specdec.serving.measure.compare import compare, crossovers, format_comparison  # noqa: E402
from specdec.serving.measure.machine import cpu_name  # noqa: E402
from specdec.serving.ops.launch import LaunchConfig  # noqa: E402
from specdec.serving.ops.lifecycle import ServerError, brief, launch  # noqa: E402

ZOO = ROOT / "specdec" / "zoo" / "tiny"
CHAIN = dict(num_steps=3, topk=1, num_draft_tokens=4)
T0 = time.time()


def say(*a) -> None:
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def start_all(configs: dict[str, tuple[LaunchConfig, dict]], logs: Path, timeout: float = 420, report=None) -> dict:
    """Launch every server at once (threads); name -> Server, or the error as a string. `report`: the caller's
    log line function (default: print)."""
    out: dict = {}
    report = report or say

    def one(name, cfg, env):
        t = time.time()
        try:
            out[name] = launch(cfg, timeout=timeout, env=env, log_path=logs / f"{name}.log", progress=False)
            report(f"{name} healthy after {time.time() - t:.0f} s at {out[name].url}")
            out[name].startup_s = round(time.time() - t, 1)
        except ServerError as exc:
            out[name] = brief(f"{exc}", 3000)
            report(f"{name} FAILED: {brief(str(exc), 1500)}")

    threads = [threading.Thread(target=one, args=(n, c, e)) for n, (c, e) in configs.items()]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return out


def measure_one_by_one(servers: dict, measure, on_error, save) -> None:
    """Measure each started server alone, stopping it when done; whatever happens, stop them all."""
    try:
        for name, srv in servers.items():
            if isinstance(srv, str):  # it did not start: start_all kept its error
                continue
            try:
                measure(name, srv)
            except Exception as exc:  # keep the other servers' measurements
                on_error(name, brief(repr(exc)))
                say(f"{name}: ERROR {exc!r}")
            finally:
                srv.stop()
                save()
    finally:
        for srv in servers.values():
            if not isinstance(srv, str):
                srv.stop()


def compare_with(base: str, sweeps: dict, out: Path) -> None:
    """Every speculative sweep against the plain one, written and printed."""
    for name, spec in sweeps.items():
        if name != base and base in sweeps:
            cmp = compare(sweeps[base], spec)
            (out / f"compare_{name}.json").write_text(json.dumps(cmp, indent=1))
            say(f"{base} vs {name}\n" + format_comparison(cmp))


# ----- recording real responses (trimmed later into tests/fixtures/sglang/)
def record_stream(url: str, path: str, body: dict, headers: dict | None = None) -> dict:
    """A streamed request as [[seconds since sent, parsed chunk or '[DONE]'], ...]."""
    t = time.perf_counter()
    events = []
    with requests.post(url + path, json=body, stream=True, timeout=120, headers=headers or {}) as r:
        status = r.status_code
        if status != 200:
            return {"status": status, "request": {"path": path, "body": body}, "text": r.text, "events": []}
        for line in r.iter_lines(decode_unicode=True):
            if not line or not line.startswith("data:"):
                continue
            data = line[5:].strip()
            events.append([round(time.perf_counter() - t, 6), data if data == "[DONE]" else json.loads(data)])
    return {"status": status, "request": {"path": path, "body": body}, "events": events}


def record_once(url: str, path: str, body: dict | None = None) -> dict:
    t = time.perf_counter()
    r = requests.post(url + path, json=body, timeout=120) if body is not None else requests.get(url + path, timeout=30)
    out = {"status": r.status_code, "request": {"path": path, "body": body}, "latency_s": round(time.perf_counter() - t, 6)}
    try:
        out["response"] = r.json()
    except ValueError:
        out["text"] = r.text
    return out


def record_fixtures(name: str, url: str, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    prompt = "Monday, Tuesday, Wednesday, Thursday,"
    sp = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    rec = {"generate": record_once(url, "/generate", {"text": prompt, "sampling_params": sp}),
           "generate_stream": record_stream(url, "/generate", {"text": prompt, "sampling_params": sp, "stream": True}),
           "completions": record_once(url, "/v1/completions", {"model": "default", "prompt": prompt, "max_tokens": 24,
                                                                "temperature": 0}),
           "completions_stream": record_stream(url, "/v1/completions", {
               "model": "default", "prompt": prompt, "max_tokens": 24, "temperature": 0, "stream": True,
               "stream_options": {"include_usage": True}}),
           "chat_stream": record_stream(url, "/v1/chat/completions", {
               "model": "default", "messages": [{"role": "user", "content": prompt}], "max_tokens": 24,
               "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}),
           "server_info": record_once(url, "/server_info"),
           "model_info": record_once(url, "/model_info"),
           "flush_cache": record_once(url, "/flush_cache", {})}
    (folder / f"{name}.json").write_text(json.dumps(rec, indent=1))
    (folder / f"{name}_metrics.txt").write_text(requests.get(url + "/metrics", timeout=30).text)
    say(f"{name}: fixtures recorded")


def check_prompts(url: str) -> dict:
    """The zoo-check prompts, greedy, 128 tokens: per-request and token-weighted accept length."""
    rows = []
    for p in CHECK_PROMPTS:
        out = requests.post(url + "/generate", json={"text": p, "sampling_params": {
            "temperature": 0, "max_new_tokens": 128, "ignore_eos": True}}, timeout=120).json()
        m = out["meta_info"]
        rows.append({"prompt": p, "output_ids": out.get("output_ids"),
                     **{k: v for k, v in m.items() if k in ("completion_tokens", "prompt_tokens", "e2e_latency")
                        or k.startswith("spec_")}})
    info = requests.get(url + "/server_info", timeout=30).json()
    res = {"requests": rows, "server_avg_accept_length": [s.get("avg_spec_accept_length")
                                                          for s in info.get("internal_states", [])]}
    ct = sum(r.get("spec_verify_ct") or 0 for r in rows)
    if ct:
        res["accept_length_per_request"] = [r["completion_tokens"] / r["spec_verify_ct"] for r in rows]
        res["accept_length_weighted"] = sum(r["completion_tokens"] for r in rows) / ct
    return res


def lab2_decoder_mtp() -> dict:
    """The Lab 2 decoder with the same MTP layer, k = 3, on the same prompts (bf16, CUDA graphs) and its tau."""
    import torch

    from specdec.decoder.engine import Engine
    from specdec.zoo import load_bundle

    out = {}
    for dtype in (torch.bfloat16, torch.float32):
        b = load_bundle("tiny", device="cuda", dtype=dtype)
        eng = Engine(b, "mtp", k=3, max_batch=1)
        ids = [b.tokenizer(p)["input_ids"] for p in CHECK_PROMPTS]
        per = []
        for x in ids:
            r = eng.generate([x], max_new_tokens=128, stop_at_eos=False)
            # SGLang's accept length counts every completion token (the prefill's first one too) per verify step
            per.append({"tau": r.stats.tau, "sglang_accept_length": r.new_tokens / r.steps, "tokens": r.new_tokens,
                        "steps": r.steps, "acceptance_by_position": [float(a) for a in r.stats.by_position],
                        "first_ids": r.tokens[0][:32]})
        tokens, steps = sum(p["tokens"] for p in per), sum(p["steps"] for p in per)
        out[str(dtype)] = {"per_request": per, "sglang_accept_length_weighted": tokens / steps}
        say(f"Lab 2 decoder MTP k=3 {dtype}: accept length (SGLang's definition) {tokens / steps:.2f}; per request "
            f"{[round(p['sglang_accept_length'], 2) for p in per]}; tau {[round(p['tau'], 2) for p in per]}")
    return out


def sweep(name: str, url: str, folder: Path, concurrency: tuple[int, ...], categories: tuple[str, ...],
          max_new_tokens: int) -> dict:
    cfg = SweepConfig(url, categories, concurrency, max_new_tokens, warmup=4)
    t = time.time()
    res = run_sweep(cfg, progress=False)
    (folder / f"sweep_{name}.json").write_text(json.dumps(res, indent=1))
    say(f"{name}: sweep in {time.time() - t:.0f} s\n" + format_sweep(res))
    return res


def tpot_at_context(url: str, context: int = 512, new: int = 256, reps: int = 3) -> dict:
    """Batch-1 seconds per output token at `context` tokens of prompt: (e2e(new) - e2e(1)) / (new - 1)."""
    ids = [(7 * i + 11) % 4000 + 10 for i in range(context)]

    def e2e(n):
        body = {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": n, "ignore_eos": True}}
        return [requests.post(url + "/generate", json=body, timeout=300).json()["meta_info"]["e2e_latency"]
                for _ in range(reps)]

    requests.post(url + "/flush_cache", timeout=30)
    ones, fulls = e2e(1), e2e(new)
    one, full = min(ones), min(fulls)  # the best of the repeats; every repeat kept, to show how much they moved
    return {"context": context, "new_tokens": new, "e2e_1": one, "e2e_new": full, "e2e_1_all": ones,
            "e2e_new_all": fulls, "tpot_s": (full - one) / (new - 1)}


def env_report(out: Path) -> None:
    info = {"python": platform.python_version()}
    try:
        info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                             "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
    # the host's CPU: a batch-1 step at this size waits on the host's launches, so a slower CPU shows in the timings
    info["cpu"] = f"{cpu_name()} x {os.cpu_count()}"
    for mod in ("torch", "transformers", "sglang", "flashinfer", "triton", "nbclient", "ipykernel", "matplotlib",
                "fastapi", "uvicorn", "tqdm", "requests", "tokenizers", "safetensors", "nbformat", "jupyter_client"):
        try:
            m = __import__(mod)
            info[mod] = getattr(m, "__version__", "present")
        except Exception as exc:  # report, never fail
            info[mod] = f"missing ({type(exc).__name__})"
    (out / "env.json").write_text(json.dumps(info, indent=1))
    say("env", json.dumps(info))


# ----- part 1: the zoo
def part_zoo(out: Path, concurrency: tuple[int, ...]) -> None:
    common = dict(backend="sglang", attention_backend="triton", cuda_graph_max_bs=16, mem_fraction_static=0.5,
                  disable_radix_cache=True, extra_args=("--max-total-tokens", "60000"))
    t = str(ZOO / "target")
    configs = {"plain": (LaunchConfig(t, **common), {}),
               "ngram": (LaunchConfig(t, "NGRAM", num_draft_tokens=4, **common), {}),
               "standalone": (LaunchConfig(t, "STANDALONE", draft=str(ZOO / "draft"), **CHAIN, **common), {}),
               "eagle": (LaunchConfig(t, "EAGLE", draft=str(ZOO / "eagle"), **CHAIN, **common), {}),
               "nextn": (LaunchConfig(t, "NEXTN", **CHAIN, **common), {})}
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    servers = start_all(configs, logs)
    summary = {"startup_s": {n: getattr(s, "startup_s", None) for n, s in servers.items()},
               "errors": {n: s for n, s in servers.items() if isinstance(s, str)}, "modes": {}}
    sweeps = {}

    def measure(name, srv):
        if name in ("plain", "nextn", "eagle"):
            record_fixtures(name, srv.url, out / "fixtures")
        summary["modes"][name] = check_prompts(srv.url)
        say(f"{name}: check prompts accept {summary['modes'][name].get('accept_length_weighted')}")
        sweeps[name] = sweep(name, srv.url, out, concurrency, ("predictable", "code", "open"), 128)

    measure_one_by_one(servers, measure, lambda name, err: summary["modes"].setdefault(name, {}).update(error=err),
                       lambda: (out / "summary.json").write_text(json.dumps(summary, indent=1)))
    compare_with("plain", sweeps, out)
    try:
        summary["lab2_decoder_mtp_k3"] = lab2_decoder_mtp()
    except Exception as exc:
        summary["lab2_decoder_mtp_k3"] = {"error": repr(exc)}
        say(f"Lab 2 decoder: ERROR {exc!r}")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))


def part_chat(out: Path) -> None:
    """The zoo with its chat template: /v1/chat/completions, plain and streamed, recorded from a NEXTN server."""
    cfg = LaunchConfig(str(ZOO / "target"), "NEXTN", **CHAIN, backend="sglang", attention_backend="triton",
                       cuda_graph_max_bs=8, mem_fraction_static=0.3, disable_radix_cache=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    with launch(cfg, timeout=420, log_path=out / "logs" / "chat.log", progress=False) as srv:
        msgs = [{"role": "user", "content": "Monday, Tuesday, Wednesday, Thursday,"}]
        body = {"model": "default", "messages": msgs, "max_tokens": 24, "temperature": 0}
        rec = {"chat": record_once(srv.url, "/v1/chat/completions", body),
               "chat_stream": record_stream(srv.url, "/v1/chat/completions", {
                   **body, "stream": True, "stream_options": {"include_usage": True}}),
               "server_info": record_once(srv.url, "/server_info")}
    (out / "chat.json").write_text(json.dumps(rec, indent=1))
    say(f"chat: status {rec['chat']['status']}, stream {rec['chat_stream']['status']} "
        f"({len(rec['chat_stream']['events'])} events); {str(rec['chat'].get('response'))[:300]}")


# ----- part 2: where speculation pays
def llama_config(shape: str, vocab: int = 128256) -> dict:
    base = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0, "max_position_embeddings": 8192, "torch_dtype": "bfloat16", "vocab_size": vocab,
            "bos_token_id": 1, "eos_token_id": 2, "attention_bias": False, "mlp_bias": False}
    if shape == "8b":
        return {**base, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": False}
    if shape == "1b":
        return {**base, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "tie_word_embeddings": True}
    if shape == "8b-eagle":
        return {**llama_config("8b", vocab), "architectures": ["LlamaForCausalLMEagle"], "num_hidden_layers": 1}
    raise ValueError(shape)


def model_dir(shape: str, root: Path) -> str:
    """A config-only directory (random weights with --load-format dummy), with the zoo's tokenizer."""
    d = root / shape
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(llama_config(shape), indent=1))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ZOO / "target" / f, d / f)
    return str(d)


def part_where(out: Path, concurrency: tuple[int, ...], accept_lengths: tuple[float, ...], skip_plain: bool = False) -> None:
    root = Path("/tmp/specdec-shapes")
    m8, m1, e8 = model_dir("8b", root), model_dir("1b", root), model_dir("8b-eagle", root)
    common = dict(backend="sglang", attention_backend="triton", cuda_graph_max_bs=max(concurrency), load_format="dummy",
                  mem_fraction_static=0.6, disable_radix_cache=True, max_running_requests=max(concurrency),
                  extra_args=("--max-total-tokens", "65536"))
    rec = {"SGLANG_RECORD_STEP_TIME": "1"}
    plain = {"plain8b": (LaunchConfig(m8, **common), rec), "plain1b": (LaunchConfig(m1, **common), rec)}
    spec = {f"eagle8b_{a}": (LaunchConfig(m8, "EAGLE", draft=e8, **CHAIN, **common),
                             {**rec, "SGLANG_SIMULATE_ACC_LEN": str(a)}) for a in accept_lengths}
    # two waves: three 8B servers of 17 GB fit one H200 together (the KV pool capped at 65536 tokens, 8 GiB)
    waves = ([] if skip_plain else [plain]) + ([spec] if spec else [])
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    summary: dict = {"startup_s": {}, "errors": {}, "tpot_512": {}}
    sweeps = {}
    def measure(name, srv):
        summary["startup_s"][name] = srv.startup_s
        summary["tpot_512"][name] = tpot_at_context(srv.url)
        say(f"{name}: batch-1 TPOT at 512 context {summary['tpot_512'][name]['tpot_s'] * 1e3:.2f} ms")
        if name != "plain1b":
            sweeps[name] = sweep(name, srv.url, out, concurrency, ("open",), 256)

    for wave in waves:
        servers = start_all(wave, logs, timeout=480)
        summary["errors"].update({n: s for n, s in servers.items() if isinstance(s, str)})
        measure_one_by_one(servers, measure, summary["errors"].__setitem__,
                           lambda: (out / "summary.json").write_text(json.dumps(summary, indent=1)))
    if skip_plain and (out / "sweep_plain8b.json").exists():
        sweeps = {"plain8b": json.loads((out / "sweep_plain8b.json").read_text()), **sweeps}
    compare_with("plain8b", sweeps, out)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))


def tp2_waves(concurrency: tuple[int, ...], accept_length: float = 2.5) -> list[dict]:
    """The 8B shape on one GPU (plain on GPU 0, EAGLE on GPU 1, started together), then under --tp-size 2."""
    root = Path("/tmp/specdec-shapes")
    m8, e8 = model_dir("8b", root), model_dir("8b-eagle", root)
    common = dict(backend="sglang", attention_backend="triton", cuda_graph_max_bs=max(concurrency), load_format="dummy",
                  mem_fraction_static=0.6, disable_radix_cache=True, max_running_requests=max(concurrency),
                  extra_args=("--max-total-tokens", "65536"))
    rec = {"SGLANG_RECORD_STEP_TIME": "1"}
    sim = {**rec, "SGLANG_SIMULATE_ACC_LEN": str(accept_length)}
    return [
        {"plain8b_tp1": (LaunchConfig(m8, **common), {**rec, "CUDA_VISIBLE_DEVICES": "0"}),
         "eagle8b_tp1": (LaunchConfig(m8, "EAGLE", draft=e8, **CHAIN, **common), {**sim, "CUDA_VISIBLE_DEVICES": "1"})},
        {"plain8b_tp2": (LaunchConfig(m8, tp=2, **common), rec)},
        {"eagle8b_tp2": (LaunchConfig(m8, "EAGLE", draft=e8, tp=2, **CHAIN, **common), sim)},
    ]


def part_tp2(out: Path, concurrency: tuple[int, ...]) -> None:
    """The 8B shape on one GPU and under --tp-size 2 (tp2_waves), each server measured alone."""
    waves = tp2_waves(concurrency)
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    summary: dict = {"commands": {}, "startup_s": {}, "errors": {}, "tpot_512": {}, "accept_length": {}}
    sweeps: dict = {}
    for wave in waves:
        for name, (cfg, _) in wave.items():
            summary["commands"][name] = " ".join(cfg.command())
            say(f"{name}: {summary['commands'][name]}")

    def measure(name, srv):
        summary["startup_s"][name] = srv.startup_s
        summary["tpot_512"][name] = tpot_at_context(srv.url)
        say(f"{name}: batch-1 TPOT at 512 context {summary['tpot_512'][name]['tpot_s'] * 1e3:.2f} ms")
        sweeps[name] = sweep(name, srv.url, out, concurrency, ("open",), 256)
        summary["accept_length"][name] = [r.get("accept_length") for r in sweeps[name]["runs"]]

    for wave in waves:
        servers = start_all(wave, logs, timeout=480)
        summary["errors"].update({n: s for n, s in servers.items() if isinstance(s, str)})
        measure_one_by_one(servers, measure, summary["errors"].__setitem__,
                           lambda: (out / "summary.json").write_text(json.dumps(summary, indent=1)))
    for tp in ("tp1", "tp2"):
        if f"plain8b_{tp}" in sweeps and f"eagle8b_{tp}" in sweeps:
            compare_with(f"plain8b_{tp}", {k: v for k, v in sweeps.items() if k.endswith(tp)}, out)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("part", choices=("zoo", "where", "chat", "env", "tp2"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--concurrency", default=None, help="default: zoo 1,16; where 1,2,4,8,16,32,64")
    ap.add_argument("--accept-lengths", default="1.5,2.5,3.5", help="where: SGLANG_SIMULATE_ACC_LEN values ('' for none)")
    ap.add_argument("--skip-plain", action="store_true", help="where: only the speculative servers")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("SPECDEC_RUN_DIR", str(out / "run"))
    env_report(out)
    if args.part == "zoo":
        part_zoo(out, tuple(int(c) for c in (args.concurrency or "1,16").split(",")))
    elif args.part == "chat":
        part_chat(out)
    elif args.part == "tp2":
        part_tp2(out, tuple(int(c) for c in (args.concurrency or "1,4,16,64").split(",")))
    elif args.part == "where":
        part_where(out, tuple(int(c) for c in (args.concurrency or "1,2,4,8,16,32,64").split(",")),
                   tuple(float(a) for a in args.accept_lengths.split(",") if a), args.skip_plain)
    say("done")
    return 0


# --- docs/results.md: the sections this script's results feed (benchmarks/report.py stitches them) ---------

def _pooled_latency(sweep: dict, concurrency: int) -> tuple:
    """TTFT and TPOT p50 over every request of one concurrency, and the median of its categories' ITL p50 (ms)."""
    import statistics

    recs = [x for r in sweep["runs"] if r["concurrency"] == concurrency for x in r["records"]]
    itl = [r["itl_s"]["p50"] for r in sweep["runs"] if r["concurrency"] == concurrency and r.get("itl_s")]
    ms = lambda xs: 1e3 * statistics.median(xs) if xs else None  # noqa: E731
    return (ms([x["ttft"] for x in recs if x.get("ttft") is not None]), ms(itl),
            ms([x["tpot"] for x in recs if x.get("tpot") is not None]))


def _pays(rows: list[list], col: int, where: str) -> str:
    """'nextn (1.09x) pays at c=1' or 'none pays at c=16', from a table's speedup column."""
    won = [f"{r[0]} ({r[col]:.2f}x)" for r in rows if r[col] is not None and r[col] > 1]
    return f"{', '.join(won)} {'pays' if len(won) == 1 else 'pay'} at {where}" if won else f"none pays at {where}"


def render_zoo() -> str:
    """The section on `zoo`'s run."""
    from page import RES, provenance, table

    from specdec.serving.measure.records import acceptance_by_position

    d = RES / "gpu_lab3" / "zoo"
    if not (d / "summary.json").is_file():
        return ""
    summ = json.loads((d / "summary.json").read_text())
    plain = json.loads((d / "sweep_plain.json").read_text())
    rows = []
    for mode in ("plain", "ngram", "standalone", "eagle", "nextn"):
        sweep_ = json.loads((d / f"sweep_{mode}.json").read_text())
        m = summ["modes"][mode]
        lo, hi = _pooled_latency(sweep_, 1), _pooled_latency(sweep_, 16)
        if mode == "plain":
            tok = {c: sum(r["output_tokens"] for r in plain["runs"] if r["concurrency"] == c)
                   / sum(r["wall_s"] for r in plain["runs"] if r["concurrency"] == c) for c in (1, 16)}
            rows.append([mode, summ["startup_s"][mode], None, None, None, tok[1], None, tok[16], None, *lo, hi[2]])
            continue
        cmp = json.loads((d / f"compare_{mode}.json").read_text())
        pooled = {r["concurrency"]: r for r in cmp["rows"] if r["category"] == "all"}
        hists = [r["spec_correct_drafts_histogram"] for r in m["requests"]]
        by_pos = acceptance_by_position([sum(h[i] for h in hists) for i in range(len(hists[0]))])
        rows.append([mode, summ["startup_s"][mode], m["accept_length_weighted"], (m["server_avg_accept_length"] or [None])[0],
                     " / ".join(f"{x:.2f}" for x in by_pos), pooled[1]["spec_tok_s"], pooled[1]["speedup"],
                     pooled[16]["spec_tok_s"], pooled[16]["speedup"], *lo, hi[2]])
    ours = summ["lab2_decoder_mtp_k3"]
    nextn = summ["modes"]["nextn"]
    env = json.loads((d / "env.json").read_text())
    return f"""### Lab 3 on a real GPU: the tiny zoo in SGLang

{provenance(["benchmarks/results/gpu_lab3/zoo"], env["nvidia_smi"].split(",")[0], "`benchmarks/gpu_lab3.py zoo`",
            ["benchmarks/logs/gpu_lab3_zoo.log", "benchmarks/logs/gpu_lab3_server_logs.tgz"],
            ["benchmarks/results/gpu_lab3/zoo/"])}

SGLang {env["sglang"]} from the offline pack, torch {env["torch"]}: five servers of the shipped tiny target (with its
retrained MTP layer) started together by the course's launcher (`specdec.serving.ops.lifecycle.launch`), triton attention,
radix cache off, chains of 3 drafts (top-k 1, 4 draft tokens; NGRAM 4 draft tokens), then measured one at a time by
`specdec bench`'s sweep: prompt categories predictable, code and open,
128 new tokens (ignore_eos), concurrency 1 and 16, the cache flushed before each run. "Accept length (4 prompts)" is the
server's counters on `benchmarks/sglang_zoo_check.py`'s four prompts, completion_tokens / spec_verify_ct summed over them
(SGLang's definition); "per position" is P(draft i accepted) from the same requests' histograms; speedups are over the plain
server on the same prompts, all categories pooled; latencies in ms (p50; ITL = a chunk's gap over its tokens).

{table(["mode", "startup s", "accept length (4 prompts)", "server avg_spec_accept_length", "P(draft 1/2/3 accepted)",
        "tok/s c=1", "speedup c=1", "tok/s c=16", "speedup c=16", "TTFT c=1", "ITL c=1", "TPOT c=1", "TPOT c=16"], rows)}

The Lab 2 decoder with the same MTP layer (`Engine(bundle, "mtp", k=3)`, greedy, the same four prompts and 128 tokens, in the
same run on the same GPU) emits {ours["torch.bfloat16"]["sglang_accept_length_weighted"]:.2f} tokens per verify step in bf16 and
{ours["torch.float32"]["sglang_accept_length_weighted"]:.2f} in fp32, counted as SGLang counts; SGLang's NEXTN server gave
{nextn["accept_length_weighted"]:.2f} (per request {", ".join(f"{x:.2f}" for x in nextn["accept_length_per_request"])}; ours
{", ".join(f'{x["sglang_accept_length"]:.2f}' for x in ours["torch.bfloat16"]["per_request"])} in bf16). The MTP layer a
student decodes with in Lab 2 is the one SGLang serves in Lab 3. With a 4.9M-parameter target a plain step costs about
{rows[0][-2]:.1f} ms at batch 1, bound by kernel launches rather than by reading weights, so a speculative step's extra launches eat
most of what its accepted drafts save: {_pays(rows, 6, "c=1")}; {_pays(rows, 8, "c=16")}. "Where speculation pays: an 8B-shaped
target in SGLang" shows the same algorithms where a step reads gigabytes.
Real responses of these servers are test fixtures (`tests/fixtures/sglang/real_0516_zoo.json`, trimmed by
`benchmarks/trim_sglang_fixtures.py`); the chat endpoint answered 400 because the zoo had no chat template, which it now ships.
The Lab 3 lecture notebook ran end to end against real SGLang on the same kind of node (`benchmarks/gpu_lab3_notebook.sh`,
log `benchmarks/logs/gpu_lab3_notebook.log`): the executed copy is `docs/lab3_gpu_run.html`. Its concurrency sweep then sent
8 requests of 32 tokens per run, which lasts a fraction of a second on a GPU and measured mostly noise; the notebook's GPU path
now sends 32 requests of 128 tokens per run (not re-run on a GPU since).
"""


def render_where() -> str:
    """The section on `where`'s run (its plot: plot_where)."""
    import statistics

    from page import RES, provenance, table

    d = RES / "gpu_lab3" / "where"
    if not (d / "summary.json").is_file():
        return ""
    summ = json.loads((d / "summary.json").read_text())
    plain = json.loads((d / "sweep_plain8b.json").read_text())
    env = json.loads((d / "env.json").read_text())
    levels = sorted({r["concurrency"] for r in plain["runs"]})
    cmps = {f.stem.removeprefix("compare_eagle8b_"): json.loads(f.read_text()) for f in sorted(d.glob("compare_*.json"))}
    rows, cross = [], []
    base = {r["concurrency"]: r["output_tok_s"] for r in plain["runs"]}
    rows.append(["plain", None] + [base[c] for c in levels])
    for acc, c in cmps.items():
        pooled = {r["concurrency"]: r for r in c["rows"] if r["category"] == "all"}
        rows.append([f"EAGLE, simulated {acc}", statistics.fmean([pooled[x]["accept_length"] for x in levels])]
                    + [f'{pooled[x]["spec_tok_s"]:.0f} ({pooled[x]["speedup"]:.2f}x, predicted {pooled[x]["predicted_speedup"]:.2f}x)'
                       for x in levels])
        cc = crossovers(c["rows"])  # the course's rule, read from the rows (the stored crossover predates it)
        cross.append([acc, cc["measured"].get("text", cc["measured"]["status"]), cc["predicted"].get("text", cc["predicted"]["status"])])
    rows[0] = [rows[0][0], rows[0][1]] + [f"{v:.0f}" for v in rows[0][2:]]
    tp = summ["tpot_512"]
    ref = "2.5" if "2.5" in cmps else next(iter(cmps))
    costs = cmps[ref]["step_costs"]
    return f"""### Where speculation pays: an 8B-shaped target in SGLang

{provenance(["benchmarks/results/gpu_lab3/where"], env["nvidia_smi"].split(",")[0], "`benchmarks/gpu_lab3.py where`",
            ["benchmarks/logs/gpu_lab3_where.log"], ["benchmarks/results/gpu_lab3/where/"])}

A Llama-3.1-8B-shaped target (32 layers, hidden 4096, 8 KV heads, vocabulary 128256) and a one-layer EAGLE head of the same width,
both with random weights (`--load-format dummy`); `SGLANG_SIMULATE_ACC_LEN` sets the verifier's mean accept length; chains of
3 drafts, CUDA graphs up to batch {max(levels)}, `SGLANG_RECORD_STEP_TIME=1`. Each server swept by `specdec bench` at
concurrency {", ".join(map(str, levels))}, {plain["settings"]["max_new_tokens"]} new tokens per request, output tokens/s over
all requests. The prediction is Lab 1's `speedup_from_costs` from the step times the two servers measured themselves
(`step_time_dict`, seconds per decode step by batch size) and the measured accept length.

{table(["server", "accept length"] + [f"c={c}" for c in levels], rows)}

{table(["simulated accept length", "crossover, measured", "crossover, predicted from step costs"], cross)}

Why it turns: SGLang's own step times for plain and for a speculative step (accept length {ref}) were
{", ".join(f'{float(v["plain_s"]) * 1e3:.2f} / {float(v["spec_step_s"]) * 1e3:.2f} ms at batch {k}' for k, v in costs.items())}.
At batch 1 a speculative step (3 forwards of the one-layer head, then one target forward over 4 tokens) costs
{float(costs["1"]["spec_step_s"]) / float(costs["1"]["plain_s"]):.2f} plain steps: the verify reads the same 16 GB of weights a
plain step reads, and its extra tokens ride along almost free. By batch {max(levels)} it costs
{float(costs[str(max(levels))]["spec_step_s"]) / float(costs[str(max(levels))]["plain_s"]):.2f} plain steps: with
{max(levels)} x 4 tokens per verify the step is paid in arithmetic, not in weight reads. The plot: `docs/figures/where_speculation_pays.png`.

Batch-1 time per output token at 512 tokens of context ((e2e of 256 new tokens - e2e of 1) / 255, best of 3):
8B plain {tp["plain8b"]["tpot_s"] * 1e3:.2f} ms, 1B-shaped plain (Llama-3.2-1B shape, tied embeddings) {tp["plain1b"]["tpot_s"] * 1e3:.2f} ms,
8B EAGLE at 1.5 / 2.5 / 3.5: {tp["eagle8b_1.5"]["tpot_s"] * 1e3:.2f} / {tp["eagle8b_2.5"]["tpot_s"] * 1e3:.2f} / {tp["eagle8b_3.5"]["tpot_s"] * 1e3:.2f} ms.
Not run in that session: the same 8B shape with `--tp 2` (`benchmarks/gpu_lab3.py tp2`), because no two-GPU machine was lent.
"""


def plot_where(out: Path) -> Path | None:
    """Speedup over plain against concurrency, per simulated accept length (measured and predicted)."""
    from page import RES

    d = RES / "gpu_lab3" / "where"
    files = sorted(d.glob("compare_*.json"))
    if not files:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    for i, f in enumerate(files):
        c = json.loads(f.read_text())
        rows = [r for r in c["rows"] if r["category"] == "all"]
        xs = [r["concurrency"] for r in rows]
        ax.plot(xs, [r["speedup"] for r in rows], "o-", color=f"C{i}", label=f"accept length {f.stem.split('_')[-1]}, measured")
        ax.plot(xs, [r["predicted_speedup"] for r in rows], "--", color=f"C{i}", alpha=0.6, label="predicted from step costs")
    ax.axhline(1, color="k", lw=0.8)
    ax.set(xscale="log", xticks=xs, xticklabels=xs, xlabel="concurrency (requests in flight)", ylabel="speedup over plain",
           title="8B-shaped target, EAGLE chain of 3, SGLang 0.5.16 on an H200")
    ax.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    return out


if __name__ == "__main__":
    sys.exit(main())
