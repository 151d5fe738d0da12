"""One per-tick summary of the store, computed once and shared by every pane and the header.

The GPU table sorts and counts by numbers of *every* GPU (window activity, idle, throttled),
but draws only the rows on screen. Those numbers are gathered here in one pass per store change
(``SummaryCache``), so the cost of the off-screen rows is one cheap read each, and the panes do
not each walk the store again. A GPU whose ring did not move keeps its previous entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from verl_top.model import THROTTLE_MASK, GpuSample
from verl_top.store import GpuEntry, HostEntry, Store, mean

IDLE_THRESHOLD = 50.0  # % mean activity over the window below which a GPU counts as idle
# Host states in which nothing new arrives (as in the UI): left out of live counts.
DEAD_STATES = ("down", "stale", "auth_failed", "hostkey_changed", "no_python")
NO_SORT = -1.0  # the sort value of a missing number: missing values sort first


@dataclass(frozen=True)
class GpuSummary:
    """What the tables sort and count one GPU by (its row cells are built only when shown)."""

    key: str  # "host/index", the row key
    host_pos: int  # position of its host in the store (host order)
    index: int
    act: float | None  # mean activity over the window
    live: bool
    idle: bool
    throttled: bool
    sort: dict[str, float]


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


def gpu_sort_values(s: GpuSample | None, act: float | None, throttled: bool) -> dict[str, float]:
    """The numbers pane 1 can sort by; missing ones sort first."""
    if s is None:
        base = dict.fromkeys(
            ("nvml", "sm", "tensor", "dram", "memory", "power", "temp", "clock"), NO_SORT
        )
    else:
        base = {
            "nvml": _num(s.util_gpu),
            "sm": _num(s.sm_util),
            "tensor": _num(s.tensor_util),
            "dram": _num(s.dram_util),
            "memory": _num(s.mem_used_mib),
            "power": _num(s.power_w),
            "temp": _num(s.temp_c),
            "clock": _num(s.sm_mhz),
        }
    base["activity"] = _num(act)
    base["throttle"] = float(throttled)
    return base


def summarize_gpu(key: str, host_pos: int, h: HostEntry, g: GpuEntry, since: float) -> GpuSummary:
    """One GPU's entry: its window activity (the one ring read), flags and sort values."""
    act = mean(g.history.recent_values("activity", since))
    live = h.state not in DEAD_STATES
    s = g.latest
    reasons = None if s is None else s.clock_reasons
    throttled = bool(reasons and reasons & THROTTLE_MASK)
    idle = live and act is not None and act < IDLE_THRESHOLD
    return GpuSummary(
        key, host_pos, g.index, act, live, idle, throttled, gpu_sort_values(s, act, throttled)
    )


class SummaryCache:
    """Keeps the summary of the latest store version; recomputes at most once per change.

    A GPU entry is reused while its ring, latest sample, host state, window start and
    position are unchanged (a host that sent nothing this tick costs a tuple compare).
    """

    def __init__(self) -> None:
        self.summary: StoreSummary | None = None
        self._key: tuple[int, float, float] | None = None
        self._gpu_stamps: dict[str, tuple[object, ...]] = {}
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
        old = self.summary.gpus if self.summary is not None else {}
        out = StoreSummary(store.version)
        stamps: dict[str, tuple[object, ...]] = {}
        acts: list[float] = []
        for pos, h in enumerate(store.hosts.values()):
            live_host = h.state not in DEAD_STATES
            host_acts: list[float] = []
            host_idle = 0
            for index in sorted(h.gpus):
                g = h.gpus[index]
                key = f"{h.name}/{index}"
                stamp = (g.history.last_time(), len(g.history), id(g.latest), h.state, pos, since)
                prev = old.get(key)
                if prev is not None and self._gpu_stamps.get(key) == stamp:
                    gs = prev
                else:
                    gs = summarize_gpu(key, pos, h, g, since)
                stamps[key] = stamp
                out.gpus[key] = gs
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
        self._gpu_stamps = stamps
        return out
