#!/usr/bin/env bash
# One real-GPU session (run on the H200 machine from the repo root; results go to $OUT):
#  1. verl-top (pynvml backend, --record) + the agent forced to nvidia-smi + nvidia-smi itself,
#     side by side, while benchmarks/gpu_phases.py runs idle / GEMM / decode / host-stall phases;
#  2. per-phase comparison table (benchmarks/phase_readings.py);
#  3. the built-in NCCL probe on one GPU, and nccl-tests if a source tree is in .nccltests/;
#  4. whatever `verl-top`/probe processes are left afterwards (should be none).
set -u
OUT=${OUT:-out}
mkdir -p "$OUT/r"
R="$OUT/r"
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader
  python3 -c "import sys,torch,pynvml;print(sys.version);print('torch',torch.__version__)"; } > "$R/env.txt" 2>&1

python3 -m verl_top diagnose --backend pynvml --interval 0.5 --duration ${DUR:-125} \
  --record "$R/h200_pynvml.ndjson.gz" --json > "$R/diagnose_live.json" 2> "$R/diagnose_live.err" &
D=$!
python3 -m verl_top.agent --backend nvidia-smi --interval 0.5 --count $(( ${DUR:-125} * 2 )) \
  --ignore-stdin --host smi-backend > "$R/agent_smi.ndjson" 2> "$R/agent_smi.err" &
A=$!
nvidia-smi --query-gpu=timestamp,utilization.gpu,utilization.memory,memory.used,power.draw,temperature.gpu,clocks.sm \
  --format=csv,noheader,nounits -lms 500 > "$R/smi.csv" 2>&1 &
S=$!
sleep 3
python3 benchmarks/gpu_phases.py --out "$R/phases.json" --scale ${SCALE:-1} > "$R/phases.log" 2>&1
wait $D $A
kill $S
python3 benchmarks/phase_readings.py --phases "$R/phases.json" --recording "$R/h200_pynvml.ndjson.gz" \
  --agent-smi "$R/agent_smi.ndjson" --smi "$R/smi.csv" --json-out "$R/readings.json" > "$R/readings.md" 2>&1

if [ -d .nccltests ]; then
  NH=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0])")
  mkdir -p /tmp/nccl/lib && ln -sf "$NH/lib/libnccl.so.2" /tmp/nccl/lib/libnccl.so && ln -sfn "$NH/include" /tmp/nccl/include
  timeout 400 make -C .nccltests -j16 NCCL_HOME=/tmp/nccl CUDA_HOME=/usr/local/cuda > "$R/nccltests_build.log" 2>&1
  export LD_LIBRARY_PATH="/tmp/nccl/lib:$NH/lib:${LD_LIBRARY_PATH:-}"
  [ -x .nccltests/build/all_reduce_perf ] && timeout 120 .nccltests/build/all_reduce_perf -b 1M -e 1G -f 4 -g 1 > "$R/all_reduce_perf.txt" 2>&1
fi
timeout 300 python3 -m verl_top probe nccl --gpus 1 --max-bytes 1G --json > "$R/probe_torch.json" 2>&1; echo "rc=$?" >> "$R/probe_torch.json"
[ -x .nccltests/build/all_reduce_perf ] && { timeout 300 python3 -m verl_top probe nccl --gpus 1 --nccl-tests .nccltests/build --json > "$R/probe_nccltests.json" 2>&1; echo "rc=$?" >> "$R/probe_nccltests.json"; }
sleep 1
ps -eo pid,args | grep -E "torch_probe|verl[-_]top|all_reduce_perf" | grep -v grep > "$R/leftover.txt"
tar -czf "$OUT/results.tar.gz" -C "$OUT" r
cat "$R/readings.md"; tail -5 "$R/probe_torch.json"; echo "leftover:"; cat "$R/leftover.txt"
