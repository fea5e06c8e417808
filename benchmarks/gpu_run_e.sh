#!/usr/bin/env bash
# GPU session E (H200): real SGLang 0.5.16 (offline pack in .sglang-pack) serving the shipped tiny zoo.
set -uo pipefail
OUT=${1:?outdir}
PACK=.sglang-pack . .sglang-pack/setup.sh
export PYTHONUNBUFFERED=1
timeout 560 python3 benchmarks/sglang_zoo_check.py --out "$OUT/sglang_zoo.json" 2>&1 | grep -E "^\{|^\[|Error|error" | tail -30
