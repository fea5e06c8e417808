#!/usr/bin/env bash
# GPU session C (H200): train the workshop-size `small` zoo (not shipped) into /tmp/zoo-small, for session D.
set -uo pipefail
OUT=${1:?outdir}
export PYTHONPATH=. PYTHONUNBUFFERED=1
( time python3 -m specdec zoo build --recipe small --device cuda --out /tmp/zoo-small ) 2>&1 | grep -v "it/s\]$" > "$OUT/train_small.log"
tail -12 "$OUT/train_small.log"
cp /tmp/zoo-small/zoo.json "$OUT/zoo-small.json"
