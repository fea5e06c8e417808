#!/usr/bin/env bash
# Train the shipped `tiny` zoo on one GPU (it was run on an H200; log in benchmarks/logs/).
# usage (repository root, on the GPU machine): bash benchmarks/train_zoo_gpu.sh OUTDIR
set -euo pipefail
OUT=${1:-/tmp/zoo-out}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import sys, torch, transformers, tokenizers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'tokenizers', tokenizers.__version__)"
time python3 -m specdec zoo build --recipe tiny --device cuda --out "$OUT/tiny"
tar -C "$OUT" -czf "$OUT/zoo-tiny.tgz" tiny && rm -rf "$OUT/tiny"
ls -la "$OUT"
