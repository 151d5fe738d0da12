#!/bin/bash
# ON THE GPU MACHINE (device tool), from the repository root: the TUI on a node (issue 30
# item 5), two trees side by side on the real NVML backend, each through VERL_TOP_BENCH_CODE:
#   .devrun/head, .devrun/base: `git archive REV verl_top pyproject.toml` of each tree;
#   .devrun/bench: `git archive REV benchmarks/client_on_node.py benchmarks/_common.py
#     benchmarks/postmortem_log.py` and the two fixtures it reads (the live log's source, the
#     replay trace), so the harness is the same for both;
#   .devrun/whl: cp312 wheels (textual, rich, pygments, markdown-it-py, mdit-py-plugins,
#     linkify-it-py, uc-micro-py, textual-plotext, plotext, asyncssh, cryptography, cffi,
#     pycparser, platformdirs, python-hostlist, typing_extensions, hyperscan, orjson, py-spy);
#   .devrun/deb: tmux and its libraries (Debian: tmux, libevent-core-2.1-7, libutempter0).
# .devrun is ignored (.git/info/exclude) and carried. What each run measured is in
# benchmarks/results/h200_tui_on_node_2026-12-05*/ (README.md). The 2026-12-03 run
# (benchmarks/results/h200_tui_on_node/) used this script's earlier form, at 562e627.
# Phase A: head, base, head, base with --sampler none. Phase B: head, base once more with the
# parts (py-spy when it can read the process there, else the instruments' second run).
# Run as: STOP_AFTER=330 WARMUP=8 DUR=25 bash benchmarks/tui_on_node_h200.sh
# Local dry run (no GPU, local tmux and packages): LOCAL=1 BACKEND=replay WARMUP=2 DUR=3 ...
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p "$R"
DR=$PWD/.devrun
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$R/steps.log"; }
pack() { tar czf "$OUT/tui_h200.tgz" -C "$OUT" r; }
if [ -z "${LOCAL:-}" ]; then
  D=/tmp/tmuxroot; mkdir -p $D
  for f in "$DR"/deb/*.deb; do dpkg -x "$f" $D; done
  export PATH=$D/usr/bin:/tmp/site/bin:$PATH LD_LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$DR"/whl/*.whl > "$R/pip.log" 2>&1 || el "pip failed"
  # client_on_node.py starts verl-top under tmux with PYTHONPATH=<code root> alone, so /tmp/site
  # goes in through a .pth file of this interpreter (first on sys.path, ahead of the image's own).
  PURE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "import sys; sys.path.insert(0, '/tmp/site')" > "$PURE/000_devrun_site.pth" || el "no .pth"
fi
tmux -V >> "$R/steps.log" 2>&1 || el "no tmux"
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader; nproc
  grep -m1 'model name' /proc/cpuinfo; python3 --version; which python3; uname -r; tmux -V
  (cd /tmp && python3 -c "
import importlib, importlib.metadata as md
for d, m in (('textual', 'textual'), ('rich', 'rich'), ('pygments', 'pygments'), ('markdown-it-py', 'markdown_it'), ('orjson', 'orjson'), ('hyperscan', 'hyperscan'), ('asyncssh', 'asyncssh'), ('psutil', 'psutil'), ('nvidia-ml-py', 'pynvml')):
    print(d, md.version(d), importlib.import_module(m).__file__)")
} > "$R/machine.txt" 2>&1
for side in head base; do
  (cd "$DR/$side" && PYTHONPATH=$DR/$side python3 -c "import verl_top; print('$side', verl_top.__file__)" \
     && PYTHONPATH=$DR/$side python3 -m verl_top --version) >> "$R/machine.txt" 2>&1
done
SPY=instruments
if [ "${SAMPLER:-auto}" != instruments ] && command -v py-spy > /dev/null; then
  tmux new-session -d -s probe -x 80 -y 20 "python3 -c 'import time; time.sleep(30)'"; sleep 1
  ppid=$(tmux display-message -p -t probe '#{pane_pid}')
  py-spy dump --nonblocking --pid "$ppid" > "$R/py_spy_probe.txt" 2>&1 && SPY=py-spy
  tmux kill-session -t probe
fi
el "ready; parts by $SPY"
run() {  # side sampler tag
  local side=$1 sampler=$2 tag=$3 i
  i=$(ls "$R" | grep -c "^${side}_${tag}.*json$")
  VERL_TOP_BENCH_CODE=$DR/$side python3 "$DR/bench/benchmarks/client_on_node.py" \
    --warmup ${WARMUP:-8} --duration ${DUR:-25} --sampler $sampler --backend ${BACKEND:-auto} \
    --out "$R" --json-out "$R/${side}_${tag}$i.json" > "$R/${side}_${tag}$i.txt" 2>&1
  el "$side ${tag}$i rc=$? $(grep -m1 -i 'cpu % of a core' "$R/${side}_${tag}$i.txt" | cut -c1-120)"
  pack
}
for side in head base head base; do
  [ $(( $(date +%s) - T0 )) -gt ${STOP_AFTER:-400} ] && { el "stop: time"; break; }
  run $side none ""
done
for side in head base; do
  [ $(( $(date +%s) - T0 )) -gt ${STOP_AFTER:-400} ] && { el "stop: time"; break; }
  run $side $SPY parts
done
el "done"
pack
