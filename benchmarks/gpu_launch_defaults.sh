#!/usr/bin/env bash
# The DEFAULT `specdec launch ... --backend sglang` command (no memory flags, as a student types it)
# starts on the first try on one GPU for every algorithm, and a script that started it in the background
# (SIGINT ignored, as `&` does here) stops it with SIGTERM, leaving no process and giving back the GPU memory.
#
# Cases: the tiny zoo with none, NEXTN, EAGLE, STANDALONE, NGRAM; a Llama-3.1-8B-shaped model (config only,
# --load-format dummy; benchmarks/gpu_lab3.py's shapes) with none, EAGLE (a one-layer head) and NGRAM.
# Each case, one after another: the launcher in the background, its serving line, one /generate, SIGTERM to
# the launcher's pid, then checks that its exit status is 0 with a "stopped" line, that no process of the
# server's session (nor any SGLang process) is left, and that nvidia-smi's used memory is back; one line per case.
#
# usage (GPU node, offline pack):
#   PACK=.sglang-pack . .sglang-pack/setup.sh; bash benchmarks/gpu_launch_defaults.sh [CASE|GROUP ...]
#   bash benchmarks/gpu_launch_defaults.sh --dry-run [CASE|GROUP ...]   # any machine: the commands, nothing started
#   bash benchmarks/gpu_launch_defaults.sh --list
# groups: zoo, 8b, all (the default). A server start takes 45 to 70 s (120 s the first time, compiling kernels):
# `zoo` and `8b` each fit one 10-minute device call. Environment: OUT (default /tmp/gpu_launch_defaults),
# CASE_LIMIT (seconds a case may take to start, default 240), BUDGET (seconds for the whole run, default 560:
# a case that cannot fit is skipped and said so), PYTHON (default python3), LAUNCH_BACKEND (default sglang;
# specdec rehearses the zoo cases on a CPU through specdec serve, as tests/test_launch_gpu_script.py does).
# Writes $OUT/gpu_launch_defaults.log, each case's launcher output ($OUT/CASE.out) and server log ($OUT/run).
set -u
ZOO_CASES="zoo-none zoo-NEXTN zoo-EAGLE zoo-STANDALONE zoo-NGRAM"
SHAPE_CASES="8b-none 8b-EAGLE 8b-NGRAM"
OUT=${OUT:-/tmp/gpu_launch_defaults}
CASE_LIMIT=${CASE_LIMIT:-240}
BUDGET=${BUDGET:-560}
MIN_CASE=90  # seconds: less than this left, a case is skipped rather than cut short
PY=${PYTHON:-python3}
BACKEND=${LAUNCH_BACKEND:-sglang}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 SPECDEC_RUN_DIR=$OUT/run
SHAPES=$OUT/shapes
T0=$(date +%s)
LAUNCHER=""
SERVING='serving [A-Za-z]+ at http://[0-9.]+:[0-9]+ \(pid [0-9]+'  # the launcher's line once its server can generate

usage() { sed -n '12,22p' "$0" | sed 's/^# \{0,1\}//'; }

# ----- the arguments: cases and groups, in order, each once
DRY=0
CASES=()
add() { case " ${CASES[*]-} " in *" $1 "*) ;; *) CASES+=("$1") ;; esac; }
for a in "$@"; do
  case $a in
    --dry-run) DRY=1 ;;
    --list) for c in $ZOO_CASES $SHAPE_CASES; do echo "$c"; done; exit 0 ;;
    -h|--help) usage; exit 0 ;;
    all) for c in $ZOO_CASES $SHAPE_CASES; do add "$c"; done ;;
    zoo) for c in $ZOO_CASES; do add "$c"; done ;;
    8b) for c in $SHAPE_CASES; do add "$c"; done ;;
    zoo-*|8b-*)
      case " $ZOO_CASES $SHAPE_CASES " in
        *" $a "*) add "$a" ;;
        *) echo "gpu_launch_defaults: unknown case $a; cases: $ZOO_CASES $SHAPE_CASES; groups: zoo 8b all" >&2; exit 2 ;;
      esac ;;
    *) echo "gpu_launch_defaults: unknown case $a; cases: $ZOO_CASES $SHAPE_CASES; groups: zoo 8b all" >&2; exit 2 ;;
  esac
done
[ ${#CASES[@]} -eq 0 ] && for c in $ZOO_CASES $SHAPE_CASES; do add "$c"; done

case_args() {  # the command line a student would type: no memory flags
  local chain="--num-steps 3 --topk 1 --num-draft-tokens 4"
  case $1 in
    zoo-none) echo "--model tiny" ;;
    zoo-NEXTN|zoo-EAGLE|zoo-STANDALONE) echo "--model tiny --speculative-algorithm ${1#zoo-} $chain" ;;
    zoo-NGRAM) echo "--model tiny --speculative-algorithm NGRAM" ;;
    8b-none) echo "--model $SHAPES/8b --load-format dummy" ;;
    8b-EAGLE) echo "--model $SHAPES/8b --speculative-algorithm EAGLE --draft $SHAPES/8b-eagle $chain --load-format dummy" ;;
    8b-NGRAM) echo "--model $SHAPES/8b --speculative-algorithm NGRAM --load-format dummy" ;;
  esac
}

make_shapes() {  # config-only model directories (random weights with --load-format dummy), gpu_lab3.py's shapes
  "$PY" - "$ROOT/benchmarks" "$SHAPES" <<'EOF'
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from gpu_lab3 import model_dir
for shape in ("8b", "8b-eagle"):
    model_dir(shape, Path(sys.argv[2]))
EOF
}

rendered_flags() {  # the memory (and attention) flags of the rendered SGLang command
  # shellcheck disable=SC2046
  "$PY" -m specdec launch $(case_args "$1") --backend "$BACKEND" --dry-run | tail -n 1 \
    | grep -oE -- '--(max-total-tokens|mem-fraction-static|context-length|attention-backend) [^ ]+' | tr '\n' ' '
}

gpu_used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | awk '{s += $1} END {print s + 0}'; }

elapsed() { echo $(( $(date +%s) - T0 )); }

left_behind() {  # processes of the server's session, and any SGLang process: "pid argv" lines
  "$PY" - "$1" <<'EOF'
import os, sys
sid = int(sys.argv[1]) if sys.argv[1].isdigit() else -1
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        stat = open(f"/proc/{pid}/stat").read()
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        continue
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        continue
    if int(fields[3]) == sid or b"sglang.launch_server" in argv or argv[0].startswith(b"sglang::"):
        print(pid, b" ".join(argv)[:120].decode(errors="replace"))
EOF
}

probe() {  # one greedy /generate, and the KV pool SGLang settled on
  "$PY" - "$1" <<'EOF'
import json, sys, urllib.request
url = sys.argv[1]
body = json.dumps({"text": "def read_config(path):\n", "sampling_params": {"temperature": 0, "max_new_tokens": 16}})
try:
    req = urllib.request.Request(url + "/generate", data=body.encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        out = json.loads(r.read())
    gen = f"/generate 200 ({out['meta_info']['completion_tokens']} tokens)"
except Exception as exc:  # the line says what failed; the case then counts as failed
    gen = f"/generate FAILED ({type(exc).__name__}: {str(exc)[:80]})"
try:
    with urllib.request.urlopen(url + "/server_info", timeout=30) as r:
        info = json.loads(r.read())
    pool = f"SGLang's pool {info.get('max_total_num_tokens')} tokens, mem_fraction_static {info.get('mem_fraction_static')}"
except Exception:
    pool = "no /server_info"
print(f"{gen}; {pool}")
EOF
}

stop_launcher() {  # SIGTERM to the launcher, then up to 90 s for it to stop its server and exit; its status
  local pid=$1 waited=0
  kill -TERM "$pid" 2>/dev/null
  # polled every 0.2 s (450 looks: 90 s): a specdec serve stops in about a second, the rehearsal need not wait more
  while kill -0 "$pid" 2>/dev/null && [ $waited -lt 450 ]; do sleep 0.2; waited=$((waited + 1)); done
  if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null; fi
  wait "$pid"
}

cleanup() {  # whatever happens: no launcher, no server left
  if [ -n "$LAUNCHER" ] && kill -0 "$LAUNCHER" 2>/dev/null; then stop_launcher "$LAUNCHER" > /dev/null; fi
  "$PY" -c "from specdec.serving.ops.lifecycle import reap_stale; reap_stale()" 2>/dev/null
}

run_case() {
  local name=$1 left limit flags before out t0 pid="" url="" started=no secs="-" gen="" rc="-" rest="" back="" ok=1
  left=$(( BUDGET - $(elapsed) ))
  if [ $left -lt $MIN_CASE ]; then
    printf '%-15s skipped: %d s of the %d s budget left (run it in another call)\n' "$name" "$left" "$BUDGET" >> "$OUT/summary"
    return 1
  fi
  limit=$(( left - 30 < CASE_LIMIT ? left - 30 : CASE_LIMIT ))
  flags=$(rendered_flags "$name")
  before=$(gpu_used)
  out=$OUT/$name.out
  echo "== [$(elapsed) s] $name: specdec launch $(case_args "$name") --backend $BACKEND   (start limit ${limit} s)"
  t0=$(date +%s)
  # in the background of this script: SIGINT ignored, as a student's script starts it
  # shellcheck disable=SC2046
  : > "$out"
  "$PY" -m specdec launch $(case_args "$name") --backend "$BACKEND" --timeout "$limit" > "$out" 2>&1 &
  LAUNCHER=$!
  while ! grep -qE "$SERVING" "$out" && kill -0 $LAUNCHER 2>/dev/null && [ $(( $(date +%s) - t0 )) -le $((limit + 15)) ]; do
    sleep 0.2
  done
  if grep -qE "$SERVING" "$out"; then
    started=yes
    secs=$(( $(date +%s) - t0 ))
    url=$(grep -oE "$SERVING" "$out" | head -n 1 | grep -oE 'http://[0-9.]+:[0-9]+')
    pid=$(grep -oE "$SERVING" "$out" | head -n 1 | grep -oE '[0-9]+$')
    gen=$(probe "$url")
    echo "   $gen"
    case $gen in "/generate 200"*) ;; *) ok=0 ;; esac
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | sed 's/^/   GPU process: /'
  else
    ok=0
    echo "   not serving after $(( $(date +%s) - t0 )) s; the launcher's last lines:"
    tail -n 25 "$out" | sed 's/^/   | /'
  fi
  if kill -0 $LAUNCHER 2>/dev/null; then
    stop_launcher $LAUNCHER
    rc=$?
    [ "$rc" = 0 ] && grep -q '^specdec launch: stopped' "$out" || ok=0
  else
    wait $LAUNCHER
    rc="exited $? by itself"
    ok=0
  fi
  LAUNCHER=""
  sleep 2
  rest=$(left_behind "${pid:-none}")
  [ -n "$rest" ] && { ok=0; echo "   LEFT RUNNING:"; echo "$rest" | sed 's/^/   | /'; }
  local used waited=0
  used=$(gpu_used)
  while [ "$used" -gt $((before + 512)) ] && [ $waited -lt 30 ]; do sleep 1; waited=$((waited + 1)); used=$(gpu_used); done
  if [ "$used" -le $((before + 512)) ]; then back="GPU memory back ($used MiB used, $before before)"; else
    back="GPU MEMORY NOT BACK ($used MiB used, $before before)"; ok=0; fi
  tail -n 2 "$out" | sed 's/^/   | /'
  printf '%-15s %s: started %s in %s s; %s; SIGTERM -> exit %s; %s; %s; flags: %s\n' "$name" \
    "$([ $ok = 1 ] && echo ok || echo FAILED)" "$started" "$secs" "${gen:-no /generate}" "$rc" \
    "$([ -z "$rest" ] && echo "no process left" || echo "PROCESSES LEFT")" "$back" "$flags" >> "$OUT/summary"
  return $((1 - ok))
}

main() {
  mkdir -p "$OUT/run"
  : > "$OUT/summary"
  local need_shapes=0 failed=0 c
  for c in "${CASES[@]}"; do case $c in 8b-*) need_shapes=1 ;; esac; done
  [ $need_shapes = 1 ] && { make_shapes || { echo "could not write the 8B-shaped model directories"; return 1; }; }
  if [ $DRY = 1 ]; then
    for c in "${CASES[@]}"; do
      echo "== $c: specdec launch $(case_args "$c") --backend $BACKEND"
      # shellcheck disable=SC2046
      "$PY" -m specdec launch $(case_args "$c") --backend "$BACKEND" --dry-run || failed=$((failed + 1))
    done
    return $failed
  fi
  trap cleanup EXIT
  trap 'exit 130' INT TERM
  echo "== [$(elapsed) s] node, cases: ${CASES[*]}"
  nvidia-smi --query-gpu=index,name,memory.total,memory.used,memory.free,driver_version --format=csv
  if [ "$BACKEND" = sglang ]; then
    "$PY" -c "import sys, torch, importlib.metadata as m; print('python', sys.version.split()[0], 'torch', torch.__version__, 'sglang', m.version('sglang'))" \
      2> /dev/null || echo "(no SGLang here)"
  else  # the rehearsal: no SGLang to name, and torch's import would cost the CPU 2 s for a version
    echo "(a rehearsal through specdec serve: no SGLang)"
  fi
  for c in "${CASES[@]}"; do run_case "$c" || failed=$((failed + 1)); done
  echo "== [$(elapsed) s] summary (one line per case)"
  cat "$OUT/summary"
  echo "$(( ${#CASES[@]} - failed ))/${#CASES[@]} cases started with the default command and stopped cleanly"
  return $failed
}

mkdir -p "$OUT"
main 2>&1 | tee "$OUT/gpu_launch_defaults.log"
exit "${PIPESTATUS[0]}"
