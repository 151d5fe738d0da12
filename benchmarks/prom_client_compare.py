"""The Prometheus client, BASE against HEAD, alternating against one real Prometheus (ratios).

    python benchmarks/prom_client_compare.py                     # BASE = main, 128 x 8 GPUs
    python benchmarks/prom_client_compare.py --base HEAD~3 --pairs 4 --rounds 6

The same synthetic dcgm-exporter exposition as ``benchmarks/prom_scale.py`` (labels modelled on
the real H100 EKS capture, values constructed) is scraped by the real ``/usr/bin/prometheus``.
``verl_top`` as it is at ``--base`` is extracted with ``git archive``; then child processes run
the real :class:`PrometheusSource` -> ``Pipeline`` -> ``Store`` of BASE and of the working tree
(HEAD) in turn, ``--pairs`` times each, so a busy shared machine slows both alike. Each child
does the start-up history and ``--rounds`` rounds and reports client CPU (``process_time``) and
wall time; the table gives the medians over all children of a side and HEAD/BASE.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import REPO, ensure_repo_on_path, median, table

ensure_repo_on_path()

from prom_scale import exposition, serve_file  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))
from promserver import PROMETHEUS, PromServer  # noqa: E402

CHILD = """
import asyncio, json, sys, time
from verl_top.sources.pipeline import Pipeline
from verl_top.sources.prometheus import PrometheusSource, PromSettings
from verl_top.store import Store, StoreLimits

async def main(url, rounds, interval):
    settings = PromSettings(url=url, interval=interval, budget=interval, request_timeout=interval)
    store = Store(StoreLimits(window_s=300.0, points=61))
    pipeline = Pipeline(store, parsers={})
    source = PrometheusSource(settings)
    c0, w0 = time.process_time(), time.perf_counter()
    await source._history(pipeline.emit)
    out = {"history_cpu_s": time.process_time() - c0, "history_wall_s": time.perf_counter() - w0}
    out["points_per_gpu"] = min((len(g.history) for g in store.iter_gpus()), default=0)
    cpu, wall = [], []
    for _ in range(rounds):
        c0, w0 = time.process_time(), time.perf_counter()
        await source.poll(pipeline.emit)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
        await asyncio.sleep(0.2)
    close = getattr(source.client, "close", None)
    if close is not None:
        await close()
    out.update(round_cpu_s=cpu, round_wall_s=wall, gpus=store.gpu_count())
    out["queries"] = source.client.requests
    print(json.dumps(out))

asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
"""


def extract(rev: str, into: Path) -> Path:
    """``verl_top`` at git revision ``rev`` under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "verl_top"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def child(root: Path, url: str, args: argparse.Namespace) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, url, str(args.rounds), str(args.interval)],
        env=env, capture_output=True, text=True, timeout=600, cwd=root,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"child under {root} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default="main")
    parser.add_argument("--hosts", type=int, default=128)
    parser.add_argument("--gpus-per-host", type=int, default=8)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--history-wait", type=float, default=20.0)
    parser.add_argument("--addr", default="127.0.0.95")
    args = parser.parse_args()
    if not os.path.exists(PROMETHEUS):
        sys.exit(f"{PROMETHEUS} not installed (apt-get install -y prometheus)")
    n = args.hosts * args.gpus_per_host
    with tempfile.TemporaryDirectory(prefix="verltop-promcmp-") as tmp:
        work = Path(tmp)
        (work / "base").mkdir()
        sides = {"BASE": extract(args.base, work / "base"), "HEAD": REPO}
        http, port = serve_file(exposition(args.hosts, args.gpus_per_host), args.addr, work)
        prom = PromServer(work / "prom", {"dcgm": [f"{args.addr}:{port}"]}, args.addr, "5s")
        results: dict[str, list[dict]] = {"BASE": [], "HEAD": []}
        try:
            prom.wait_for("DCGM_FI_DEV_GPU_TEMP", n, timeout=90)
            time.sleep(args.history_wait)
            for _ in range(args.pairs):
                for name, root in sides.items():
                    results[name].append(child(root, prom.url, args))
        finally:
            prom.stop()
            os.kill(http.pid, signal.SIGTERM)
            http.wait(timeout=10)
    rows, med = [], {}
    for name, runs in results.items():
        rounds = [c for r in runs for c in r["round_cpu_s"]]
        med[name] = {
            "round": median(rounds) or 0.0,
            "history": median([r["history_cpu_s"] for r in runs]) or 0.0,
        }
        rows.append([
            name, len(runs), runs[0]["gpus"], runs[0]["points_per_gpu"],
            med[name]["history"], median([r["history_wall_s"] for r in runs]),
            med[name]["round"], median([w for r in runs for w in r["round_wall_s"]]),
        ])  # fmt: skip
    print(f"{n} GPUs; BASE = {args.base}; {args.pairs} children per side, alternating")
    print(
        table(
            ["side", "children", "GPUs", "points/GPU", "history CPU s", "history wall s",
             "round CPU s p50", "round wall s p50"],
            rows,
        )
    )  # fmt: skip
    for key in ("history", "round"):
        if med["BASE"][key]:
            print(f"HEAD/BASE {key} CPU: {med['HEAD'][key] / med['BASE'][key]:.2f}")


if __name__ == "__main__":
    main()
