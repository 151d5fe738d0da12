#!/bin/bash
# The real-job test bed: ONE command on the GPU machine runs the recipe's real verl 0.5.0 job
# (../shared/recipes/real-verl-h200) with verl-top watching it, plus the agent-cost measurement,
# and packs everything into one archive, $OUT/realjob-$MODEL.tar.gz.
#
#   bash .devrun/src/benchmarks/real_job/real_job.sh          (on the GPU machine; see prepare.sh)
#
# Layout it expects (prepare.sh makes it): DEVRUN/src (verl_top + benchmarks of this checkout),
# DEVRUN/verl-real (the recipe's payload), DEVRUN/whl (textual, asyncssh, ..., nvitop wheels).
# env: MODEL=tiny|small STEPS RESP_LEN BATCH ALGO (the recipe's knobs), AGENT_COST=1|0,
#      COST_S=10 (seconds per tool and rate), WATCH_S=80 (seconds verl-top watches), TOPO=1|0
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
export SRC=$(cd "$HERE/../.." && pwd)
DEVRUN=${DEVRUN:-$(cd "$SRC/.." && pwd)}
OUT=${OUT:-/tmp/realjob-out}   # gets only the archive (the device returns at most 8 files)
WORK=/tmp/realjob; rm -rf $WORK
export MODEL=${MODEL:-tiny} R=$WORK/r
mkdir -p "$R" "$OUT"
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }

# 0. verl-top's own dependencies, apart from the verl payload (which shadows transformers & co)
export VT_SITE=/tmp/vt-site
rm -rf $VT_SITE
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $VT_SITE \
  "$DEVRUN"/whl/*.whl > "$R/pip.log" 2>&1 || { el "wheel install failed"; tail "$R/pip.log"; }
el "verl-top wheels installed"
{ nvidia-smi; nvidia-smi -L; uname -a; nproc; python3 --version; } > "$R/machine.txt" 2>&1

# 1. the agent's cost next to nvidia-smi, nvitop and raw pynvml, GPU idle (issue 21)
if [ "${AGENT_COST:-1}" = 1 ]; then
  (cd "$SRC/benchmarks" && PYTHONPATH=$SRC:$VT_SITE python3 agent_cost.py --backend pynvml \
     --rates 1,10 --duration "${COST_S:-10}" ${COST_VARIANTS:-} --json-out "$R/agent_cost.json" \
     > "$R/agent_cost.txt" 2>&1)
  el "agent cost done"; sed -n '/^tool/,$p' "$R/agent_cost.txt" | cut -c1-200
  # the same agent through the pynvml module instead of ctypes: its rows only, 1 Hz
  (cd "$SRC/benchmarks" && PYTHONPATH=$SRC:$VT_SITE python3 agent_cost.py --backend pynvml \
     --rates 1 --duration "${COST_S:-10}" --only-agent --no-floor-detail --agent-extra "--nvml pynvml" \
     --json-out "$R/agent_cost_pynvml.json" > "$R/agent_cost_pynvml.txt" 2>&1)
  el "agent cost (pynvml) done"; sed -n '/^tool/,$p' "$R/agent_cost_pynvml.txt" | cut -c1-200
fi

# 2. topology: nvidia-smi's matrix, and verl-top's own collection when this checkout has it
if [ "${TOPO:-1}" = 1 ]; then
  nvidia-smi topo -m > "$R/topo_smi.txt" 2>&1
  # the nccl work's own capture (hello + topo records, pane 4's text), when this checkout has it
  [ -f "$SRC/benchmarks/topology_capture.py" ] && (cd "$SRC" && PYTHONPATH=$SRC:$VT_SITE timeout 120 \
     python3 benchmarks/topology_capture.py --out "$R/topology" > "$R/topology_capture.txt" 2>&1)
  (cd "$SRC" && PYTHONPATH=$SRC:$VT_SITE timeout 60 python3 -m verl_top.agent --once \
     --ignore-stdin --host h200 > "$R/agent_once.ndjson" 2> "$R/agent_once.err")
  el "topology captured"
fi

# 3. the real verl job; verl-top watches it from the sidecar (watch.sh)
export WATCH_S=${WATCH_S:-80}
SIDECAR="bash $HERE/watch.sh" OUT=$R bash "$DEVRUN/verl-real/device_run.sh"
RC=$?
el "verl job done rc=$RC"
# the watchers were started with WATCH_S; give any still writing (snapshot, shots) time to end
for _ in $(seq 1 45); do grep -q "^.*done$" "$R/watch/watch.log" 2>/dev/null && break; sleep 2; done

# 4. where the client's CPU went (cProfile of the headless app and of diagnose)
(cd "$SRC" && PYTHONPATH=$SRC:$VT_SITE python3 benchmarks/real_job/client_parts.py \
   "$R/watch/shots.prof" "$R/watch/diagnose.prof" > "$R/client_parts.txt" 2>&1)
cat "$R/client_parts.txt"

# 5. one archive with everything
ls -la "$R" "$R/watch" 2>/dev/null | head -60
tar -czf "$OUT/realjob-$MODEL.tar.gz" -C "$WORK" r
ls -la "$OUT/realjob-$MODEL.tar.gz"
for f in "$R"/watch/diagnose.json; do [ -f "$f" ] && head -c 1500 "$f"; done
echo; tail -5 "$R/watch/snapshot.log" 2>/dev/null
exit 0
