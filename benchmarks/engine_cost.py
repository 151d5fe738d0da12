"""Cost of one diagnosis evaluation (``Engine().evaluate``) on a store of N GPUs with full rings.

The store is filled as ``client_scale.py`` fills it: the real agent's replay lines (8 GPUs per
host) through the real decoder and pipeline, every ring prefilled to capacity (600 points = the
state after an hour at 1 Hz). With ``--steps`` (default on) verl step lines are added every
20 s over the window, so the phase-aware rules work on stage bands as in a real job, not only
on the replay labels. Each evaluation uses a fresh ``Engine`` and reads the same store.
With ``--per-rule``, each rule's CPU in the engine's order on one fresh view per run (what it
adds to the rules before it: the view keeps what they read), the costliest first. With
``--lag``, ``runs`` more evaluations in a worker thread with the cyclic GC paused, as
``monitor.judge`` runs them, while the main thread sleeps 2 ms at a time: how late it wakes
is how long the evaluation held the GIL at a stretch (a frame of the UI waits as long).

    python benchmarks/engine_cost.py --gpus 256,1024 --runs 5 --json-out engine.json
    python benchmarks/engine_cost.py --gpus 1024,4096 --runs 3 --per-rule
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import threading
import time
from typing import Any

from _common import ensure_repo_on_path, median, table, write_json

ensure_repo_on_path()

from client_scale import GPUS_PER_HOST, Pending, SyntheticCluster, make_templates  # noqa: E402

from verl_top.diagnosis.engine import STEP_RULES, Engine  # noqa: E402
from verl_top.diagnosis.guards import device_guard  # noqa: E402
from verl_top.diagnosis.view import StepMemo, View  # noqa: E402
from verl_top.model import VerlStep  # noqa: E402
from verl_top.sources.pipeline import Pipeline  # noqa: E402
from verl_top.store import Store, StoreLimits  # noqa: E402

STEP_EVERY_S = 20.0
# One GRPO step's stage times (s), shaped after the real Qwen2.5-0.5B log: gen dominates.
STEP_TIMINGS = {"gen": 9.0, "old_log_prob": 1.5, "ref": 1.2, "adv": 0.1, "update_actor": 6.0}


def fill(gpus: int, steps: bool, now: float | None = None) -> Store:
    """A store of ``gpus`` GPUs with every ring full, plus verl steps when ``steps``; the
    newest sample at ``now`` (default: the wall clock)."""
    hosts = max(1, gpus // GPUS_PER_HOST)
    store = Store(StoreLimits())
    pipeline = Pipeline(store)
    cluster = SyntheticCluster(hosts, 1.0, make_templates(), Pending())
    now = time.time() if now is None else now
    cluster.hello(pipeline.emit, now - store.limits.points)
    # As SyntheticCluster.prefill, but each host on its own phase within the second, as agents
    # started at different moments are (so hosts share no sample times).
    points = store.limits.points
    for i in range(points):
        for k, host in enumerate(cluster.hosts):
            offset = (k * 0.618034) % 1.0
            cluster.feed_host(pipeline.emit, host, now - (points - i) - offset, i)
    if steps:
        t, n = now - store.limits.points + STEP_EVERY_S, 1
        while t <= now:
            metrics = {f"timing_s/{k}": v for k, v in STEP_TIMINGS.items()}
            metrics["timing_s/step"] = sum(STEP_TIMINGS.values()) + 0.2
            metrics["perf/throughput"] = 1500.0
            store.ingest(VerlStep(host=cluster.hosts[0], t=t, step=n, metrics=metrics))
            t, n = t + STEP_EVERY_S, n + 1
    return store


def per_rule(store: Store, runs: int) -> dict[str, float]:
    """Median CPU ms of each rule (and of reading the steps and the GPU list first), run in
    the engine's order on one fresh view per run, as ``run_rules`` runs them."""
    engine = Engine()
    cpu: dict[str, list[float]] = {}

    def timed(name: str, fn: Any) -> None:
        c0 = time.process_time()
        fn()
        cpu.setdefault(name, []).append((time.process_time() - c0) * 1000)

    for _ in range(runs):
        gc.collect()
        view = View(store, engine.thresholds, StepMemo())
        timed("(steps)", view.steps)
        timed("(GPU list)", view.gpus)
        for step, rules in STEP_RULES.items():
            for rule in rules:
                name = rule.__name__.replace("_", ".", 1)
                timed(name, lambda: device_guard(view, step, name) or rule(view, engine.thresholds))  # noqa: B023
    return dict(sorted(((k, median(v)) for k, v in cpu.items()), key=lambda kv: -kv[1]))


def gil_waits(store: Store, runs: int) -> list[float]:
    """Per evaluation in a worker thread (GC paused, as ``monitor.judge``): the longest a
    thread sleeping 2 ms at a time woke late, in ms."""
    out = []
    for _ in range(runs):
        gc.collect()
        late: list[float] = []
        worker = threading.Thread(target=_paused_evaluation, args=(store,))
        worker.start()
        while worker.is_alive():
            t0 = time.perf_counter()
            time.sleep(0.002)
            late.append(time.perf_counter() - t0 - 0.002)
        worker.join()
        out.append(max(late, default=0.0) * 1000)
    return out


def _paused_evaluation(store: Store) -> None:
    enabled = gc.isenabled()
    gc.disable()
    try:
        Engine().evaluate(store)
    finally:
        if enabled:
            gc.enable()


def measure(
    gpus: int, runs: int, steps: bool, rules: bool = False, lag: bool = False
) -> dict[str, Any]:
    """Fill a store and time ``runs`` evaluations (wall and CPU); each rule's too with
    ``rules``, the longest GIL hold seen from another thread with ``lag``."""
    store = fill(gpus, steps)
    walls, cpus = [], []
    verdict = None
    for _ in range(runs):
        gc.collect()
        w0, c0 = time.perf_counter(), time.process_time()
        verdict = Engine().evaluate(store)
        cpus.append((time.process_time() - c0) * 1000)
        walls.append((time.perf_counter() - w0) * 1000)
    assert verdict is not None
    return {
        "gpus": store.gpu_count(),
        "steps": len(store.steps),
        "runs": runs,
        "wall_ms_p50": median(walls),
        "wall_ms_min": min(walls),
        "cpu_ms_p50": median(cpus),
        "findings": [f.rule for f in verdict.findings],
        "rules_cpu_ms_p50": per_rule(store, runs) if rules else {},
        "gil_wait_ms_max": max(gil_waits(store, runs)) if lag else None,
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--gpus", default="256,1024", help="GPU counts (hosts = GPUs / 8)")
    p.add_argument("--runs", type=int, default=5, help="evaluations per size")
    p.add_argument("--no-steps", action="store_true", help="no verl step lines in the store")
    p.add_argument("--per-rule", action="store_true", help="also time each rule (table)")
    p.add_argument(
        "--lag", action="store_true", help="also: longest GIL hold seen from another thread"
    )
    p.add_argument("--json-out", default=None, metavar="FILE")
    args = p.parse_args(argv)
    rows = [
        measure(int(g), args.runs, not args.no_steps, args.per_rule, args.lag)
        for g in args.gpus.split(",")
    ]
    load = os.getloadavg()
    print(
        table(
            [
                "GPUs",
                "steps",
                "runs",
                "wall ms p50",
                "wall ms min",
                "CPU ms p50",
                "GIL wait ms max",
            ],
            [
                [
                    r["gpus"],
                    r["steps"],
                    r["runs"],
                    r["wall_ms_p50"],
                    r["wall_ms_min"],
                    r["cpu_ms_p50"],
                    r["gil_wait_ms_max"],
                ]
                for r in rows
            ],
            digits=1,
        )
    )
    if args.per_rule:
        names = list(rows[0]["rules_cpu_ms_p50"])
        print(
            table(
                ["rule (CPU ms p50)", *(f"{r['gpus']} GPUs" for r in rows)],
                [[n, *(r["rules_cpu_ms_p50"].get(n) for r in rows)] for n in names[:15]],
                digits=1,
            )
        )
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if args.json_out:
        write_json(args.json_out, {"benchmark": "engine_cost", "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
