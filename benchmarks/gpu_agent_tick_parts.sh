#!/usr/bin/env bash
# Where the agent's per-tick cost goes on a real GPU (issue 21; first run as h200_session3.sh),
# the agent next to nvidia-smi / nvitop / gpustat in one run, and (issue 29) the agent of this
# checkout against a base version, alternating in one run, when build/agent-base holds one.
#   run with the device tool, carrying the comparators' wheels (and the base agent):
#   bash benchmarks/gpu_agent_tick_parts.sh     (carry ["build/bench-wheels"]: nvitop, gpustat, blessed, jinxed, wcwidth wheels)
#   base agent: mkdir -p build/agent-base && git archive BASE verl_top/agent | tar -x -C build/agent-base
#               (carry ["build/bench-wheels", "build/agent-base"])
set -u
OUT=${OUT:-out}
R="$OUT/r"; mkdir -p "$R"
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-index build/bench-wheels/*.whl > "$R/pip.txt" 2>&1
{ nvidia-smi --query-gpu=name,driver_version,persistence_mode,pstate --format=csv; nproc;
  python3 -c 'import sys; print(sys.version)'; cat /proc/cpuinfo | grep -m1 'model name'; } > "$R/machine.txt" 2>&1
python3 benchmarks/nvml_cold.py --reps ${COLD_REPS:-6} --alternatives --json-out "$R/nvml_cold.json" > "$R/nvml_cold.txt" 2>&1
python3 benchmarks/agent_cost.py --backend pynvml --rates ${RATES:-1} --duration ${COST_S:-20} --fan-out 8 \
    --variant "every-tick=--mem-every 1 --cpu-every 1" --json-out "$R/agent_cost.json" > "$R/agent_cost.txt" 2>&1
if [ -d build/agent-base/verl_top/agent ]; then
  python3 benchmarks/agent_tick_ab.py --base-dir build/agent-base/verl_top/agent --backend pynvml \
      --rate ${AB_RATE:-1} --ticks ${AB_TICKS:-60} --json-out "$R/agent_tick_ab.json" > "$R/agent_tick_ab.txt" 2>&1
fi
tar -czf "$OUT/agent_tick_parts.tar.gz" -C "$OUT" r
cat "$R/machine.txt" "$R/nvml_cold.txt" "$R/agent_cost.txt"
[ -f "$R/agent_tick_ab.txt" ] && cat "$R/agent_tick_ab.txt"
