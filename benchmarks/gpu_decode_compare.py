"""The shipped tiny zoo on a GPU, one line per proposer: `specdec decode --model tiny --method M --k 4
--max-new-tokens 128 --compare` (bf16, CUDA graphs, the CLI's default code prompt, batch 1), after
tests/test_cuda_graphs.py (graphed output equals eager for every proposer, also as rows join and leave).

Its log is what docs/results.md reads: the GPU's name, torch's version, pytest's summary, then per proposer
"<method> graphs <bool> tau <x> tok/s <x> plain <x> speedup <x> same <bool>".

usage (GPU node):  PYTHONPATH=. python3 benchmarks/gpu_decode_compare.py [--methods mtp,eagle,draft,heads,ngram] > $OUT/LOG
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys

METHODS = ("mtp", "eagle", "draft", "heads", "ngram")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--no-tests", action="store_true", help="skip tests/test_cuda_graphs.py")
    args = p.parse_args(argv)
    run = lambda cmd: subprocess.run(cmd, capture_output=True, text=True, check=False)  # noqa: E731
    smi = run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]) if shutil.which("nvidia-smi") else None
    print(smi.stdout.strip() if smi and smi.returncode == 0 else "no GPU named by nvidia-smi", flush=True)
    print("torch", run([sys.executable, "-c", "import torch; print(torch.__version__)"]).stdout.strip(), flush=True)
    if not args.no_tests:
        t = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "tests/test_cuda_graphs.py"])
        print("\n".join((t.stdout + t.stderr).strip().splitlines()[-3:]), flush=True)
    for m in args.methods.split(","):
        r = run([sys.executable, "-m", "specdec", "decode", "--model", "tiny", "--method", m, "--k", "4",
                 "--max-new-tokens", "128", "--compare", "--json"])
        if r.returncode != 0:
            print(m, "failed:", r.stderr.strip().splitlines()[-1:] or r.returncode, flush=True)
            continue
        d = json.loads(r.stdout)
        print(d["method"], "graphs", d["cuda_graphs"], "tau %.2f" % d["tau"], "tok/s %.0f" % d["tokens_per_s"],
              "plain %.0f" % d["plain_tokens_per_s"], "speedup %.2f" % d["speedup"], "same", d["same_as_plain"], flush=True)
    return 0


# --- docs/results.md: the sections its logs feed (benchmarks/report.py stitches the sections) ---------------

HEADER = ["method", "CUDA graphs", "tau", "tokens/s", "plain tokens/s", "speedup", "identical to plain"]


def _rows(text: str) -> list[list]:
    rows = []
    for line in text.splitlines():
        w = line.split()
        if len(w) == 13 and w[1] == "graphs":  # "<method> graphs True tau X tok/s Y plain Z speedup S same B"
            rows.append([w[0], w[2], float(w[4]), float(w[6]), float(w[8]), float(w[10]), w[12]])
    return rows


def render_first() -> str:
    """The first run, on the decoder before the step-level engine (log benchmarks/logs/gpu_final.log)."""
    from page import LOGS, provenance, table

    log = LOGS / "gpu_final.log"
    if not log.is_file():
        return ""
    return f"""### The shipped tiny zoo on the H200, `specdec decode --compare`

{provenance(["benchmarks/logs/gpu_final.log"], "NVIDIA H200", "`benchmarks/gpu_decode_compare.py --methods mtp,eagle,draft,ngram`",
            ["benchmarks/logs/gpu_final.log"])}

`specdec decode --model tiny --method M --k 4 --max-new-tokens 128 --compare` (bf16, CUDA
graphs, the CLI's default code prompt, batch 1), after `tests/test_cuda_graphs.py` passed on the GPU (graphed output
equals eager for every proposer). The log was written by the same commands from a one-off shell script, before they
became `benchmarks/gpu_decode_compare.py` (which also prints the GPU's name and torch's version first).

{table(HEADER, _rows(log.read_text()))}

On this prompt the target soon repeats itself, which every proposer predicts well (tau > 4); the held-out figures on the
zoo page are the representative ones. Even a 5 M-parameter model gains on the GPU once graphs remove the launch cost.
"""


def render_engine() -> str:
    """The run after the decoder became a step-level engine (log benchmarks/logs/gpu_check_engine.log)."""
    from page import LOGS, provenance, table

    log = LOGS / "gpu_check_engine.log"
    if not log.is_file():
        return ""
    text = log.read_text()
    gpu = text.splitlines()[0]
    passed = next((ln.strip() for ln in text.splitlines() if " passed" in ln), "")
    return f"""### The step-level engine on the GPU

{provenance(["benchmarks/logs/gpu_check_engine.log"], gpu, "`benchmarks/gpu_decode_compare.py`",
            ["benchmarks/logs/gpu_check_engine.log"])}

After the decoder became one speculative step and a step-level engine that admits and
retires rows between steps: `tests/test_cuda_graphs.py` on the GPU ({passed}: graphed output equals eager for every
proposer, also while requests join and leave a running batch), then the same `specdec decode --compare` as the section
above, with the parallel heads added (the log was written by the same commands from a one-off shell script, before they
became `benchmarks/gpu_decode_compare.py`). This run still had the MTP layer as first
trained: the shipped layer was retrained later the same day (`docs/zoo.md`), and no GPU was lent after that.

{table(HEADER, _rows(text))}
"""


if __name__ == "__main__":
    sys.exit(main())
