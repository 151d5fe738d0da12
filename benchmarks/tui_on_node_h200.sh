#!/bin/bash
# ON THE GPU MACHINE (device tool), from the repository root: the TUI on a node (issue 30 item 5):
# HEAD (this tree) and BASE (.devrun/base: `git archive f5d20d2 verl_top pyproject.toml`, before
# the redraw work) alternating on the real NVML backend, benchmarks/client_on_node.py each.
# Carried (ignored folders): .devrun/deb (tmux 3.3a + libevent-core + libutempter debs),
# .devrun/whl (textual 8.2.8, textual-plotext, plotext, asyncssh, cryptography, cffi, pycparser,
# platformdirs, mdit-py-plugins, python-hostlist wheels for cp312), .devrun/base.
# Run as: STOP_AFTER=78 WARMUP=8 DUR=25 bash benchmarks/tui_on_node_h200.sh
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p "$R"
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$R/steps.log"; }
D=/tmp/tmuxroot; mkdir -p $D
for f in .devrun/deb/*.deb; do dpkg -x "$f" $D; done
export PATH=$D/usr/bin:$PATH LD_LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
tmux -V >> "$R/steps.log" 2>&1 || el "no tmux"
W=""
for n in textual textual_plotext plotext asyncssh cryptography cffi pycparser platformdirs mdit_py_plugins python_hostlist; do
  W="$W $(ls .devrun/whl/${n}-*.whl)"
done
[ -n "${SKIP_PIP:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile $W > "$R/pip.log" 2>&1 \
  || python3 -m pip install -q --no-index --no-deps --no-compile --user --break-system-packages $W >> "$R/pip.log" 2>&1 \
  || el "pip failed"
python3 -c "import textual, verl_top; print('textual', textual.__version__)" >> "$R/steps.log" 2>&1
{ nvidia-smi -L; nproc; python3 --version; uname -r; } > "$R/machine.txt" 2>&1
el "ready"
for side in head base head base; do
  [ $(( $(date +%s) - T0 )) -gt ${STOP_AFTER:-150} ] && { el "stop: time"; break; }
  if [ $side = base ]; then export VERL_TOP_BENCH_CODE=$PWD/.devrun/base; else unset VERL_TOP_BENCH_CODE; fi
  i=$(ls "$R" | grep -c "^${side}_.*json$")
  python3 benchmarks/client_on_node.py --warmup ${WARMUP:-8} --duration ${DUR:-25} --sampler none --backend ${BACKEND:-auto} \
    --out "$R" --json-out "$R/${side}_$i.json" > "$R/${side}_$i.txt" 2>&1
  el "$side $i rc=$? $(grep -m1 -i 'cpu %' "$R/${side}_$i.txt" | cut -c1-150)"
  tar czf "$OUT/tui_h200.tgz" -C "$OUT" r  # after each run: a cut-off call still brings these
done
tar czf "$OUT/tui_h200.tgz" -C "$OUT" r
