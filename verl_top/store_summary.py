"""One per-tick summary of the store, computed once and shared by every pane and the header.

The GPU table sorts and counts by numbers of *every* GPU (window activity, idle, throttled),
but draws only the rows on screen. Those numbers are gathered here in one pass per store change
(``SummaryCache``), so the cost of the off-screen rows is one cheap read each, and the panes do
not each walk the store again. A GPU whose ring did not move keeps its previous entry.
"""

from __future__ import annotations

import asyncio
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
    indices: dict[str, frozenset[int]] = field(default_factory=dict)  # host -> its GPUs here

    def covers(self, store: Store) -> bool:
        """True when every host of ``store`` is here with the same GPUs: the panes read the
        summary of each (one made in slices can miss a host or GPU that came meanwhile)."""
        indices = self.indices
        if len(indices) != len(store.hosts):
            return False
        for name, h in store.hosts.items():
            own = indices.get(name)
            if own is None or h.gpus.keys() != own:
                return False
        return True


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


def _key_of(store: Store) -> tuple[int, float, float]:
    """What a summary depends on: the store's version, its window, its clock."""
    return (store.version, store.limits.window_s, store.now)


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
        self._pinned: StoreSummary | None = None

    def get(self, store: Store) -> StoreSummary:
        """The summary of ``store`` as it is now (cached per version and window), or the one
        pinned for the tick being drawn (``pin``)."""
        if self._pinned is not None:
            return self._pinned
        key = _key_of(store)
        if self.summary is None or key != self._key:
            out, acts = StoreSummary(store.version), list[float]()
            since = store.window_start()
            for pos, h in enumerate(store.hosts.values()):
                self._add_host(out, acts, pos, h, since)
            self._keep(store, key, out, acts)
        assert self.summary is not None
        return self.summary

    def fresh(self, store: Store) -> bool:
        """True when ``get`` would return the summary it holds (nothing to compute)."""
        return self.summary is not None and self._key == _key_of(store)

    async def compute_sliced(self, store: Store, per_turn: int) -> StoreSummary:
        """``get``'s summary, made with a turn of the event loop after every ``per_turn``
        GPUs: at 4096 GPUs one pass held the loop ~25 ms, half of a refresh tick (issue 30).

        The store may move on between turns; each GPU is read once, at its turn (a monitor
        reads its GPUs one after another too). ``covers`` says whether the summary still has
        every host and GPU the store holds when it is done."""
        key = _key_of(store)
        out, acts = StoreSummary(store.version), list[float]()
        since = store.window_start()
        count = 0
        for pos, h in enumerate(list(store.hosts.values())):
            self._add_host(out, acts, pos, h, since)
            count += len(h.gpus)
            if count >= per_turn:
                count = 0
                await asyncio.sleep(0)
        return self._keep(store, key, out, acts)

    @property
    def pinned(self) -> StoreSummary | None:
        """The summary pinned for the tick being drawn, if any."""
        return self._pinned

    def pin(self, summary: StoreSummary | None) -> None:
        """Make ``get`` return ``summary`` until pinned again (None: computed as usual). The
        tick that made a summary in slices draws with it although the store moved on since."""
        self._pinned = summary

    def _add_host(
        self, out: StoreSummary, acts: list[float], pos: int, h: HostEntry, since: float
    ) -> None:
        """Summarize ``h``'s GPUs into ``out`` (the live ones' latest activity into ``acts``)."""
        gpus = out.gpus
        live_host = h.state not in DEAD_STATES
        host_acts: list[float] = []
        host_idle = 0
        indices, windows = self._host_gpus(h)
        out.indices[h.name] = indices
        for index, key, window in windows:
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

    def _keep(
        self, store: Store, key: tuple[int, float, float], out: StoreSummary, acts: list[float]
    ) -> StoreSummary:
        """Finish ``out`` and keep it as the summary of the store at ``key``."""
        out.cluster_act = mean(acts)
        if len(self._windows) > len(out.gpus):  # GPUs gone: drop their running sums
            self._windows = {k: w for k, w in self._windows.items() if k in out.gpus}
            self._hosts = {k: v for k, v in self._hosts.items() if k in store.hosts}
        self.summary, self._key = out, key
        self.computed += 1
        return out

    def _host_gpus(self, h: HostEntry) -> tuple[frozenset[int], list[tuple[int, str, WindowMean]]]:
        """``h``'s GPU indices, and (index, row key, running mean) of each in index order, made
        again only when the host's GPUs changed (not a key string and a sort per GPU per
        tick)."""
        cached = self._hosts.get(h.name)
        if cached is not None and h.gpus.keys() == cached[0]:
            return cached
        windows = self._windows
        out = []
        for index in sorted(h.gpus):
            key = f"{h.name}/{index}"
            window = windows.get(key)
            if window is None:
                window = windows[key] = WindowMean()
            out.append((index, key, window))
        made = self._hosts[h.name] = (frozenset(h.gpus), out)
        return made
