"""Step 2 — communication and synchronization: is the network or a sync slow?"""

from __future__ import annotations

import math
from dataclasses import dataclass

from verl_top.diagnosis.findings import Finding, Rule, RuleResult, no_data, passed, scale
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.diagnosis.view import View, fmt_pct
from verl_top.store import GpuEntry

STEP = 2
NEED_NCCL = "needs an NCCL_DEBUG=INFO log: run with NCCL_DEBUG=INFO and pass --nccl-log PATH"
WATCHDOG_TEXT = "Watchdog caught collective operation timeout"


def _nnodes(view: View) -> tuple[int | None, str]:
    """Number of nodes in the job and where that number came from."""
    for info in view.store.nccl.values():
        if info.nnodes:
            return info.nnodes, "NCCL log"
    hit = view.config("trainer.nnodes")
    if hit is not None and (n := view.num(hit[1])):
        return int(n), "trainer.nnodes"
    hosts = view.gpu_host_count()
    return (hosts, "GPU hosts monitored") if hosts else (None, "")


def nccl_transport_socket(view: View, th: Thresholds) -> RuleResult:
    """Multi-node job whose NCCL log says it uses the Socket transport (RDMA off)."""
    infos = [i for i in view.store.nccl.values() if i.transport]
    if not infos:
        return no_data(STEP, "nccl.transport_socket", NEED_NCCL)
    socket = [i for i in infos if "socket" in i.transport.lower()]
    nnodes, src = _nnodes(view)
    if not socket:
        return passed(
            STEP,
            "nccl.transport_socket",
            "transport: " + ", ".join(sorted({i.transport for i in infos})),
        )
    if nnodes is not None and nnodes <= 1:
        return passed(
            STEP,
            "nccl.transport_socket",
            "Socket transport but a single node (no inter-node traffic)",
        )
    sev = 0.8 if nnodes else 0.4
    where = ", ".join(sorted({f"{i.host}:{i.path}" if i.path else i.host for i in socket}))
    return Finding(
        STEP,
        "nccl.transport_socket",
        sev,
        f"NCCL uses TCP sockets between nodes (RDMA not enabled) on a {nnodes or '?'}-node job",
        [
            f"NCCL log ({where}): transport {socket[0].transport}",
            f"nodes: {nnodes or 'unknown'} ({src or 'not known'})",
        ],
        "Enable InfiniBand/RoCE: unset NCCL_IB_DISABLE, set NCCL_IB_HCA to the HCAs (e.g. mlx5_0) and "
        "NCCL_SOCKET_IFNAME to the data interface; check the IB devices are in the container.",
        {"transport": socket[0].transport, "nnodes": nnodes},
    )


def _expected(view: View, th: Thresholds, probe) -> tuple[float | None, str]:  # type: ignore[no-untyped-def]
    if probe.expected_gbs:
        return probe.expected_gbs, probe.link or "probe's expectation"
    names = " ".join(view.device_names())
    if (
        probe.scope == "intra"
        and probe.collective == "all_reduce"
        and ("H100" in names or "H200" in names)
    ):
        return th.nvlink_allreduce_gbs, "8xH100/H200 NVLink all_reduce"
    return None, ""


def nccl_busbw_low(view: View, th: Thresholds) -> RuleResult:
    """Probe busbw at >= busbw_min_bytes below busbw_ratio of the link's expected value."""
    probes = [p for p in view.store.probes if p.ok and p.rows and p.nranks > 1]
    if not probes:
        return no_data(
            STEP,
            "nccl.busbw_low",
            "needs a bandwidth probe: run `verl-top probe nccl` (perturbs training)",
        )
    worst: tuple[float, float, float, str, object] | None = None
    for p in probes:
        big = [r.busbw_gbs for r in p.rows if r.size_bytes >= th.busbw_min_bytes]
        if not big:
            continue
        got = max(big)
        exp, link = _expected(view, th, p)
        if exp is None:
            continue
        ratio = got / exp
        if worst is None or ratio < worst[0]:
            worst = (ratio, got, exp, link, p)
    if worst is None:
        return no_data(
            STEP,
            "nccl.busbw_low",
            "probe lacks >= 1 GiB rows or an expected bandwidth for its link",
        )
    ratio, got, exp, link, p = worst
    if ratio >= th.busbw_ratio:
        return passed(
            STEP,
            "nccl.busbw_low",
            f"busbw {got:.0f} GB/s = {fmt_pct(ratio)} of {exp:.0f} GB/s ({link})",
        )
    return Finding(
        STEP,
        "nccl.busbw_low",
        scale(ratio, th.busbw_ratio, 0.1, 0.5, 0.9),
        f"NCCL {p.collective} busbw {got:.0f} GB/s is {fmt_pct(ratio)} of the {exp:.0f} GB/s expected ({link})",
        [
            f"max busbw at >= {th.busbw_min_bytes / 2**30:.0f} GiB: {got:.1f} GB/s ({p.tool}, {p.nranks} ranks, {p.scope}, hosts {', '.join(p.hosts) or '?'})",
            f"expected {exp:.0f} GB/s for {link}",
            f"transport: {p.transport or 'unknown'}",
        ],
        "Check the transport (NCCL_DEBUG=INFO: IB vs Socket), NCCL_IB_HCA / NCCL_SOCKET_IFNAME, "
        "GPUDirect RDMA (NCCL_NET_GDR_LEVEL) and NIC/switch health.",
        {"busbw_gbs": got, "expected_gbs": exp, "ratio": ratio},
    )


def sync_weight_update(view: View, th: Thresholds) -> RuleResult:
    """Trainer->rollout weight sync (update_weights, older reshard) above weight_update_frac."""
    if not view.recent_steps():
        return no_data(STEP, "sync.weight_update", "needs verl steps: pass --verl-log PATH")
    rec = view.recent_steps()
    key = "update_weights"
    shares = [s.share("update_weights") for s in rec]
    if all(x is None for x in shares):
        key = "reshard"
        shares = [
            (v / s.step_time_core)
            if (v := _timing_any(s.metrics, "reshard")) and s.step_time_core
            else None
            for s in rec
        ]
    vals = sorted(x for x in shares if x is not None)
    if not vals:
        return no_data(
            STEP,
            "sync.weight_update",
            "no timing_s/update_weights or reshard: this verl version times weight sync inside gen",
        )
    share = vals[len(vals) // 2]
    if share <= th.weight_update_frac:
        return passed(STEP, "sync.weight_update", f"{key} {fmt_pct(share)} of step")
    secs = [s.stage_times.get(key) or _timing_any(s.metrics, key) or 0 for s in rec]
    return Finding(
        STEP,
        "sync.weight_update",
        scale(share, th.weight_update_frac, 0.4, 0.4, 0.85),
        f"Weight sync ({key}) takes {fmt_pct(share)} of the step",
        [f"timing_s/{key} {max(secs):.0f} s max, {fmt_pct(share)} of step, {view.steps_text()}"],
        "Use bucketed sync (actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes, "
        "default 2048) and check the transport (IB, not Socket) between trainer and rollout.",
        {"share": share, "stage": key},
    )


def _timing_any(metrics: dict[str, float], name: str) -> float | None:
    for k in (f"timing_s/{name}", f"timing/{name}"):
        if k in metrics:
            return float(metrics[k])
    return None


@dataclass
class NodeWait:
    """How often one node sat with every GPU idle while another node worked."""

    host: str
    waiting: int  # seconds (1 s buckets) of the window spent waiting
    seconds: int  # seconds of the window with samples from this node
    episodes: int  # separate waiting stretches (gaps > 2 s)

    @property
    def frac(self) -> float:
        """Share of the node's seconds spent waiting."""
        return self.waiting / max(1, self.seconds)


def _per_second(view: View, gpus: list[GpuEntry]) -> dict[int, list[float]]:
    """A node's activity values by whole second: each GPU's in turn, oldest first."""
    series = [view.gpu_series(g, "activity") for g in gpus]
    per_s: dict[int, list[float]] = {}
    if series and all(ts == series[0][0] for ts, _ in series):
        # One agent tick samples all GPUs of a node: one time axis. With one point per
        # second, a second's values are the GPUs' values at that point, in GPU order.
        keys = list(map(int, series[0][0]))
        if len(set(keys)) == len(keys):
            for k, row in zip(keys, zip(*(vs for _, vs in series), strict=True), strict=True):
                vals = list(row)
                if math.isnan(sum(vals)):
                    vals = [v for v in vals if v == v]  # NaN = missing
                if vals:
                    per_s[k] = vals
            return per_s
    for ts, vs in series:
        for k, v in zip(map(int, ts), vs, strict=True):
            if v == v:
                if k in per_s:
                    per_s[k].append(v)
                else:
                    per_s[k] = [v]
    return per_s


def node_waits(view: View, th: Thresholds) -> dict[str, NodeWait]:
    """Per node, the seconds of the window where all its GPUs were below ``sync_wait_idle_pct``
    while another node's mean was above ``sync_wait_busy_pct``. Empty with < 2 GPU nodes."""
    buckets: dict[str, dict[int, list[float]]] = {}
    for h in view.hosts():
        per_s = _per_second(view, list(h.gpus.values()))
        if per_s:
            buckets[h.name] = per_s
    if len(buckets) < 2:
        return {}
    # Per second, the two highest node means with their nodes: "the busiest other node" is the
    # top one, or the second when the top one is the node itself (hosts x seconds of work, not
    # hosts^2 x seconds).
    top: dict[int, tuple[tuple[float, str], tuple[float, str] | None]] = {}
    for host, mine in buckets.items():
        for t, vals in mine.items():
            m = (sum(vals) / len(vals), host)
            best = top.get(t)
            if best is None:
                top[t] = (m, None)
            elif m[0] > best[0][0]:
                top[t] = (m, best[0])
            elif best[1] is None or m[0] > best[1][0]:
                top[t] = (best[0], m)
    out: dict[str, NodeWait] = {}
    for host, mine in buckets.items():
        waiting: list[int] = []
        for t in sorted(t for t, vals in mine.items() if max(vals) < th.sync_wait_idle_pct):
            others = [m for m, h2 in filter(None, top.get(t, ())) if h2 != host]
            if others and max(others) > th.sync_wait_busy_pct:
                waiting.append(t)
        episodes = sum(1 for i, t in enumerate(waiting) if i == 0 or t - waiting[i - 1] > 2)
        out[host] = NodeWait(host, len(waiting), len(mine), episodes)
    return out


def sync_wait(view: View, th: Thresholds) -> RuleResult:
    """On a node all GPUs idle together while another node's GPUs are busy, repeatedly."""
    waits = node_waits(view, th)
    if not waits:
        return no_data(STEP, "sync.wait", "needs GPU samples from >= 2 nodes")
    worst: tuple[float, int, str] | None = None
    for host, w in waits.items():
        if w.episodes >= th.sync_wait_episodes and w.frac > th.sync_wait_frac:
            if worst is None or w.frac > worst[0]:
                worst = (w.frac, w.episodes, host)
    if worst is None:
        return passed(STEP, "sync.wait", f"no node idles while another works ({len(waits)} nodes)")
    frac, episodes, host = worst
    return Finding(
        STEP,
        "sync.wait",
        scale(frac, th.sync_wait_frac, 0.5, 0.55, 0.9),
        f"{host} waits with all GPUs idle {fmt_pct(frac)} of the time while other nodes work",
        [
            f"{host}: all GPUs < {th.sync_wait_idle_pct:.0f} % activity in {fmt_pct(frac)} of seconds, {episodes} episodes, {view.window_text}",
            f"other nodes > {th.sync_wait_busy_pct:.0f} % at the same times",
        ],
        "A straggler or uneven split makes nodes wait at the next collective: see step 4 "
        "(trainer.balance_batch, rollout load balance, the slow node).",
        {"host": host, "frac": frac, "episodes": episodes},
    )


def nccl_watchdog(view: View, th: Thresholds) -> RuleResult:
    """A ProcessGroupNCCL watchdog timeout or NCCL WARN line appeared."""
    hits = [
        e
        for e in view.store.events
        if e.kind in ("watchdog", "nccl_warn") or WATCHDOG_TEXT in e.text or "NCCL WARN" in e.text
    ]
    if not hits:
        if not (view.store.events or view.store.nccl or view.store.steps):
            return no_data(STEP, "nccl.watchdog", "needs the job's logs: --verl-log / --nccl-log")
        return passed(STEP, "nccl.watchdog", "no watchdog timeout or NCCL WARN line")
    watchdog = [e for e in hits if e.kind == "watchdog" or WATCHDOG_TEXT in e.text]
    first = (watchdog or hits)[-1]
    return Finding(
        STEP,
        "nccl.watchdog",
        1.0 if watchdog else 0.7,
        "NCCL watchdog timeout: a collective hung" if watchdog else "NCCL WARN lines in the log",
        [
            f"{len(hits)} line(s); latest from {first.host}:{first.path or 'log'}: {first.text.strip()[:300]}"
        ],
        "Find the rank that never joined (straggler, OOM, crash) in its worker log; raising "
        "actor_rollout_ref.nccl_timeout only delays the error. NCCL_DEBUG=INFO shows the last collective.",
        {"count": len(hits), "watchdog": len(watchdog), "line": first.text.strip()[:500]},
    )


RULES: list[Rule] = [
    nccl_transport_socket,
    nccl_busbw_low,
    sync_weight_update,
    sync_wait,
    nccl_watchdog,
]
