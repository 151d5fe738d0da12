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
rm -rf "$DEST/whl"; cp -r "$3" "$DEST/whl"
du -sh "$DEST"/*
