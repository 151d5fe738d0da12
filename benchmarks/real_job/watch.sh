#!/bin/bash
# Sidecar of real_job.sh (started by the recipe's device_run.sh just before verl, killed when it
# ends): waits until verl's WorkerDict is ALIVE in Ray, then watches the job with verl-top four
# ways at once for WATCH_S seconds -- the TUI under tmux (recording the session), the same app
# headless taking SVGs of every pane, `snapshot` and `diagnose --json` -- while sampling the
# ground truth: process titles of the GPU processes, ps, Ray actors and tasks.
set -u
# verl-top and its wheels, then the payload's Ray-dashboard extras (cryptography for asyncssh);
# not the verl site packages (their transformers & co are for verl only)
export PYTHONPATH=$SRC:$VT_SITE:/tmp/verl-dash
W=$R/watch; mkdir -p "$W"
DASH=http://127.0.0.1:8265
el() { echo "[watch $(date +%T)] $*" >> "$W/watch.log"; }
ray_get() {  # ray_get PATH FILE: one state-API answer to FILE
  python3 -c "import sys,urllib.request; open(sys.argv[2],'wb').write(urllib.request.urlopen(sys.argv[1],timeout=5).read())" "$DASH$1" "$2" 2>>"$W/watch.log"
}
alive() {
  python3 - "$DASH" <<'PY'
import json, sys, urllib.request
try:
    d = json.load(urllib.request.urlopen(sys.argv[1] + "/api/v0/actors?limit=100", timeout=2))
    rows = d["data"]["result"]["result"]
except Exception:
    sys.exit(1)
sys.exit(0 if any("WorkerDict" in r.get("class_name", "") and r.get("state") == "ALIVE" for r in rows) else 1)
PY
}
for _ in $(seq 1 120); do alive && break; sleep 2; done
el "WorkerDict alive"
ARGS="--ray $DASH --verl-log $VERL_LOG --interval 1"
# one tick of the agent with the job's GPU process on the GPU, through each NVML binding
for b in pynvml ctypes; do
  (cd "$SRC" && timeout 60 python3 -m verl_top.agent --once --ignore-stdin --nvml $b \
     --procs-every 1 --host vm > "$W/agent_once_$b.ndjson" 2> "$W/agent_once_$b.err")
done

# ground truth samplers: GPU process titles every second, ps every 5 s
( while :; do
    for pid in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null); do
      echo "$(date +%s.%N | cut -c1-14) $pid $(tr '\0' ' ' < /proc/$pid/cmdline 2>/dev/null)"
    done; sleep 1; done ) > "$W/titles.txt" 2>/dev/null &
TITLES=$!
( while :; do echo "== $(date +%s)"; ps -eo pid,ppid,pcpu,rss,etimes,cputimes,args --sort=-pcpu | head -30 | cut -c1-220; sleep 5; done ) > "$W/ps.txt" 2>&1 &
PS=$!

# 1. the TUI under tmux, recording the session (Textual draws on stderr: not redirected)
if command -v tmux > /dev/null; then
  tmux new-session -d -s vt -x 160 -y 48 \
    "cd $SRC && PYTHONPATH=$PYTHONPATH python3 -m verl_top $ARGS --record $W/session.ndjson.gz"
  el "tmux TUI started"
else
  el "no tmux on this machine: TUI only headless (live_shots.py)"
fi
# 2. the same app headless, pictures of each pane at the end
# (profiled with a CPU clock: client_parts.py splits its CPU into sampling, logs, Ray, diagnosis,
# rendering; the TUI under tmux is not profiled, its total is the true cost)
python3 "$SRC/benchmarks/real_job/live_shots.py" --watch "$WATCH_S" --out "$W/shots" \
  --profile "$W/shots.prof" -- $ARGS > "$W/shots.log" 2>&1 &
SHOTS=$!
# 3. snapshot and diagnose over the same window
# (run from $SRC: `python3 -m` puts the working directory first on sys.path, and the checkout's
# root on the GPU machine holds another copy of verl_top)
cd "$SRC"
python3 -m verl_top snapshot $ARGS --duration "$WATCH_S" -o "$W/snapshot" > "$W/snapshot.log" 2>&1 &
SNAP=$!
python3 "$SRC/benchmarks/real_job/profiled.py" "$W/diagnose.prof" -- diagnose $ARGS \
  --duration "$WATCH_S" --json > "$W/diagnose.json" 2> "$W/diagnose.err" &
DIAG=$!

# the TUI's own cost, from /proc: CPU seconds and RSS every 2 s; tmux pane text every 10 s
VT=""
T=0
while [ $T -lt "$WATCH_S" ]; do
  if [ -z "$VT" ] && command -v tmux > /dev/null; then
    P=$(tmux list-panes -t vt -F '#{pane_pid}' 2>/dev/null | head -1)
    VT=$( (pgrep -P "$P" python3 || echo "$P") 2>/dev/null | head -1)
    el "TUI pid $VT"
  fi
  [ -n "$VT" ] && [ -r /proc/$VT/stat ] && \
    echo "$T $(awk '{print $14+$15}' /proc/$VT/stat) $(awk '{print $2}' /proc/$VT/statm)" >> "$W/tui_cpu_ticks.txt"
  # the client's cost per part: the headless collectors (sampling, log following, Ray polling,
  # store) against the TUI (the same plus rendering); clock ticks (100 Hz) and RSS pages
  for pair in "shots:$SHOTS" "snapshot:$SNAP" "diagnose:$DIAG" "tui:$VT"; do
    pid=${pair#*:}
    [ -n "$pid" ] && [ -r /proc/$pid/stat ] && \
      echo "$T ${pair%%:*} $(awk '{print $14+$15}' /proc/$pid/stat) $(awk '{print $2}' /proc/$pid/statm)"
  done >> "$W/client_cpu_ticks.txt"
  if [ $((T % 10)) = 0 ] && command -v tmux > /dev/null; then
    tmux capture-pane -p -t vt > "$W/tui_$(printf %03d $T).txt" 2>/dev/null
  fi
  [ $T = 30 ] && { ray_get "/api/v0/actors?limit=1000" "$W/ray_actors.json"; ray_get "/api/v0/tasks?limit=1000&detail=1" "$W/ray_tasks.json"; }
  sleep 2; T=$((T + 2))
done
for k in 2 3 4 5; do
  command -v tmux > /dev/null && { tmux send-keys -t vt "$k"; sleep 1.5; tmux capture-pane -p -t vt > "$W/tui_pane$k.txt"; }
done
command -v tmux > /dev/null && { tmux send-keys -t vt "1"; sleep 1; tmux send-keys -t vt q; }
el "waiting for snapshot, diagnose, shots"
wait $SNAP $DIAG $SHOTS
el "done"
sleep 2
kill $TITLES $PS 2>/dev/null
