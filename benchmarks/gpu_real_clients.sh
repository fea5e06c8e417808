#!/usr/bin/env bash
# Real clients against `specdec serve` on a GPU node: SGLang's own benchmark client (0.5.16, from the
# offline pack; backends sglang, sglang-oai, sglang-oai-chat) and the `openai` package, unchanged, against
# the tiny zoo served with NEXTN (the target's MTP layer) on the GPU; then SIGTERM to the server, which
# must drain and exit 0 with its `stopped` line, leaving no process.
# usage (GPU node, offline pack):  PACK=.sglang-pack . .sglang-pack/setup.sh; bash benchmarks/gpu_real_clients.sh
# writes $OUT/gpu_real_clients.log; commit it as benchmarks/logs/gpu_real_clients.log
set -u
OUT=${OUT:-/tmp/gpu_real_clients}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_real_clients.log") 2>&1
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
PORT=${PORT:-30123}
T0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - T0 )) s] $*"; }

stamp "node"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
python3 -c "import sys, torch, transformers, sglang; print('python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'sglang', sglang.__version__)"
TOK=$(python3 -c "from specdec.zoo import resolve; print(resolve('tiny')['target'])")

stamp "specdec serve --model tiny --speculative-algorithm mtp --k 3 --port $PORT (background, SIGINT ignored)"
( trap '' INT; exec python3 -m specdec serve --model tiny --speculative-algorithm mtp --k 3 --port "$PORT" \
    --max-running-requests 16 > "$OUT/serve.log" 2>&1 ) &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null' EXIT
for _ in $(seq 1 240); do
  curl -sf "http://127.0.0.1:$PORT/health_generate" > /dev/null && break
  kill -0 $SERVER 2>/dev/null || { echo "specdec serve exited:"; cat "$OUT/serve.log"; exit 1; }
  sleep 0.5
done
head -n 5 "$OUT/serve.log"

for backend in sglang sglang-oai sglang-oai-chat; do
  stamp "python3 -m sglang.benchmark.serving --backend $backend (64 prompts, random-ids 64 in / 128 out, concurrency 8)"
  timeout 240 python3 -m sglang.benchmark.serving --backend "$backend" --host 127.0.0.1 --port "$PORT" \
      --tokenizer "$TOK" --dataset-name random-ids --random-input-len 64 --random-output-len 128 \
      --random-range-ratio 1.0 --num-prompts 64 --max-concurrency 8 --seed 1 2>&1 | grep -v "^\s*$" | tail -n 40
  echo "exit status ${PIPESTATUS[0]}"
done

stamp "the openai package: completions, a list prompt, chat, streaming with usage"
timeout 120 python3 - "$PORT" <<'EOF'
import sys
import openai
client = openai.OpenAI(base_url=f"http://127.0.0.1:{sys.argv[1]}/v1", api_key="none")
model = client.models.list().data[0].id
c = client.completions.create(model=model, prompt="def add(a, b):", max_tokens=32, temperature=0)
print("completion:", c.usage, repr(c.choices[0].text[:60]))
c = client.completions.create(model=model, prompt=["import os", "class A:"], max_tokens=8, temperature=0)
print("list prompt:", len(c.choices), "choices", [ch.index for ch in c.choices], c.usage)
try:
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                                       temperature=0, max_tokens=16)
    print("chat:", r.usage, repr(r.choices[0].message.content[:60]))
except openai.BadRequestError as exc:
    print("chat: 400", exc.body if hasattr(exc, "body") else exc)
s = client.completions.create(model=model, prompt="for i in range(", max_tokens=32, temperature=0, stream=True,
                              stream_options={"include_usage": True})
chunks = list(s)
print("stream:", len(chunks), "chunks, last usage", chunks[-1].usage)
EOF
echo "exit status $?"

stamp "SIGTERM to specdec serve: drain, exit status, stopped line, nothing left"
kill -TERM $SERVER; wait $SERVER; echo "specdec serve exit status $?"
tail -n 3 "$OUT/serve.log"
sleep 1
pgrep -af "specdec serve" || echo "no specdec serve process left"
trap - EXIT
stamp "done"
