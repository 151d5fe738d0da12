"""One per-tick summary of the store, computed once and shared by every pane and the header.

The GPU table sorts and counts by numbers of *every* GPU (window activity, idle, throttled),
but draws only the rows on screen. Those numbers are gathered here in one pass per store change
(``SummaryCache``), so the cost of the off-screen rows is one cheap read each, and the panes do
not each walk the store again. A GPU whose ring did not move keeps its previous entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from verl_top.model import THROTTLE_MASK, GpuSample
from verl_top.store import GpuEntry, HostEntry, Ring, Store, mean

IDLE_THRESHOLD = 50.0  # % mean activity over the window below which a GPU counts as idle
# Host states in which nothing new arrives (as in the UI): left out of live counts.
DEAD_STATES = ("down", "stale", "auth_failed", "hostkey_changed", "no_python")
NO_SORT = -1.0  # the sort value of a missing number: missing values sort first
RESUM_EVERY = 600  # running sums are recomputed from scratch this often (float drift)


class WindowMean:
    """Mean of one ring column over ``[since, newest]``, kept by adding the points that
    arrived and subtracting those that left the window since the last call: a few Python
    operations per tick instead of re-reading ~300 points for each of 1000+ GPUs.

    Falls back to summing the window again when the ring's times stepped back, when the
    window grew, when points still counted were overwritten (a window longer than the ring),
    and every ``RESUM_EVERY`` calls. Missing points (NaN) are left out, as ``recent_values``.
    """

    __slots__ = ("lo", "hi", "total", "count", "since", "calls")

    def __init__(self) -> None:
        self.lo = self.hi = 0  # ordinals [lo, hi) are counted
        self.total = 0.0
        self.count = 0
        self.since = float("inf")
        self.calls = 0

    def update(self, ring: Ring, column: str, since: float) -> float | None:
        """The mean of ``column`` from ``since`` on (None without a value)."""
        pushes = ring.pushes
        held_from = pushes - len(ring)
        self.calls += 1
        if (
            since < self.since
            or self.lo < held_from
            or self.calls % RESUM_EVERY == 0
            or not ring.ascending()
        ):
            return self._resum(ring, column, since, held_from, pushes)
        # The ring's arrays are read in place (an ordinal's slot is ordinal % capacity while
        # it is held): this runs for every GPU at every tick.
        cap, times, col = ring.capacity, ring.times, ring.cols[column]
        total, count = self.total, self.count
        for o in range(self.hi, pushes):
            v = col[o % cap]
            if v == v:
                total += v
                count += 1
        lo, hi = self.lo, pushes
        while lo < hi:
            i = lo % cap
            if times[i] >= since:
                break
            v = col[i]
            if v == v:
                total -= v
                count -= 1
            lo += 1
        self.lo, self.hi, self.since = lo, hi, since
        self.total, self.count = (total, count) if count else (0.0, 0)
        return total / count if count else None

    def _resum(
        self, ring: Ring, column: str, since: float, held_from: int, pushes: int
    ) -> float | None:
        ascending = ring.ascending()  # else the plain read: bisecting needs ascending times
        values = ring.recent_values(column, since) if ascending else ring.values(column, since)
        self.total, self.count = float(sum(values)), len(values)
        # Counted ordinals: the held points from the window start on (times ascend here;
        # with a step back the next call sums again, so lo/hi only need to be consistent).
        lo = held_from
        while lo < pushes and ring.at(column, lo)[0] < since:
            lo += 1
        self.lo, self.hi, self.since = lo, pushes, since
        if not ascending:
            self.lo = held_from - 1  # forces a new sum next time
        return self.total / self.count if self.count else None


# Pane 1's sort keys read from the latest sample (activity and throttle are the summary's own).
SORT_FIELDS = {
    "nvml": "util_gpu",
    "sm": "sm_util",
    "tensor": "tensor_util",
    "dram": "dram_util",
    "memory": "mem_used_mib",
    "power": "power_w",
    "temp": "temp_c",
    "clock": "sm_mhz",
}


class GpuSummary(NamedTuple):
    """What the tables sort and count one GPU by (its row cells are built only when shown).

    A tuple, not a dataclass: 4096 of these are made per tick."""

    key: str  # "host/index", the row key
    host_pos: int  # position of its host in the store (host order)
    gpu_index: int  # the GPU's index on its host ("index" is tuple.index)
    act: float | None  # mean activity over the window
    live: bool
    idle: bool  # live and below IDLE_THRESHOLD over the window
    throttled: bool
    latest: GpuSample | None

    def sort_value(self, column: str) -> float:
        """The number pane 1 sorts by for ``column``; missing values sort first."""
        if column == "activity":
            return _num(self.act)
        if column == "throttle":
            return float(self.throttled)
        field_name = SORT_FIELDS.get(column)
        if field_name is None or self.latest is None:
            return NO_SORT
        return _num(getattr(self.latest, field_name, None))

    @property
    def sort(self) -> dict[str, float]:
        """Every sort value by column (what a built row carries)."""
        return {c: self.sort_value(c) for c in (*SORT_FIELDS, "activity", "throttle")}


@dataclass(frozen=True)
class HostSummary:
    """Per-host aggregates of its GPUs."""

    name: str
    gpus: int
    act: float | None  # mean of its GPUs' window activity
    idle: int


@dataclass
class StoreSummary:
    """Every GPU and host of one store version, in host order."""

    version: int
    gpus: dict[str, GpuSummary] = field(default_factory=dict)
    hosts: dict[str, HostSummary] = field(default_factory=dict)
    idle: int = 0  # idle live GPUs
    throttled: int = 0  # throttled live GPUs
    cluster_act: float | None = None  # mean latest activity over live GPUs (the header's)


def _num(v: float | None) -> float:
    return NO_SORT if v is None or v != v else float(v)


def summarize_gpu(
    key: str, host_pos: int, h: HostEntry, g: GpuEntry, since: float, window: WindowMean
) -> GpuSummary:
    """One GPU's entry: its window activity (a running mean) and flags."""
    act = window.update(g.history, "activity", since)
    live = h.state not in DEAD_STATES
    s = g.latest
    reasons = None if s is None else s.clock_reasons
    throttled = bool(reasons and reasons & THROTTLE_MASK)
    idle = live and act is not None and act < IDLE_THRESHOLD
    return GpuSummary(key, host_pos, g.index, act, live, idle, throttled, s)


class SummaryCache:
    """Keeps the summary of the latest store version; recomputes at most once per change.

    Each GPU's window activity is a running mean (``WindowMean``): one tick costs a few
    operations per GPU, whatever the window length.
    """

    def __init__(self) -> None:
        self.summary: StoreSummary | None = None
        self._key: tuple[int, float, float] | None = None
        self._windows: dict[str, WindowMean] = {}
        self._hosts: dict[str, tuple[frozenset[int], list[tuple[int, str, WindowMean]]]] = {}
        self.computed = 0  # how many summaries were computed (for tests)

    def get(self, store: Store) -> StoreSummary:
        """The summary of ``store`` as it is now (cached per version and window)."""
        key = (store.version, store.limits.window_s, store.now)
        if self.summary is None or key != self._key:
            self.summary = self._compute(store)
            self._key = key
            self.computed += 1
        return self.summary

    def _compute(self, store: Store) -> StoreSummary:
        since = store.window_start()
        out = StoreSummary(store.version)
        gpus = out.gpus
        acts: list[float] = []
        for pos, h in enumerate(store.hosts.values()):
            live_host = h.state not in DEAD_STATES
            host_acts: list[float] = []
            host_idle = 0
            for index, key, window in self._host_gpus(h):
                g = h.gpus[index]
                gs = summarize_gpu(key, pos, h, g, since, window)
                gpus[key] = gs
                if gs.act is not None:
                    host_acts.append(gs.act)
                host_idle += gs.idle
                if live_host:
                    out.idle += gs.idle
                    out.throttled += gs.throttled
                    latest = None if g.latest is None else g.latest.activity
                    if latest is not None:
                        acts.append(latest)
            out.hosts[h.name] = HostSummary(h.name, len(h.gpus), mean(host_acts), host_idle)
        out.cluster_act = mean(acts)
        if len(self._windows) > len(gpus):  # GPUs gone: drop their running sums
            self._windows = {k: w for k, w in self._windows.items() if k in gpus}
            self._hosts = {k: v for k, v in self._hosts.items() if k in store.hosts}
        return out

    def _host_gpus(self, h: HostEntry) -> list[tuple[int, str, WindowMean]]:
        """(index, row key, running mean) of each GPU of ``h`` in index order, made again only
        when the host's GPUs changed (not a key string and a sort per GPU per tick)."""
        cached = self._hosts.get(h.name)
        if cached is not None and h.gpus.keys() == cached[0]:
            return cached[1]
        windows = self._windows
        out = []
        for index in sorted(h.gpus):
            key = f"{h.name}/{index}"
            window = windows.get(key)
            if window is None:
                window = windows[key] = WindowMean()
            out.append((index, key, window))
        self._hosts[h.name] = (frozenset(h.gpus), out)
        return out
