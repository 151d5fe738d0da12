"""Client cost of ``--prometheus`` at scale: 128 hosts x 8 GPUs read from a real Prometheus.

    python benchmarks/prom_scale.py                          # 128 x 8 GPUs, 5 s interval, 6 rounds
    python benchmarks/prom_scale.py --hosts 16 --rounds 3 --json-out prom.json

A synthetic dcgm-exporter exposition (labels modelled on the real H100 EKS lines of
tests/fixtures/prometheus/dcgm_h100x8_eks_sampled.prom; every field verl-top reads, plus the
default list's other fields; values constructed) is served by ``python -m http.server`` in a
child process and scraped by the real ``/usr/bin/prometheus`` (child process, temporary data
directory, 127.0.0.x). Neither counts as client.

In this process, the real :class:`PrometheusSource` feeds a real ``Pipeline`` -> ``Store``:
first the start-up range queries (history), then ``--rounds`` rounds every ``--interval`` s.
Per round: queries, bytes received, wall time and client CPU (``process_time``: decoding,
JSON through ``untrusted.loads``, records, store ingest), and CPU as a share of the interval.
Side by side (alternate rounds), the comparator asks the same metrics *without* the ``by``
aggregation (every raw series with all its labels), which is what a naive client does.

node_exporter (``--node-cores``, 0: none): a child process serves one node_exporter page per
host (``instance`` and ``nodename`` labels naming the DCGM host, kept by ``honor_labels``; CPU
seconds per core and mode, network, disk and memory series; counters advance with time so
``irate`` has values; CONSTRUCTED values). The rounds then alternate three variants: verl-top
with its node_exporter queries, verl-top without them (``PromSettings.node=False``: what the
DCGM rounds cost alone), and the raw-series comparator: the with/without ratio is the cost
of the host metrics, measured in one run. Every measured round of the first asks the host
queries (live they are asked once per node_exporter scrape interval, NodePlan).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from _common import ensure_repo_on_path, median, table, write_json

ensure_repo_on_path()

from verl_top.sources.pipeline import Pipeline  # noqa: E402
from verl_top.sources.prometheus import GPU_METRICS, PrometheusSource, PromSettings  # noqa: E402
from verl_top.store import Store, StoreLimits  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from promserver import PROMETHEUS, PromServer, free_port  # noqa: E402

# Fields of dcgm-exporter's default list that verl-top does not read (they cost scrape and
# storage, not client work, since verl-top asks for its metrics by name).
OTHER_FIELDS = (
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
)


def exposition(hosts: int, gpus: int) -> str:
    """CONSTRUCTED values on real-looking labels: one line per field, GPU and host."""
    lines = []
    fields = [m.metric for m in GPU_METRICS] + list(OTHER_FIELDS)
    for name in fields:
        lines.append(f"# HELP {name} synthetic\n# TYPE {name} gauge")
        for h in range(hosts):
            for g in range(gpus):
                labels = (
                    f'gpu="{g}",UUID="GPU-{h:08x}-{g:04x}-0000-0000-000000000000",'
                    f'pci_bus_id="00000000:{0x53 + 17 * g:02X}:00.0",device="nvidia{g}",'
                    f'modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-{h:03d}",'
                    f'DCGM_FI_DRIVER_VERSION="580.105.08"'
                )
                value = 0.25 + 0.5 * ((h * gpus + g) % 7) / 7 if "PROF" in name else 40 + g
                lines.append(f"{name}{{{labels}}} {value:.6f}")
    return "\n".join(lines) + "\n"


class RawSource(PrometheusSource):
    """The comparator: the same metrics, every raw series with all its labels (no ``by``)."""

    def __init__(self, settings: PromSettings) -> None:
        super().__init__(settings)
        sel = settings.selector
        self.gpu_exprs = {m.field: f"{m.metric}{{{sel}}}" for m in GPU_METRICS}


async def measure(source: PrometheusSource, pipeline: Pipeline) -> dict[str, float]:
    """One round: queries, bytes, wall and CPU seconds."""
    q0, b0 = source.client.requests, source.client.bytes
    c0, w0 = time.process_time(), time.perf_counter()
    await source.poll(pipeline.emit)
    return {
        "queries": source.client.requests - q0,
        "bytes": source.client.bytes - b0,
        "wall_s": time.perf_counter() - w0,
        "cpu_s": time.process_time() - c0,
    }


class LagProbe:
    """The event loop's worst lag behind a 50 ms ticker: how long the screen would freeze."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t0 = loop.time()
            await asyncio.sleep(0.05)
            self.worst = max(self.worst, loop.time() - t0 - 0.05)

    def start(self) -> None:
        self.worst = 0.0
        self._task = asyncio.create_task(self._tick())

    def stop(self) -> float:
        if self._task is not None:
            self._task.cancel()
        return self.worst


NODE_SERVER = r"""
import sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

hosts, cores, addr, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
MODES = ("idle", "iowait", "irq", "nice", "softirq", "steal", "system", "user")
SHARE = (0.55, 0.02, 0.0, 0.0, 0.01, 0.0, 0.07, 0.35)  # of each second, per core


def page(now):
    out = []
    for h in range(hosts):
        inst = f'instance="gpu-node-{h:03d}:9100"'
        out.append(f'node_uname_info{{{inst},nodename="gpu-node-{h:03d}",sysname="Linux"}} 1')
        for c in range(cores):
            for mode, share in zip(MODES, SHARE):
                out.append(f'node_cpu_seconds_total{{{inst},cpu="{c}",mode="{mode}"}} {now * share:.2f}')
        for dev, rate in (("lo", 9e6), ("eth0", 2e6), ("ib0", 3e9), ("docker0", 1e3)):
            out.append(f'node_network_receive_bytes_total{{{inst},device="{dev}"}} {now * rate:.0f}')
            out.append(f'node_network_transmit_bytes_total{{{inst},device="{dev}"}} {now * rate / 2:.0f}')
        for dev in ("nvme0n1", "nvme1n1", "sda", "dm-0"):
            out.append(f'node_disk_read_bytes_total{{{inst},device="{dev}"}} {now * 5e6:.0f}')
            out.append(f'node_disk_written_bytes_total{{{inst},device="{dev}"}} {now * 2e7:.0f}')
        out.append(f'node_memory_MemTotal_bytes{{{inst}}} 2.16e12')
        out.append(f'node_memory_MemAvailable_bytes{{{inst}}} 1.5e12')
        for name, v in (("node_load1", 31.5), ("node_load5", 30.1), ("node_load15", 29.8)):
            out.append(f'{name}{{{inst}}} {v}')
    return ("\n".join(out) + "\n").encode()


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = page(time.time())
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


ThreadingHTTPServer((addr, port), Handler).serve_forever()
"""


async def run(url: str, args: argparse.Namespace) -> dict:
    settings = PromSettings(
        url=url, interval=args.interval, budget=args.interval, request_timeout=args.interval
    )
    store = Store(StoreLimits(window_s=300.0, points=61))
    pipeline = Pipeline(store, parsers={})
    ours, raw = PrometheusSource(settings), RawSource(settings)
    gpus_only = PrometheusSource(replace(settings, node=False))
    lag = LagProbe()
    lag.start()
    c0, w0, q0 = time.process_time(), time.perf_counter(), ours.client.requests
    await ours._history(pipeline.emit)  # noqa: SLF001 - the start-up step on its own
    history = {
        "queries": ours.client.requests - q0,
        "bytes": ours.client.bytes,
        "wall_s": time.perf_counter() - w0,
        "cpu_s": time.process_time() - c0,
        "points_per_gpu": min((len(g.history) for g in store.iter_gpus()), default=0),
        "loop_lag_max_s": lag.stop(),
    }
    variants = [("aggregated (verl-top)", ours), ("raw series", raw)]
    if args.node_cores:
        variants.insert(1, (GPUS_ONLY, gpus_only))
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name, _ in variants}
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    for i in range(args.rounds * len(variants)):
        # every variant inside each interval; the order turns each round (drift falls on all)
        turn = i // len(variants)
        name, src = variants[(i + turn) % len(variants)]
        if src.node_plan is not None:
            # Every measured round asks the host queries (live, they run once per
            # node_exporter scrape interval): the table shows a round that has them.
            src.node_plan.next_at = -math.inf
        lag.start()
        row = await measure(src, pipeline)
        row["loop_lag_max_s"] = lag.stop()
        rounds[name].append(row)
        next_at += args.interval / len(variants)
        await asyncio.sleep(max(0.0, next_at - loop.time()))
    for _, src in variants:
        await src.client.close()
    hosts = sum(1 for h in store.hosts.values() if h.latest is not None)
    return {"history": history, "rounds": rounds, "gpus": store.gpu_count(), "host_samples": hosts}


GPUS_ONLY = "verl-top without node_exporter"


def serve_file(body: str, addr: str, workdir: Path) -> tuple[subprocess.Popen, int]:
    www = workdir / "www"
    www.mkdir()
    (www / "metrics").write_text(body)
    port = free_port(addr)
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", addr, "--directory", str(www)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return proc, port


def require_prometheus() -> None:
    """Exit with the way to install it when the real Prometheus is missing."""
    if not os.path.exists(PROMETHEUS):
        sys.exit(f"{PROMETHEUS} not installed (apt-get install -y prometheus)")


def serve_exposition(
    hosts: int, gpus: int, addr: str, workdir: Path
) -> tuple[str, subprocess.Popen, str]:
    """The synthetic exposition served over HTTP: (body, server process, its host:port)."""
    body = exposition(hosts, gpus)
    http, port = serve_file(body, addr, workdir)
    return body, http, f"{addr}:{port}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=128)
    parser.add_argument("--gpus-per-host", type=int, default=8)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--history-wait", type=float, default=20.0, help="s of data before start")
    parser.add_argument("--scrape-interval", default="5s", help="Prometheus scrape_interval")
    parser.add_argument("--addr", default="127.0.0.94")
    parser.add_argument(
        "--node-cores", type=int, default=64, help="cores per node_exporter page (0: none)"
    )
    parser.add_argument("--json-out")
    args = parser.parse_args()
    require_prometheus()
    n = args.hosts * args.gpus_per_host
    with tempfile.TemporaryDirectory(prefix="verltop-prombench-") as tmp:
        work = Path(tmp)
        body, http, target = serve_exposition(args.hosts, args.gpus_per_host, args.addr, work)
        targets = {"dcgm": [target]}
        node = None
        if args.node_cores:
            node_port = free_port(args.addr)
            node = subprocess.Popen(
                [sys.executable, "-c", NODE_SERVER, str(args.hosts), str(args.node_cores),
                 args.addr, str(node_port)],
            )  # fmt: skip
            targets["node"] = [f"{args.addr}:{node_port}"]
        prom = PromServer(work / "prom", targets, args.addr, scrape_interval=args.scrape_interval)
        try:
            prom.wait_for("DCGM_FI_DEV_GPU_TEMP", n, timeout=60)
            if node is not None:
                prom.wait_for("node_load1", args.hosts, timeout=60)
            time.sleep(args.history_wait)
            result = asyncio.run(run(prom.url, args))
        finally:
            prom.stop()
            for child in (http, node):
                if child is not None:
                    os.kill(child.pid, signal.SIGTERM)
                    child.wait(timeout=10)
    hist = result["history"]
    print(
        f"{n} GPUs ({args.hosts} hosts x {args.gpus_per_host}), exposition {len(body) / 1e6:.1f} MB "
        f"per scrape, interval {args.interval:g} s; GPUs in the store: {result['gpus']}, "
        f"hosts with node_exporter values: {result['host_samples']}"
    )
    print(
        f"start-up history: {hist['queries']} range queries, {hist['bytes'] / 1e6:.1f} MB, "
        f"{hist['wall_s']:.2f} s wall, {hist['cpu_s']:.2f} s client CPU, "
        f"{hist['points_per_gpu']} points per GPU, event loop lag max {hist['loop_lag_max_s']:.2f} s"
    )
    rows = []
    summary = {}
    for name, rs in result["rounds"].items():
        cpu = median([r["cpu_s"] for r in rs]) or 0.0
        summary[name] = cpu
        rows.append(
            [
                name,
                len(rs),
                median([r["queries"] for r in rs]),
                (median([r["bytes"] for r in rs]) or 0) / 1e6,
                median([r["wall_s"] for r in rs]),
                cpu,
                max(r["cpu_s"] for r in rs),
                100 * cpu / args.interval,
                max(r["loop_lag_max_s"] for r in rs),
            ]
        )
    print(
        table(
            [
                "variant",
                "rounds",
                "queries/round",
                "MB/round",
                "wall s p50",
                "CPU s p50",
                "CPU s max",
                f"CPU % of {args.interval:g} s",
                "loop lag max s",
            ],
            rows,
        )
    )
    ours, raw = summary["aggregated (verl-top)"], summary["raw series"]
    if ours:
        print(f"raw / aggregated client CPU: {raw / ours:.1f}x")
    if summary.get(GPUS_ONLY):
        ratio = ours / summary[GPUS_ONLY]
        print(f"with / without node_exporter client CPU (same run, alternating): {ratio:.2f}x")
    write_json(args.json_out, {"args": vars(args), **result, "exposition_bytes": len(body)})


if __name__ == "__main__":
    main()
