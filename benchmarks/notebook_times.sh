#!/usr/bin/env bash
# Seconds per notebook on this machine, each run as a student runs it: `specdec execute NOTEBOOK` (Lab 3 starts
# its own `specdec serve` servers), one after another, with the load average before and after each.
# usage: bash benchmarks/notebook_times.sh > benchmarks/logs/cpu_notebook_times.log
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
echo "# notebooks on $(nproc) cores, $(date -u +%F), commit $(git rev-parse --short HEAD): seconds per notebook by \`specdec execute\`"
for nb in notebooks/0{1,2,3}_*.ipynb solutions/0{1,2,3}_*.ipynb labs/0{1,2,3}_*.ipynb; do
  name=$(echo "$nb" | tr / _)
  cp "$nb" "$out/$name"
  echo "== $nb  before: $(cut -d' ' -f1-3 /proc/loadavg)"
  PYTHONPATH=$PWD MPLBACKEND=Agg .venv/bin/python -m specdec execute "$out/$name" 2>&1 | grep -E "code cells run in|Traceback" | sed -E "s|$out/||; s|; executed copy: .*||"
  echo "   after: $(cut -d' ' -f1-3 /proc/loadavg)"
done
rm -rf "$out"
