#!/usr/bin/env bash
# GPU session B (H200): decode-step latency of a 1B-shaped model: eager, CUDA graphs, torch.compile.
set -uo pipefail
OUT=${1:?outdir}
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 500 python3 benchmarks/gpu_bench.py latency --out "$OUT/latency.json" 2>&1 | grep -v Warning | tail -30
