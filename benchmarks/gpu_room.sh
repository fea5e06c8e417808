#!/usr/bin/env bash
# The instructor's kit on a GPU node with real SGLang: `specdec preflight`, then `specdec room --students 4
# --engine sglang` on the tiny zoo (the four servers start together), one /generate per student with its
# key (and one without, which must be refused), GPU memory per server, `specdec room --stop`, and a check
# that no SGLang process is left. About 3 minutes (a server start takes 50 to 120 s; they overlap).
# usage (GPU node, offline pack):  PACK=.sglang-pack . .sglang-pack/setup.sh; bash benchmarks/gpu_room.sh
# writes $OUT/gpu_room.log (and the servers' logs under $OUT/run); commit it as benchmarks/logs/gpu_room.log
set -u
OUT=${OUT:-/tmp/gpu_room}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1 SPECDEC_RUN_DIR=$OUT/run
ROOM_CSV=$OUT/room.csv STATE=$OUT/room.json
T0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - T0 )) s] $*"; }

main() {
  trap 'python3 -m specdec room --stop --state "$STATE" > /dev/null 2>&1' EXIT  # whatever happens: no server left
  stamp "node"
  nvidia-smi --query-gpu=index,name,memory.total,memory.used,memory.free,driver_version --format=csv
  python3 -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__)"
  missing=$(python3 -c "
import importlib.util as u
print(' '.join(m for m in ('requests', 'tqdm', 'fastapi', 'uvicorn', 'sglang') if u.find_spec(m) is None))")
  if [ -n "$missing" ]; then echo "missing on this node: $missing (the course's launcher needs them): stop"; return 1; fi

  stamp "specdec preflight --models tiny --students 4 --mode gpu"
  timeout 120 python3 -m specdec preflight --models tiny --students 4 --mode gpu --import-timeout 100
  echo "preflight exit status $?"

  stamp "specdec room --students 4 --engine sglang --model tiny"
  python3 -m specdec room --students 4 --engine sglang --model tiny --out "$ROOM_CSV" --state "$STATE" \
      --timeout 180 --grace 15 > "$OUT/room.out" 2>&1 &
  ROOM=$!
  while [ ! -s "$ROOM_CSV" ] && kill -0 $ROOM 2>/dev/null; do sleep 1; done
  cat "$OUT/room.out"
  if [ ! -s "$ROOM_CSV" ]; then
    wait $ROOM; echo "room exit status $? before all servers were ready"
    tail -n 30 "$OUT"/run/room-*/student-*.log
    return 1
  fi
  stamp "room ready"

  stamp "one /generate per student: with its key, without it, with a neighbour's"
  python3 - "$ROOM_CSV" <<'EOF'
import csv, json, sys, urllib.error, urllib.request

def post(url, body, key=None):
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()[:100]

def get(url, key):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())

rows = list(csv.DictReader(open(sys.argv[1])))
body = {"text": "def read_config(path):\n", "sampling_params": {"temperature": 0, "max_new_tokens": 32}}
ok = True
for i, r in enumerate(rows):
    status, out = post(r["url"] + "/generate", body, r["key"])
    none, _ = post(r["url"] + "/generate", body)
    other, _ = post(r["url"] + "/generate", body, rows[(i + 1) % len(rows)]["key"])
    good = status == 200 and none == 401 and other == 401
    ok &= good
    m = out["meta_info"] if status == 200 else {}
    print(f"{r['name']} {r['url']}: with key {status} ({m.get('completion_tokens')} tokens, e2e {m.get('e2e_latency', 0):.3f} s), "
          f"without {none}, neighbour's key {other} -> {'ok' if good else 'WRONG'}")
    info = get(r["url"] + "/server_info", r["key"])
    state = (info.get("internal_states") or [{}])[0]
    print(f"  server_info: version {info.get('version')}, mem_fraction_static {info.get('mem_fraction_static')}, "
          f"max_total_tokens {info.get('max_total_tokens')}, max_total_num_tokens {info.get('max_total_num_tokens')}, "
          f"memory_usage {state.get('memory_usage')}")
print("all students served and guarded" if ok else "SOME STUDENT CHECK FAILED")
EOF

  stamp "GPU memory per process while the room runs"
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
  nvidia-smi --query-gpu=memory.used,memory.free --format=csv
  grep -h "KV Cache is allocated\|max_total_num_tokens=" "$OUT"/run/room-*/student-*.log | cut -c1-220

  stamp "specdec room --stop"
  python3 -m specdec room --stop --state "$STATE"
  wait $ROOM; echo "room exit status $?"
  tail -n 3 "$OUT/room.out"
  stamp "stopped"
  sleep 2
  left=$(python3 "$(dirname "$0")/sglang_left.py")
  if [ -z "$left" ]; then echo "no SGLang process left"; else echo "LEFT RUNNING:"; echo "$left"; fi
  [ -e "$STATE" ] && echo "STATE FILE LEFT: $STATE" || echo "state file removed"
  nvidia-smi --query-gpu=memory.used,memory.free --format=csv
}

main 2>&1 | tee "$OUT/gpu_room.log"
