#!/bin/bash
# Run-to-run spread of `specdec bench` on the CPU: tiny zoo, plain and mtp (k=3) `specdec serve`, two
# sweeps each without repeats, then one each with --repeats 2, and --compare of each pair.
# Usage: benchmarks/bench_noise_cpu.sh [OUT_DIR]   (default benchmarks/results/bench_noise_cpu)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-benchmarks/results/bench_noise_cpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD
PY=${PYTHON:-python}
$PY -m specdec serve --model tiny --port 31801 --threads 1 > "$OUT/plain.log" 2>&1 &
P1=$!
$PY -m specdec serve --model tiny --speculative-algorithm mtp --k 3 --port 31802 --threads 1 > "$OUT/mtp.log" 2>&1 &
P2=$!
trap 'kill $P1 $P2' EXIT
for _ in $(seq 120); do
  curl -sf localhost:31801/health >/dev/null && curl -sf localhost:31802/health >/dev/null && break
  sleep 1
done
sweep() {  # name port tag extra-args...
  local n=$1 port=$2 tag=$3; shift 3
  $PY -m specdec bench --url "http://127.0.0.1:$port" --categories predictable,open --concurrency 1,4 \
    --max-new-tokens 32 --min-run-s 3 --quiet --out "$OUT/${n}_$tag.json" "$@" > "$OUT/${n}_$tag.txt" 2>&1
}
for tag in 1 2; do sweep plain 31801 $tag; sweep mtp 31802 $tag; done
sweep plain 31801 r2 --repeats 2; sweep mtp 31802 r2 --repeats 2
for tag in 1 2 r2; do
  $PY -m specdec bench --compare "$OUT/plain_$tag.json" "$OUT/mtp_$tag.json" --plots "$OUT/plots_$tag" > "$OUT/cmp_$tag.txt" 2>&1
done
