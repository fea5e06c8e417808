#!/usr/bin/env bash
# Retrain the shipped zoo's MTP layer unrolled over k = 4 draft steps on one GPU (log in benchmarks/logs/).
# usage (repository root, on the GPU machine): bash benchmarks/train_mtp_unrolled.sh OUTDIR [train options]
# then here: python benchmarks/train_mtp_unrolled.py install OUTDIR
set -euo pipefail
OUT=${1:-/tmp/mtp-out}
shift || true
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import sys, torch, tokenizers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'tokenizers', tokenizers.__version__)"
time python3 benchmarks/train_mtp_unrolled.py train --out "$OUT" --device cuda "$@"
ls -la "$OUT" "$OUT"/*/
