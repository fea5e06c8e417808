#!/usr/bin/env bash
# SGLang's own benchmark client, `python -m sglang.benchmark.serving` from the sglang 0.5.16 wheel, unchanged,
# against `specdec serve --model tiny` on this machine (real clients must work unchanged).
#
#   benchmarks/sglang_bench_client.sh            # the benchmark: backends sglang, sglang-oai, sglang-oai-chat
#   benchmarks/sglang_bench_client.sh record     # 2 prompts per backend and stream mode through
#                                                # benchmarks/record_proxy.py -> tests/fixtures/sglang/bench_serving_0516_requests.json
#
# SGLANG_PY: a python that imports sglang 0.5.16 (on the GPU node: python3 after sourcing the offline pack's setup.sh).
# On the CPU machine it was a throwaway venv whose .pth file puts the project's venv (CPU torch 2.13, numpy,
# requests, tqdm) behind its own packages:
#   python3 -m venv /tmp/sglvenv && echo /work/main/.venv/lib/python3.11/site-packages \
#     > /tmp/sglvenv/lib/python3.11/site-packages/zz_mainvenv.pth
#   pip download sglang==0.5.16 --no-deps -d /tmp/sgl && /tmp/sglvenv/bin/pip install --no-deps /tmp/sgl/sglang-0.5.16-*.whl
#   /tmp/sglvenv/bin/pip install aiohttp psutil pyzmq orjson pybase64 datasets msgspec partial_json_parser xgrammar \
#     sentencepiece einops compressed_tensors gguf transformers==5.12.1 tokenizers==0.22.2 torchvision==0.29.1
#   /tmp/sglvenv/bin/pip install --no-deps triton
# The client imports sglang.srt (server code) at the top, hence the server-side packages. torchvision is needed
# by that import chain and PyPI has only CUDA builds of it, so it brings its own torch (2.14.1, CUDA build; it runs
# the client's few torch imports on the CPU). transformers 5.12.1 is SGLang's pin (newer ones fail at import:
# "'qwen3_asr' is already used by a Transformers config").
set -u
cd "$(dirname "$0")/.."
SGLANG_PY=${SGLANG_PY:-/tmp/sglvenv/bin/python}
SPECDEC_PY=${SPECDEC_PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
TOK=$PWD/specdec/zoo/tiny/target  # the zoo's tokenizer: the client samples token ids from it (random-ids)
PORT=${PORT:-30991}
PROXY_PORT=$((PORT + 1))
NUM=${NUM_PROMPTS:-32}
CONC=${CONCURRENCY:-4}
MODE=${1:-bench}
RUN=$(mktemp -d /tmp/sglang-bench-client.XXXXXX)
SERVER=""
PROXY=""

stop() {  # the process groups this script started, one at a time
  [ -n "$PROXY" ] && kill -TERM -- "-$PROXY" 2>/dev/null
  [ -n "$SERVER" ] && kill -TERM -- "-$SERVER" 2>/dev/null
  [ -n "$SERVER" ] && wait "$SERVER" 2>/dev/null
  PROXY="" SERVER=""
}
trap 'stop; exit 130' INT TERM HUP
trap stop EXIT

serve() {  # $1: speculative algorithm (none or mtp)
  setsid "$SPECDEC_PY" -m specdec serve --model tiny --speculative-algorithm "$1" --k 3 --port "$PORT" \
    --served-model-name tiny > "$RUN/serve_$1.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
    sleep 1
  done
  head -3 "$RUN/serve_$1.log"
}

client() {  # $1: backend, $2: base URL, rest: more flags
  local backend=$1 url=$2
  shift 2
  "$SGLANG_PY" -W ignore -m sglang.benchmark.serving --backend "$backend" --base-url "$url" \
    --dataset-name random-ids --tokenizer "$TOK" --model "$TOK" --served-model-name tiny \
    --random-input-len 128 --random-output-len 64 --flush-cache --seed 1 --disable-tqdm \
    --output-file "$RUN/results.jsonl" "$@" 2>&1 |
    grep -v -i "warn\|^  warnings\.\|^benchmark_args=\|^Namespace("
  echo "client rc=${PIPESTATUS[0]}"
}

echo "sglang: $("$SGLANG_PY" -c 'import sglang; print(sglang.__version__)' 2>/dev/null), torch in the client's venv:" \
     "$("$SGLANG_PY" -c 'import torch; print(torch.__version__)' 2>/dev/null); specdec at $(git describe --always --dirty)"
echo "machine: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"

if [ "$MODE" = record ]; then
  serve mtp
  for backend in sglang sglang-oai sglang-oai-chat; do
    for stream in stream no_stream; do
      rm -f "$RUN/$backend.$stream.jsonl"
      setsid "$SGLANG_PY" benchmarks/record_proxy.py "http://127.0.0.1:$PORT" "$PROXY_PORT" "$RUN/$backend.$stream.jsonl" &
      PROXY=$!
      sleep 3
      flags=(--num-prompts 2 --random-input-len 16 --random-output-len 8 --max-concurrency 1)
      [ "$stream" = no_stream ] && flags+=(--disable-stream)
      client "$backend" "http://127.0.0.1:$PROXY_PORT" "${flags[@]}" | grep -E "Successful requests|client rc"
      kill -TERM -- "-$PROXY"
      wait "$PROXY" 2>/dev/null
      PROXY=""
    done
  done
  "$SPECDEC_PY" benchmarks/bench_serving_fixture.py "$RUN"
  exit 0
fi

for algo in mtp none; do
  echo
  echo "######## specdec serve --model tiny --speculative-algorithm $algo --k 3"
  serve "$algo"
  for backend in sglang sglang-oai sglang-oai-chat; do
    for stream in stream no_stream; do
      [ "$algo" = none ] && [ "$stream" = no_stream ] && continue
      echo
      echo "==== backend $backend, $stream, $NUM prompts at concurrency $CONC"
      flags=(--num-prompts "$NUM" --max-concurrency "$CONC")
      [ "$stream" = no_stream ] && flags+=(--disable-stream)
      client "$backend" "http://127.0.0.1:$PORT" "${flags[@]}" | awk '/Serving Benchmark Result/{on=1} on || /rror/'
    done
  done
  echo "server warnings: $(grep -c -i warn "$RUN/serve_$algo.log")"
  stop
done
