"""The store: bounded, columnar history of everything the sources report.

Written only from the event loop (``ingest``); read by the diagnosis and the UI. Every buffer
has a fixed capacity, so memory stays flat however long verl-top runs: GPU and host history
live in fixed-size ``array('d')`` rings (one column per metric, NaN = missing), and steps,
probes and events in bounded deques.

Time: ``Store.now`` follows the data (the newest ``t`` ingested), so diagnosis over a replay is
deterministic; ``received`` wall-clock times are kept for staleness and latency.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, TypeVar

from verl_top.model import (
    ClockOffset,
    Dropped,
    GpuSample,
    Heartbeat,
    Hello,
    HostSample,
    HostState,
    LogEvent,
    LogLines,
    NcclInfo,
    NodeTopology,
    ProbeResult,
    ProcessList,
    RayActor,
    RayActors,
    RayNode,
    Record,
    RolloutSample,
    SourceStatus,
    VerlConfig,
    VerlStep,
)
from verl_top.proc_history import ProcHistory
from verl_top.progress import ProgressTracker

# A ring column: float samples in an array, phase labels in a list (sliced the same way).
_Column = TypeVar("_Column", array, list)

NAN = float("nan")
RING_START = 16  # points a new ring allocates; it doubles up to its capacity
# Records that create a host entry (the hosts cap applies to them).
_HOST_RECORDS = (Hello, GpuSample, HostSample, ProcessList, HostState, Heartbeat, LogLines)

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
# A sample's GPU_METRICS as a tuple, read in C (4096 GPUs: ~4000 samples a second).
_GPU_FIELDS = attrgetter(*GPU_METRICS)

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

ROLLOUT_METRICS: tuple[str, ...] = (
    "running",
    "waiting",
    "kv_cache_pct",
    "gen_tokens_s",
    "prompt_tokens_s",
    "preemptions_s",
    "ttft_p50_s",
    "ttft_p90_s",
    "tpot_p50_s",
    "e2e_p50_s",
    "e2e_p90_s",
)
MAX_ROLLOUT_SERVERS = 4096  # a bound on foreign keys: more servers than this are dropped


class Ring:
    """Fixed-capacity columnar ring buffer of timestamped points.

    The columns start small and double until they reach ``capacity`` (only then does the ring
    wrap), so a host or GPU that sent one record costs ~2 KB, not the full history: a flood of
    new host names stays cheap up to the store's host cap.
    """

    __slots__ = (
        "capacity",
        "times",
        "cols",
        "_columns",
        "labels",
        "_alloc",
        "_head",
        "_count",
        "_pushes",
        "_back_at",
    )

    def __init__(self, columns: Sequence[str], capacity: int, labels: bool = False) -> None:
        self.capacity = capacity
        self._alloc = min(capacity, RING_START)  # slots allocated now (the modulus until full)
        self.times = array("d", [NAN]) * self._alloc
        self.cols = {c: array("d", [NAN]) * self._alloc for c in columns}
        self._columns = tuple(self.cols.values())  # in column order, for push_row
        self.labels: list[str] | None = [""] * self._alloc if labels else None
        self._head = 0  # next write position
        self._count = 0
        self._pushes = 0  # points ever pushed
        self._back_at = -1  # ordinal of the newest point whose time went back or was NaN

    def __len__(self) -> int:
        return self._count

    def push(self, t: float, values: dict[str, float | None], label: str = "") -> None:
        """Append one point; missing columns are stored as NaN."""
        self.push_row(t, [values.get(name) for name in self.cols], label)

    def push_row(self, t: float, row: Sequence[float | None], label: str = "") -> None:
        """Append one point given as one value per column, in the ring's column order (the
        store's per-sample path: no dict per sample); None is stored as NaN."""
        if self._count == self._alloc < self.capacity:
            self._grow()
        i = self._head
        if t != t or (self._count and t < self.times[(i - 1) % self._alloc]):
            self._back_at = self._pushes  # the bisecting readers fall back while it is held
        self._pushes += 1
        self.times[i] = t
        for col, v in zip(self._columns, row, strict=True):
            col[i] = NAN if v is None else v
        if self.labels is not None:
            # One object per distinct label: a ring holds hundreds and a store thousands of
            # rings, and every full garbage collection visits each held label. Decoded lines
            # give each sample its own copy, scattered over the heap: 2.4 M of them at 4096
            # GPUs made a full collection take ~0.4 s (cache misses), holding the event loop.
            self.labels[i] = sys.intern(label) if label else ""
        self._head = (i + 1) % self._alloc
        if self._count < self._alloc:
            self._count += 1

    def _grow(self) -> None:
        """Double the columns (never past ``capacity``). Only called while the ring has not
        wrapped, so the points sit in order at [0, alloc) and the next one goes at ``alloc``."""
        old = self._alloc
        new = min(self.capacity, old * 2)
        pad = array("d", [NAN]) * (new - old)
        self.times.extend(pad)
        for col in self.cols.values():
            col.extend(pad)
        if self.labels is not None:
            self.labels.extend([""] * (new - old))
        self._alloc = new
        self._head = old

    def _indices(self, since: float | None) -> Iterator[int]:
        start = (self._head - self._count) % self._alloc
        for k in range(self._count):
            i = (start + k) % self._alloc
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
        start = (self._head - n) % self._alloc

        def chrono(a: array) -> array:
            return a[start : start + n] if start + n <= self._alloc else a[start:] + a[: self._head]

        col = chrono(self.cols[column])
        if since is not None:
            col = col[bisect_left(chrono(self.times), since) :]
        return [v for v in col if v == v]  # v == v drops NaN (missing)

    def ascending(self) -> bool:
        """True when the held times ascend (no step back, no NaN): windows can be bisected."""
        return self._back_at < self._pushes - self._count

    def _from(self, a: _Column, k: int) -> _Column:
        """Column ``a`` from its ``k``-th held point on, oldest first (sliced in C, one copy)."""
        n, start = self._count, (self._head - self._count) % self._alloc
        first = min(n, self._alloc - start)  # held points before the wrap
        if k >= first:
            return a[k - first : n - first]
        if n == first:
            return a[start + k : start + n]
        return a[start + k : self._alloc] + a[: n - first]

    def _start(self, since: float | None) -> int:
        """How many held points are older than ``since`` (bisected: the times ascend)."""
        if since is None:
            return 0
        n, start = self._count, (self._head - self._count) % self._alloc
        first = min(n, self._alloc - start)
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

    def start_of(self, since: float | None) -> int | None:
        """How many held points are older than ``since`` when the times ascend, else None;
        with ``array_from`` / ``times_array_from``, a reader of several columns of one window
        finds its start once."""
        return self._start(since) if self.ascending() else None

    def array_from(self, column: str, k: int) -> array:
        """The values of ``column`` from the ``k``-th held point on (``k`` from ``start_of``),
        NaN kept, as a C array: summed or compared without a float object per point held."""
        return self._from(self.cols[column], k)

    def times_array_from(self, k: int) -> array:
        """The times of the held points from the ``k``-th on, as ``array_from``."""
        return self._from(self.times, k)

    @property
    def first_column(self) -> str:
        """A column name, for readers that want only the times of ``series``."""
        return next(iter(self.cols))

    def recent_labels(self, since: float | None = None) -> list[str]:
        """Same labels as ``label_series(since)[1]``, sliced like ``recent_series``."""
        if self.labels is None:
            return []
        if not self.ascending():
            return self.label_series(since)[1]
        return self._from(self.labels, self._start(since))

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
        return self.times[(self._head - 1) % self._alloc]


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
    clock_offset: float | None = None  # seconds added to this host's times (None: not measured)


@dataclass
class RolloutEntry:
    """One rollout server (vLLM / SGLang): its latest sample and its history."""

    name: str
    history: Ring
    latest: RolloutSample | None = None


@dataclass
class StoreLimits:
    """Capacities of the store's buffers."""

    window_s: float = 300.0  # history shown and used by diagnosis
    points: int = 600  # ring capacity per GPU/host
    steps: int = 5000
    probes: int = 200
    events: int = 500
    latencies: int = 4096
    hosts: int = 2048  # hosts the store tracks; records of further hosts are dropped, counted
    gpus_per_host: int = 256  # GPU series per host (the wire's index cap is 0..255)
    gpus: int = 8192  # GPU series over all hosts (~100 KB each at 600 points)
    nccl: int = 1024  # NCCL summaries (one per host and log path)
    drop_reasons: int = 64  # distinct drop reasons kept per host (then "other")
    future_s: float = 300.0  # a live record this far ahead of arrival does not move ``now``


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
        # What each followed verl log gave (lines read/matched, steps, config keys, first
        # unreadable line), by "host:path"; filled by the pipeline's parsers (issue 17).
        self.log_stats: dict[str, dict[str, object]] = {}
        # Set when finished logs are read post-mortem: path -> {"mtime": ..., "size": ...}.
        self.post_mortem: dict[str, dict[str, object]] = {}
        self.probes: deque[ProbeResult] = deque(maxlen=self.limits.probes)
        self.nccl: dict[str, NcclInfo] = {}
        # Per host: the agent's topology/network inventory record, and its GPU link matrix
        # {(i, j): "NV18" | "SYS" | ...} that pane 4 and map.topology read.
        self.node_topology: dict[str, NodeTopology] = {}
        self.topology: dict[str, dict[tuple[int, int], str]] = {}
        self.events: deque[LogEvent] = deque(maxlen=self.limits.events)
        self.latencies: deque[float] = deque(maxlen=self.limits.latencies)
        self.now: float = 0.0  # newest data time seen
        self.first_t: float | None = None  # data time of the first timed record
        self.verl_log_given = False  # --verl-log was given (its first line may not be here yet)
        self.version = 0  # bumps on every ingest; lets views skip work when nothing changed
        self.replay = False  # set by replay sources: the header says REPLAY
        # Where the data comes from (verl_top/origin.py: local, ssh, ray, prometheus, replay,
        # demo, post-mortem), so messages say what to do in this session's terms.
        self.origin = "local"
        self.notes: deque[str] = deque(maxlen=50)  # source-level messages for the UI
        # Ray cluster (--ray): nodes, the job's live actors by (host, pid), the driver log.
        self.ray_nodes: list[RayNode] = []
        self.ray_actors: list[RayActor] = []
        self.ray_by_pid: dict[tuple[str, int], RayActor] = {}
        self.ray_driver_log = ""
        self.ray_version = ""  # the cluster's Ray version (its dashboard's /api/version)
        self.ray_job: tuple[str, str] = ("", "")  # (job id, entrypoint: the launch command)
        # The last Python stacks collected (verl_top.stacks.ProcessStack: the node screen's key,
        # `verl-top stacks`), written into snapshots as stacks.txt and snapshot.json "stacks".
        self.stacks: list[Any] = []
        self.proc_history = ProcHistory()  # per process CPU / memory over time (process screen)
        # Foreign input refused or cut, by host and reason (see protocol.validate).
        self.drops: dict[str, dict[str, int]] = {}
        self._gpu_total = 0
        self._capped: set[tuple[str, str]] = set()  # (host, cap) already said once

        # Rollout servers (vLLM / SGLang metrics from --prometheus), by scrape address.
        self.rollout: dict[str, RolloutEntry] = {}
        # Sources that are not one host (Prometheus): their last state, by source name.
        self.sources: dict[str, SourceStatus] = {}
        # verl version / trainer mode / engine of the job: (inputs signature, VerlFlavour),
        # kept by verl_top.verl.flavour.store_flavour until its inputs change.
        self.verl_flavour: tuple[object, Any] | None = None
        # The method each job process runs, since when, and each method's recent durations.
        self.progress = ProgressTracker()
        # Writes queued while a worker thread reads the store (``hold``), oldest first.
        self._held: deque[tuple[Callable[..., None], tuple[Any, ...]]] | None = None

    # -- writing ---------------------------------------------------------------------------

    def host(self, name: str) -> HostEntry:
        """The entry of host ``name``, created on first use."""
        entry = self.hosts.get(name)
        if entry is None:
            entry = HostEntry(name=name, history=Ring(HOST_METRICS, self.limits.points))
            self.hosts[name] = entry
        return entry

    def gpu(self, host: str, index: int) -> GpuEntry | None:
        """The entry of GPU ``index`` on ``host``, created on first use; None over a cap."""
        h = self.host(host)
        entry = h.gpus.get(index)
        if entry is None:
            if len(h.gpus) >= self.limits.gpus_per_host:
                self._cap_hit(host, "gpus_per_host", self.limits.gpus_per_host, f"GPU {index}")
                return None
            if self._gpu_total >= self.limits.gpus:
                self._cap_hit(host, "gpus", self.limits.gpus, f"GPU {index}")
                return None
            self._gpu_total += 1
            entry = GpuEntry(
                host=host,
                index=index,
                history=Ring(GPU_METRICS + GPU_DERIVED, self.limits.points, labels=True),
            )
            h.gpus[index] = entry
        return entry

    def count_drop(self, host: str, reason: str, count: int = 1) -> None:
        """Count ``count`` refused records (or fields) of ``host`` under ``reason`` (bounded)."""
        per = self.drops.get(host)
        if per is None:
            if len(self.drops) >= self.limits.hosts:
                host = "(other hosts)"
            per = self.drops.setdefault(host, {})
        if reason not in per and len(per) >= self.limits.drop_reasons:
            reason = "other"
        per[reason] = per.get(reason, 0) + count
        self.version += 1

    def dropped(self, host: str) -> int:
        """How many records or fields of ``host`` were refused or cut, all reasons."""
        return sum(self.drops.get(host, {}).values())

    def _cap_hit(self, host: str, cap: str, limit: int, what: str) -> None:
        """Count a record refused by a store cap; say it once per host and cap, with the number."""
        self.count_drop(host, f"cap:{cap}>{limit}")
        if (host, cap) not in self._capped and len(self._capped) < 4 * self.limits.hosts:
            self._capped.add((host, cap))
            raise_it = "; --max-gpus N raises it" if cap == "gpus" else ""
            self.notes.append(
                f"{host}: {what} refused: the store keeps at most {limit} "
                f"{cap.replace('_', ' ')} (further ones are counted, not kept{raise_it})"
            )

    def _admit(self, record: Record) -> bool:
        """False when ``record`` would add a host past the cap (then it is counted)."""
        if record.host in self.hosts or not isinstance(record, _HOST_RECORDS):
            return True
        if len(self.hosts) < self.limits.hosts:
            return True
        self._cap_hit(record.host, "hosts", self.limits.hosts, "host")
        return False

    def ingest(self, record: Record, received: float | None = None) -> None:
        """Apply one record. Never raises for records built by ``protocol.validate``."""
        if self._held is not None:
            self._held.append((self._ingest, (record, received)))
            return
        self._ingest(record, received)

    def _ingest(self, record: Record, received: float | None) -> None:
        self.version += 1
        if not self._admit(record):
            return
        if (
            record.t
            and record.t > self.now
            and not isinstance(record, HostState | Dropped | ClockOffset)
            and (self.replay or received is None or record.t <= received + self.limits.future_s)
        ):
            self.now = record.t
            if self.first_t is None:
                self.first_t = record.t
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
            if self.gpu(rec.host, info.index) is None:
                break
        if rec.gpus:
            h.state, h.reason = "up", ""
        else:
            h.state, h.reason = "no_gpu", rec.error or "no GPU found"
        self._touch(rec, received)

    def _on_gpu(self, rec: GpuSample, received: float | None) -> None:
        h = self._touch(rec, received)
        g = h.gpus.get(rec.index)  # a known GPU: no second host lookup (4096 samples/s)
        if g is None and (g := self.gpu(rec.host, rec.index)) is None:
            return
        g.latest = rec
        reasons = rec.clock_reasons
        derived = (rec.activity, None if reasons is None else float(rec.throttled), reasons)
        g.history.push_row(rec.t, _GPU_FIELDS(rec) + derived, rec.label)
        if received is not None and rec.t:
            self.latencies.append(received - rec.t)

    def _on_host(self, rec: HostSample, received: float | None) -> None:
        h = self._touch(rec, received)
        h.latest = rec
        values = {name: getattr(rec, name, None) for name in HOST_METRICS}
        values["cpu_max_core"] = max(rec.cpu_per_core) if rec.cpu_per_core else rec.cpu_max_core_pct
        h.history.push(rec.t, values)

    def _on_procs(self, rec: ProcessList, received: float | None) -> None:
        self._touch(rec, received).procs = rec
        self.progress.observe(rec)
        self.proc_history.add(rec)

    def _on_state(self, rec: HostState, received: float | None) -> None:
        h = self.host(rec.host)
        h.state, h.reason = rec.state, rec.reason

    def _on_heartbeat(self, rec: Heartbeat, received: float | None) -> None:
        self._touch(rec, received).heartbeat = rec

    def _on_log(self, rec: LogLines, received: float | None) -> None:
        # Lines are kept with a monitored host. A file followed on a machine that is not
        # monitored (the driver log beside --prometheus or remote --hosts) makes no host row:
        # it would sit in "connecting" forever.
        h = self.hosts.get(rec.host)
        if h is not None:
            h.log_tail.extend(rec.lines)

    def _on_step(self, rec: VerlStep, received: float | None) -> None:
        # A restarted run reuses step numbers: keep arrival order, replace same-step duplicates.
        # Two lines of one step that agree on every key they share are one step printed in
        # parts (fully async: the rollouter's dict, then the trainer's): merge them.
        if self.steps and self.steps[-1].step == rec.step:
            prev = self.steps[-1]
            if all(prev.metrics[k] == v for k, v in rec.metrics.items() if k in prev.metrics):
                rec = dataclasses.replace(rec, metrics={**prev.metrics, **rec.metrics})
            self.steps[-1] = rec
        else:
            self.steps.append(rec)

    def insert_steps(self, records: Sequence[VerlStep], before: VerlStep | None) -> None:
        """Steps read from earlier in a log than ``before`` (a big log's history, filled in
        after its recent steps were shown): placed just before it, or after every step when
        ``before`` is None or gone; the newest ``limits.steps`` are kept."""
        if not records:
            return
        if self._held is not None:
            self._held.append((self.insert_steps, (records, before)))
            return
        steps = list(self.steps)
        at = next((i for i, s in enumerate(steps) if s is before), None)
        if at is None:
            at = len(steps) if before is None else 0
        self.steps.clear()
        self.steps.extend([*steps[:at], *records, *steps[at:]])
        self.version += 1

    def _on_config(self, rec: VerlConfig, received: float | None) -> None:
        self.config = dict(rec.values)
        self.config_source = rec.source

    def _on_probe(self, rec: ProbeResult, received: float | None) -> None:
        self.probes.append(rec)

    def _on_nccl(self, rec: NcclInfo, received: float | None) -> None:
        key = f"{rec.host}:{rec.path}"
        if key not in self.nccl and len(self.nccl) >= self.limits.nccl:
            self._cap_hit(rec.host, "nccl", self.limits.nccl, f"NCCL log {rec.path}")
            return
        self.nccl[key] = rec

    def _on_clock(self, rec: ClockOffset, received: float | None) -> None:
        if rec.host in self.hosts or len(self.hosts) < self.limits.hosts:
            self.host(rec.host).clock_offset = rec.offset

    def _on_drop(self, rec: Dropped, received: float | None) -> None:
        self.count_drop(rec.host, rec.reason, rec.count)
        if rec.reason.startswith("cap:") and (rec.host, rec.reason) not in self._capped:
            if len(self._capped) < 4 * self.limits.hosts:
                self._capped.add((rec.host, rec.reason))
                self.notes.append(f"{rec.host}: input cut at a cap ({rec.reason[4:]})")

    def _on_topo(self, rec: NodeTopology, received: float | None) -> None:
        from verl_top.nccl.topo import clean_topology, record_matrix  # pure, no I/O

        rec = clean_topology(rec)
        if rec.host not in self.node_topology and len(self.node_topology) >= 4096:
            return  # bounded like every other per-host table
        self.node_topology[rec.host] = rec
        matrix = record_matrix(rec)
        if matrix:
            self.topology[rec.host] = matrix
        else:
            self.topology.pop(rec.host, None)

    def _on_event(self, rec: LogEvent, received: float | None) -> None:
        self.events.append(rec)

    def _on_ray(self, rec: RayActors, received: float | None) -> None:
        self.ray_nodes = list(rec.nodes)
        self.ray_actors = list(rec.actors)
        self.ray_by_pid = {(a.host, a.pid): a for a in rec.actors if a.pid}
        self.ray_driver_log = rec.driver_log
        self.ray_version = rec.ray_version or self.ray_version
        if rec.entrypoint:
            self.ray_job = (rec.job_id, rec.entrypoint)
        if rec.note and (not self.notes or self.notes[-1] != rec.note):
            self.notes.append(rec.note)

    def _on_rollout(self, rec: RolloutSample, received: float | None) -> None:
        # Not a host: rollout servers must not create host rows without GPUs.
        entry = self.rollout.get(rec.host)
        if entry is None:
            if len(self.rollout) >= MAX_ROLLOUT_SERVERS:
                return
            entry = RolloutEntry(rec.host, Ring(ROLLOUT_METRICS, self.limits.points))
            self.rollout[rec.host] = entry
        entry.latest = rec
        entry.history.push(rec.t, {name: getattr(rec, name) for name in ROLLOUT_METRICS})

    def _on_source(self, rec: SourceStatus, received: float | None) -> None:
        old = self.sources.get(rec.host)
        self.sources[rec.host] = rec
        if old is None or (old.state, old.reason) != (rec.state, rec.reason):
            if rec.state != "up" or rec.reason or old is not None:  # a silent start: no note
                self.notes.append(
                    f"{rec.host}: {rec.state}" + (f": {rec.reason}" if rec.reason else "")
                )

    _HANDLERS: dict[type, Callable[[Store, Any, float | None], None]] = {
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
        Dropped: _on_drop,
        ClockOffset: _on_clock,
        RolloutSample: _on_rollout,
        SourceStatus: _on_source,
        NodeTopology: _on_topo,
    }

    def mark_stale(self, stale_after: float, now_wall: float | None = None) -> list[str]:
        """Mark hosts silent for ``stale_after`` seconds (wall clock) as stale; return them."""
        if self._held is not None:
            return []  # their records wait in the queue: silence now says nothing
        now_wall = self.wall_clock() if now_wall is None else now_wall
        changed = []
        for h in self.hosts.values():
            if h.state == "up" and h.last_received is not None:
                # A source that samples slowly (Prometheus every 5 s) says so in its hello:
                # three of its intervals without data, not the screen's refresh, make it stale.
                limit = max(stale_after, 3 * h.hello.interval) if h.hello else stale_after
                if now_wall - h.last_received > limit:
                    h.state, h.reason = "stale", f"no data for {now_wall - h.last_received:.0f}s"
                    changed.append(h.name)
        if changed:
            self.version += 1
        return changed

    # -- a reader in another thread (monitor.py's background diagnosis) --------------------

    def hold(self) -> None:
        """Queue every write from now on (``ingest``, ``insert_steps``; ``mark_stale`` waits)
        instead of applying it: another thread is reading the store, which must not change
        under it. Readers on this thread see the store as it was."""
        if self._held is None:
            self._held = deque()

    @property
    def held(self) -> int:
        """Writes waiting in the queue (0 when writes apply at once)."""
        return 0 if self._held is None else len(self._held)

    def release(self, budget: int | None = None) -> bool:
        """Apply up to ``budget`` queued writes (all when None), in order; True when the queue
        is empty and writes apply at once again. Writes arriving meanwhile queue behind."""
        held = self._held
        if held is None:
            return True
        n = len(held) if budget is None else min(budget, len(held))
        self._held = None  # what is applied now goes through, not back into the queue
        try:
            for _ in range(n):
                fn, args = held.popleft()
                fn(*args)
        finally:
            self._held = held if held else None
        return self._held is None

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

    def input_health(self) -> dict[str, object]:
        """What the boundary refused or cut, per host and reason, and each host's clock offset."""
        return {
            "dropped": {h: dict(sorted(r.items())) for h, r in self.drops.items()},
            "clock_offset_s": {
                h.name: round(h.clock_offset, 3)
                for h in self.hosts.values()
                if h.clock_offset is not None
            },
        }

    def is_live(self, host: str) -> bool:
        """True when the host's data is current (up, not stale or down)."""
        h = self.hosts.get(host)
        return h is not None and h.state in ("up", "no_gpu")
