#!/usr/bin/env bash
# GPU check of the step-level engine (H100/H200): the CUDA-graph tests (graphs equal eager, also as
# rows join and leave), then `specdec decode --compare` per proposer as in gpu_run_final.sh (default
# prompt, 128 tokens, bf16, graphs). Log: benchmarks/logs/gpu_check_engine.log
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__)"
python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda_graphs.py 2>&1 | tail -3
for m in mtp eagle draft heads ngram; do
  python3 -m specdec decode --model tiny --method $m --k 4 --max-new-tokens 128 --compare --json 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print(d['method'], 'graphs', d['cuda_graphs'], 'tau %.2f' % d['tau'], 'tok/s %.0f' % d['tokens_per_s'], 'plain %.0f' % d['plain_tokens_per_s'], 'speedup %.2f' % d['speedup'], 'same', d['same_as_plain'])"
done
