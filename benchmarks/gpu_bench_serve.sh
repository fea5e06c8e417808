#!/usr/bin/env bash
# `specdec bench` against `specdec serve` on a GPU (tiny zoo, CUDA graphs), plain and NEXTN (the target's MTP
# layer, k=3), with what a sound sweep needs: every concurrency level warmed before it is timed, runs
# sized by time, two repeats each, and `--compare` with its intervals.
# usage (GPU node):  bash benchmarks/gpu_bench_serve.sh   (writes $OUT/gpu_bench_serve.log and the sweeps' JSON)
set -u
OUT=${OUT:-/tmp/gpu_bench_serve}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_bench_serve.log") 2>&1
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
T0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - T0 )) s] $*"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

. "$(dirname "$0")/serve_bg.sh"

sweep() {  # NAME ALGORITHM PORT
  stamp "specdec serve --speculative-algorithm $2 (background, SIGINT ignored)"
  serve_bg "$1" "$3" --speculative-algorithm "$2" --k 3 --max-running-requests 16 || return 1
  local pid=$SERVE_PID
  head -n 3 "$OUT/serve-$1.log"
  stamp "specdec bench $1"
  python3 -m specdec bench --url "http://127.0.0.1:$3" --categories predictable,code,open --concurrency 1,4,16 \
      --max-new-tokens 128 --min-run-s 3 --repeats 2 --quiet --out "$OUT/$1.json"
  kill -TERM $pid; wait $pid; echo "specdec serve exit status $?"; tail -n 1 "$OUT/serve-$1.log"
}

sweep plain none 30131
sweep mtp mtp 30132
stamp "specdec bench --compare plain.json mtp.json"
python3 -m specdec bench --compare "$OUT/plain.json" "$OUT/mtp.json" --plots "$OUT/plots" --json "$OUT/compare.json"
pgrep -af "specdec serve" || echo "no specdec serve process left"
stamp "done"
