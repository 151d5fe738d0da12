#!/bin/bash
# Stage what real_job.sh needs on the GPU machine into DEST (an ignored folder of the checkout
# that the device call carries; 64 MiB in all with the checkout):
#   bash benchmarks/real_job/prepare.sh DEST PAYLOAD WHEELS
#     PAYLOAD: the recipe's build_payload.sh output (../shared/recipes/real-verl-h200)
#     WHEELS:  wheels of verl-top's dependencies the GPU machine lacks, e.g.
#              pip download --no-deps --only-binary=:all: --python-version 3.12 \
#                --platform manylinux_2_17_x86_64 -d WHEELS textual==8.2.8 textual-plotext \
#                plotext mdit-py-plugins asyncssh platformdirs nvitop   (+ python-hostlist built)
# Then, on the GPU machine: bash DEST/src/benchmarks/real_job/real_job.sh
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 DEST PAYLOAD WHEELS" >&2; exit 2; }
REPO=$(cd "$(dirname "$0")/../.." && pwd)
DEST=$1
mkdir -p "$DEST/src"
rm -rf "$DEST/src/verl_top" "$DEST/src/benchmarks"
cp -r "$REPO/verl_top" "$REPO/benchmarks" "$DEST/src/"
find "$DEST/src" -name __pycache__ -prune -exec rm -rf {} +
rm -rf "$DEST/src/benchmarks/results"
[ -d "$DEST/verl-real" ] || cp -r "$2" "$DEST/verl-real"
chmod -R u+w "$DEST/verl-real"
# Two knobs on the staged copies of the recipe's scripts (the recipe itself stays as it is):
# ROWS=N prompts in the generated data (64 by default; BATCH may then go up to N), and
# VERL_EXTRA='k=v ...' Hydra overrides appended to the verl command line (keys not set already).
sed -i 's/^for i in range(64):$/for i in range(int(os.environ.get("ROWS", "64"))):/' \
  "$DEST/verl-real/make_assets.py"
# MINI / MICRO: PPO mini-batch and the micro-batches (defaults 8 / 4, the recipe's values)
sed -i -e 's/ppo_mini_batch_size=8 /ppo_mini_batch_size=${MINI:-8} /' \
  -e 's/ppo_micro_batch_size_per_gpu=4$/ppo_micro_batch_size_per_gpu=${MICRO:-4}/' \
  -e 's/log_prob_micro_batch_size_per_gpu=4$/log_prob_micro_batch_size_per_gpu=${MICRO:-4}/' \
  "$DEST/verl-real/run_verl.sh"
sed -i 's/^exec python3 -m verl.trainer.main_ppo "${ARGS\[@\]}" "\$@"$/& ${VERL_EXTRA:-}/' \
  "$DEST/verl-real/run_verl.sh"
grep -q 'ROWS' "$DEST/verl-real/make_assets.py" && grep -q 'VERL_EXTRA' "$DEST/verl-real/run_verl.sh" \
  || { echo "prepare.sh: could not add ROWS / VERL_EXTRA to the recipe's scripts" >&2; exit 1; }
rm -rf "$DEST/whl"; cp -r "$3" "$DEST/whl"
du -sh "$DEST"/*
