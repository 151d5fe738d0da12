"""Stragglers: a GPU or node that lags its peers now, with its likely cause and its cost.

A synchronous verl step waits at every collective for the slowest rank, so one slow GPU or node
sets the pace of all of them (and more nodes cannot help). ``map.imbalance`` judges averages over
the whole window; this module looks at the last ``straggler_window_s`` seconds so a straggler is
named within seconds of appearing, by cause:

- ``throttle``: a GPU whose clock-event reasons show power/thermal/hardware slowdown for most of
  the window while its SM clock is below ``straggler_clock_ratio`` of its busy peers';
- ``lost``: a GPU that fell off the bus (NVML ``GpuIsLost``, XID 79);
- ``host``: a node whose GPUs work at less than ``straggler_activity_ratio`` of the other
  nodes' while its host shows why (iowait, CPU saturated, one core pinned);
- ``nic``: a node whose NCCL log prints network errors (``NET/IB``, ``ibv_``, socket closed), or
  whose network rate fell below ``nic_rate_ratio`` of the other nodes' while it was on par before;
- ``flap``: a node whose agent went silent ``flap_gaps`` times in the window (gaps longer than
  ``flap_gap_s``), not shared by most other nodes (then it is the client's own network).

Its cost per step is estimated from the job's GPU-bound stage time (the steps' median seconds of
rollout, log-prob and update stages): a rank at ratio r of its peers' speed stretches that time
by 1/r - 1, and every other rank waits for it.
"""

from __future__ import annotations

import re
import statistics
from bisect import bisect_left
from dataclasses import dataclass, field

from verl_top.diagnosis.findings import Finding, scale
from verl_top.diagnosis.readable import seconds
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.diagnosis.view import View
from verl_top.model import THROTTLE_MASK, clock_reason_names
from verl_top.store import GpuEntry, HostEntry

# Stages whose time the GPUs set (a slow GPU or node stretches them).
GPU_STAGES = ("gen", "old_log_prob", "ref", "values", "update_critic", "update_actor")
# NCCL WARN text that points at the network (gpu_comm.md §2.4).
NIC_MARKS = ("NET/IB", "NET/Socket", "ibv_", "Connection closed by remote peer", "NET/OFI")
STEP = 4
_XID_GPU = re.compile(r"GPU (\d+): XID \d+")
_HCA = re.compile(r"\bhca (\w[\w.:-]*)")
SHARED_GAP_SHARE = 0.25  # gaps on more than this share of hosts are the client's, not a host's
STRETCH_BASIS = "the last step's GPU-bound stages beyond the run's median"


@dataclass(frozen=True)
class Straggler:
    """One GPU (``gpu`` set) or node that lags its peers, why, and what it costs."""

    host: str
    gpu: int | None
    kind: str  # throttle | lost | host | nic | flap
    cause: str
    ratio: float | None = None  # its speed relative to its peers (clock or activity), if known
    cost_s: float | None = None  # seconds per step
    evidence: list[str] = field(default_factory=list)
    cost_basis: str = ""

    @property
    def name(self) -> str:
        """``node7:gpu3`` or ``node7``."""
        return f"{self.host}:gpu{self.gpu}" if self.gpu is not None else self.host


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def gpu_bound_seconds(view: View) -> float | None:
    """Median seconds per recent step of the stages the GPUs set."""
    return view.median_seconds(*GPU_STAGES)


def _cost(view: View, ratio: float | None) -> float | None:
    base = gpu_bound_seconds(view)
    if base is None or ratio is None or ratio <= 0 or ratio >= 1:
        return None
    step = view.median_step_s()
    cost = base * (1 / ratio - 1)
    return round(min(cost, step) if step else cost, 1)


class _Recent:
    """The last ``straggler_window_s`` seconds of the store, read once per evaluation."""

    def __init__(self, view: View, th: Thresholds) -> None:
        self.view = view
        self.th = th
        self.since = view.now - th.straggler_window_s
        self._means: dict[str, dict[str, float]] = {}

    def gpu(self, g: GpuEntry, column: str) -> list[float]:
        return self.view.gpu_values(g, column, self.since)

    def host(self, h: HostEntry, column: str, since: float | None = None) -> list[float]:
        vals = h.history.recent_column(column, self.since if since is None else since)
        return [v for v in vals if v == v]

    def host_means(self, hosts: list[HostEntry], column: str) -> dict[str, float]:
        """Each host's mean of ``column`` over the last half window (read once per column)."""
        hit = self._means.get(column)
        if hit is None:
            since = self.view.now - self.th.straggler_window_s / 2  # the latest seconds: fast
            hit = self._means[column] = {
                h.name: m for h in hosts if (m := _mean(self.host(h, column, since))) is not None
            }
        return hit


def throttled_gpus(view: View, th: Thresholds, recent: _Recent) -> list[Straggler]:
    """GPUs held down by power/thermal/HW slowdown while slower than their busy peers.

    Only GPUs whose latest sample is throttled are read back (most evaluations read none);
    the peers' clock is the median of the busy GPUs' latest samples."""
    clocks: list[float] = []
    cands: list[GpuEntry] = []
    for g in view.store.iter_gpus():
        lt = g.latest
        if lt is None or lt.t < recent.since:
            continue
        if lt.throttled:
            cands.append(g)
        elif lt.sm_mhz is not None and (lt.activity or 0.0) >= th.busy_pct:
            clocks.append(lt.sm_mhz)
    peers = _median(clocks)
    out: list[Straggler] = []
    for g in cands:
        flags = recent.gpu(g, "throttled")
        if not flags or sum(flags) / len(flags) < 0.5:
            continue
        mine = _mean(recent.gpu(g, "sm_mhz"))
        if mine is None or not peers or mine >= th.straggler_clock_ratio * peers:
            continue
        mask = 0
        for bits in set(recent.gpu(g, "clock_reasons")):
            mask |= int(bits)
        reasons = [n for n in clock_reason_names(mask & THROTTLE_MASK)] or ["slowdown"]
        ratio = mine / peers
        out.append(
            Straggler(
                g.host,
                g.index,
                "throttle",
                f"throttled ({', '.join(reasons)}): SM clock {mine:.0f} MHz vs {peers:.0f} MHz "
                "on its busy peers",
                ratio,
                _cost(view, ratio),
                cost_basis=f"the GPU-bound stages ({seconds(gpu_bound_seconds(view))}/step) "
                f"at {ratio:.2f}x its peers' clock; every other rank waits for it",
                evidence=[
                    f"{g.host}:gpu{g.index} throttled in {sum(flags):.0f} of {len(flags)} samples "
                    f"of the last {th.straggler_window_s:.0f} s ({', '.join(reasons)})",
                    f"SM clock {mine:.0f} MHz = {ratio:.2f}x the median of {len(clocks)} busy "
                    f"GPUs' latest ({peers:.0f} MHz)",
                ],
            )
        )
    return out


def lost_gpus(view: View) -> list[Straggler]:
    """GPUs whose latest sample says they fell off the bus."""
    return [
        Straggler(
            g.host,
            g.index,
            "lost",
            "fell off the bus (NVML: GPU is lost, XID 79 class)",
            evidence=[f"{g.host}:gpu{g.index}: latest sample has lost=true"],
        )
        for g in view.store.iter_gpus()
        if g.latest is not None and g.latest.lost
    ]


def xid_gpus(view: View) -> list[Straggler]:
    """GPUs with an XID error in the window (``event`` kind ``xid``: the Prometheus source's
    DCGM_FI_DEV_XID_ERRORS, "GPU 3: XID 79 (...)"), the latest per GPU."""
    latest: dict[tuple[str, int], str] = {}
    for e in view.store.events:
        if e.kind == "xid" and e.t >= view.since and (m := _XID_GPU.match(e.text)):
            latest[(e.host, int(m.group(1)))] = e.text
    return [
        Straggler(
            host,
            gpu,
            "xid",
            text.split(": ", 1)[-1].split(", from")[0],
            evidence=[f"{host}: {text}"],
        )
        for (host, gpu), text in sorted(latest.items())
    ]


def _host_cause(recent: _Recent, h: HostEntry, hosts: list[HostEntry], th: Thresholds) -> str:
    """Why the host's own side is slow, when it stands out from the other hosts over the last
    seconds: iowait, CPU saturated, one core pinned ("" when nothing does)."""
    checks = (
        ("iowait_pct", th.host_iowait_pct, "host iowait {:.0f} % (storage stalls its data)"),
        ("cpu_pct", th.host_cpu_pct, "host CPU saturated ({:.0f} %)"),
        ("cpu_max_core", th.host_core_pct, "one host CPU core pinned ({:.0f} %)"),
    )
    for column, limit, text in checks:
        means = recent.host_means(hosts, column)
        mine = means.get(h.name)
        if mine is None or mine < limit:
            continue
        # most hosts below the limit: the others' median is too (no need to leave h out)
        below = sum(1 for k, v in means.items() if k != h.name and v < limit)
        if below * 2 > len(means) - 1:
            return text.format(mine)
    return ""


def _step_stretch(view: View) -> float | None:
    """Seconds the last two steps' GPU-bound stages both took beyond the median of the steps
    before them (the smaller excess); None when either is within 10 % (jitter) or there are
    too few steps."""
    steps = [s for s in view.steps() if not s.is_outlier]
    if len(steps) < 5:
        return None
    secs = [sum(s.stage_times.get(n, 0.0) for n in GPU_STAGES) for s in steps]
    base = _median(secs[:-2])
    if not base:
        return None
    extra = min(secs[-2:]) - base
    return round(extra, 1) if extra > 0.1 * base else None


def _seconds(recent: _Recent, h: HostEntry, th: Thresholds) -> dict[int, tuple[float, float]]:
    """Per whole second of the window: the node's mean GPU activity and its share of GPUs
    spinning in NCCL (NVML util pinned, SM below hang_busy_pct)."""
    acc: dict[int, list[float]] = {}
    for g in h.gpus.values():
        ts, act = g.history.recent_series("activity", recent.since)
        util = g.history.recent_column("util_gpu", recent.since)
        for t, a, u in zip(ts, act, util, strict=False):
            if a == a:
                row = acc.setdefault(int(t), [0.0, 0.0, 0.0])
                row[0] += a
                row[1] += u >= th.stall_spin_pct and a < th.hang_busy_pct
                row[2] += 1
    return {k: (v[0] / v[2], v[1] / v[2]) for k, v in acc.items()}


def _lag_share(
    name: str, per: dict[str, dict[int, tuple[float, float]]], th: Thresholds
) -> tuple[float, float, float]:
    """(share of the node's seconds it lagged, its mean activity, the others'): a second lags
    when the others compute and it works below straggler_activity_ratio of them, or when the
    others wait in NCCL while it still works."""
    lag = n = 0
    mine_sum = others_sum = 0.0
    for sec, (mine, _) in per[name].items():
        rows = [p[sec] for k, p in per.items() if k != name and sec in p]
        if not rows:
            continue
        others = statistics.median(r[0] for r in rows)
        waiting = statistics.median(r[1] for r in rows)
        n += 1
        mine_sum, others_sum = mine_sum + mine, others_sum + others
        working = others >= th.hang_busy_pct and mine < th.straggler_activity_ratio * others
        lag += working or (waiting >= 0.5 and mine >= others + 10)
    return (lag / n, mine_sum / n, others_sum / n) if n else (0.0, 0.0, 0.0)


def slow_nodes(view: View, th: Thresholds, recent: _Recent) -> list[Straggler]:
    """Nodes whose host stands out (iowait, CPU) while their GPUs do not keep pace, second by
    second: lower activity than the other nodes', or still working while they wait in NCCL."""
    hosts = [h for h in view.hosts() if h.gpus]
    if len(hosts) < 2:
        return []
    causes = {h.name: c for h in hosts if (c := _host_cause(recent, h, hosts, th))}
    if not causes:
        return []  # the usual case: no per-second work at all
    per = {h.name: _seconds(recent, h, th) for h in hosts}
    out: list[Straggler] = []
    for name, cause in causes.items():
        share, mine, others = _lag_share(name, per, th)
        if share < 0.5:
            continue
        out.append(
            Straggler(
                name,
                None,
                "host",
                f"{cause}; its GPUs lag the other nodes' in {share:.0%} of the last "
                f"{th.straggler_window_s:.0f} s",
                None,
                _step_stretch(view),
                cost_basis=STRETCH_BASIS,
                evidence=[
                    f"{name}: GPU activity {mine:.0f} % vs {others:.0f} % (median of "
                    f"{len(hosts) - 1} other nodes), lagging {share:.0%} of the seconds of the "
                    f"last {th.straggler_window_s:.0f} s (below "
                    f"{th.straggler_activity_ratio:g}x theirs, or working while they wait in NCCL)",
                    cause,
                ],
            )
        )
    return out


def _net_seconds(h: HostEntry, since: float) -> dict[int, float]:
    """The host's network rate (rx + tx) by whole second from ``since``."""
    ts, rx = h.history.recent_series("net_rx_bps", since)
    tx = h.history.recent_column("net_tx_bps", since)
    out: dict[int, float] = {}
    for t, a, b in zip(ts, rx, tx, strict=False):
        if a == a or b == b:
            out[int(t)] = (a if a == a else 0.0) + (b if b == b else 0.0)
    return out


class _Medians:
    """Per whole second, every host's rate sorted: the other hosts' median in O(log n)."""

    def __init__(self, rates: dict[str, dict[int, float]]) -> None:
        by_sec: dict[int, list[float]] = {}
        for per in rates.values():
            for sec, v in per.items():
                by_sec.setdefault(sec, []).append(v)
        self.rates = rates
        self.sorted = {sec: sorted(v) for sec, v in by_sec.items()}

    def without(self, sec: int, value: float) -> float | None:
        """The median of second ``sec``'s rates with one ``value`` (the host's own) left out."""
        xs = self.sorted.get(sec)
        if not xs or len(xs) < 2:
            return None
        i = bisect_left(xs, value)
        n = len(xs) - 1

        def at(k: int) -> float:
            return xs[k] if k < i else xs[k + 1]

        return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2

    def low_share(self, host: str, ratio: float) -> tuple[float, float, float] | None:
        """(share of the host's seconds below ``ratio`` x the other hosts' median, its mean
        rate, the others' mean median); None with fewer than 3 comparable seconds."""
        low = n = 0
        mine_sum = others_sum = 0.0
        for sec, rate in self.rates.get(host, {}).items():
            peers = self.without(sec, rate)
            if not peers or peers < 1e6:  # < 1 MB/s: nothing to compare that second
                continue
            n += 1
            low += rate < ratio * peers
            mine_sum, others_sum = mine_sum + rate, others_sum + peers
        return (low / n, mine_sum / n, others_sum / n) if n >= 3 else None


def failing_nics(view: View, th: Thresholds, recent: _Recent) -> list[Straggler]:
    """Nodes whose NCCL log prints network errors, or whose network rate collapsed (below
    nic_rate_ratio of the other nodes' in most recent seconds, on par over the window)."""
    errors: dict[str, list[str]] = {}
    for e in view.store.events:
        if e.kind == "nccl_warn" and e.t >= view.since and any(m in e.text for m in NIC_MARKS):
            errors.setdefault(e.host, []).append(e.text)
    hosts = [h for h in view.hosts() if len(h.history)]
    now = _Medians({h.name: _net_seconds(h, recent.since) for h in hosts})
    before: _Medians | None = None  # the whole window, read only for a host that dropped
    out: list[Straggler] = []
    for h in hosts:
        lines = errors.get(h.name, [])
        drop = now.low_share(h.name, th.nic_rate_ratio) if len(hosts) > 1 else None
        dropped = False
        if drop is not None and drop[0] >= 0.8:
            if before is None:
                before = _Medians({o.name: _net_seconds(o, view.since) for o in hosts})
            past = before.low_share(h.name, th.nic_rate_ratio)
            dropped = past is not None and past[0] <= 0.5
        if not lines and not dropped:
            continue
        parts, ev = [], []
        if lines:
            hca = _HCA.search(lines[-1])
            parts.append(
                f"NCCL network errors ({len(lines)} line(s))"
                + (f" on {hca.group(1)}" if hca else "")
            )
            ev.append(f"{h.name}: latest NCCL WARN: {lines[-1].strip()[:300]}")
        if dropped and drop is not None:
            parts.append(f"network at {drop[1] / drop[2]:.2f}x the other nodes'")
            ev.append(
                f"{h.name}: network {drop[1] / 1e6:.1f} MB/s vs {drop[2] / 1e6:.1f} MB/s (median "
                f"of other nodes), low in {drop[0]:.0%} of the last "
                f"{th.straggler_window_s:.0f} s, on par over the window before"
            )
        out.append(
            Straggler(
                h.name,
                None,
                "nic",
                "failing NIC: " + ", ".join(parts),
                None,
                _step_stretch(view),
                evidence=ev,
                cost_basis=STRETCH_BASIS,
            )
        )
    return out


def _gaps(h: HostEntry, since: float, now: float, gap_s: float) -> list[float]:
    """Lengths of the silences (> gap_s) in the host's samples from ``since``, the current one
    included."""
    ts, _ = h.history.recent_series("cpu_pct", since)
    out = [b - a for a, b in zip(ts, ts[1:], strict=False) if b - a > gap_s]
    if ts and now - ts[-1] > gap_s:
        out.append(now - ts[-1])
    return out


def flapping_hosts(view: View, th: Thresholds) -> list[Straggler]:
    """Nodes whose agent dropped out ``flap_gaps`` times in the window, alone."""
    hosts = [h for h in view.hosts() if len(h.history)]
    found: list[tuple[HostEntry, list[float]]] = []
    for h in hosts:
        gaps = _gaps(h, view.since, view.now, th.flap_gap_s)
        if len(gaps) >= th.flap_gaps:
            found.append((h, gaps))
    if len(hosts) < 2 or len(found) > max(1.0, SHARED_GAP_SHARE * len(hosts)):
        return []  # (nearly) every host at once: the client's own network or a pause
    return [
        Straggler(
            h.name,
            None,
            "flap",
            f"flapping: its agent went silent {len(gaps)} times in the last "
            f"{th.window_s:.0f} s (longest {max(gaps):.0f} s)",
            cost_s=_step_stretch(view),
            cost_basis=STRETCH_BASIS,
            evidence=[
                f"{h.name}: silences of "
                + ", ".join(f"{g:.0f} s" for g in gaps[-5:])
                + f" (state now: {h.state})"
            ],
        )
        for h, gaps in found
    ]


def stragglers(view: View, th: Thresholds) -> list[Straggler]:
    """Every straggler of the recent window, the costliest first."""
    recent = _Recent(view, th)
    found = (
        lost_gpus(view)
        + xid_gpus(view)
        + throttled_gpus(view, th, recent)
        + slow_nodes(view, th, recent)
        + failing_nics(view, th, recent)
        + flapping_hosts(view, th)
    )
    return sorted(found, key=lambda s: (s.kind not in ("lost", "xid"), -(s.cost_s or 0.0), s.name))


def straggler_finding(view: View, th: Thresholds, found: list[Straggler]) -> Finding:
    """``map.imbalance`` naming the stragglers: the costliest first, each with its cause."""
    top = found[0]
    step = view.median_step_s()
    cost = top.cost_s
    title = f"Straggler {top.name}: {top.cause}"
    if cost is not None:
        title += f"; costs ~{seconds(cost)} per step"
    if len(found) > 1:
        title += f" (+{len(found) - 1} more)"
    evidence: list[str] = []
    for s in found[:6]:
        evidence += s.evidence
    if cost is not None:
        evidence.append(f"cost ~{seconds(cost)} per step: {top.cost_basis}")
    share = cost / step if cost is not None and step else None
    sev = scale(share, 0.05, 0.5, 0.5, 0.85) if share is not None else 0.6
    if top.kind in ("lost", "xid"):
        sev = 0.9
    return Finding(
        STEP,
        "map.imbalance",
        sev,
        title,
        evidence,
        _advice(top),
        {
            "culprits": [{"host": s.host, "gpu": s.gpu, "kind": s.kind} for s in found],
            "slow_node": top.host if top.gpu is None else None,
            "spread": None,
        },
        cost_s=cost,
        save_s=cost,
        step_s=step,
        save_basis=f"{top.cost_basis}; fixing or draining {top.name} recovers it"
        if cost is not None
        else "",
    )


ADVICE = {
    "throttle": "Cool or re-seat the GPU, check its power limit (nvidia-smi -q -d PERFORMANCE) "
    "and the node's fans; drain it from the job until it runs at its peers' clock.",
    "lost": "The GPU fell off the bus: drain the node and reset the GPU (XID 79 in dmesg).",
    "xid": "Look the XID up in NVIDIA's XID catalogue; 48/63/64/79/94/95 mean a GPU to drain "
    "and reset (memory errors, fell off the bus).",
    "host": "Find what loads the host (dataloader workers, storage, other jobs); move data to "
    "local disk or raise data.dataloader_num_workers.",
    "nic": "Check the NIC (ibstat, port counters, cable) and NCCL_IB_HCA; drain the node until "
    "its link is healthy.",
    "flap": "Check the node's network and power: a node that keeps dropping out stalls every "
    "collective it is part of.",
}


def _advice(top: Straggler) -> str:
    return (
        ADVICE[top.kind]
        + " More nodes will not help: every step waits for the slowest rank at each "
        f"collective, so {top.name} sets the pace of all of them."
    )
