#!/usr/bin/env bash
# GPU session A (H200): train the shipped tiny zoo, check CUDA graphs against eager on it, and run the
# oracle sweep on a 1B-shaped model. usage: bash benchmarks/gpu_run_a.sh OUTDIR
set -uo pipefail
OUT=${1:?outdir}
export PYTHONPATH=. PYTHONUNBUFFERED=1
bash benchmarks/train_zoo_gpu.sh "$OUT" 2>&1 | grep -v "it/s\]$" > "$OUT/train_zoo_gpu.log"
tail -5 "$OUT/train_zoo_gpu.log"
rm -rf specdec/zoo/tiny && tar -C specdec/zoo -xzf "$OUT/zoo-tiny.tgz"
python3 -m pytest -q -p no:cacheprovider tests/test_cuda_graphs.py 2>&1 | tail -3 | tee "$OUT/gpu_tests.log"
python3 -m specdec decode --model tiny --method mtp --k 4 --max-new-tokens 128 --compare 2>&1 | tail -4 | tee -a "$OUT/gpu_tests.log"
timeout 240 python3 benchmarks/gpu_bench.py oracle --out "$OUT/oracle.json" 2>&1 | tail -20
