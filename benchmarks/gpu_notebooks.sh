#!/usr/bin/env bash
# Every lab's notebooks run on the GPU node as a student runs them (`specdec execute`: a Jupyter kernel in the
# notebook's own folder, the GPU path the notebook picks itself), then graded there as an instructor grades them
# (`specdec grade`). Labs 1 and 2 need no server; Lab 3's notebooks start real SGLang (the pack's) and stop it.
# Run on the device after `PACK=.sglang-pack . .sglang-pack/setup.sh`, with .nbpack/nbsite.tar.xz carried (nbclient,
# ipykernel, jupyter_client and their small needs, which the GPU image lacks: tools/nbpack/build.sh; the pack brings
# IPython and pyzmq).
# usage: bash benchmarks/gpu_notebooks.sh 1 2   (Labs 1 and 2: one device call)   |   bash benchmarks/gpu_notebooks.sh 3
# Under $OUT: the executed copies (nb/), the grades (grade_labN.json), the servers' logs (run/); the log on stdout.
# benchmarks/gpu_notebooks_report.py reads them back into benchmarks/logs/gpu_notebooks.log.
set -u
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: $0 LAB... (1, 2, 3)" >&2; exit 2; }
for lab in "$@"; do case $lab in 1|2|3) ;; *) echo "$0: no lab $lab (1, 2, 3)" >&2; exit 2 ;; esac; done
[ -n "${OUT:-}" ] || { echo "$0: set OUT to the folder for the executed copies and grades" >&2; exit 2; }
[ -e .nbpack/nbsite.tar.xz ] || { echo "$0: no .nbpack/nbsite.tar.xz: build it with tools/nbpack/build.sh" >&2; exit 2; }
mkdir -p /tmp/nbsite "$OUT/nb" && tar -xJf .nbpack/nbsite.tar.xz -C /tmp/nbsite
export PYTHONPATH=/tmp/nbsite:$PWD:${PYTHONPATH:-} MPLBACKEND=Agg SPECDEC_RUN_DIR=$OUT/run
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers, nbclient, ipykernel; print('torch', torch.__version__, 'transformers', transformers.__version__, 'nbclient', nbclient.__version__, 'ipykernel', ipykernel.__version__)"
python3 -c "import sglang; print('sglang', sglang.__version__)" 2>/dev/null || echo "sglang: not importable"

# what a run leaves behind, counted once the servers it stopped have had 30 s to drain and exit (SGLang takes seconds)
left() {
  local n i
  for i in $(seq 30); do n=$(pgrep -fc 'sglang.launch_server|specdec serve|ipykernel_launcher'); [ "$n" = 0 ] && break; sleep 1; done
  echo "   processes left: $n (sglang, specdec serve, kernels)"
}

execute() {  # notebook, limit in seconds
  local nb=$1 limit=$2 t0=$SECONDS
  timeout -k 15 "$limit" python3 -m specdec execute "$nb" --out "$OUT/nb/$(echo "$nb" | tr / _)" --timeout "$limit" 2>&1 \
    | grep -v "^\s*$" | tail -n 3
  echo "== execute $nb: rc=${PIPESTATUS[0]} in $((SECONDS - t0)) s"; left
}

grade() {  # lab number, limit in seconds, notebooks
  local lab=$1 limit=$2 t0=$SECONDS; shift 2
  timeout -k 15 "$limit" python3 -m specdec grade "$@" --json "$OUT/grade_lab$lab.json" --csv "$OUT/grade_lab$lab.csv" 2>&1 \
    | grep -v "^\s*$" | tail -n 3
  echo "== grade lab $lab ($*): rc=${PIPESTATUS[0]} in $((SECONDS - t0)) s"; left
}

for lab in "$@"; do
  case $lab in
    1) for nb in notebooks/01_simulated_loop.ipynb solutions/01_simulated_loop.ipynb labs/01_simulated_loop.ipynb; do
         execute "$nb" 60
       done
       grade 1 90 solutions/01_simulated_loop.ipynb labs/01_simulated_loop.ipynb ;;
    2) execute notebooks/02_static_k_mtp.ipynb 240
       execute solutions/02_static_k_mtp.ipynb 150
       execute labs/02_static_k_mtp.ipynb 120
       grade 2 150 solutions/02_static_k_mtp.ipynb labs/02_static_k_mtp.ipynb ;;
    3) [ "${LAB3_LECTURE:-1}" = 1 ] && execute "${LAB3_LECTURE_NB:-notebooks/03_sglang_live.ipynb}" 480
       [ "${LAB3_SOLUTION:-1}" = 1 ] && execute solutions/03_sglang_live.ipynb 480
       [ "${LAB3_UNTOUCHED:-0}" = 1 ] && execute labs/03_sglang_live.ipynb 250
       grade 3 60 solutions/03_sglang_live.ipynb labs/03_sglang_live.ipynb ;;
  esac
done
pkill -f sglang.launch_server && echo "stopped sglang servers left behind" || true
