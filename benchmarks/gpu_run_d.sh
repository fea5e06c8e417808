#!/usr/bin/env bash
# GPU session D (H200), right after C on the same machine: end-to-end on the `small` zoo, then the
# 1B latency table again with the compiled variants.
set -uo pipefail
OUT=${1:?outdir}
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 300 python3 benchmarks/gpu_bench.py e2e --zoo /tmp/zoo-small/target --out "$OUT/e2e_small.json" 2>&1 | grep -v Warning | tail -40
timeout 240 python3 benchmarks/gpu_bench.py latency --out "$OUT/latency.json" 2>&1 | grep "^{" | tail -5
