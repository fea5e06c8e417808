#!/usr/bin/env bash
# GPU session F (H200): retrain the shipped tiny zoo (Qwen2-compatible tokenizer) and check CUDA graphs on it.
set -uo pipefail
OUT=${1:?outdir}
export PYTHONPATH=. PYTHONUNBUFFERED=1
bash benchmarks/train_zoo_gpu.sh "$OUT" 2>&1 | grep -v "it/s\]$" > "$OUT/train_zoo_gpu.log"
tail -6 "$OUT/train_zoo_gpu.log"
rm -rf specdec/zoo/tiny && tar -C specdec/zoo -xzf "$OUT/zoo-tiny.tgz"
python3 -m pytest -q -p no:cacheprovider tests/test_cuda_graphs.py 2>&1 | tail -2 | tee "$OUT/gpu_tests.log"
