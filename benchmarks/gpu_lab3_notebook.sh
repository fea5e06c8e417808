#!/usr/bin/env bash
# Lab 3's lecture notebook executed end to end against real SGLang on the GPU node, then the zoo's chat endpoint
# recorded. Run after `PACK=.sglang-pack . .sglang-pack/setup.sh`, with .nbpack/nbsite.tar.xz carried: nbclient,
# ipykernel and their small pure-Python needs, which the GPU image lacks (tools/nbpack/build.sh builds it).
# The executed copy comes back under $OUT; docs/lab3_gpu_run.html is rendered from it on the CPU machine.
set -u
mkdir -p /tmp/nbsite && tar -xJf .nbpack/nbsite.tar.xz -C /tmp/nbsite
export PYTHONPATH=/tmp/nbsite:$PWD:$PYTHONPATH MPLBACKEND=Agg SPECDEC_RUN_DIR=$OUT/run
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
t0=$(date +%s)
python3 -m specdec execute notebooks/03_sglang_live.ipynb --out "$OUT/03_sglang_live.gpu.ipynb" --timeout 900
echo "notebook rc=$? in $(( $(date +%s) - t0 )) s"
python3 benchmarks/gpu_lab3.py chat --out "$OUT/chat"
echo "left behind: $(pgrep -fc sglang.launch_server) sglang servers"
