"""Step 2 — communication and synchronization: is the network or a sync slow?"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from verl_top.diagnosis.findings import Finding, Rule, RuleResult, no_data, passed, scale
from verl_top.diagnosis.guards import mode_guard
from verl_top.diagnosis.readable import number, seconds
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.diagnosis.view import View, fmt_pct
from verl_top.diagnosis.worth import Worth
from verl_top.model import ProbeResult
from verl_top.nccl.expected import fill_expectation, inventory_for, rdma_ports
from verl_top.store import GpuEntry

STEP = 2
NEED_NCCL = "needs an NCCL_DEBUG=INFO log: run with NCCL_DEBUG=INFO and pass --nccl-log PATH"
WATCHDOG_TEXT = "Watchdog caught collective operation timeout"


def _nnodes(view: View) -> tuple[int | None, str]:
    """Number of nodes in the job and where that number came from."""
    for info in view.store.nccl.values():
        if info.nnodes:
            return info.nnodes, "NCCL log"
    for info in view.store.nccl.values():
        if len(info.gpus_per_host or {}) > 1:
            return len(info.gpus_per_host or {}), "NCCL Init COMPLETE lines"
    multi = [p for p in view.store.probes if len(p.hosts) > 1]
    if multi:
        return len(multi[-1].hosts), f"{multi[-1].tool} rank list"
    hit = view.config("trainer.nnodes")
    if hit is not None and (n := view.num(hit[1])):
        return int(n), "trainer.nnodes"
    hosts = view.gpu_host_count()
    return (hosts, "GPU hosts monitored") if hosts else (None, "")


def human_size(n: int) -> str:
    """1073741824 -> "1 GiB"; other sizes in the largest whole unit."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            v = n / (1 << shift)
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} B"


@dataclass
class BusbwJudgement:
    """One probe's peak busbw at its largest sizes against what its links should carry."""

    probe: ProbeResult
    got: float
    size: int  # message size of the peak
    sizes_text: str  # which rows were used, in words
    expected: float | None
    basis: str  # where ``expected`` came from
    assumed: bool

    @property
    def ratio(self) -> float | None:
        """got / expected."""
        return self.got / self.expected if self.expected else None


def judge_probe(view: View, th: Thresholds, p: ProbeResult) -> BusbwJudgement | None:
    """Peak busbw over the largest sizes present (>= busbw_min_bytes when there are such rows)
    and the expectation from the user's number, the agents' inventory, the log or the table."""
    if not p.rows:
        return None
    largest = max(r.size_bytes for r in p.rows)
    floor = min(th.busbw_min_bytes, largest)
    best: tuple[float, int] | None = None
    for r in p.rows:
        if r.size_bytes < floor:
            continue
        for bw in (r.busbw_gbs, r.in_place_busbw_gbs):
            if bw is not None and (best is None or bw > best[0]):
                best = (bw, r.size_bytes)
    if best is None:
        return None
    if floor >= th.busbw_min_bytes:
        sizes = f">= {human_size(int(th.busbw_min_bytes))} (largest {human_size(largest)})"
    else:
        sizes = (
            f"the largest size present, {human_size(largest)} (below "
            f"{human_size(int(th.busbw_min_bytes))}: the peak may be higher)"
        )
    inter = len(p.hosts) > 1 or p.scope == "inter"
    override = (th.expect_inter_busbw_gbs if inter else th.expect_busbw_gbs) or None
    trial = dataclasses.replace(p, rows=[])
    names = view.device_names()
    exp = fill_expectation(
        trial,
        gpu_name=p.gpu_name or (names[0] if names else ""),
        inventory=view.store.node_topology,
        override=override,
    )
    known = p.expected_gbs and "assumed" not in (p.expected_source or "")
    if exp is not None and not (exp.assumed and known):
        return BusbwJudgement(p, best[0], best[1], sizes, exp.gbs, exp.basis, exp.assumed)
    if p.expected_gbs:  # the producer knew better than a guess (or nothing else is known)
        basis = p.expected_source or p.link or "probe's expectation"
        assumed = "assumed" in (p.expected_source or "")
        return BusbwJudgement(p, best[0], best[1], sizes, p.expected_gbs, basis, assumed)
    joined = " ".join(names)
    if not inter and p.collective == "all_reduce" and ("H100" in joined or "H200" in joined):
        basis = "8xH100/H200 NVLink all_reduce (thresholds.nvlink_allreduce_gbs)"
        return BusbwJudgement(p, best[0], best[1], sizes, th.nvlink_allreduce_gbs, basis, False)
    return BusbwJudgement(p, best[0], best[1], sizes, None, "", False)


def _socket_sources(view: View) -> list[tuple[str, str, dict[str, str]]]:
    """(where, transport, NCCL settings) of every multi-node Socket transport seen."""
    out = []
    for i in view.store.nccl.values():
        if "socket" in i.transport.lower():
            out.append(
                (
                    f"NCCL log {i.host}:{i.path}" if i.path else f"NCCL log {i.host}",
                    i.transport,
                    i.settings or {},
                )
            )
    for p in view.store.probes:
        if len(p.hosts) > 1 and "socket" in p.transport.lower():
            out.append((f"{p.tool} across {', '.join(p.hosts)}", p.transport, p.settings or {}))
    return out


def _rdma_inventory(view: View) -> list[str]:
    """ "host: mlx5_0 IB 400 Gb/s, ..." for monitored hosts that have active IB/RoCE ports."""
    out = []
    for host, topo in view.store.node_topology.items():
        ports = rdma_ports(topo)
        if ports:
            out.append(f"{host}: " + ", ".join(f"{n} {r:g} Gb/s" for n, r in ports[:8]))
    return out


def _gbs(x: float | None) -> str:
    """GB/s for a sentence: whole numbers from 100 up, one decimal below (a 1-NIC HDR link's
    6.44 of 23.5 must not read as "6 of 24")."""
    if x is None:
        return "?"
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}"


def _why_failed(p: ProbeResult) -> str:
    """A failed run's reason for a no-data detail: its first line, bounded."""
    first = p.error.strip().splitlines()[0] if p.error.strip() else "failed"
    return f"{p.tool or 'probe'}: {first[:200]}"


def nccl_transport_socket(view: View, th: Thresholds) -> RuleResult:
    """Multi-node job or probe whose NCCL traffic uses the Socket transport (RDMA off)."""
    infos = [i for i in view.store.nccl.values() if i.transport]
    probes = [p for p in view.store.probes if p.transport and len(p.hosts) > 1]
    if not infos and not probes:
        given = [p for p in view.store.probes if len(p.hosts) > 1]
        if given and not given[-1].ok and given[-1].error:
            return no_data(STEP, "nccl.transport_socket", _why_failed(given[-1]))
        if given:
            # --nccl-log was given, but the run printed no line naming the transport.
            return no_data(
                STEP,
                "nccl.transport_socket",
                f"the {len(given[-1].hosts)}-node {given[-1].tool} output has no NCCL INFO line "
                "naming the transport: rerun it with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET",
            )
        return no_data(STEP, "nccl.transport_socket", NEED_NCCL)
    socket = _socket_sources(view)
    nnodes, src = _nnodes(view)
    if not socket:
        seen = {i.transport for i in infos} | {p.transport for p in probes}
        return passed(STEP, "nccl.transport_socket", "transport: " + ", ".join(sorted(seen)))
    if nnodes is not None and nnodes <= 1:
        return passed(
            STEP,
            "nccl.transport_socket",
            "Socket transport but a single node (no inter-node traffic)",
        )
    rdma = _rdma_inventory(view)
    sev = 0.9 if rdma else (0.8 if nnodes else 0.4)
    where, transport, settings = socket[0]
    evidence = [
        f"{where}: transport {transport}",
        f"nodes: {nnodes or 'unknown'} ({src or 'not known'})",
    ]
    off = [f"{k}={settings[k]}" for k in ("NCCL_IB_DISABLE", "NCCL_NET") if k in settings]
    named = [f"{k}={settings[k]}" for k in ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA") if k in settings]
    if off or named:
        evidence.append("settings seen: " + ", ".join(off + named))
    if rdma:
        evidence.append("these nodes have RDMA ports: " + "; ".join(rdma[:4]))
    gap: dict[str, float] = {}
    for p in view.store.probes:
        if len(p.hosts) > 1 and "socket" in p.transport.lower():
            j = judge_probe(view, th, p)
            if j is not None and j.expected:
                evidence.append(
                    f"busbw {j.got:.1f} GB/s at {human_size(j.size)} = {fmt_pct(j.ratio or 0.0)} of "
                    f"~{j.expected:.0f} GB/s expected ({j.basis})"
                )
                gap = {"busbw_gbs": j.got, "expected_gbs": j.expected}
                break
    fix = "Enable InfiniBand/RoCE: "
    fix += (
        "unset NCCL_IB_DISABLE (it is set to 1); "
        if "NCCL_IB_DISABLE=1" in off
        else "check NCCL_IB_DISABLE is unset; "
    )
    fix += (
        "set NCCL_IB_HCA to the HCAs (e.g. mlx5_0; a single HCA limits the job to one NIC) and "
        "NCCL_SOCKET_IFNAME to the bootstrap interface; check the IB devices are in the container."
    )
    return Finding(
        STEP,
        "nccl.transport_socket",
        sev,
        f"NCCL uses TCP sockets between nodes (RDMA not enabled) on a {nnodes or '?'}-node job",
        evidence,
        fix,
        {"transport": transport, "nnodes": nnodes, "settings": dict(settings), **gap},
    )


def _unused_nics(view: View, p: ProbeResult) -> list[str]:
    """An evidence line when NCCL listed fewer NICs than the nodes have active RDMA ports."""
    found = inventory_for(p.hosts, view.store.node_topology)
    have = [len(rdma_ports(rec)) for rec in found.values()]
    if not p.nics or not have or min(have) <= p.nics:
        return []
    hca = (p.settings or {}).get("NCCL_IB_HCA")
    return [
        f"NCCL used {p.nics} NIC(s) per node; the nodes have {min(have)} active RDMA ports"
        + (f" (NCCL_IB_HCA={hca} limits it)" if hca else " (check NCCL_IB_HCA)")
    ]


def _gdr_note(transport: str) -> str:
    """Why an RDMA transport without GPUDirect matters, "" otherwise."""
    if transport in ("IB", "RoCE"):
        return (
            " without GPUDirect RDMA (channels via NET/IB/<n> without /GDRDMA): data is staged "
            "through host memory; check the nvidia-peermem module and NCCL_NET_GDR_LEVEL"
        )
    return ""


def nccl_busbw_low(view: View, th: Thresholds) -> RuleResult:
    """Peak busbw at the largest sizes below busbw_ratio of what the probe's links should carry."""
    probes = [p for p in view.store.probes if p.ok and p.rows and p.nranks > 1]
    if not probes:
        failed = [p for p in view.store.probes if not p.ok and p.error]
        if failed:  # say why the run that was given cannot be judged
            return no_data(STEP, "nccl.busbw_low", _why_failed(failed[-1]))
        return no_data(
            STEP,
            "nccl.busbw_low",
            "needs a bandwidth probe: run `verl-top probe nccl` (perturbs training)",
        )
    judged = [j for p in probes if (j := judge_probe(view, th, p)) is not None]
    rated = [j for j in judged if j.ratio is not None]
    if not rated:
        return no_data(
            STEP,
            "nccl.busbw_low",
            "no expected bandwidth for the probe's link: pass --expect-busbw GBS or monitor "
            "the nodes (NIC inventory)",
        )
    worst = min(rated, key=lambda j: j.ratio or 0.0)
    ratio = worst.ratio or 0.0
    p = worst.probe
    if ratio >= th.busbw_ratio:
        return passed(
            STEP,
            "nccl.busbw_low",
            f"busbw {_gbs(worst.got)} GB/s at {human_size(worst.size)} = {fmt_pct(ratio)} of "
            f"{_gbs(worst.expected)} GB/s ({worst.basis})",
        )
    sev = scale(ratio, th.busbw_ratio, 0.1, 0.5, 0.9)
    if worst.assumed:
        sev = min(sev, 0.5)  # a design-based guess must not outrank measured facts
    where = f"{p.nranks} ranks, {len(p.hosts) or 1} node(s)"
    if p.gpus_per_host:
        where += (
            " (" + ", ".join(f"{h}: {n} GPUs" for h, n in list(p.gpus_per_host.items())[:4]) + ")"
        )
    return Finding(
        STEP,
        "nccl.busbw_low",
        sev,
        f"NCCL {p.collective} busbw {_gbs(worst.got)} GB/s is {fmt_pct(ratio)} of the "
        f"{_gbs(worst.expected)} GB/s expected" + (" (assumed)" if worst.assumed else ""),
        [
            f"peak busbw over {worst.sizes_text}: {worst.got:.1f} GB/s at {human_size(worst.size)} ({p.tool}, {where})",
            f"expected {_gbs(worst.expected)} GB/s: {worst.basis}",
            f"transport: {p.transport or 'unknown'}" + _gdr_note(p.transport),
            *_unused_nics(view, p),
        ],
        "Check the transport (NCCL_DEBUG=INFO: IB vs Socket), NCCL_IB_HCA / NCCL_SOCKET_IFNAME, "
        "GPUDirect RDMA (NCCL_NET_GDR_LEVEL) and NIC/switch health.",
        {
            "busbw_gbs": worst.got,
            "expected_gbs": worst.expected,
            "ratio": ratio,
            "size_bytes": worst.size,
            "expected_basis": worst.basis,
            "assumed": worst.assumed,
        },
    )


def sync_weight_update(view: View, th: Thresholds) -> RuleResult:
    """Trainer->rollout weight sync (update_weights, older reshard) above weight_update_frac."""
    if (guard := mode_guard(view, STEP, "sync.weight_update")) is not None:
        return guard  # across separate pools: sync.weight_push
    if not view.recent_steps():
        return no_data(STEP, "sync.weight_update", view.need_steps())
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
    med = sorted(secs)[len(secs) // 2]
    transport = (
        "the HCCL links between trainer and rollout"
        if view.facts().device == "npu"
        else "the transport (IB, not Socket) between trainer and rollout"
    )
    return Finding(
        STEP,
        "sync.weight_update",
        scale(share, th.weight_update_frac, 0.4, 0.4, 0.85),
        f"Weight sync ({key}) takes {fmt_pct(share)} of the step",
        [f"timing_s/{key} {seconds(max(secs))} max, {fmt_pct(share)} of step, {view.steps_text()}"],
        "Use bucketed sync (actor_rollout_ref.rollout.checkpoint_engine."
        f"update_weights_bucket_megabytes, default 2048) and check {transport}.",
        {"share": share, "stage": key},
        **_sync_worth(view, th, med).fields(),
        stage="sync",
    )


# With the model size unknown, the sync bound assumes a 70B model (the largest common dense
# size: the smallest saving).
SYNC_ASSUMED_B = 70.0


def _sync_worth(view: View, th: Thresholds, secs: float) -> Worth:
    """Weight sync moves the model's BF16 weights once per step: over one 400 Gb/s NIC that
    takes 2 bytes x params / ib_nic_gbs; the rest of the sync time is what bucketing and the
    transport can win."""
    size = view.facts().model_params_b
    assumed = size is None
    size = SYNC_ASSUMED_B if size is None else size
    ideal = 2 * size / th.ib_nic_gbs  # GB / (GB/s)
    what = f"{number(size)}B model" + (" assumed (size not in the config)" if assumed else "")
    nic = f"one {number(th.ib_nic_gbs)} GB/s NIC"
    basis = f"{what}: its BF16 weights move in {seconds(ideal)} over {nic}"
    return Worth(secs, max(0.0, secs - ideal), view.median_step_s(), basis)


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


def _per_second(view: View, gpus: list[GpuEntry]) -> tuple[list[int], list[float], list[float]]:
    """A node's activity by whole second: the seconds, ascending, and in each the mean and
    the maximum of its GPUs' values."""
    axes = [view.gpu_axis(g) for g in gpus]
    if axes and axes[0] is not None and axes.count(axes[0]) == len(axes):
        # One agent tick samples all GPUs of a node (equal times, told apart by their bytes):
        # the activity columns are zipped without a list of floats per GPU.
        keys = list(map(int, view.gpu_times(gpus[0])))
        if len(set(keys)) == len(keys):
            return _rows_summary(keys, [view.gpu_column(g, "activity") for g in gpus])
    series = [view.gpu_series(g, "activity") for g in gpus]
    if series and all(ts == series[0][0] for ts, _ in series):  # times that step back
        keys = list(map(int, series[0][0]))
        if len(set(keys)) == len(keys):
            return _rows_summary(keys, [vs for _, vs in series])
    per_s: dict[int, list[float]] = {}
    for ts, vs in series:
        for k, v in zip(map(int, ts), vs, strict=True):
            if v == v:
                if k in per_s:
                    per_s[k].append(v)
                else:
                    per_s[k] = [v]
    return _summary(per_s)


def _rows_summary(
    keys: list[int], columns: list[Sequence[float]]
) -> tuple[list[int], list[float], list[float]]:
    """(seconds, means, maxima) of GPUs on one time axis with one point per second: a
    second's values are the GPUs' values at that point, in GPU order (sums and maxima of
    the rows taken in C)."""
    rows = list(zip(*columns, strict=True))
    sums = list(map(sum, rows))
    n = len(columns)
    if all(x == x for x in sums):
        return _ascending(keys, [x / n for x in sums], list(map(max, rows)))
    # A NaN (missing) in some rows: those seconds average the values present.
    return _summary({k: [v for v in row if v == v] for k, row in zip(keys, rows, strict=True)})


def _summary(per_s: dict[int, list[float]]) -> tuple[list[int], list[float], list[float]]:
    """(seconds, means, maxima) of the seconds that hold a value, ascending."""
    kept = {k: vals for k, vals in per_s.items() if vals}
    return _ascending(
        list(kept),
        [sum(vals) / len(vals) for vals in kept.values()],
        [max(vals) for vals in kept.values()],
    )


def _ascending(
    keys: list[int], means: list[float], tops: list[float]
) -> tuple[list[int], list[float], list[float]]:
    if all(a < b for a, b in zip(keys, keys[1:], strict=False)):
        return keys, means, tops
    order = sorted(range(len(keys)), key=keys.__getitem__)
    return [keys[i] for i in order], [means[i] for i in order], [tops[i] for i in order]


def node_waits(view: View, th: Thresholds) -> dict[str, NodeWait]:
    """Per node, the seconds of the window where all its GPUs were below ``sync_wait_idle_pct``
    while another node's mean was above ``sync_wait_busy_pct``. Empty with < 2 GPU nodes."""
    buckets: dict[str, tuple[list[int], list[float], list[float]]] = {}
    for h in view.hosts():
        per_s = _per_second(view, list(h.gpus.values()))
        if per_s[0]:
            buckets[h.name] = per_s
    if len(buckets) < 2:
        return {}
    # "Another node is busy at t" is "the nodes busy at t, less this one if it is, are some":
    # one count per second (hosts x seconds of work, not hosts^2 x seconds).
    busy, idle = th.sync_wait_busy_pct, th.sync_wait_idle_pct
    busy_at: Counter[int] = Counter()
    for keys, means, _ in buckets.values():
        busy_at.update([t for t, m in zip(keys, means, strict=True) if m > busy])
    out: dict[str, NodeWait] = {}
    for host, (keys, means, tops) in buckets.items():
        waiting = [
            t
            for t, m, top in zip(keys, means, tops, strict=True)
            if top < idle and busy_at[t] > (m > busy)
        ]
        episodes = sum(1 for i, t in enumerate(waiting) if i == 0 or t - waiting[i - 1] > 2)
        out[host] = NodeWait(host, len(waiting), len(keys), episodes)
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
