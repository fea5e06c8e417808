#!/usr/bin/env bash
# GPU check of the final code (H200): CUDA graphs equal eager on the shipped zoo, and `specdec decode
# --compare` per proposer (default prompt, 128 tokens, bf16, graphs). Log: benchmarks/logs/gpu_final.log
export PYTHONPATH=. PYTHONUNBUFFERED=1
python3 -m pytest -q -p no:cacheprovider tests/test_cuda_graphs.py 2>&1 | tail -2
for m in mtp eagle draft ngram; do
  python3 -m specdec decode --model tiny --method $m --k 4 --max-new-tokens 128 --compare --json 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print(d['method'], 'graphs', d['cuda_graphs'], 'tau %.2f' % d['tau'], 'tok/s %.0f' % d['tokens_per_s'], 'plain %.0f' % d['plain_tokens_per_s'], 'speedup %.2f' % d['speedup'], 'same', d['same_as_plain'])"
done
