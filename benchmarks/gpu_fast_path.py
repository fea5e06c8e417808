"""The default `specdec decode` path on a GPU, end to end, as a user runs it: time per output token on random
weights of the Llama-3.1-8B and Llama-3.2-1B shapes (bf16, batch 1, a 512-token prompt, 256 new tokens, plain
decoding), each start a process of its own:
  starts    `specdec decode --random-weights SHAPE --method ar` (fused, CUDA graphs): the first start with
            --compile on and an empty compile cache (it compiles and tunes, and fills the cache), then later
            starts with every default (--compile auto: compiled, since the cache now holds this model's
            kernels); the process's wall time, the compile's own time (its progress line), the time to the
            first token and per output token after it. Once per compile scope (--compile-scope step: each
            captured step compiled whole; layers: one decoder layer compiled for all layers, and the LM head),
            each with its own folder in the compile cache
  variants  the same with --compile off, and with --no-fuse --compile off (the checkpoint's layout, as the CLI
            loaded before issue 21)
  floor     (weight bytes read by a step + the live KV bytes) / the device-to-device copy rate, measured here
The JSON and the log are rewritten after each measurement; a failure is recorded and the rest go on; what the
time budget does not reach is marked skipped.

usage (GPU node): PYTHONPATH=. python3 benchmarks/gpu_fast_path.py --out $OUT/gpu_fast_path.json  (log: .log beside)
                  [--shapes 8b,1b] [--scopes step,layers] [--starts 3] [--budget-s 540]
                  [--cache-dir DIR: default a fresh temporary one]
       python3 benchmarks/gpu_fast_path.py --smoke --out /tmp/fp.json   (CPU, the zoo's tiny shape, no GPU part: tests)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository's specdec, run from anywhere


@dataclass
class Plan:
    shapes: tuple = ("8b", "1b")
    scopes: tuple = ("step", "layers")  # --compile-scope of the starts (specdec.decoder.cuda_graphs.SCOPES)
    prompt_tokens: int = 512
    new_tokens: int = 256
    starts: int = 3  # the first (empty cache) and the later ones (the cache read)
    device_args: tuple = ()  # the CLI's defaults: the GPU, bf16
    gpu: bool = True  # the copy rate and the floor

    @classmethod
    def smoke(cls) -> "Plan":
        return cls(shapes=("tiny",), prompt_tokens=32, new_tokens=16, starts=2, device_args=("--device", "cpu"),
                   gpu=False)


class Run:
    """The log and the JSON, rewritten after each measurement, and the time budget."""

    def __init__(self, out: Path, budget_s: float):
        self.out, self.log_path = out, out.with_suffix(".log")
        self.deadline = time.time() + budget_s
        self.results: dict = {"env": {}, "floor": {}, "runs": []}
        self.lines: list[str] = []
        out.parent.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.deadline - time.time()

    def log(self, line: str) -> None:
        print(line, flush=True)
        self.lines.append(line)
        self.log_path.write_text("\n".join(self.lines) + "\n")

    def save(self) -> None:
        self.out.write_text(json.dumps(self.results, indent=2) + "\n")


def prompt_text(n: int) -> str:
    """About n tokens of code for the zoo's tokenizer (which the random-weight shapes use)."""
    from specdec.zoo import resolve
    from specdec.zoo.tokenizer import ZooTokenizer

    tok = ZooTokenizer(resolve("tiny")["target"])
    source = "".join(p.read_text() for p in sorted((ROOT / "specdec" / "decoder").glob("*.py")))
    return tok.decode(tok(source)["input_ids"][:n])


def compile_seconds(text: str) -> int | None:
    """The seconds of the last "specdec: compiled in N s" line that `specdec decode`/`serve` printed (fast.compiling),
    or None where nothing was compiled."""
    found = re.findall(r"compiled in (\d+) s", text)
    return int(found[-1]) if found else None


def decode(shape: str, plan: Plan, prompt: str, extra: list[str], env: dict, timeout: float) -> dict:
    """One `specdec decode` process: its JSON's timings, its wall time and the compile's time."""
    argv = [sys.executable, "-m", "specdec", "decode", "--random-weights", shape, "--method", "ar", "--prompt", prompt,
            "--max-new-tokens", str(plan.new_tokens), "--json", *plan.device_args, *extra]
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"exit status {r.returncode}: {(r.stderr.strip().splitlines() or [''])[-1][:300]}")
    d = json.loads(r.stdout)
    return {"process_s": round(wall, 2), "compile_s": compile_seconds(r.stderr),
            "compiled": d["compiled"], "compile_scope": d["compile_scope"], "fused": d["fused"], "cuda_graphs": d["cuda_graphs"], "device": d["device"],
            "prompt_tokens": d["prompt_tokens"][0], "new_tokens": d["new_tokens"], "ttft_ms": 1e3 * d["ttft_s"],
            "tpot_ms": 1e3 * d["tpot_s"]}


def floor_ms(shape: str, plan: Plan, bandwidth: float) -> float:
    """A plain step's floor at the run's mean context: every weight read once (an untied embedding only its
    rows), and the keys and values of the live context, at the copy rate."""
    import torch

    from specdec.zoo.dummy import shape_config, target_bytes

    cfg = shape_config(shape)[0]
    weights = target_bytes(cfg, torch.bfloat16) - (0 if cfg.tie_word_embeddings else 2 * cfg.vocab_size * cfg.hidden_size)
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2
    context = plan.prompt_tokens + plan.new_tokens / 2
    return 1e3 * (weights + kv_per_token * context) / bandwidth


def environment(plan: Plan) -> dict:
    import torch

    from specdec.serving.measure.machine import cpu_name

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    # a working tree with changes to tracked files measures more than its commit: say so beside it
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                             text=True, cwd=ROOT).stdout.split("\n")
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__,
            "device": torch.cuda.get_device_name() if plan.gpu else "cpu", "commit": commit.stdout.strip(),
            "changed_files": sorted(line[3:] for line in changed if line.strip()), "cpu": cpu_name(),
            "plan": asdict(plan)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("gpu_fast_path.json"))
    p.add_argument("--shapes", default=None, help="comma-separated: 8b,1b (default both)")
    p.add_argument("--scopes", default=None, help="comma-separated --compile-scope values of the starts "
                                                  "(default step,layers)")
    p.add_argument("--starts", type=int, default=None, help="processes per scope, the first with --compile on "
                                                            "(default 3)")
    p.add_argument("--budget-s", type=float, default=540.0, help="stop starting processes after this long")
    p.add_argument("--cache-dir", default=None, help="the compile cache (default: a fresh temporary folder)")
    p.add_argument("--smoke", action="store_true", help="CPU, the zoo's tiny shape, no GPU part (the tests)")
    args = p.parse_args(argv)
    plan = Plan.smoke() if args.smoke else Plan()
    if args.shapes:
        plan.shapes = tuple(args.shapes.split(","))
    if args.scopes:
        plan.scopes = tuple(args.scopes.split(","))
    if args.starts:
        plan.starts = args.starts
    run = Run(args.out, args.budget_s)
    cache = args.cache_dir or tempfile.mkdtemp(prefix="specdec-compile-")
    env = {**os.environ, "SPECDEC_COMPILE_DIR": cache, "PYTHONPATH": str(ROOT)}
    run.results["env"] = environment(plan)
    e = run.results["env"]
    changed = f" with {len(e['changed_files'])} files changed ({', '.join(e['changed_files'])})" if e["changed_files"] else ""
    run.log(f"{e['device']}, torch {e['torch']}, commit {e['commit']}{changed}; {e['cpu']}; compile cache {cache}")
    if plan.gpu:
        import torch
        from gpu_bench import copy_bandwidth  # benchmarks/ is this script's directory

        bw = copy_bandwidth()
        torch.cuda.empty_cache()
        run.results["copy_bytes_per_s"] = bw
        run.log(f"copy rate {bw / 1e12:.2f} TB/s")
        for shape in plan.shapes:
            run.results["floor"][shape] = floor_ms(shape, plan, bw)
            run.log(f"{shape} floor {run.results['floor'][shape]:.3f} ms per output token")
    prompt = prompt_text(plan.prompt_tokens)
    first = [] if args.smoke else ["--compile", "on"]  # a CPU has nothing to compile: --compile on is refused
    variants = []  # (name, scope, flags): per scope, start 1 fills the scope's cache folder, the later ones read it
    for scope in plan.scopes:
        scoped = ["--compile-scope", scope]
        variants += [(f"start 1 ({scope})", scope, first + scoped)]
        variants += [(f"start {i + 1} ({scope})", scope, scoped) for i in range(1, plan.starts)]
    variants += [("compile off", None, ["--compile", "off"]),
                 ("unfused, compile off", None, ["--no-fuse", "--compile", "off"])]
    for shape in plan.shapes:
        for name, scope, extra in variants:
            entry = {"shape": shape, "variant": name, "scope": scope, "flags": " ".join(extra) or "(defaults)"}
            if run.left() < 30:
                entry["skipped"] = f"time budget: {run.left():.0f} s left"
            else:
                try:
                    entry.update(decode(shape, plan, prompt, extra, env, timeout=max(30.0, run.left())))
                except Exception as exc:  # recorded: one failure must not lose the rest of the run
                    entry["error"] = f"{type(exc).__name__}: {exc}"
            run.results["runs"].append(entry)
            run.save()
            run.log(" ".join(f"{k}={round(v, 3) if isinstance(v, float) else v}" for k, v in entry.items()))
    for shape in plan.shapes:
        for scope in plan.scopes:
            starts = [e for e in run.results["runs"] if e["shape"] == shape and e["scope"] == scope and "tpot_ms" in e]
            summary(run, shape, scope, starts)
    if args.cache_dir is None:  # a temporary cache: its kernels are of no use to a later run of this script
        shutil.rmtree(cache, ignore_errors=True)
    return 0


def summary(run: Run, shape: str, scope: str, starts: list[dict]) -> None:
    """One scope's line: the later starts' median time per output token, and every start's compile time."""
    later = [e for e in starts if not e["variant"].startswith("start 1 ")]
    if later:
        tpot, floor = statistics.median(e["tpot_ms"] for e in later), run.results["floor"].get(shape)
        compiles = [e["compile_s"] for e in starts]
        run.log(f"{shape}, --compile-scope {scope}: default path {tpot:.3f} ms per output token (median of the later starts)"
                + (f", {tpot / floor:.2f}x the floor" if floor else "")
                + (f"; compile {compiles[0]} s at the first start, {compiles[1:]} s at the later ones"
                   if compiles[0] is not None else "; not compiled"))


# --- docs/results.md: the section its results feed (benchmarks/report.py stitches the sections) ---------------

# issue 21's goals for the default path: (at most this many times the floor, at least this many times SGLang's speed)
GOALS = {"8b": (1.20, 1.15), "1b": (1.8, 1.4)}
FINAL_8B = "2026-11-29_final_8b"  # the 8B default path of the code after the gated down projection and two-pass argmax
MAIN_8B = "2026-11-29_main_8b"  # that 8B path once only the 1B's down tile was gated again (fa0b6fa's + two-pass argmax)
OTHER_CALLS = "2026-11-29_other_calls"  # the day's other calls of gpu_fast_path_sglang.py, kept beside the rows'
RESULTS = ROOT / "benchmarks" / "results"


def sglang_ms(shape: str) -> float | None:
    """SGLang's batch-1 ms per output token on `shape`, measured in the call of that shape's rows
    (benchmarks/gpu_fast_path_sglang.py decode)."""
    from page import load

    return tpot_512_ms(load(f"gpu_fast_path_sglang/sglang_{shape}.json"))


def tpot_512_ms(sglang: dict | None) -> float | None:
    """SGLang's batch-1 ms per output token at 512 tokens of context in one of its result files (None: not there)."""
    return next((v["tpot_s"] * 1e3 for v in (sglang or {}).get("tpot_512", {}).values()), None)


def meets(shape: str, tpot: float, floor: float, sglang: float) -> bool:
    """Issue 21's goals for a shape's default path: at most GOALS' multiple of the floor, at least its speed-up."""
    most_floor, least_sglang = GOALS[shape]
    return tpot / floor <= most_floor and sglang / tpot >= least_sglang


def later_8b(folder: str) -> tuple[dict, float, float, float] | None:
    """A later call's 8B default path (benchmarks/results/gpu_fast_path_sglang/FOLDER/): its results, the start-2
    step-scope ms per token, its floor and SGLang's figure in that call; None where the files are not there."""
    from page import load

    data = load(f"gpu_fast_path_sglang/{folder}/gpu_fast_path.json")
    theirs = tpot_512_ms(load(f"gpu_fast_path_sglang/{folder}/sglang.json"))
    if not (data and "8b" in data.get("floor", {}) and theirs):
        return None
    tpot = next(e["tpot_ms"] for e in data["runs"] if e["variant"] == "start 2 (step)")
    return data, tpot, data["floor"]["8b"], theirs


def default_path(shape: str, run: str = "start 2 (step)", then: bool = False) -> tuple[float, float, float]:
    """The default path's ms per output token on `shape` (one run of the committed results), its floor and
    SGLang's figure from the same call, for the sections that cite it. then: the rows the current ones replaced
    (their "before" entry, which keeps its own floor and SGLang's figure), for sections written against those."""
    from page import load

    data = load("gpu_fast_path.json")
    if not then:
        tpot = next(e["tpot_ms"] for e in data["runs"] if e["shape"] == shape and e["variant"] == run)
        return tpot, data["floor"][shape], sglang_ms(shape)
    was = data["before"][shape]
    tpot = next(e["tpot_ms"] for e in was["runs"] if e["variant"] == run)
    return tpot, was["floor"], tpot_512_ms(load(f"gpu_fast_path_sglang/{was['sglang']}"))


def render() -> str:
    from page import load, provenance, table

    data = load("gpu_fast_path.json")
    if not data:
        return ""
    sglang = {shape: ms for shape in data["floor"] if (ms := sglang_ms(shape)) is not None}
    header = ["shape", "run", "flags", "process s", "compile s", "ms to first token", "ms per output token", "x floor",
              "speed / SGLang's"]
    rows = [[e["shape"], e["variant"], e["flags"], e.get("process_s", f"not run ({e['skipped']})" if "skipped" in e else None),
             e.get("compile_s"), e.get("ttft_ms"),
             e.get("tpot_ms"), e["tpot_ms"] / data["floor"][e["shape"]] if e.get("tpot_ms") and
             e["shape"] in data["floor"] else None,
             sglang[e["shape"]] / e["tpot_ms"] if e.get("tpot_ms") and e["shape"] in sglang else None]
            for e in data["runs"]]
    anchor = ", ".join(f"{s} {ms:.3f} ms" for s, ms in sglang.items())
    when = ""  # a shape measured again in a later call keeps its own date (env_SHAPE: the call of the other rows)
    for shape in (s for s in data["floor"] if f"env_{s}" in data):
        others = ", ".join(s for s in data["floor"] if s != shape)
        when += (f" The {others} rows come from a call on {data['env']['date'][:10]} (the device's git printed {data['env']['commit']}), the {shape}"
                 f" rows from one on {data[f'env_{shape}']['date'][:10]} ({data[f'env_{shape}']['commit']}), each with"
                 " SGLang in its call.")
    before = ""  # the rows a shape's newer call replaced: its default path then, against now
    for shape, was in data.get("before", {}).items():
        then = {e["variant"]: e["tpot_ms"] for e in was["runs"] if e.get("tpot_ms")}
        now = {e["variant"]: e["tpot_ms"] for e in data["runs"] if e["shape"] == shape and e.get("tpot_ms")}
        pairs = [f"{v} {then[v]:.2f} -> {now[v]:.2f} ms ({now[v] / then[v] - 1:+.1%})" for v in now if v in then]
        if pairs:
            before += (f"\n- {shape}, against the rows these replaced ({was['date'][:10]}, the device's git printed "
                       f"{was['commit']}; log `benchmarks/logs/gpu_fast_path.log`; since then: {was['since']}): "
                       + "; ".join(pairs) + ".")
    goals = ""  # issue 21's: the default path (start 2, step scope) against the floor and SGLang in its call
    for shape, (most_floor, least_sglang) in GOALS.items():
        if shape not in sglang or not any(e["shape"] == shape and e["variant"] == "start 2 (step)" and e.get("tpot_ms")
                                          for e in data["runs"]):
            continue
        tpot, floor, theirs = default_path(shape)
        ok = meets(shape, tpot, floor, theirs)
        goals += (f"\n- {shape}, the default path (start 2, `--compile-scope step`): {tpot:.3f} ms a token, "
                  f"{tpot / floor:.3f}x the floor (goal <= {most_floor}x) and {theirs / tpot:.2f}x SGLang's speed "
                  f"(goal >= {least_sglang}x): {'met' if ok else 'missed'}.")
        others = [json.loads(f.read_text()) for f in
                  sorted((RESULTS / "gpu_fast_path_sglang" / OTHER_CALLS).glob(f"*sglang_{shape}.json"))]
        spread = [theirs] + [v["tpot_s"] * 1e3 for o in others for v in o.get("tpot_512", {}).values()]
        if len(spread) > 1:  # SGLang's figure moved between calls and machines more than the goal's margin
            goals += (f" SGLang's figure for this shape in the same day's other calls: "
                      f"{', '.join(f'{ms:.3f}' for ms in spread[1:])} ms; against the lowest, "
                      f"{tpot:.3f} ms would be {min(spread) / tpot:.2f}x (across calls: not the goal's measure).")
    if got := later_8b(FINAL_8B):  # the code after the 8B rows above, in a later call
        later, tpot, floor, theirs = got
        ok = meets("8b", tpot, floor, theirs)
        was, was_floor, was_sglang = default_path("8b")
        goals += (f"\n- 8b, the code after these rows (the gated down projection and the two-pass argmax, measured above "
                  f"only on the 1B), in a later call ({later['env']['date'][:10]}, the device's git printed "
                  f"{later['env']['commit']} with only benchmark and results files changed; results "
                  f"`benchmarks/results/gpu_fast_path_sglang/{FINAL_8B}/`): {tpot:.3f} ms a token, floor {floor:.3f} ms, "
                  f"SGLang {theirs:.3f} ms: {tpot / floor:.3f}x the floor and {theirs / tpot:.2f}x SGLang's speed: "
                  f"{'met' if ok else 'missed'}. Against the rows above: ours {tpot / was - 1:+.1%}, the floor "
                  f"{floor / was_floor - 1:+.1%}, SGLang {theirs / was_sglang - 1:+.1%} (the two changes "
                  "were not measured apart on the 8B).")
        ab = {side: [e["tpot_ms"] for f in sorted((RESULTS / "gpu_fast_path_sglang" / FINAL_8B / "ab").glob(f"{side}_*.json"))
                     for e in json.loads(f.read_text())["runs"] if e["variant"].startswith("start") and "(step)" in e["variant"]]
              for side in ("old", "new")}
        if all(ab.values()):
            goals += (f" In the next call, that code and fa0b6fa's interleaved on one machine (no SGLang; "
                      f"`{FINAL_8B}/ab/`, the log has two more of fa0b6fa's starts): fa0b6fa "
                      f"{', '.join(f'{t:.3f}' for t in ab['old'])} ms, this code {', '.join(f'{t:.3f}' for t in ab['new'])} ms "
                      f"({statistics.median(ab['new']) / statistics.median(ab['old']) - 1:+.1%}). So the 8B's down projection "
                      "is no longer gated (`tuned/gemv.json`: only the 1B's tile is); that code, fa0b6fa's 8B path with the "
                      "two-pass argmax, was measured in a later call (next).")
    if got := later_8b(MAIN_8B):  # the 8B's path as the code now has it, SGLang in its call
        now, tpot, floor, theirs = got
        goals += (f"\n- 8b, the default path as the code now has it (only the 1B's down tile gated: fa0b6fa's 8B path "
                  f"with the two-pass argmax), in a later call ({now['env']['date'][:10]}, the device's git printed "
                  f"{now['env']['commit']}; results `benchmarks/results/gpu_fast_path_sglang/{MAIN_8B}/`): "
                  f"{tpot:.3f} ms a token, floor {floor:.3f} ms, SGLang {theirs:.3f} ms: {tpot / floor:.3f}x the floor "
                  f"(goal <= {GOALS['8b'][0]}x) and {theirs / tpot:.2f}x SGLang's speed (goal >= {GOALS['8b'][1]}x): "
                  f"{'met' if meets('8b', tpot, floor, theirs) else 'missed'}.")
    return f"""### The default `specdec decode` path on random weights

{provenance(["benchmarks/results/gpu_fast_path.json"], data["env"]["device"], "`benchmarks/gpu_fast_path.py`",
            ["benchmarks/logs/gpu_fast_path.log", "benchmarks/logs/gpu_fast_path_sglang.log"],
            ["benchmarks/results/gpu_fast_path.json", "benchmarks/results/gpu_fast_path_sglang/"])}

Each row is one `specdec decode --random-weights SHAPE --method ar` process (batch 1, a
{data["env"]["plan"]["prompt_tokens"]}-token prompt, {data["env"]["plan"]["new_tokens"]} new tokens), fused: start 1
with `--compile on` and an empty compile cache, start 2 with the defaults (`--compile auto` compiles where the cache holds
the model's kernels, as it then did), for each `--compile-scope` (`step` compiles each captured step whole, `layers` one
decoder layer for all layers and the LM head), then `--compile off`, then the checkpoint's own
layout. SGLang 0.5.16 plain on the same shapes
and machine (random weights, triton attention, CUDA graphs; `benchmarks/gpu_fast_path_sglang.py decode`), batch-1 time
per output token at 512 tokens of context: {anchor}.{when}

{table(header, rows)}
{goals}
{before}
"""


if __name__ == "__main__":
    sys.exit(main())
