"""Event-loop stalls while a big finished verl log is caught up (``--verl-log`` with a replay).

    python benchmarks/catchup.py                # a 20 MB log of 10 000 step lines
    python benchmarks/catchup.py --steps 40000

A second task spins on ``asyncio.sleep(0)`` while ``LocalFollowSource`` reads the log to its end
into a Pipeline/Store; the table gives the longest and the 99th-percentile gap between two of its
turns (how long the UI could not draw, as CPU time of the loop's thread, so that other processes
on a busy machine do not count), and the total wall time. The comparator is the same log read
with the follower's former 8 MiB per poll and no pacing (``--unpaced``), run side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time

from _common import ensure_repo_on_path, write_json

ensure_repo_on_path()

from verl_top.agent import follow  # noqa: E402
from verl_top.sources import local  # noqa: E402
from verl_top.sources.local import LocalFollowSource  # noqa: E402
from verl_top.sources.pipeline import Pipeline  # noqa: E402
from verl_top.store import Store  # noqa: E402


def write_log(path: str, steps: int) -> None:
    pairs = " - ".join(f"actor/m_{k:03d}:{k / 1000:.3f}" for k in range(100))
    with open(path, "w") as fh:
        for s in range(steps):
            fh.write(f"\x1b[36m(TaskRunner pid=1)\x1b[0m step:{s} - {pairs}\n")


async def measure(path: str, paced: bool) -> tuple[float, float, float]:
    store = Store()
    pipe = Pipeline(store)
    gaps: list[float] = []
    running = True

    async def spinner() -> None:
        # CPU time of this thread between two turns: the work the loop did meanwhile, without
        # the time other processes held the CPU (the shared 2-core VM is busy).
        last = time.thread_time()
        while running:
            await asyncio.sleep(0)
            now = time.thread_time()
            gaps.append(now - last)
            last = now

    saved = local.CATCH_UP_READ, local.SLICE_S
    if not paced:  # the former behaviour: 8 MiB per poll, every record of a poll at once
        local.CATCH_UP_READ, local.SLICE_S = follow.MAX_READ_PER_POLL, 1e9
    task = asyncio.create_task(spinner())
    await asyncio.sleep(0)  # the spinner is running before the catch-up starts
    t0 = time.perf_counter()
    try:
        await LocalFollowSource([("verl", path, True)], until_eof=True).run(pipe.emit)
    finally:
        local.CATCH_UP_READ, local.SLICE_S = saved
    total = time.perf_counter() - t0
    running = False
    await task
    gaps.sort()
    return max(gaps), gaps[int(len(gaps) * 0.99)], total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--json-out", help="write the figures as JSON to this file")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "driver.log")
        write_log(path, args.steps)
        size = os.path.getsize(path) / 2**20
        print(f"log: {args.steps} step lines, {size:.1f} MiB")
        print(f"{'mode':<10} {'max stall ms':>13} {'p99 ms':>8} {'total s':>8}")
        for paced in (False, True):
            worst, p99, total = asyncio.run(measure(path, paced))
            name = "paced" if paced else "unpaced"
            print(f"{name:<10} {worst * 1e3:>13.1f} {p99 * 1e3:>8.1f} {total:>8.2f}")
            rows.append(
                {"mode": name, "max_stall_ms": worst * 1e3, "p99_ms": p99 * 1e3, "s": total}
            )
    write_json(args.json_out, {"benchmark": "catchup", "argv": sys.argv[1:], "rows": rows})


if __name__ == "__main__":
    main()
