"""Cost of one app refresh with pane 1 visible, for N hosts × 8 GPUs (headless Textual).

    PYTHONPATH=.:tests python benchmarks/ui_refresh.py 16 128

For each size (median of 10): a refresh after every GPU got a new sample
(the 1 Hz steady state: every row rebuilt, changed cells written), and a refresh with nothing
new. The diagnosis engine is left out (its own cost is measured by its own benchmark).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

from ui_data import load_trace, scale_store, trace_sample

from verl_top.inputs import Inputs
from verl_top.sources.pipeline import Pipeline
from verl_top.ui.app import VerlTopApp


class NoEngine:
    def evaluate(self, store):  # noqa: ANN001, ANN201 - stand-in
        return None


async def measure(hosts: int, rounds: int = 10) -> dict[str, float]:
    store = scale_store(hosts)
    rows = load_trace()
    inputs = Inputs(store=store, pipeline=Pipeline(store, parsers={}), title="bench")
    app = VerlTopApp(inputs, engine=NoEngine(), live=False)
    out: dict[str, list[float]] = {"all_new": [], "unchanged": []}
    async with app.run_test(size=(200, 60)) as pilot:
        await pilot.pause()
        for r in range(rounds):
            now = store.now + 1
            for g in list(store.iter_gpus()):
                store.ingest(
                    trace_sample(rows[(r * 7 + g.index) % len(rows)], g.host, g.index, now, True),
                    received=now,
                )
            t = time.perf_counter()
            app.refresh_now()
            out["all_new"].append(time.perf_counter() - t)
            await pilot.pause()
            store.version += 1
            t = time.perf_counter()
            app.refresh_now()
            out["unchanged"].append(time.perf_counter() - t)
            await pilot.pause()
    return {k: statistics.median(v) * 1000 for k, v in out.items()}


def main() -> None:
    for hosts in [int(a) for a in sys.argv[1:]] or [16]:
        res = asyncio.run(measure(hosts))
        print(
            f"{hosts} hosts × 8 = {hosts * 8} GPUs: "
            + ", ".join(f"{k} {v:.1f} ms" for k, v in res.items())
        )


if __name__ == "__main__":
    main()
