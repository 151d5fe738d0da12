#!/bin/bash
# A real hang for verl-top to catch (issue 29 item 6): the recipe's real verl 0.5.0 PPO job (GAE,
# so a critic runs update_critic) on the GPU machine; after STOP_AFTER_STEPS steps its
# ray::WorkerDict process is stopped with SIGSTOP inside STOP_METHOD for STOP_S seconds, then
# resumed with SIGCONT. verl-top watches the whole run in one process (`snapshot --record`: the
# recording is the fixture the replay test reads), the TUI runs under tmux with its screen
# captured every 2 s, and the ground truth is sampled (ps: state, CPU, title every second).
# Everything ends up in ONE archive, $OUT/real_hang.tar.gz; the summary at the end replays the
# recording through benchmarks/hang_replay.py (when was the hang flagged, was the process named).
#
#   on the GPU machine, after benchmarks/real_job/prepare.sh staged DEVRUN (src, verl-real, whl):
#   bash DEVRUN/src/benchmarks/real_hang.sh
#
# env: STOP_AFTER_STEPS=3  STOP_METHOD=update_critic  STOP_S=60  WATCH_S=240
#      ALGO=gae MODEL=small STEPS=14 RESP_LEN=128 (the recipe's knobs; gae has the critic)
# Budget (one device call, 600 s): ~60 s payload and model, ~40 s Ray and model load, a ~22 s
# first step, ~8 s a step after it, the 60 s stop: verl ends after ~5 min.
#      FAKE_JOB=1: no verl, no GPU -- a stand-in worker titled ray::WorkerDict.critic_update_critic
#                  and a log of step lines, verl-top with --backend replay: tests this script's
#                  own logic (tests/test_real_hang_script.py).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
export SRC=${SRC:-$(cd "$HERE/.." && pwd)}
DEVRUN=${DEVRUN:-$(cd "$SRC/.." && pwd)}
OUT=${OUT:-/tmp/real-hang-out}
export STOP_AFTER_STEPS=${STOP_AFTER_STEPS:-3} STOP_METHOD=${STOP_METHOD:-update_critic}
export STOP_S=${STOP_S:-60} WATCH_S=${WATCH_S:-240}
export ALGO=${ALGO:-gae} MODEL=${MODEL:-small} STEPS=${STEPS:-14} RESP_LEN=${RESP_LEN:-128}
export FAKE_JOB=${FAKE_JOB:-0}

el() { echo "[real_hang $(date +%T)] $*" | tee -a "$R/real_hang.log"; }

# ---- the stopper: SIGSTOP the WorkerDict inside STOP_METHOD, SIGCONT after STOP_S -----------
worker_pid() {  # the first process whose title starts with ray::WorkerDict
  local p
  for p in /proc/[0-9]*; do
    case "$( { tr '\0' ' ' < "$p/cmdline"; } 2> /dev/null)" in
      ray::WorkerDict*)
        # FAKE_JOB: only this run's stand-in (the test suite starts other WorkerDict stand-ins
        # beside it; stopping one of those would lose it and this run would stop nothing)
        if [ "$FAKE_JOB" = 1 ]; then
          { tr '\0' '\n' < "$p/environ"; } 2> /dev/null | grep -qxF "REAL_HANG_RUN=$R" || continue
        fi
        echo "${p#/proc/}"; return 0 ;;
    esac
  done
  return 1
}
steps_done() { grep -c 'step:[0-9]' "$VERL_LOG" 2> /dev/null || echo 0; }
stopper() {
  local pid="" title t0
  for _ in $(seq 1 600); do pid=$(worker_pid) && break; sleep 1; done
  [ -n "$pid" ] || { el "stopper: no ray::WorkerDict process"; return 1; }
  el "stopper: worker pid $pid; waiting for $STOP_AFTER_STEPS steps"
  for _ in $(seq 1 600); do [ "$(steps_done)" -ge "$STOP_AFTER_STEPS" ] && break; sleep 1; done
  # poll the title every 10 ms until it names the method (any method after 120 s)
  t0=$(date +%s)
  while :; do
    # argv[0] is the title Ray sets (ray::WorkerDict.<role>_<method>)
    title=$( { tr '\0' '\n' < "/proc/$pid/cmdline" | head -1; } 2> /dev/null)
    [ -n "$title" ] || { el "stopper: worker gone"; return 1; }
    case "$title" in *".$STOP_METHOD"* | *"_$STOP_METHOD"*) break ;; esac
    if [ $(( $(date +%s) - t0 )) -ge 120 ]; then
      case "$title" in ray::WorkerDict.*) el "stopper: $STOP_METHOD not seen in 120 s"; break ;; esac
    fi
    sleep 0.01
  done
  kill -STOP "$pid"
  echo "stop $(date +%s.%N) $pid $title" >> "$R/stop.txt"
  el "stopper: SIGSTOP $pid in '$title' for $STOP_S s"
  sleep "$STOP_S"
  kill -CONT "$pid"
  echo "cont $(date +%s.%N) $pid" >> "$R/stop.txt"
  el "stopper: SIGCONT $pid"
}

# ---- the sidecar: verl-top, the TUI, ground truth, the stopper ------------------------------
sidecar() {
  local W=$R/watch ARGS
  mkdir -p "$W"
  # verl-top and its wheels, not the verl payload device_run.sh put on PYTHONPATH
  [ -n "${VT_SITE:-}" ] && export PYTHONPATH=$SRC:$VT_SITE:/tmp/verl-dash
  ARGS="--verl-log $VERL_LOG --follow --interval 1"
  [ "$FAKE_JOB" = 1 ] && ARGS="$ARGS --backend replay --replay-trace $SRC/tests/fixtures/agent/h200_phased_trace.jsonl"
  cd "$SRC" || return 1
  # ground truth: every second, the WorkerDict processes' state, CPU and title
  ( while :; do
      echo "== $(date +%s.%N)"
      ps -eo pid,stat,pcpu,args 2> /dev/null | awk '$4 ~ /^ray::WorkerDict/' | cut -c1-200
      sleep 1
    done ) > "$W/ps.txt" 2>&1 &
  local PSS=$!
  # one verl-top process over the whole run: its recording is the fixture
  python3 -m verl_top snapshot $ARGS --duration "$WATCH_S" --record "$W/session.ndjson.gz" \
    -o "$W/snapshot" > "$W/snapshot.log" 2>&1 &
  local SNAP=$!
  echo "$SNAP" > "$R/snapshot.pid"  # main waits for it: device_run.sh kills this sidecar
  # the TUI under tmux, its screen every 2 s
  if command -v tmux > /dev/null; then
    tmux new-session -d -s vthang -x 160 -y 48 "PYTHONPATH=$PYTHONPATH python3 -m verl_top $ARGS"
    ( T=0; while [ $T -lt "$WATCH_S" ]; do
        tmux capture-pane -p -t vthang > "$W/tui_$(date +%s).txt" 2> /dev/null
        sleep 2; T=$((T + 2)); done
      tmux send-keys -t vthang q 2> /dev/null ) &
  else
    el "no tmux: no TUI captures"
  fi
  stopper
  wait $SNAP
  kill $PSS 2> /dev/null
  tmux kill-session -t vthang 2> /dev/null
  el "sidecar done"
}

# ---- a stand-in job for testing this script without a GPU ------------------------------------
fake_job() {
  # a worker whose title says it is in critic_update_critic, and one step line every 2 s
  # (the interpreter itself, not a launcher script that would exec it with its own argv[0])
  local py
  py=$(python3 -c 'import sys; print(sys.executable)')
  ( export REAL_HANG_RUN=$R; exec -a "ray::WorkerDict.critic_$STOP_METHOD" "$py" -c 'import time
while True: time.sleep(0.05)' ) &
  local WORKER=$!
  local n=1 end=$(( $(date +%s) + WATCH_S ))
  : > "$VERL_LOG"
  while [ "$(date +%s)" -lt "$end" ]; do
    echo "(TaskRunner pid=1) step:$n - timing_s/gen:1.0 - timing_s/update_critic:0.5 - timing_s/update_actor:0.4 - timing_s/step:2.0" >> "$VERL_LOG"
    n=$((n + 1)); sleep 2
  done
  kill -CONT $WORKER 2> /dev/null; kill $WORKER 2> /dev/null
}

if [ "${1:-}" = sidecar ]; then
  sidecar
  exit $?
fi

# ---- main --------------------------------------------------------------------------------------
WORK=${WORK:-/tmp/real-hang}
rm -rf "$WORK"
export R=$WORK/r
mkdir -p "$R" "$OUT"
if [ "$FAKE_JOB" = 1 ]; then
  export PYTHONPATH=$SRC:${PYTHONPATH:-}
  export VERL_LOG=$R/verl.log
  fake_job &
  JOB=$!
  sidecar
  wait $JOB
else
  # verl-top's wheels apart from the verl payload (which shadows transformers & co)
  export VT_SITE=/tmp/vt-site
  rm -rf $VT_SITE
  python3 -m pip install -q --no-index --no-deps --no-compile --target $VT_SITE \
    "$DEVRUN"/whl/*.whl > "$R/pip.log" 2>&1 || el "wheel install failed (see pip.log)"
  export PYTHONPATH=$SRC:$VT_SITE:/tmp/verl-dash
  { nvidia-smi; uname -a; nproc; python3 --version; } > "$R/machine.txt" 2>&1
  el "verl: ALGO=$ALGO MODEL=$MODEL STEPS=$STEPS RESP_LEN=$RESP_LEN; stop after $STOP_AFTER_STEPS steps in $STOP_METHOD for $STOP_S s"
  SIDECAR="bash $HERE/real_hang.sh sidecar" OUT=$R bash "$DEVRUN/verl-real/device_run.sh"
  el "verl done rc=$?"
  # device_run.sh killed the sidecar when verl ended; its verl-top may still be recording
  SNAP=$(cat "$R/snapshot.pid" 2> /dev/null)
  for _ in $(seq 1 "$WATCH_S"); do [ -n "$SNAP" ] && kill -0 "$SNAP" 2> /dev/null || break; sleep 1; done
  tmux kill-session -t vthang 2> /dev/null
fi

# ---- summary and the one archive ----------------------------------------------------------------
cat "$R/stop.txt" 2> /dev/null
(cd "$SRC" && python3 benchmarks/hang_replay.py "$R/watch/session.ndjson.gz" --stop-file "$R/stop.txt" \
  --target-s 20 --json-out "$R/hang_replay.json" > "$R/hang_replay.txt" 2>&1)
cat "$R/hang_replay.txt"
tar -czf "$OUT/real_hang.tar.gz" -C "$WORK" r
ls -la "$OUT/real_hang.tar.gz"
exit 0
