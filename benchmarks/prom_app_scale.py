"""The real app at scale through ``--prometheus``: N GPUs scraped by a real Prometheus, on screen.

    python benchmarks/prom_app_scale.py --hosts 2048 --duration 60    # 16384 GPUs
    python benchmarks/prom_app_scale.py --hosts 16 --duration 10      # quick

``benchmarks/prom_scale.py`` measures the Prometheus source alone (a round's queries, decoding
and ingest). This runs the whole client as a user gets it: the same synthetic dcgm-exporter
exposition (prom_scale.py's: labels modelled on the real H100 EKS capture, values constructed),
served by ``python -m http.server`` and scraped by the real ``/usr/bin/prometheus`` (child
processes, not counted); in this process the real ``PrometheusSource`` (the CLI's default
interval, round budget and request timeout unless given) feeds ``Pipeline`` -> ``Store`` (limits as ``build_inputs``
makes them for a 1 s refresh and a 300 s window) and the real ``VerlTopApp`` runs headless
(live, its 1 s refresh timer, the real diagnosis ``Engine`` in its worker thread) with pane 1
(the GPU table) visible.

Measured over ``--duration`` s after the start-up history and ``--warmup`` s: client CPU % of
one core (``process_time`` / wall), pane 1's refresh (wall and CPU, p50 / p95), the engine
(wall and thread CPU, p50), the event loop's lag (max, and waits over 50 ms), full garbage
collections, RSS, the median points per GPU (a round that misses its budget keeps the last
values and adds none), the source's state, and how many GPUs the store holds (the store caps GPU series at
``StoreLimits.gpus``; ``--gpus-cap`` lifts the cap to measure every GPU of the exposition).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ensure_repo_on_path, median, percentile, table, write_json
from client_scale import (
    GcClock,
    LoopLag,
    TimedEngine,
    Timings,
    rss_mb,
    time_pane,
    time_sliced_summary,
)
from prom_scale import require_prometheus, serve_exposition

ensure_repo_on_path()

from verl_top.inputs import Inputs  # noqa: E402
from verl_top.sources.pipeline import Pipeline  # noqa: E402
from verl_top.sources.prometheus import PrometheusSource, PromSettings  # noqa: E402
from verl_top.store import Store, StoreLimits  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from promserver import PromServer  # noqa: E402

WINDOW_S = 300.0
REFRESH_S = 1.0


def app_limits(gpus_cap: int) -> StoreLimits:
    """The limits ``build_inputs`` gives a 1 s refresh and a 300 s window; GPU cap optional."""
    base = StoreLimits(window_s=WINDOW_S, points=max(120, int(WINDOW_S / REFRESH_S) + 1))
    if gpus_cap:
        base.gpus = gpus_cap
    return base


async def _wait_for_gpus(store: Store, want: int, limit_s: float) -> float:
    """Seconds until the store holds ``want`` GPUs with a sample (or ``limit_s`` passed)."""
    start = time.perf_counter()
    while time.perf_counter() - start < limit_s:
        if sum(1 for g in store.iter_gpus() if g.latest is not None) >= want:
            break
        await asyncio.sleep(0.2)
    return time.perf_counter() - start


async def run_app(url: str, args: argparse.Namespace, gpus: int) -> dict[str, Any]:
    """The app on the Prometheus source for ``args.duration`` s; returns the figures."""
    from verl_top.ui.app import VerlTopApp  # noqa: PLC0415

    store = Store(app_limits(args.gpus_cap))
    store.origin = "prometheus"
    pipeline = Pipeline(store, parsers={})
    source = PrometheusSource(
        PromSettings(
            url=url, interval=args.interval, budget=args.budget, request_timeout=args.timeout
        )
    )
    inputs = Inputs(store=store, pipeline=pipeline, sources=[source], title="bench", mode="LIVE")
    timings = Timings()
    app = VerlTopApp(inputs, refresh=REFRESH_S, engine=TimedEngine(timings), live=True)
    time_sliced_summary(app, timings)  # (pane_ms does not hold it: made before the refresh)
    out: dict[str, Any] = {"gpus_exposed": gpus, "gpu_cap": store.limits.gpus}
    async with app.run_test(headless=True, size=(200, 60)) as pilot:
        await pilot.pause()
        time_pane(app, timings)
        out["first_data_s"] = await _wait_for_gpus(store, min(gpus, store.limits.gpus), 120.0)
        await asyncio.sleep(args.warmup)
        lag, clock = LoopLag(), GcClock()
        gc.callbacks.append(clock)
        lag_task = asyncio.create_task(lag.run())
        timings.measuring = lag.on = clock.on = True
        w0, c0 = time.perf_counter(), time.process_time()
        await asyncio.sleep(args.duration)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        timings.measuring = lag.on = clock.on = False
        lag_task.cancel()
        gc.callbacks.remove(clock)
    out.update(
        cpu_pct=100.0 * cpu / wall,
        gpus_in_store=store.gpu_count(),
        gpus_with_samples=sum(1 for g in store.iter_gpus() if g.latest is not None),
        points_per_gpu=median([float(len(g.history)) for g in store.iter_gpus()]),
        rounds=source.rounds,
        source_state={k: f"{v.state}: {v.reason}"[:160] for k, v in store.sources.items()},
        loop_lag_ms_max=max(lag.lags_ms, default=None),
        loop_waits_over_50ms=sum(1 for v in lag.lags_ms if v > 50.0),
        gc_full=clock.count,
        gc_full_ms_per_s=1000.0 * clock.seconds / wall,
        rss_mb=rss_mb(),
        refreshes=len(timings.pane_ms),
        source_queries=source.client.requests,
    )
    for key in ("pane_ms", "pane_cpu_ms", "engine_ms", "engine_cpu_ms", "summary_ms"):
        vals = getattr(timings, key)
        out[f"{key}_p50"] = median(vals)
        out[f"{key}_p95"] = percentile(vals, 95)
    await source.client.close()
    return out


HEADERS = [
    "GPUs exposed",
    "GPUs in store",
    "CPU % core",
    "pane p50 / p95 ms",
    "pane CPU p50 / p95 ms",
    "summary in slices p50 / p95 ms",
    "engine p50 ms (CPU)",
    "loop lag max ms",
    "waits > 50 ms",
    "full GC ms/s",
    "RSS MB",
]


def report(r: dict[str, Any]) -> str:
    """The printed table."""

    def pair(key: str) -> str:
        a, b = r.get(f"{key}_p50"), r.get(f"{key}_p95")
        return "—" if a is None else f"{a:.0f} / {b:.0f}"

    engine = r.get("engine_ms_p50")
    row = [
        r["gpus_exposed"],
        r["gpus_in_store"],
        r["cpu_pct"],
        pair("pane_ms"),
        pair("pane_cpu_ms"),
        pair("summary_ms"),
        "—" if engine is None else f"{engine:.0f} ({r['engine_cpu_ms_p50']:.0f})",
        r["loop_lag_ms_max"],
        r["loop_waits_over_50ms"],
        r["gc_full_ms_per_s"],
        r["rss_mb"],
    ]
    return table(HEADERS, [row])


def main(argv: list[str] | None = None) -> int:
    """Command line entry."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--hosts", type=int, default=2048)
    p.add_argument("--gpus-per-host", type=int, default=8)
    p.add_argument("--duration", type=float, default=60.0, help="measured seconds")
    p.add_argument("--warmup", type=float, default=10.0, help="seconds after the first data")
    p.add_argument("--history-wait", type=float, default=20.0, help="s of data before start")
    p.add_argument("--scrape-interval", default="5s", help="Prometheus scrape_interval")
    defaults = PromSettings(url="http://127.0.0.1:1")
    p.add_argument("--interval", type=float, default=defaults.interval, help="--prom-interval")
    p.add_argument("--budget", type=float, default=defaults.budget, help="s for a round")
    p.add_argument("--timeout", type=float, default=defaults.request_timeout, help="s a request")
    p.add_argument("--addr", default="127.0.0.96")
    p.add_argument(
        "--gpus-cap", type=int, default=0, help="StoreLimits.gpus (0: the app's default cap)"
    )
    p.add_argument("--json-out", default=None, metavar="FILE")
    args = p.parse_args(argv)
    require_prometheus()
    gpus = args.hosts * args.gpus_per_host
    with tempfile.TemporaryDirectory(prefix="verltop-promapp-") as tmp:
        work = Path(tmp)
        body, http, target = serve_exposition(args.hosts, args.gpus_per_host, args.addr, work)
        prom = PromServer(work / "prom", {"dcgm": [target]}, args.addr, args.scrape_interval)
        try:
            prom.wait_for("DCGM_FI_DEV_GPU_TEMP", gpus, timeout=120)
            time.sleep(args.history_wait)
            result = asyncio.run(run_app(prom.url, args, gpus))
        finally:
            prom.stop()
            os.kill(http.pid, signal.SIGTERM)
            http.wait(timeout=10)
    result["exposition_mb"] = len(body) / 1e6
    print(
        f"{gpus} GPUs ({args.hosts} hosts x {args.gpus_per_host}), exposition "
        f"{result['exposition_mb']:.0f} MB per scrape every {args.scrape_interval}; "
        f"{result['points_per_gpu']:.0f} points per GPU (median); {result['rounds']} rounds "
        f"every {args.interval:g} s (budget {args.budget:g} s); {args.duration:g} s measured"
    )
    for name, state in result["source_state"].items():
        print(f"source {name}: {state}")
    print(report(result))
    write_json(args.json_out, {"benchmark": "prom_app_scale", "args": vars(args), "row": result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
