# Sourced by the device scripts that sweep `specdec serve`: serve_bg NAME PORT FLAGS... starts
# `specdec serve --model tiny --port PORT FLAGS...` in the background as a script's `&` does (SIGINT ignored),
# its log in $OUT/serve-NAME.log, waits for /health_generate (or prints the log and returns 1 if it exited),
# and leaves its pid in SERVE_PID: the caller stops it with SIGTERM.
serve_bg() {
  local name=$1 port=$2; shift 2
  ( trap '' INT; exec python3 -m specdec serve --model tiny --port "$port" "$@" > "$OUT/serve-$name.log" 2>&1 ) &
  SERVE_PID=$!
  for _ in $(seq 1 240); do
    curl -sf "http://127.0.0.1:$port/health_generate" > /dev/null && return 0
    kill -0 $SERVE_PID 2>/dev/null || { echo "specdec serve exited:"; cat "$OUT/serve-$name.log"; return 1; }
    sleep 0.5
  done
  echo "specdec serve not healthy after 120 s"; return 1
}
