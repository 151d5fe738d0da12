"""Client cost at scale: N GPUs (N/8 hosts x 8) streaming at 1 Hz into the real app, headless.

    python benchmarks/client_scale.py                          # 8, 64, 256, 1024, 4096 GPUs, 20 s each
    python benchmarks/client_scale.py --gpus 1024 --duration 60 --json-out scale.json
    python benchmarks/client_scale.py --transport ssh --gpus 8,64   # real sshd + real agents

Each size runs in a fresh child process (clean RSS / CPU figures). In it:

- ``--transport wire`` (default): one async source synthesises the NDJSON lines the agents would
  send (templates taken from the real agent's replay backend on the H200 trace; ``t`` = wall time
  at synthesis; hosts spread over the second in 10 groups, like unsynchronised agents), and every
  line goes through ``protocol.Decoder`` -> ``Pipeline.emit`` -> ``Store``.
  ``--transport ssh``: one real OpenSSH sshd per host on 127.0.0.x and the real agent (replay
  backend, 8 GPUs, 1 Hz) behind each, read by ``SshSource`` (tests/sshd.py starts the daemons;
  needs root and /usr/sbin/sshd). The agents and sshd are the "nodes" and are not counted.
- The real ``VerlTopApp`` (live, its own 1 s refresh timer, the real diagnosis ``Engine``) runs
  headless (``App.run_test``) with pane 1 (the GPU table) visible.
- Before timing, the store is filled to its ring capacity (``StoreLimits.points`` samples per GPU,
  back-dated) so memory is that of a client that has run for an hour (every buffer is bounded).

Measured over the window after warm-up: client CPU % of one core (``process_time`` / wall), RSS
(psutil, at the end) and peak RSS, sample-to-screen latency (a sample's synthesis time ``t`` to
the moment the first refresh that includes it has been painted: ``call_after_refresh``),
ingest latency (``Store.latencies``: received - t), the refresh (``refresh_now``: diagnosis +
header + pane), the pane refresh alone, the engine alone (wall, and CPU of the thread running
it), refresh + paint, and the event loop's lag (how late a task sleeping 10 ms at a time wakes:
the longest any frame or key press waited).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import REPO, ensure_repo_on_path, median, percentile, table, write_json

ensure_repo_on_path()

from verl_top.agent.main import Agent, parse_args  # noqa: E402
from verl_top.agent.wire import encode_line  # noqa: E402
from verl_top.protocol import Decoder  # noqa: E402

TRACE = REPO / "tests" / "fixtures" / "agent" / "h200_phased_trace.jsonl"
GPUS_PER_HOST = 8
TEMPLATE_TICKS = 30
GROUPS = 10  # hosts are spread over the second in this many groups
TARGETS = {
    "cpu_pct": ("< 25 % of one core at 1024 GPUs", 25.0),
    "rss_mb": ("< 300 MB after an hour at 1024 GPUs", 300.0),
    "latency_p95_s": ("sample-to-screen p95 < 1.5 s", 1.5),
    "redraw_ms": ("a pane redraw < 50 ms", 50.0),
}


# ---------------------------------------------------------------------------------------------
# Line templates from the real agent


@dataclass
class Templates:
    """Per tick: encoded record bodies without host/t; the hello body."""

    hello: tuple[str, str]  # (type, body after the t field)
    ticks: list[list[tuple[str, str]]]
    hb: tuple[str, str] | None


def _split(rec: dict[str, Any]) -> tuple[str, str]:
    body = {k: v for k, v in rec.items() if k not in ("v", "type", "host", "t")}
    text = encode_line(body)
    return rec["type"], ("," + text[1:]) if len(text) > 2 else "}"


def make_templates() -> Templates:
    """Run the real agent (replay backend, 8 GPUs) for a few ticks and keep its lines."""
    argv = ["--backend", "replay", "--replay-trace", str(TRACE), "--replay-gpus", "8"]
    agent = Agent(parse_args([*argv, "--host", "x", "--no-procs"]))
    try:
        hello = _split(agent.hello())
        ticks, hb = [], None
        for i in range(TEMPLATE_TICKS):
            out = []
            for rec in agent.tick(1000.0 + i):
                if rec["type"] == "hb":
                    hb = _split(rec)
                elif rec["type"] in ("gpu", "host"):
                    out.append(_split(rec))
            ticks.append(out)
    finally:
        agent.close()
    return Templates(hello, ticks, hb)


def line(rtype: str, host: str, t: float, rest: str) -> str:
    """One wire line, fields in the agent's order."""
    return f'{{"v":1,"type":"{rtype}","host":"{host}","t":{t:.3f}{rest}'


# ---------------------------------------------------------------------------------------------
# The synthetic cluster source (wire level)


@dataclass
class Pending:
    """Batches of GPU samples emitted and not yet on screen: (t at synthesis, count)."""

    batches: list[tuple[float, int]] = field(default_factory=list)

    def take(self) -> list[tuple[float, int]]:
        out, self.batches = self.batches, []
        return out


class SyntheticCluster:
    """Emits what ``hosts`` agents would send, through the real decoder."""

    name = "synthetic-cluster"

    def __init__(self, hosts: int, rate: float, templates: Templates, pending: Pending) -> None:
        self.hosts = [f"node{i:04d}" for i in range(hosts)]
        self.rate = rate
        self.tpl = templates
        self.pending = pending
        self.decoders = {h: Decoder() for h in self.hosts}
        self.tick = 0
        self.ingest_cpu_s = 0.0  # CPU spent decoding + storing live lines (while measuring)
        self.measuring = False

    def feed_host(self, emit: Callable[[Any], None], host: str, t: float, k: int) -> int:
        """Decode and emit one host's lines of tick ``k``; returns the GPU samples emitted."""
        dec = self.decoders[host]
        n = 0
        rows = self.tpl.ticks[k % len(self.tpl.ticks)]
        if k % 5 == 0 and self.tpl.hb is not None:
            rows = [*rows, self.tpl.hb]
        for rtype, rest in rows:
            rec = dec.decode(line(rtype, host, t, rest))
            if rec is not None:
                emit(rec)
                n += rtype == "gpu"
        return n

    def hello(self, emit: Callable[[Any], None], t: float) -> None:
        """Every host's hello line."""
        rtype, rest = self.tpl.hello
        for host in self.hosts:
            rec = self.decoders[host].decode(line(rtype, host, t, rest))
            if rec is not None:
                emit(rec)

    def wire_bytes(self) -> dict[str, float]:
        """Bytes on the wire per GPU per sample (JSON lines as the agent writes them)."""
        host = self.hosts[0]
        gpu = hostb = ticks = 0
        for k in range(len(self.tpl.ticks)):
            for rtype, rest in self.tpl.ticks[k]:
                size = len(line(rtype, host, 1.0e9, rest).encode()) + 1  # + newline
                if rtype == "gpu":
                    gpu += size
                else:
                    hostb += size
            ticks += 1
        per = ticks * GPUS_PER_HOST
        return {
            "gpu_line_b": gpu / per,
            "host_share_b": hostb / per,
            "total_b": (gpu + hostb) / per,
        }

    def prefill(self, emit: Callable[[Any], None], points: int, now: float) -> None:
        """Fill every ring: ``points`` back-dated ticks (one per period) for every host."""
        for i in range(points):
            t = now - (points - i) / self.rate
            for host in self.hosts:
                self.feed_host(emit, host, t, i)
        self.tick = points

    async def run(self, emit: Callable[[Any], None]) -> None:
        """1/rate ticks forever; the hosts of a tick in GROUPS slices spread over the period."""
        loop = asyncio.get_running_loop()
        period = 1.0 / self.rate
        groups = [self.hosts[i::GROUPS] for i in range(min(GROUPS, len(self.hosts)))]
        nxt = loop.time()
        while True:
            for g, hosts in enumerate(groups):
                at = nxt + period * g / len(groups)
                delay = at - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                t = time.time()
                c0 = time.process_time()
                n = sum(self.feed_host(emit, h, t, self.tick) for h in hosts)
                if self.measuring:
                    self.ingest_cpu_s += time.process_time() - c0
                self.pending.batches.append((t, n))
            self.tick += 1
            nxt += period
            nxt = max(nxt, loop.time())


# ---------------------------------------------------------------------------------------------
# SSH transport: real sshd daemons and agents


class SshCluster:
    """One sshd per host on 127.0.0.x, an ``SshSource`` per host running the real agent."""

    def __init__(self, hosts: int, rate: float, pending: Pending) -> None:
        sys.path.insert(0, str(REPO / "tests"))
        from sshd import SshdFactory, make_settings, new_key, spec_for  # noqa: PLC0415

        from verl_top.sources.ssh import SshSource  # noqa: PLC0415

        self.tmp = Path(tempfile.mkdtemp(prefix="verl-top-bench-ssh-"))
        client, key = new_key(self.tmp / "client_ed25519")
        auth = self.tmp / "authorized_keys"
        auth.write_bytes(key.export_public_key("openssh"))
        auth.chmod(0o600)
        self.factory = SshdFactory(self.tmp / "sshd", auth, 2)
        self.daemons = [self.factory.start(log_level="ERROR") for _ in range(hosts)]
        settings = make_settings(self.tmp, {"client": client}, self.daemons, remote_python())
        agent_args = [
            "--interval",
            f"{1.0 / rate:g}",
            "--backend",
            "replay",
            "--replay-trace",
            str(TRACE),
            "--replay-gpus",
            str(GPUS_PER_HOST),
        ]
        self.sources = [SshSource(spec_for(d), settings, agent_args) for d in self.daemons]
        self.pending = pending

    def stop(self) -> None:
        """Stop every daemon (by pid) and what runs under it."""
        self.factory.stop_all()


def remote_python() -> str:
    """The python sshd's default PATH finds (as the tests do), else this one."""
    import shutil  # noqa: PLC0415

    return (
        "python3"
        if shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
        else sys.executable
    )


# ---------------------------------------------------------------------------------------------
# One size, in this process


@dataclass
class Timings:
    """What the instrumented app records."""

    refresh_ms: list[float] = field(default_factory=list)
    paint_ms: list[float] = field(default_factory=list)
    pane_ms: list[float] = field(default_factory=list)
    pane_cpu_ms: list[float] = field(default_factory=list)
    engine_ms: list[float] = field(default_factory=list)
    engine_cpu_ms: list[float] = field(default_factory=list)
    summary_ms: list[float] = field(default_factory=list)  # a tick's summary made in slices
    latency: list[tuple[float, int]] = field(default_factory=list)  # (seconds, samples)
    measuring: bool = False


class TimedEngine:
    """The real diagnosis engine, timed (wall, and CPU of the thread that runs it)."""

    def __init__(self, timings: Timings) -> None:
        from verl_top.diagnosis.engine import Engine  # noqa: PLC0415

        self.engine = Engine()
        self.timings = timings

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)  # thresholds, and whatever else the monitor reads

    def evaluate(self, store: Any, *args: Any) -> Any:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return self.engine.evaluate(store, *args)
        finally:
            if self.timings.measuring:
                self.timings.engine_ms.append((time.perf_counter() - t0) * 1000)
                self.timings.engine_cpu_ms.append((time.thread_time() - c0) * 1000)


def time_sliced_summary(app: Any, timings: Timings) -> None:
    """Time the summary a tick makes in slices before its refresh (wall, from its start to its
    end: the loop's turns between included), where the app has one (not before issue 30)."""
    summaries = getattr(app, "summaries", None)
    sliced = getattr(summaries, "compute_sliced", None)
    if sliced is None:
        return

    async def timed(store: Any, per_turn: int) -> Any:
        t0 = time.perf_counter()
        try:
            return await sliced(store, per_turn)
        finally:
            if timings.measuring:
                timings.summary_ms.append((time.perf_counter() - t0) * 1000)

    summaries.compute_sliced = timed


def time_pane(app: Any, timings: Timings) -> None:
    """Time pane 1's refresh (wall and CPU) into ``timings`` while it is measuring."""
    pane = app.pane(1)
    original = pane.refresh_pane

    def timed(st: Any, verdict: Any) -> None:
        t0, c0 = time.perf_counter(), time.process_time()
        original(st, verdict)
        if timings.measuring:
            timings.pane_ms.append((time.perf_counter() - t0) * 1000)
            timings.pane_cpu_ms.append((time.process_time() - c0) * 1000)

    pane.refresh_pane = timed


class LoopLag:
    """How late the event loop wakes a task that sleeps ``period`` s at a time: the longest any
    frame, key press or sample waited for the loop while measuring."""

    def __init__(self, period: float = 0.01) -> None:
        self.period = period
        self.lags_ms: list[float] = []
        self.on = False

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t0 = loop.time()
            await asyncio.sleep(self.period)
            if self.on:
                self.lags_ms.append(max(0.0, (loop.time() - t0 - self.period) * 1000))


def weighted_percentile(pairs: list[tuple[float, int]], q: float) -> float | None:
    """Percentile of values each counted ``weight`` times."""
    pairs = sorted(p for p in pairs if p[1] > 0)
    total = sum(w for _, w in pairs)
    if not total:
        return None
    goal = total * q / 100.0
    seen = 0
    for v, w in pairs:
        seen += w
        if seen >= goal:
            return v
    return pairs[-1][0]


def rss_mb() -> float | None:
    """Current RSS of this process."""
    try:
        import psutil  # noqa: PLC0415

        return psutil.Process().memory_info().rss / 2**20
    except Exception:
        return None


class GcClock:
    """Count and time of full (generation 2) garbage collections while measuring."""

    def __init__(self) -> None:
        self.count = 0
        self.seconds = 0.0
        self.on = False
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if info.get("generation") != 2 or not self.on:
            return
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.count += 1
            self.seconds += time.perf_counter() - self._t0


async def run_one(
    gpus: int,
    duration: float,
    warmup: float,
    transport: str,
    prefill: bool,
    prefill_points: int = 0,
    profile: str = "",
) -> dict:
    """Run the app against ``gpus`` GPUs for ``duration`` s; returns the figures."""
    from verl_top.inputs import Inputs  # noqa: PLC0415
    from verl_top.sources.pipeline import Pipeline  # noqa: PLC0415
    from verl_top.store import Store, StoreLimits  # noqa: PLC0415
    from verl_top.ui.app import VerlTopApp  # noqa: PLC0415

    hosts = max(1, gpus // GPUS_PER_HOST)
    store = Store(StoreLimits())
    pipeline = Pipeline(store)
    pending = Pending()
    timings = Timings()
    result: dict[str, Any] = {"gpus": hosts * GPUS_PER_HOST, "hosts": hosts, "transport": transport}
    ssh: SshCluster | None = None
    t_setup = time.perf_counter()
    if transport == "ssh":
        ssh = SshCluster(hosts, 1.0, pending)
        sources: list[Any] = ssh.sources

        def on_record(rec: Any) -> None:  # sample time t is the agent's wall clock
            if rec.TYPE == "gpu" and timings.measuring:
                pending.batches.append((rec.t, 1))

        pipeline.listeners.append(on_record)
        result["sshd_start_s"] = time.perf_counter() - t_setup
    else:
        cluster = SyntheticCluster(hosts, 1.0, make_templates(), pending)
        cluster.hello(pipeline.emit, time.time())
        result["wire"] = cluster.wire_bytes()
        if prefill:
            t0 = time.perf_counter()
            points = prefill_points or store.limits.points
            cluster.prefill(pipeline.emit, points, time.time())
            result["prefill_s"] = time.perf_counter() - t0
            result["prefill_points"] = points
            result["rss_after_prefill_mb"] = rss_mb()
        store.latencies.clear()
        sources = [cluster]
    inputs = Inputs(store=store, pipeline=pipeline, sources=sources, title="bench", mode="LIVE")
    app = VerlTopApp(inputs, refresh=1.0, engine=TimedEngine(timings), live=True)

    original_refresh = app.refresh_now

    def timed_refresh() -> None:
        shown = pending.take()
        t0 = time.perf_counter()
        original_refresh()
        t1 = time.perf_counter()
        if not timings.measuring:
            return
        timings.refresh_ms.append((t1 - t0) * 1000)

        def painted() -> None:
            now = time.time()
            timings.paint_ms.append((time.perf_counter() - t0) * 1000)
            timings.latency.extend((now - t, n) for t, n in shown)

        app.call_after_refresh(painted)

    app.refresh_now = timed_refresh  # type: ignore[method-assign]
    time_sliced_summary(app, timings)
    first_data: float | None = None
    connected: float | None = None
    try:
        async with app.run_test(headless=True, size=(200, 60)) as pilot:
            await pilot.pause()
            time_pane(app, timings)
            start = time.perf_counter()
            while time.perf_counter() - start < 60:
                live = sum(1 for h in store.hosts.values() if h.latest is not None or h.gpus)
                if connected is None and live >= hosts and store.gpu_count() >= hosts * 8:
                    connected = time.perf_counter() - start
                if connected is not None:
                    break
                await asyncio.sleep(0.05)
            first_data = time.perf_counter() - start
            await asyncio.sleep(warmup)
            pending.take()
            store.latencies.clear()
            gc_clock = GcClock()
            gc.callbacks.append(gc_clock)
            result["rss_start_mb"] = rss_mb()
            lag = LoopLag()
            lag_task = asyncio.create_task(lag.run())
            timings.measuring = gc_clock.on = lag.on = True
            if transport == "wire":
                cluster.measuring = True
            prof = _profiler(profile)
            w0, c0 = time.perf_counter(), time.process_time()
            rss_series = [(0.0, result["rss_start_mb"])]
            while time.perf_counter() - w0 < duration:  # RSS every 5 s: flat, or growing?
                await asyncio.sleep(min(5.0, max(0.0, duration - (time.perf_counter() - w0))))
                rss_series.append((time.perf_counter() - w0, rss_mb()))
            w1, c1 = time.perf_counter(), time.process_time()
            if prof is not None:
                prof.disable()
                prof.dump_stats(profile)
            result["rss_series"] = rss_series
            timings.measuring = gc_clock.on = lag.on = False
            lag_task.cancel()
            result["loop_lag_ms_p99"] = percentile(lag.lags_ms, 99)
            result["loop_lag_ms_max"] = max(lag.lags_ms, default=None)
            result["loop_waits_over_50ms"] = sum(1 for v in lag.lags_ms if v > 50.0)
            if transport == "wire":
                cluster.measuring = False
                result["ingest_cpu_pct"] = 100.0 * cluster.ingest_cpu_s / (w1 - w0)
            gc.callbacks.remove(gc_clock)
            result["gc_full"] = gc_clock.count
            result["gc_full_ms_per_s"] = 1000.0 * gc_clock.seconds / (w1 - w0)
            result["rss_mb"] = rss_mb()
            result["status_line"] = _plain_status(app)
    finally:
        if ssh is not None:
            ssh.stop()
    if transport == "ssh":
        result["all_hosts_streaming_s"] = connected
        result["connect_state"] = {
            s: sum(1 for h in store.hosts.values() if h.state == s)
            for s in {h.state for h in store.hosts.values()}
        }
    result["first_data_s"] = first_data
    result["wall_s"] = w1 - w0
    result["cpu_pct"] = 100.0 * (c1 - c0) / (w1 - w0)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    lat = sorted(store.latencies)
    result["ingest_latency_p50_s"] = percentile(lat, 50)
    result["ingest_latency_p95_s"] = percentile(lat, 95)
    result["latency_p50_s"] = weighted_percentile(timings.latency, 50)
    result["latency_p95_s"] = weighted_percentile(timings.latency, 95)
    result["latency_max_s"] = max((v for v, _ in timings.latency), default=None)
    for key in (
        "refresh_ms",
        "paint_ms",
        "pane_ms",
        "pane_cpu_ms",
        "engine_ms",
        "engine_cpu_ms",
        "summary_ms",
    ):
        vals = getattr(timings, key)
        result[f"{key}_p50"] = median(vals)
        result[f"{key}_p95"] = percentile(vals, 95)
        result[f"{key}_max"] = max(vals) if vals else None
    result["refreshes"] = len(timings.refresh_ms)
    result["samples_on_screen"] = sum(n for _, n in timings.latency)
    return result


def _profiler(path: str) -> Any:
    """A running cProfile profiler of the event loop's thread when ``path`` is set."""
    if not path:
        return None
    import cProfile  # noqa: PLC0415

    prof = cProfile.Profile()
    prof.enable()
    return prof


def _plain_status(app: Any) -> dict[str, Any]:
    """The header's status line and pane 1's GPU status line as shown (readable at scale?)."""
    out: dict[str, Any] = {}
    for name, selector in (("header", "#status-line"), ("gpu_status", "#gpu-status")):
        try:
            widget = app.query_one(selector)
            out[name] = str(widget.render()).strip()
        except Exception as exc:  # noqa: BLE001 - a benchmark reports, never fails on this
            out[name] = f"unreadable: {type(exc).__name__}"
    return out


# ---------------------------------------------------------------------------------------------
# Driver


HEADERS = [
    "GPUs",
    "hosts",
    "via",
    "CPU % core",
    "RSS MB",
    "lat p50 s",
    "lat p95 s",
    "ingest p95 s",
    "refresh p50/p95 ms",
    "pane p50/p95 ms",
    "pane CPU p50/p95 ms",
    "engine p50 ms",
    "loop lag max ms",
    "paint p95 ms",
    "ingest % core",
    "full GC ms/s",
    "RSS start→end MB",
]


def _pair(r: dict, key: str) -> str:
    a, b = r.get(f"{key}_p50"), r.get(f"{key}_p95")
    if a is None:
        return "—"
    return f"{a:.1f} / {b:.1f}"


def _growth(r: dict) -> str:
    a, b = r.get("rss_start_mb"), r.get("rss_mb")
    return "—" if a is None or b is None else f"{a:.0f} → {b:.0f}"


def report(results: list[dict]) -> str:
    """The printed table and the targets."""
    rows = []
    for r in results:
        if "error" in r:
            rows.append([r.get("gpus"), r.get("hosts"), r.get("transport"), "error", *[None] * 13])
            continue
        rows.append(
            [
                r["gpus"],
                r["hosts"],
                r["transport"],
                r["cpu_pct"],
                r["rss_mb"],
                r["latency_p50_s"],
                r["latency_p95_s"],
                r["ingest_latency_p95_s"],
                _pair(r, "refresh_ms"),
                _pair(r, "pane_ms"),
                _pair(r, "pane_cpu_ms"),
                r["engine_ms_p50"],
                r.get("loop_lag_ms_max"),
                r["paint_ms_p95"],
                r.get("ingest_cpu_pct"),
                r.get("gc_full_ms_per_s"),
                _growth(r),
            ]
        )
    text = table(HEADERS, rows)
    text += "\n\ntargets (product.md, 128 hosts x 8 = 1024 GPUs at 1 Hz):\n"
    for _, (words, _) in TARGETS.items():
        text += f"  {words}\n"
    wire = next((r["wire"] for r in results if r.get("wire")), None)
    if wire:
        text += (
            f"\nwire (JSON, as the agent writes it): {wire['gpu_line_b']:.0f} B per GPU sample"
            f" + {wire['host_share_b']:.0f} B of host/heartbeat lines per GPU"
            f" = {wire['total_b']:.0f} B per GPU per second at 1 Hz\n"
        )
    for r in results:
        if r.get("summary_ms_p95") is not None:
            text += (
                f"\n{r['gpus']} GPUs: the tick's summary made in slices before its refresh (not in"
                f" refresh or pane): p50/p95 {_pair(r, 'summary_ms')} ms wall, turns of the"
                " loop between\n"
            )
    for r in results:
        status = r.get("status_line")
        if status:
            text += f"\n{r['gpus']} GPUs, header: {status.get('header', '')}\n"
            text += f"{r['gpus']} GPUs, pane 1: {status.get('gpu_status', '')}\n"
    for r in results:
        if "error" in r:
            text += f"  {r['gpus']} GPUs failed: {r['error']}\n"
    return text


def run_child(gpus: int, args: argparse.Namespace) -> dict:
    """One size in a fresh interpreter; its JSON comes back through a temp file."""
    fd, out = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--one",
        str(gpus),
        "--duration",
        str(args.duration),
        "--warmup",
        str(args.warmup),
        "--transport",
        args.transport,
        "--json-out",
        out,
    ]
    if args.no_prefill:
        cmd.append("--no-prefill")
    if args.prefill_points:
        cmd += ["--prefill-points", str(args.prefill_points)]
    if args.profile:
        cmd += ["--profile", f"{args.profile}.{gpus}"]
    timeout = args.duration + args.warmup + 900  # 4096 GPUs: prefill takes minutes
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    try:
        data = json.loads(Path(out).read_text() or "{}")
    except ValueError:
        data = {}
    finally:
        Path(out).unlink(missing_ok=True)
    if proc.returncode != 0 or not data:
        tail = (proc.stderr or proc.stdout)[-600:]
        return {"gpus": gpus, "hosts": gpus // 8, "transport": args.transport, "error": tail}
    return data


def main(argv: list[str] | None = None) -> int:
    """Command line entry."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--gpus", default="8,64,256,1024,4096", help="GPU counts (hosts = GPUs / 8)")
    p.add_argument("--duration", type=float, default=20.0, help="measured seconds per size")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds before measuring")
    p.add_argument("--transport", default="wire", choices=("wire", "ssh"))
    p.add_argument("--no-prefill", action="store_true", help="start with empty rings")
    p.add_argument(
        "--prefill-points",
        type=int,
        default=0,
        help="samples pushed per GPU before measuring (default: the ring capacity; 3600 = an hour)",
    )
    p.add_argument(
        "--profile",
        default="",
        metavar="FILE",
        help="cProfile the measured window into FILE.<gpus> (pstats; inflates the timings)",
    )
    p.add_argument("--one", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--json-out", default=None, metavar="FILE")
    args = p.parse_args(argv)

    if args.one:  # child: one size, raw JSON only
        res = asyncio.run(
            run_one(
                args.one,
                args.duration,
                args.warmup,
                args.transport,
                not args.no_prefill,
                args.prefill_points,
                args.profile,
            )
        )
        Path(args.json_out).write_text(json.dumps(res))
        return 0

    results = []
    for gpus in (int(x) for x in args.gpus.split(",") if x.strip()):
        print(f"{gpus} GPUs via {args.transport}: {args.duration:g} s ...", flush=True)
        results.append(run_child(gpus, args))
    print()
    print(report(results))
    write_json(
        args.json_out,
        {
            "benchmark": "client_scale",
            "argv": sys.argv[1:] if argv is None else argv,
            "targets": {k: v[0] for k, v in TARGETS.items()},
            "rows": results,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
