#!/usr/bin/env bash
# Issue 21, item 4 on a GPU: `specdec serve` on the zoo, plain, NEXTN-style MTP at k = 3, and the same with
# --adaptive-k (the engine chooses 0..3 drafts each step: the most expected tokens per second, from the acceptance
# and the step times it measured per batch width and k, specdec/decoder/adaptive.py), each swept by `specdec bench` at concurrency 1, 4, 16, 64 (code and open prompts,
# 128 tokens, every level warmed, runs of at least 4 s), each against plain with `--compare`.
# usage (GPU node):  OUT=$OUT bash benchmarks/gpu_adaptive_k.sh
set -u
OUT=${OUT:-/tmp/gpu_adaptive_k}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
T0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - T0 )) s] $*"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

. "$(dirname "$0")/serve_bg.sh"

sweep() {  # NAME PORT FLAGS...
  local name=$1 port=$2; shift 2
  stamp "specdec serve $* (background, SIGINT ignored)"
  serve_bg "$name" "$port" --max-running-requests 64 "$@" || return 1
  local pid=$SERVE_PID
  head -n 2 "$OUT/serve-$name.log"
  python3 -m specdec bench --url "http://127.0.0.1:$port" --categories code,open --concurrency 1,4,16,64 \
      --max-new-tokens 128 --min-run-s 4 --quiet --out "$OUT/$name.json"
  kill -TERM $pid; wait $pid; echo "specdec serve exit status $?"
}

sweep plain 30141 --speculative-algorithm none
sweep mtp 30142 --speculative-algorithm mtp --k 3
sweep adaptive 30143 --speculative-algorithm mtp --k 3 --adaptive-k
for s in mtp adaptive; do
  stamp "specdec bench --compare plain.json $s.json"
  python3 -m specdec bench --compare "$OUT/plain.json" "$OUT/$s.json" --json "$OUT/compare_$s.json" --plots "$OUT/plots_$s"
done
stamp "done; left running: $(pgrep -fc 'specdec serve' || true)"
