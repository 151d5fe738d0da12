#!/usr/bin/env bash
# Second real-GPU session: the agent's cost next to nvidia-smi / nvitop / gpustat (same run),
# and a headless `verl-top snapshot` taken while benchmarks/gpu_phases.py runs (for docs/examples).
set -u
OUT=${OUT:-out}
R="$OUT/r"; mkdir -p "$R"
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
python3 benchmarks/agent_cost.py --backend pynvml --duration ${COST_S:-15} --json-out "$R/agent_cost.json" > "$R/agent_cost.txt" 2>&1
python3 benchmarks/gpu_phases.py --out "$R/phases_snap.json" --scale ${SCALE:-0.5} > "$R/phases_snap.log" 2>&1 &
W=$!
python3 -m verl_top snapshot --backend pynvml --interval 0.5 --duration ${SNAP_S:-40} -o "$R/snap" > "$R/snapshot.log" 2>&1
wait $W
tar -czf "$OUT/results2.tar.gz" -C "$OUT" r
cat "$R/agent_cost.txt"; cat "$R/snapshot.log"; head -40 "$R/snap/report.md"
