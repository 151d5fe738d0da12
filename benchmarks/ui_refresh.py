"""Cost of one app refresh with pane 1 visible, for N hosts × 8 GPUs (headless Textual).

    python benchmarks/ui_refresh.py 16 128
    python benchmarks/ui_refresh.py 128 --rounds 30 --json-out ui_refresh.json

For each size: a refresh after every GPU got a new sample (the 1 Hz steady state: every row
rebuilt, changed cells written), and a refresh with nothing new; CPU (``process_time``, the
figure to read on a shared machine) and wall, median and p95 over ``--rounds``. After each
refresh the app gets ``PAINT_S`` to draw it (layout, the widgets' lines, the compositor; the
headless driver writes nothing): that CPU is the "paint", which a refresh can make cheaper or
dearer without its own figure showing it. The store is tests/ui_data.py's (the real H200 trace
dealt to the hosts). The diagnosis runs once, before the timed refreshes (its own cost is
engine_cost.py's): every refresh shows that verdict.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from _common import (
    ensure_repo_on_path,
    ensure_tests_on_path,
    median,
    percentile,
    table,
    write_json,
)

ensure_repo_on_path()
ensure_tests_on_path()

from ui_data import load_trace, scale_store, trace_sample  # noqa: E402

from verl_top.diagnosis.engine import Engine  # noqa: E402
from verl_top.inputs import Inputs  # noqa: E402
from verl_top.sources.pipeline import Pipeline  # noqa: E402
from verl_top.ui.app import VerlTopApp  # noqa: E402


class OnceEngine:
    """The real engine, evaluated once; later calls return that verdict (the refresh is timed,
    not the diagnosis)."""

    def __init__(self) -> None:
        self.engine = Engine()
        self.verdict: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def evaluate(self, store: Any, *args: Any) -> Any:
        if self.verdict is None:
            self.verdict = self.engine.evaluate(store, *args)
        return self.verdict


PAINT_S = 0.05  # the screen is drawn within a frame (1/60 s) of a refresh


async def _painted(pilot: Any, cpu: list[float]) -> None:
    """Let the app draw what the refresh changed; the CPU that took (ms)."""
    c = time.process_time()
    await pilot.pause(PAINT_S)
    cpu.append((time.process_time() - c) * 1000)


def _timed(fn: Any, wall: list[float], cpu: list[float]) -> None:
    t, c = time.perf_counter(), time.process_time()
    fn()
    cpu.append((time.process_time() - c) * 1000)
    wall.append((time.perf_counter() - t) * 1000)


async def measure(hosts: int, rounds: int) -> dict[str, Any]:
    """``rounds`` refreshes of each kind at ``hosts`` × 8 GPUs; the figures in ms."""
    store = scale_store(hosts)
    rows = load_trace()
    inputs = Inputs(store=store, pipeline=Pipeline(store, parsers={}), title="bench")
    app = VerlTopApp(inputs, engine=OnceEngine(), live=False)
    kinds = ("all_new_cpu", "all_new_wall", "all_new_paint_cpu", "unchanged_cpu", "unchanged_wall")
    series: dict[str, list[float]] = {k: [] for k in kinds}
    async with app.run_test(size=(200, 60)) as pilot:
        await pilot.pause()
        for r in range(rounds):
            now = store.now + 1
            for g in list(store.iter_gpus()):
                store.ingest(
                    trace_sample(rows[(r * 7 + g.index) % len(rows)], g.host, g.index, now, True),
                    received=now,
                )
            _timed(app.refresh_now, series["all_new_wall"], series["all_new_cpu"])
            await _painted(pilot, series["all_new_paint_cpu"])
            store.version += 1
            _timed(app.refresh_now, series["unchanged_wall"], series["unchanged_cpu"])
            await pilot.pause(PAINT_S)
    out: dict[str, Any] = {"hosts": hosts, "gpus": hosts * 8, "rounds": rounds}
    for key, vals in series.items():
        out[f"{key}_ms_p50"] = median(vals)
        out[f"{key}_ms_p95"] = percentile(vals, 95)
    return out


HEADERS = [
    "GPUs",
    "all new: CPU p50/p95 ms",
    "wall p50/p95 ms",
    "its paint: CPU p50/p95 ms",
    "nothing new: CPU p50/p95 ms",
    "wall p50/p95 ms",
]


def _pair(r: dict[str, Any], key: str) -> str:
    return f"{r[f'{key}_ms_p50']:.1f} / {r[f'{key}_ms_p95']:.1f}"


def main(argv: list[str] | None = None) -> int:
    """Command line entry."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("hosts", nargs="*", type=int, default=[16], help="hosts (× 8 GPUs each)")
    p.add_argument("--rounds", type=int, default=10, help="refreshes of each kind per size")
    p.add_argument("--json-out", default=None, metavar="FILE")
    args = p.parse_args(argv)
    results = [asyncio.run(measure(h, max(1, args.rounds))) for h in args.hosts]
    rows = [
        [
            r["gpus"],
            _pair(r, "all_new_cpu"),
            _pair(r, "all_new_wall"),
            _pair(r, "all_new_paint_cpu"),
            _pair(r, "unchanged_cpu"),
            _pair(r, "unchanged_wall"),
        ]
        for r in results
    ]
    print(table(HEADERS, rows))
    write_json(
        args.json_out,
        {
            "benchmark": "ui_refresh",
            "argv": sys.argv[1:] if argv is None else argv,
            "rows": results,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
