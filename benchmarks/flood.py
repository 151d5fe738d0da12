"""Memory under hostile floods: one node sending GPU indices without end, or a host per line.

    python benchmarks/flood.py                 # 100 000 lines per case
    python benchmarks/flood.py --lines 1000000
    PYTHONPATH=OLD_TREE python benchmarks/flood.py --lines 5000   # the code before issue 16

Each case runs in a fresh child process: NDJSON lines (the agent's wire format) go through
``Decoder`` -> ``Pipeline.emit`` -> ``Store`` as the SSH intake would feed them, and the table
reports the tracemalloc peak of that path (Python allocations), the process's peak RSS (ru_maxrss)
and the store's GPU/host counts and drop counts. The comparator is the same number of lines from a
well-behaved node (8 GPUs), so the ratio is what the flood costs beyond normal traffic.

Before issue 16 the store created a GPU series for every index it saw (one node grew the client to
4 GB in 20 s); the caps (GPU index 0..255 on the wire, 256 GPU series per host, 2048 hosts, 8192
GPU series in all) bound it now.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import tracemalloc

from _common import REPO, ensure_repo_on_path, write_json

ensure_repo_on_path()

T0 = 1_800_000_000.0
CASES = ("normal", "gpu_index_flood", "in_range_flood", "host_flood")


def _line(case: str, i: int) -> str:
    host, index = "node-01", i % 8
    if case == "gpu_index_flood":
        index = i  # 0, 1, 2, ... 99 999: all but 256 are refused at decode
    elif case == "in_range_flood":
        index = i % 256  # every valid index: the store's per-host cap is what holds
    elif case == "host_flood":
        host = f"h{i}"  # a new host per line (e.g. a hostile Ray node list)
    rec = {"v": 1, "type": "gpu", "host": host, "t": T0 + i * 1e-3, "index": index}
    rec.update(util_gpu=97.0, mem_used_mib=70000.0, power_w=600.0, temp_c=60.0, sm_mhz=1980.0)
    return json.dumps(rec, separators=(",", ":"))


def run_case(case: str, lines: int) -> dict[str, object]:
    """One case in this process: feed the lines, measure."""
    from verl_top.protocol import Decoder
    from verl_top.sources.pipeline import Pipeline
    from verl_top.store import Store

    tracemalloc.start()
    store = Store(wall_clock=lambda: T0 + 1000)
    pipe = Pipeline(store, wall_clock=lambda: T0 + 1000)
    dec = Decoder()
    t0 = time.perf_counter()
    for i in range(lines):
        rec = dec.decode(_line(case, i))
        if rec is not None:
            pipe.emit(rec)
        if (i % 1000 == 999 or i == lines - 1) and hasattr(dec, "take_drops"):  # (new in #16)
            for dropped in dec.take_drops("node-01" if case != "host_flood" else None):
                pipe.emit(dropped)
    wall = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "case": case,
        "lines": lines,
        "peak_mib": peak / 2**20,
        "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "hosts": len(store.hosts),
        "gpus": store.gpu_count(),
        "refused": sum(sum(r.values()) for r in getattr(store, "drops", {}).values()),
        "lines_per_s": lines / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument(
        "--cases", default=",".join(CASES), help="comma list of " + ", ".join(CASES)
    )
    parser.add_argument("--json-out", help="write the figures as JSON to this file")
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # child mode
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case, args.lines)))
        return
    rows = []
    for case in args.cases.split(","):
        env = dict(os.environ)
        env.setdefault("PYTHONPATH", str(REPO))  # a PYTHONPATH given (an old tree) wins
        out = subprocess.run(
            [sys.executable, __file__, "--case", case, "--lines", str(args.lines)],
            check=True,
            capture_output=True,
            text=True,
            env=env,
        )
        rows.append(json.loads(out.stdout))
    base = rows[0]["peak_mib"]
    print(
        f"{'case':<16} {'lines':>8} {'peak MiB':>9} {'x normal':>9} {'maxRSS MiB':>11} "
        f"{'hosts':>6} {'GPUs':>6} {'refused':>8} {'lines/s':>9}"
    )
    for r in rows:
        print(
            f"{r['case']:<16} {r['lines']:>8} {r['peak_mib']:>9.1f} {r['peak_mib'] / base:>9.1f} "
            f"{r['maxrss_mib']:>11.0f} {r['hosts']:>6} {r['gpus']:>6} {r['refused']:>8} "
            f"{r['lines_per_s']:>9.0f}"
        )
    write_json(args.json_out, {"benchmark": "flood", "argv": sys.argv[1:], "rows": rows})


if __name__ == "__main__":
    main()
