#!/usr/bin/env bash
# One device call after issues 21 and 22's CPU work (2026-11-27), three parts, each under its own time limit:
#   tree     `specdec decode` on the zoo with a draft tree (topk 4, 8 draft tokens) and with the chain, EAGLE head and
#            MTP layer, on the GPU (CUDA graphs for the chain and the plain run; a tree verifies eagerly): identical
#            to plain decoding, tau, tokens/s
#   compile  benchmarks/gpu_fast_path.py on the 1B shape, two starts: the first with --compile on and an empty
#            cache, the second with the defaults (--compile auto compiles only from a cache holding the kernels)
#   serve    benchmarks/gpu_fast_path_sglang.py serve at concurrency 16 and 64: `specdec serve` with today's
#            defaults (not compiled; one step's events handed over in one call) beside SGLang, plain and NEXTN
# usage (GPU node): PACK=.sglang-pack . .sglang-pack/setup.sh; OUT=$OUT bash benchmarks/gpu_tree_and_defaults.sh
set -u
OUT=${OUT:-/tmp/gpu_tree_and_defaults}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 SPECDEC_RUN_DIR=$OUT/run
T0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - T0 )) s] $*"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

stamp "tree"
for m in eagle mtp; do
  for shape in "--k 4" "--topk 4 --num-steps 4 --num-draft-tokens 8" "--topk 2 --num-steps 4 --num-draft-tokens 8"; do
    timeout 120 python3 -m specdec decode --model tiny --method $m $shape --max-new-tokens 128 --compare --json \
      > "$OUT/tree.json" 2> "$OUT/tree.err" || { echo "$m $shape failed:"; tail -3 "$OUT/tree.err"; continue; }
    python3 -c "
import json, sys; d = json.load(open('$OUT/tree.json'))
print('$m', '$shape', '| tau %.2f tok/s %.0f plain %.0f speedup %.2f identical %s graphs %s' % (d['tau'], d['tokens_per_s'],
      d['plain_tokens_per_s'], d['speedup'], d['same_as_plain'], d['cuda_graphs']))"
  done
done

stamp "compile"
timeout 230 python3 benchmarks/gpu_fast_path.py --shapes 1b --starts 2 --budget-s 200 --out "$OUT/gpu_fast_path_1b.json" \
  | grep -E "shape=|default path|floor"

stamp "serve"
timeout 330 python3 benchmarks/gpu_fast_path_sglang.py serve --levels 16,64 --min-run-s 4 --out "$OUT/serve" > "$OUT/serve.log" 2>&1
grep -E "healthy|FAILED|ERROR|sweep in|^(code|open) +(16|64) " "$OUT/serve.log"
rm -rf "$OUT/serve/logs" "$OUT/run" "$OUT"/serve/sweep_*.json  # what does not come back (too many files) stays out
stamp "done; left running: $(pgrep -fc 'launch_server|specdec serve' || true)"
