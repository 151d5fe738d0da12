"""The store: bounded, columnar history of everything the sources report.

Written only from the event loop (``ingest``); read by the diagnosis and the UI. Every buffer
has a fixed capacity, so memory stays flat however long verl-top runs: GPU and host history
live in fixed-size ``array('d')`` rings (one column per metric, NaN = missing), and steps,
probes and events in bounded deques.

Time: ``Store.now`` follows the data (the newest ``t`` ingested), so diagnosis over a replay is
deterministic; ``received`` wall-clock times are kept for staleness and latency.
"""

from __future__ import annotations

import math
import time
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from verl_top.model import (
    GpuSample,
    Heartbeat,
    Hello,
    HostSample,
    HostState,
    LogEvent,
    LogLines,
    NcclInfo,
    ProbeResult,
    ProcessList,
    RayActor,
    RayActors,
    RayNode,
    Record,
    VerlConfig,
    VerlStep,
)

NAN = float("nan")

GPU_METRICS: tuple[str, ...] = (
    "util_gpu",
    "util_mem",
    "mem_used_mib",
    "power_w",
    "temp_c",
    "sm_mhz",
    "mem_mhz",
    "sm_util",
    "sm_occupancy",
    "tensor_util",
    "dram_util",
    "nvlink_tx_mibs",
    "nvlink_rx_mibs",
    "pcie_tx_mibs",
    "pcie_rx_mibs",
)
# Derived columns stored next to the raw ones ("clock_reasons" is the NVML bitmask as a number,
# so the window keeps which reason throttled the clocks, not only that they were).
GPU_DERIVED: tuple[str, ...] = ("activity", "throttled", "clock_reasons")

HOST_METRICS: tuple[str, ...] = (
    "cpu_pct",
    "iowait_pct",
    "load1",
    "mem_used_bytes",
    "net_rx_bps",
    "net_tx_bps",
    "disk_read_bps",
    "disk_write_bps",
    "agent_cpu_pct",
    "cpu_max_core",  # derived: the busiest core (a single-threaded host loop pins one)
)


class Ring:
    """Fixed-capacity columnar ring buffer of timestamped points."""

    __slots__ = ("capacity", "times", "cols", "labels", "_head", "_count", "_pushes", "_back_at")

    def __init__(self, columns: Sequence[str], capacity: int, labels: bool = False) -> None:
        self.capacity = capacity
        self.times = array("d", [NAN]) * capacity
        self.cols = {c: array("d", [NAN]) * capacity for c in columns}
        self.labels: list[str] | None = [""] * capacity if labels else None
        self._head = 0  # next write position
        self._count = 0
        self._pushes = 0  # points ever pushed
        self._back_at = -1  # ordinal of the newest point whose time went back or was NaN

    def __len__(self) -> int:
        return self._count

    def push(self, t: float, values: dict[str, float | None], label: str = "") -> None:
        """Append one point; missing columns are stored as NaN."""
        i = self._head
        if t != t or (self._count and t < self.times[(i - 1) % self.capacity]):
            self._back_at = self._pushes  # the bisecting readers fall back while it is held
        self._pushes += 1
        self.times[i] = t
        for name, col in self.cols.items():
            v = values.get(name)
            col[i] = NAN if v is None else float(v)
        if self.labels is not None:
            self.labels[i] = label
        self._head = (i + 1) % self.capacity
        if self._count < self.capacity:
            self._count += 1

    def _indices(self, since: float | None) -> Iterator[int]:
        start = (self._head - self._count) % self.capacity
        for k in range(self._count):
            i = (start + k) % self.capacity
            if since is None or self.times[i] >= since:
                yield i

    def series(self, column: str, since: float | None = None) -> tuple[list[float], list[float]]:
        """Times and values of ``column`` (oldest first), NaN kept, from ``since`` on."""
        col = self.cols[column]
        ts: list[float] = []
        vs: list[float] = []
        for i in self._indices(since):
            ts.append(self.times[i])
            vs.append(col[i])
        return ts, vs

    def values(self, column: str, since: float | None = None) -> list[float]:
        """Non-missing values of ``column`` from ``since`` on, oldest first."""
        col = self.cols[column]
        return [v for i in self._indices(since) if not math.isnan(v := col[i])]

    def recent_values(self, column: str, since: float | None = None) -> list[float]:
        """Same result as ``values`` for a ring whose times ascend (one GPU's or host's
        samples), but the ring is sliced in C and the window start found by bisection, so the
        UI can read 1000+ GPUs' windows at every refresh."""
        n = self._count
        if not n:
            return []
        start = (self._head - n) % self.capacity

        def chrono(a: array) -> array:
            return (
                a[start : start + n] if start + n <= self.capacity else a[start:] + a[: self._head]
            )

        col = chrono(self.cols[column])
        if since is not None:
            col = col[bisect_left(chrono(self.times), since) :]
        return [v for v in col if v == v]  # v == v drops NaN (missing)

    def ascending(self) -> bool:
        """True when the held times ascend (no step back, no NaN): windows can be bisected."""
        return self._back_at < self._pushes - self._count

    def _from(self, a: array | list, k: int) -> array | list:
        """Column ``a`` from its ``k``-th held point on, oldest first (sliced in C, one copy)."""
        n, start = self._count, (self._head - self._count) % self.capacity
        first = min(n, self.capacity - start)  # held points before the wrap
        if k >= first:
            return a[k - first : n - first]
        if n == first:
            return a[start + k : start + n]
        return a[start + k : self.capacity] + a[: n - first]

    def _start(self, since: float | None) -> int:
        """How many held points are older than ``since`` (bisected: the times ascend)."""
        if since is None:
            return 0
        n, start = self._count, (self._head - self._count) % self.capacity
        first = min(n, self.capacity - start)
        k = bisect_left(self.times, since, start, start + first) - start
        return k if k < first else first + bisect_left(self.times, since, 0, n - first)

    def recent_series(
        self, column: str, since: float | None = None
    ) -> tuple[list[float], list[float]]:
        """Same result as ``series`` (NaN kept), read with C slicing and a bisected window
        start when the times ascend; the diagnosis reads 1000+ GPUs' windows per evaluation."""
        if not self.ascending():
            return self.series(column, since)
        k = self._start(since)
        return self._from(self.times, k).tolist(), self._from(self.cols[column], k).tolist()

    def recent_column(self, column: str, since: float | None = None) -> list[float]:
        """The values of ``recent_series`` alone (NaN kept)."""
        if not self.ascending():
            return self.series(column, since)[1]
        return self._from(self.cols[column], self._start(since)).tolist()

    def recent_labels(self, since: float | None = None) -> list[str]:
        """Same labels as ``label_series(since)[1]``, sliced like ``recent_series``."""
        if self.labels is None:
            return []
        if not self.ascending():
            return self.label_series(since)[1]
        return self._from(self.labels, self._start(since))  # type: ignore[return-value]

    def label_series(self, since: float | None = None) -> tuple[list[float], list[str]]:
        """Times and phase labels (replayed traces only)."""
        if self.labels is None:
            return [], []
        idx = list(self._indices(since))
        return [self.times[i] for i in idx], [self.labels[i] for i in idx]

    @property
    def pushes(self) -> int:
        """Points ever pushed: the ordinal the next point gets (held: the last ``len``)."""
        return self._pushes

    def at(self, column: str, ordinal: int) -> tuple[float, float]:
        """Time and ``column`` value of the point with this ordinal (it must still be held),
        for readers that keep running aggregates instead of re-reading the window."""
        i = ordinal % self.capacity
        return self.times[i], self.cols[column][i]

    def last_time(self) -> float | None:
        """Time of the newest point, or None when empty."""
        if not self._count:
            return None
        return self.times[(self._head - 1) % self.capacity]


def mean(values: Sequence[float]) -> float | None:
    """Arithmetic mean, or None for no values."""
    return sum(values) / len(values) if values else None


@dataclass
class GpuEntry:
    """One GPU of one host: its latest sample and its history."""

    host: str
    index: int
    history: Ring
    latest: GpuSample | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.host, self.index)


@dataclass
class HostEntry:
    """Everything the store knows about one host."""

    name: str
    history: Ring
    hello: Hello | None = None
    state: str = "connecting"
    reason: str = ""
    last_received: float | None = None  # wall clock of the last line from this host
    last_t: float | None = None  # data time of the last sample
    latest: HostSample | None = None
    procs: ProcessList | None = None
    gpus: dict[int, GpuEntry] = field(default_factory=dict)
    heartbeat: Heartbeat | None = None
    log_tail: deque[str] = field(default_factory=lambda: deque(maxlen=200))
    malformed: int = 0  # lines from this host that could not be decoded


@dataclass
class StoreLimits:
    """Capacities of the store's buffers."""

    window_s: float = 300.0  # history shown and used by diagnosis
    points: int = 600  # ring capacity per GPU/host
    steps: int = 5000
    probes: int = 200
    events: int = 500
    latencies: int = 4096


class Store:
    """Bounded in-memory state of the monitored cluster."""

    def __init__(
        self,
        limits: StoreLimits | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.limits = limits or StoreLimits()
        self.wall_clock = wall_clock
        self.hosts: dict[str, HostEntry] = {}
        self.steps: deque[VerlStep] = deque(maxlen=self.limits.steps)
        self.config: dict[str, object] = {}
        self.config_source = ""
        self.probes: deque[ProbeResult] = deque(maxlen=self.limits.probes)
        self.nccl: dict[str, NcclInfo] = {}
        self.events: deque[LogEvent] = deque(maxlen=self.limits.events)
        self.latencies: deque[float] = deque(maxlen=self.limits.latencies)
        self.now: float = 0.0  # newest data time seen
        self.version = 0  # bumps on every ingest; lets views skip work when nothing changed
        self.replay = False  # set by replay sources: the header says REPLAY
        self.notes: deque[str] = deque(maxlen=50)  # source-level messages for the UI
        # Ray cluster (--ray): nodes, the job's live actors by (host, pid), the driver log.
        self.ray_nodes: list[RayNode] = []
        self.ray_actors: list[RayActor] = []
        self.ray_by_pid: dict[tuple[str, int], RayActor] = {}
        self.ray_driver_log = ""

    # -- writing ---------------------------------------------------------------------------

    def host(self, name: str) -> HostEntry:
        """The entry of host ``name``, created on first use."""
        entry = self.hosts.get(name)
        if entry is None:
            entry = HostEntry(name=name, history=Ring(HOST_METRICS, self.limits.points))
            self.hosts[name] = entry
        return entry

    def gpu(self, host: str, index: int) -> GpuEntry:
        """The entry of GPU ``index`` on ``host``, created on first use."""
        h = self.host(host)
        entry = h.gpus.get(index)
        if entry is None:
            entry = GpuEntry(
                host=host,
                index=index,
                history=Ring(GPU_METRICS + GPU_DERIVED, self.limits.points, labels=True),
            )
            h.gpus[index] = entry
        return entry

    def ingest(self, record: Record, received: float | None = None) -> None:
        """Apply one record. Never raises for well-typed records."""
        self.version += 1
        if record.t and record.t > self.now and not isinstance(record, HostState):
            self.now = record.t
        handler = self._HANDLERS.get(type(record))
        if handler is not None:
            handler(self, record, received)

    def _touch(self, record: Record, received: float | None) -> HostEntry:
        h = self.host(record.host)
        h.last_received = received if received is not None else self.wall_clock()
        if record.t:
            h.last_t = record.t
        if h.state in ("connecting", "stale") and h.hello is not None:
            h.state, h.reason = (
                ("up", "")
                if h.hello.gpus or not h.hello.error
                else (
                    "no_gpu",
                    h.hello.error,
                )
            )
        return h

    def _on_hello(self, rec: Hello, received: float | None) -> None:
        h = self.host(rec.host)
        h.hello = rec
        for info in rec.gpus:
            self.gpu(rec.host, info.index)
        if rec.gpus:
            h.state, h.reason = "up", ""
        else:
            h.state, h.reason = "no_gpu", rec.error or "no GPU found"
        self._touch(rec, received)

    def _on_gpu(self, rec: GpuSample, received: float | None) -> None:
        self._touch(rec, received)
        g = self.gpu(rec.host, rec.index)
        g.latest = rec
        values = {name: getattr(rec, name) for name in GPU_METRICS}
        values["activity"] = rec.activity
        values["throttled"] = None if rec.clock_reasons is None else float(rec.throttled)
        values["clock_reasons"] = rec.clock_reasons
        g.history.push(rec.t, values, rec.label)
        if received is not None and rec.t:
            self.latencies.append(received - rec.t)

    def _on_host(self, rec: HostSample, received: float | None) -> None:
        h = self._touch(rec, received)
        h.latest = rec
        values = {name: getattr(rec, name, None) for name in HOST_METRICS}
        values["cpu_max_core"] = max(rec.cpu_per_core) if rec.cpu_per_core else None
        h.history.push(rec.t, values)

    def _on_procs(self, rec: ProcessList, received: float | None) -> None:
        self._touch(rec, received).procs = rec

    def _on_state(self, rec: HostState, received: float | None) -> None:
        h = self.host(rec.host)
        h.state, h.reason = rec.state, rec.reason

    def _on_heartbeat(self, rec: Heartbeat, received: float | None) -> None:
        self._touch(rec, received).heartbeat = rec

    def _on_log(self, rec: LogLines, received: float | None) -> None:
        h = self.host(rec.host)
        h.log_tail.extend(line for line in rec.lines)

    def _on_step(self, rec: VerlStep, received: float | None) -> None:
        # A restarted run reuses step numbers: keep arrival order, replace same-step duplicates.
        if self.steps and self.steps[-1].step == rec.step:
            self.steps[-1] = rec
        else:
            self.steps.append(rec)

    def _on_config(self, rec: VerlConfig, received: float | None) -> None:
        self.config = dict(rec.values)
        self.config_source = rec.source

    def _on_probe(self, rec: ProbeResult, received: float | None) -> None:
        self.probes.append(rec)

    def _on_nccl(self, rec: NcclInfo, received: float | None) -> None:
        self.nccl[f"{rec.host}:{rec.path}"] = rec

    def _on_event(self, rec: LogEvent, received: float | None) -> None:
        self.events.append(rec)

    def _on_ray(self, rec: RayActors, received: float | None) -> None:
        self.ray_nodes = list(rec.nodes)
        self.ray_actors = list(rec.actors)
        self.ray_by_pid = {(a.host, a.pid): a for a in rec.actors if a.pid}
        self.ray_driver_log = rec.driver_log
        if rec.note and (not self.notes or self.notes[-1] != rec.note):
            self.notes.append(rec.note)

    _HANDLERS: dict[type, Callable[[Store, Record, float | None], None]] = {
        Hello: _on_hello,
        GpuSample: _on_gpu,
        HostSample: _on_host,
        ProcessList: _on_procs,
        HostState: _on_state,
        Heartbeat: _on_heartbeat,
        LogLines: _on_log,
        VerlStep: _on_step,
        VerlConfig: _on_config,
        ProbeResult: _on_probe,
        NcclInfo: _on_nccl,
        LogEvent: _on_event,
        RayActors: _on_ray,
    }  # type: ignore[dict-item]

    def mark_stale(self, stale_after: float, now_wall: float | None = None) -> list[str]:
        """Mark hosts silent for ``stale_after`` seconds (wall clock) as stale; return them."""
        now_wall = self.wall_clock() if now_wall is None else now_wall
        changed = []
        for h in self.hosts.values():
            if h.state == "up" and h.last_received is not None:
                if now_wall - h.last_received > stale_after:
                    h.state, h.reason = "stale", f"no data for {now_wall - h.last_received:.0f}s"
                    changed.append(h.name)
        if changed:
            self.version += 1
        return changed

    # -- reading ---------------------------------------------------------------------------

    def window_start(self, window_s: float | None = None) -> float:
        """Data time at which the current window starts."""
        return self.now - (self.limits.window_s if window_s is None else window_s)

    def iter_gpus(self) -> Iterator[GpuEntry]:
        """All GPUs of all hosts, hosts in insertion order, GPUs by index."""
        for h in self.hosts.values():
            for index in sorted(h.gpus):
                yield h.gpus[index]

    def gpu_count(self) -> int:
        """Number of GPUs known across hosts."""
        return sum(len(h.gpus) for h in self.hosts.values())

    def host_counts(self) -> dict[str, int]:
        """Number of hosts in each state."""
        counts: dict[str, int] = {}
        for h in self.hosts.values():
            counts[h.state] = counts.get(h.state, 0) + 1
        return counts

    def gpu_mean(self, entry: GpuEntry, column: str, window_s: float | None = None) -> float | None:
        """Mean of a GPU column over the window (None when no data)."""
        return mean(entry.history.values(column, self.window_start(window_s)))

    def ray_actor(self, host: str, pid: int) -> RayActor | None:
        """The Ray actor running as ``pid`` on ``host`` (``--ray`` only), if any."""
        return self.ray_by_pid.get((host, pid))

    def is_live(self, host: str) -> bool:
        """True when the host's data is current (up, not stale or down)."""
        h = self.hosts.get(host)
        return h is not None and h.state in ("up", "no_gpu")
