#!/usr/bin/env bash
# Third real-GPU session (issue 21): where the agent's per-tick cost goes on the H200, and the
# agent next to nvidia-smi / nvitop / gpustat in one run.
#   run with the device tool, carrying the comparators' wheels:
#   bash benchmarks/h200_session3.sh     (carry ["build/bench-wheels"]: nvitop, gpustat, blessed, jinxed, wcwidth wheels)
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
tar -czf "$OUT/session3.tar.gz" -C "$OUT" r
cat "$R/machine.txt" "$R/nvml_cold.txt" "$R/agent_cost.txt"
