"""The hot paths issue 29 touched, measured in this tree and in a base tree, alternating.

    git archive main | tar -x -C /tmp/base          # the base: any other checkout of verl-top
    python benchmarks/side_by_side.py /tmp/base --rounds 3

Each round runs one child process per tree (base first, then this one), so both see the same
machine load; the table gives each tree's median over the rounds and the ratio head / base.
The child measures, with ``time.process_time``:

- ``engine``: one ``Engine().evaluate`` on a store filled like ``engine_cost.py`` (the real
  agent's replay lines, every ring full, a verl step every 20 s) plus one process list per host
  with 8 WorkerDict processes in ``update_actor`` (title changes every 20 s, as a job's do) —
  the job.hang and straggler rules' steady state (nothing hangs, nothing lags);
- ``procs_ingest``: ``Store.ingest`` of those process lists (the tracker runs there);
- ``verl_log``: ``Pipeline.emit`` of a real verl driver log (the early-verl Qwen2.5 log, 20
  copies, 32k lines) as one followed file: the verl parser plus, in this tree, the watchdog
  scanner.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOG = (
    HERE.parent
    / "tests"
    / "fixtures"
    / "verl"
    / "real_Qwen2.5-0.5B-bsz256_2-prompt1024-resp512-0.567.log"
)

CHILD = r"""
import gc, json, sys, time
root, gpus, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sys.path[:0] = [root, root + "/benchmarks"]
from engine_cost import fill
from verl_top.diagnosis.engine import Engine
from verl_top.model import GpuProcess, LogLines, ProcessList
from verl_top.sources.pipeline import Pipeline
from verl_top.store import Store

now = time.time()
store = fill(gpus, True, now)
lists = []
for k in range(30):  # 30 title changes per host over the last 600 s
    method = "actor_rollout_update_actor" if k % 2 else "actor_rollout_generate_sequences"
    for host in list(store.hosts):
        procs = [GpuProcess(pid=1000 + i, gpu_index=i, used_mib=6e4, cmd="ray::WorkerDict." + method,
                            cpu_pct=99.0, env_rank=i) for i in range(8)]
        lists.append(ProcessList(host=host, t=now - 600 + 20 * k, procs=procs))
gc.collect()
c0 = time.process_time()
for plist in lists:
    store.ingest(plist)
procs_ms = (time.process_time() - c0) * 1000
cpus = []
for _ in range(5):
    gc.collect()
    c0 = time.process_time()
    Engine().evaluate(store)
    cpus.append((time.process_time() - c0) * 1000)
lines = open(log, errors="replace").read().splitlines() * 20
s2 = Store()
pipe = Pipeline(s2, wall_clock=lambda: now)
gc.collect()
c0 = time.process_time()
for i in range(0, len(lines), 500):
    pipe.emit(LogLines(host="h", t=now, path="/d.log", kind="verl", lines=lines[i:i + 500]))
log_ms = (time.process_time() - c0) * 1000
print(json.dumps({"engine": sorted(cpus)[2], "procs_ingest": procs_ms, "verl_log": log_ms,
                  "steps": len(s2.steps)}))
"""


def child(root: Path, gpus: int) -> dict[str, float]:
    """One measurement in the tree at ``root``."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(root), str(gpus), str(LOG)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", type=Path, help="the base tree (a checkout of verl-top)")
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    head = HERE.parent
    runs: dict[str, list[dict[str, float]]] = {"base": [], "head": []}
    for r in range(args.rounds):
        for name, root in (("base", args.base), ("head", head)):
            runs[name].append(child(root, args.gpus))
            print(f"round {r + 1} {name}: {runs[name][-1]}", file=sys.stderr)
    print(f"{args.gpus} GPUs, median of {args.rounds} alternating rounds, CPU ms")
    print(f"{'measure':<14} {'base':>9} {'head':>9} {'head/base':>10}")
    for key in ("engine", "procs_ingest", "verl_log"):
        b = statistics.median(x[key] for x in runs["base"])
        h = statistics.median(x[key] for x in runs["head"])
        print(f"{key:<14} {b:>9.1f} {h:>9.1f} {h / b:>10.2f}")
    same = {x["steps"] for x in runs["base"] + runs["head"]}
    print(f"verl steps parsed: {sorted(same)} (must be one number: the same log, the same steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
