#!/usr/bin/env bash
# The instructor's room on a GPU with real SGLang: an instructor's `specdec room --students 2 --algorithm none,NEXTN
# --engine sglang` (started in the background of this script, SIGINT ignored, as a script starts it), student 1
# pastes the line the room prints, and Lab 3's solution and lecture run against the room's servers with
# `specdec execute`; the room's servers must still serve afterwards; SIGTERM to the room's pid must stop it all
# (no SGLang process, no state file, GPU memory back). About 4 minutes.
# usage (GPU node, offline pack):  PACK=.sglang-pack . .sglang-pack/setup.sh; bash benchmarks/gpu_lab3_room.sh
# with .nbpack/nbsite.tar.xz carried (nbclient, ipykernel and their pure-Python needs, which the GPU image lacks:
# tools/nbpack/build.sh builds it).
# writes $OUT/gpu_lab3_room.log, the executed notebooks and the servers' logs; commit the log as
# benchmarks/logs/gpu_lab3_room.log
set -u
OUT=${OUT:-/tmp/gpu_lab3_room}
mkdir -p "$OUT"
if [ -e .nbpack/nbsite.tar.xz ]; then mkdir -p /tmp/nbsite && tar -xJf .nbpack/nbsite.tar.xz -C /tmp/nbsite; fi
export PYTHONPATH=/tmp/nbsite:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 SPECDEC_RUN_DIR=$OUT/run MPLBACKEND=Agg
ROOM_CSV=$OUT/room.csv STATE=$OUT/room.json
T0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - T0 )) s] $*"; }


main() {
  stamp "node"
  nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv
  stamp "specdec room --students 2 --algorithm none,NEXTN --engine sglang --model tiny (in the background)"
  python3 -m specdec room --students 2 --algorithm none,NEXTN --engine sglang --model tiny --out "$ROOM_CSV" \
      --state "$STATE" --timeout 240 --grace 15 > "$OUT/room.out" 2>&1 &
  ROOM=$!
  trap 'kill -TERM $ROOM 2>/dev/null; python3 -m specdec room --stop --state "$STATE" > /dev/null 2>&1' EXIT
  while ! grep -q "student-01: export " "$OUT/room.out" 2>/dev/null && kill -0 $ROOM 2>/dev/null; do sleep 1; done
  cat "$OUT/room.out"
  line=$(grep "student-01: export " "$OUT/room.out" | head -1 | sed 's/^ *student-01: //')
  if [ -z "$line" ]; then wait $ROOM; echo "room exit status $? before it printed the students' lines"; tail -n 30 "$OUT"/run/room-*/student-*.log; return 1; fi
  stamp "student 1 pastes: $line"
  for nb in solutions/03_sglang_live.ipynb notebooks/03_sglang_live.ipynb; do
    name=$(basename "$(dirname "$nb")")_03
    cp "$nb" "$OUT/$name.ipynb"
    stamp "specdec execute $nb (as $name) with student 1's environment"
    ( eval "$line"; timeout 500 python3 -m specdec execute "$OUT/$name.ipynb" ) > "$OUT/$name.out" 2>&1
    echo "exit status $?"
    python3 - "$OUT/$name.executed.ipynb" <<'PY'
import json, sys
nb = json.load(open(sys.argv[1]))
text = "\n".join("".join(o.get("text", "")) for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", []))
keep = ("using the room", "started our own", "total:", "speedup", "trend", "crossover", "stops paying", "accept length",
        "servers still running", "Error", "predicted")
for ln in text.splitlines():
    if any(k in ln for k in keep):
        print("   ", ln[:220])
PY
  done
  stamp "every room server still serves"
  python3 - "$ROOM_CSV" <<'PY'
import csv, json, sys, urllib.request
body = json.dumps({"text": "def read_config(path):\n", "sampling_params": {"temperature": 0, "max_new_tokens": 16}}).encode()
for r in csv.DictReader(open(sys.argv[1])):
    req = urllib.request.Request(r["url"] + "/generate", data=body, headers={"Content-Type": "application/json",
                                                                           "Authorization": f"Bearer {r['key']}"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        m = json.loads(resp.read())["meta_info"]
    print(f"  {r['name']}: {resp.status}, {m['completion_tokens']} tokens, spec_verify_ct {m.get('spec_verify_ct')}")
PY
  stamp "SIGTERM to the room (pid $ROOM)"
  kill -TERM $ROOM
  wait $ROOM; echo "room exit status $?"
  tail -n 3 "$OUT/room.out"
  sleep 2
  left=$(python3 "$(dirname "$0")/sglang_left.py")
  if [ -z "$left" ]; then echo "no SGLang process left"; else echo "LEFT RUNNING:"; echo "$left"; fi
  [ -e "$STATE" ] && echo "STATE FILE LEFT: $STATE" || echo "state file removed"
  nvidia-smi --query-gpu=memory.used,memory.free --format=csv
  stamp "done"
}

main 2>&1 | tee "$OUT/gpu_lab3_room.log"
