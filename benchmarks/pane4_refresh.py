"""Pane 4's refresh with process lists, for one code tree (run it on two, alternately, to compare).

    PYTHONPATH=TREE python benchmarks/pane4_refresh.py TREE 16 --rounds 25 --lists-every 5

N hosts × 8 GPUs (tests/ui_data.py's store, the real H200 trace), each host with 8 WorkerDict
GPU processes and, where the tree's model has them, their job-process records plus the driver;
GPU samples every round, process lists every ``--lists-every`` rounds (the agent's default
listing stride is 5 ticks). Prints the median CPU ms of ``refresh_now`` with pane 4 visible.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any


def _plist(model: Any, host: str, t: float, r: int) -> Any:
    title = "ray::WorkerDict.actor_rollout_generate_sequences"
    procs = [
        model.GpuProcess(pid=1000 + i, gpu_index=i, used_mib=40000.0, cmd=title, env_rank=i)
        for i in range(8)
    ]
    extra: dict[str, Any] = {}
    if hasattr(model, "JobProcess"):
        jobs = [
            model.JobProcess(
                pid=1000 + i, state="RS"[(i + r) % 2], title=title, method=title[16:], gpus=[i]
            )
            for i in range(8)
        ]
        jobs.append(model.JobProcess(pid=900, state="S", title="ray::TaskRunner.run"))
        extra["job_procs"] = jobs
    return model.ProcessList(host=host, t=t, procs=procs, **extra)


async def measure(tree: str, hosts: int, rounds: int, every: int) -> float:
    """Median CPU ms of one refresh with pane 4 visible."""
    sys.path.insert(0, f"{tree}/tests")
    from ui_data import load_trace, scale_store, trace_sample

    from verl_top import model
    from verl_top.diagnosis.engine import Engine
    from verl_top.inputs import Inputs
    from verl_top.sources.pipeline import Pipeline
    from verl_top.ui.app import VerlTopApp

    store = scale_store(hosts)
    rows = load_trace()
    engine = Engine()
    verdict = engine.evaluate(store)
    engine.evaluate = lambda _store: verdict  # type: ignore[method-assign] # time the refresh
    app = VerlTopApp(
        Inputs(store=store, pipeline=Pipeline(store, parsers={})), engine=engine, live=False
    )
    cpu: list[float] = []
    async with app.run_test(size=(200, 60)) as pilot:
        await pilot.press("4")
        await pilot.pause()
        for r in range(rounds):
            now = store.now + 1
            for g in list(store.iter_gpus()):
                sample = trace_sample(
                    rows[(r * 7 + g.index) % len(rows)], g.host, g.index, now, True
                )
                store.ingest(sample, received=now)
            if r % every == 0:
                for h in list(store.hosts):
                    store.ingest(_plist(model, h, now, r), received=now)
            c = time.process_time()
            app.refresh_now()
            cpu.append((time.process_time() - c) * 1000)
            await pilot.pause()
    cpu.sort()
    return cpu[len(cpu) // 2]


def main() -> int:
    """Command line entry."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("tree", help="the checkout whose verl_top is on PYTHONPATH")
    p.add_argument("hosts", type=int, nargs="?", default=16)
    p.add_argument("--rounds", type=int, default=25)
    p.add_argument("--lists-every", type=int, default=5)
    a = p.parse_args()
    print(f"{asyncio.run(measure(a.tree, a.hosts, a.rounds, a.lists_every)):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
