"""Step 4 — parallelism and device mapping: are GPUs used evenly and placed well?"""

from __future__ import annotations

from verl_top.diagnosis.advice import replicas_advice, seqlen_advice, unused_gpu_advice
from verl_top.diagnosis.findings import Finding, Rule, RuleResult, no_data, passed, scale
from verl_top.diagnosis.straggler import straggler_finding, stragglers
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.diagnosis.view import View, fmt_pct, mean, median
from verl_top.diagnosis.worth import NO_STAGE_TIME, Worth, setting_worth
from verl_top.nccl.topo import slow_tp_groups, topology_marks
from verl_top.store import GpuEntry

STEP = 4
ROLLOUT_TP = "actor_rollout_ref.rollout.tensor_model_parallel_size"
NEED_CONFIG = (
    "needs the job's resolved config: --verl-log (verl prints it at start) or --verl-config FILE"
)


def _in_gen(phase: str | None) -> bool:
    return phase == "gen"


def _outside_gen(phase: str | None) -> bool:
    return phase != "gen"


# Module-level filters: the view keeps each filter's point spans, so every GPU reuses them.
PHASE_FILTERS = (("gen", _in_gen), ("other", _outside_gen))


def _roles(view: View) -> dict[tuple[str, int], str] | None:
    """GPU -> role ('' when no process) when process lists are known, else None."""
    if not any(h.procs is not None for h in view.hosts()):
        return None
    roles: dict[tuple[str, int], str] = {}
    for h in view.hosts():
        for idx in h.gpus:
            roles[(h.name, idx)] = ""
        for p in h.procs.procs if h.procs else []:
            roles[(h.name, p.gpu_index)] = p.role or roles.get((h.name, p.gpu_index)) or "compute"
    return roles


def map_imbalance(view: View, th: Thresholds) -> RuleResult:
    """A straggler of the last seconds with its cause (straggler.py), else activity spread
    across GPUs of one role in the same phase, or a slow node, over the window."""
    found = stragglers(view, th)
    if found:
        return straggler_finding(view, th, found)
    gpus = view.gpus()
    if len(gpus) < 2:
        return no_data(STEP, "map.imbalance", "needs GPU samples from >= 2 GPUs")
    roles = _roles(view)
    groups: dict[tuple[str, str], dict[str, float]] = {}
    for g in gpus:
        role = roles.get(g.key, "") if roles is not None else "all"
        if roles is not None and not role:
            continue  # no process: map.unused_gpu covers it
        for phase, keep in PHASE_FILTERS:
            m = view.gpu_phase_mean(g, "activity", keep)
            if m is not None:
                groups.setdefault((role, phase), {})[view.gpu_name(g)] = m
    worst: tuple[float, str, str, str, float, float] | None = None
    for (role, phase), means in groups.items():
        if len(means) < 2:
            continue
        hi, lo = max(means, key=means.__getitem__), min(means, key=means.__getitem__)
        spread = means[hi] - means[lo]
        if worst is None or spread > worst[0]:
            worst = (spread, f"{role}/{phase}", hi, lo, means[hi], means[lo])
    node_means: dict[str, float] = {}
    for h in view.hosts():
        vals = [m for g in h.gpus.values() if (m := view.gpu_mean(g, "activity")) is not None]
        if vals:
            node_means[h.name] = sum(vals) / len(vals)
    cluster = mean(list(node_means.values()))
    slow = None
    if len(node_means) >= 2 and cluster:
        name = min(node_means, key=node_means.__getitem__)
        if node_means[name] < th.node_ratio * cluster:
            slow = (name, node_means[name], node_means[name] / cluster)
    spread_bad = worst is not None and worst[0] > th.imbalance_points
    if not spread_bad and slow is None:
        return passed(
            STEP, "map.imbalance", f"spread {worst[0] if worst else 0:.0f} points, no slow node"
        )
    ev, sev, title = [], 0.0, ""
    if spread_bad and worst is not None:
        spread, group, hi, lo, vhi, vlo = worst
        sev = scale(spread, th.imbalance_points, 80, 0.4, 0.7)
        ev.append(f"{group}: {hi} {vhi:.0f} % vs {lo} {vlo:.0f} % activity, {view.window_text}")
        title = (
            f"Uneven GPUs: {lo} at {vlo:.0f} % while {hi} runs {vhi:.0f} % ({spread:.0f} points)"
        )
    if slow is not None:
        sev = max(sev, scale(slow[2], th.node_ratio, 0.2, 0.45, 0.7))
        ev.append(
            f"node {slow[0]} mean {slow[1]:.0f} % = {slow[2]:.2f}x cluster mean {cluster:.0f} %"
        )
        title = title or f"Node {slow[0]} runs at {slow[2]:.2f}x the cluster's GPU activity"
    return Finding(
        STEP,
        "map.imbalance",
        sev,
        title,
        ev,
        "Find the straggler: check that GPU/node (throttle, ECC, NIC); balance work with "
        "trainer.balance_batch=True and rollout load balancing.",
        {"spread": worst[0] if worst else None, "slow_node": slow[0] if slow else None},
    )


def map_unused_gpu(view: View, th: Thresholds) -> RuleResult:
    """A GPU without a compute process while the job runs on others."""
    roles = _roles(view)
    if roles is None:
        return no_data(STEP, "map.unused_gpu", "needs GPU process lists from the agent")
    used = [k for k, r in roles.items() if r]
    unused = sorted(k for k, r in roles.items() if not r)
    if not used:
        return passed(
            STEP, "map.unused_gpu", "no GPU process at all: job not running on these GPUs"
        )
    if not unused:
        return passed(STEP, "map.unused_gpu", f"all {len(roles)} GPUs hold a compute process")
    frac = len(unused) / len(roles)
    names = ", ".join(f"{h}:gpu{i}" for h, i in unused[:8])
    return Finding(
        STEP,
        "map.unused_gpu",
        scale(frac, 0.0, 0.5, 0.5, 0.8),
        f"{len(unused)} of {len(roles)} GPUs have no process while the job runs ({names})",
        [
            f"GPUs without a compute process: {names}",
            f"{len(used)} GPUs hold job processes (latest process list)",
        ],
        unused_gpu_advice(view.facts()),
        {"unused": [f"{h}:{i}" for h, i in unused], "gpus": len(roles)},
        **_unused_worth(view, len(unused), len(roles)).fields(),
    )


def _unused_worth(view: View, unused: int, gpus: int) -> Worth:
    """The job's work spread over every GPU would shorten the step by the unused share."""
    step_s = view.median_step_s()
    if not step_s:
        return Worth(basis=NO_STAGE_TIME)
    save = step_s * unused / gpus
    return Worth(save, save, step_s, f"the step's work spread over all {gpus} GPUs")


def map_rollout_replicas(view: View, th: Thresholds) -> RuleResult:
    """During gen, far fewer busy GPUs than the rollout replicas should keep busy."""
    tp_hit = view.config(ROLLOUT_TP)
    if tp_hit is None or not (tp := view.num(tp_hit[1])):
        return no_data(
            STEP,
            "map.rollout_replicas",
            NEED_CONFIG + " (needs rollout tensor_model_parallel_size)",
        )
    gen_means: dict[str, float] = {}
    for g in view.gpus():
        m = view.gpu_phase_mean(g, "activity", _in_gen)
        if m is not None:
            gen_means[view.gpu_name(g)] = m
    if not gen_means:
        return no_data(
            STEP,
            "map.rollout_replicas",
            "needs GPU samples during gen (verl steps give the stage bands)",
        )
    gpus = len(gen_means)
    busy = sum(1 for v in gen_means.values() if v > th.busy_pct)
    replicas = max(1, int(gpus // tp))
    expected = replicas * int(tp)
    ratio = busy / expected
    if ratio >= th.replicas_ratio:
        return passed(STEP, "map.rollout_replicas", f"{busy} of {expected} GPUs busy during gen")
    if busy == 0 and replicas <= 1:
        # One replica and it is idle: nothing is spread badly; the rollout itself is slow
        # (flow.rollout_bound judges it, with advice for its engine).
        return passed(
            STEP,
            "map.rollout_replicas",
            "one rollout replica, no GPU busy during gen: the rollout itself is slow "
            "(flow.rollout_bound), not its placement",
        )
    return Finding(
        STEP,
        "map.rollout_replicas",
        scale(ratio, th.replicas_ratio, 0.0, 0.6, 0.9),
        f"During gen only {busy} of {gpus} GPUs are busy ({replicas} replicas of TP {int(tp)} expected)",
        [
            f"busy GPUs (> {th.busy_pct:.0f} % activity) during gen: {busy} of {gpus}, {view.window_text}",
            f"{ROLLOUT_TP} = {int(tp)}: {replicas} replicas x {int(tp)} GPUs expected busy",
        ],
        replicas_advice(view.facts()),
        {"busy": busy, "gpus": gpus, "tp": tp, "replicas": replicas},
        **_replicas_worth(view, ratio).fields(),
        stage="rollout",
    )


def _replicas_worth(view: View, busy_ratio: float) -> Worth:
    """Idle replicas: the rollout share their GPUs sat out."""
    gen = view.median_role_share("rollout")
    if gen is None:
        return Worth(basis=NO_STAGE_TIME)
    basis = f"{fmt_pct(1 - busy_ratio)} of the expected GPUs idle through the rollout"
    return setting_worth(view, gen[2], 1 - busy_ratio, basis)


def _seqlen(s) -> tuple[float, float, bool] | None:  # noqa: ANN001 - a diagnosis StepView
    """(spread / mean, 1 - mean / max, after balancing) of one step's tokens per DP rank."""
    m = s.metrics.get("global_seqlen/mean")
    hi, lo = (
        s.metrics.get("global_seqlen/balanced_max"),
        s.metrics.get("global_seqlen/balanced_min"),
    )
    if hi is not None and lo is not None and m:
        # balance_batch already evened the ranks out: judge what they got
        return (hi - lo) / m, max(0.0, 1 - m / hi) if hi else 0.0, True
    d, mx = s.metrics.get("global_seqlen/minmax_diff"), s.metrics.get("global_seqlen/max")
    if d is None or not m:
        return None
    top = mx if mx else m + d / 2  # no max logged: the spread's midpoint above the mean
    return d / m, max(0.0, 1 - m / top), False


def map_seqlen_imbalance(view: View, th: Thresholds) -> RuleResult:
    """global_seqlen/minmax_diff over global_seqlen/mean above seqlen_ratio — after balancing
    when verl logs it (global_seqlen/balanced_max - balanced_min): that is what the ranks got."""
    rows = [row for s in view.recent_steps() if (row := _seqlen(s)) is not None]
    if not rows:
        return no_data(
            STEP,
            "map.seqlen_imbalance",
            view.need_steps("global_seqlen/* (logged with trainer.balance_batch=True)"),
        )
    r = median(x[0] for x in rows) or 0.0
    wait = median(x[1] for x in rows) or 0.0
    after = rows[-1][2]
    if r <= th.seqlen_ratio:
        return passed(STEP, "map.seqlen_imbalance", f"spread/mean {r:.3f}")
    bb = view.config("trainer.balance_batch")
    keys = "balanced_max - balanced_min" if after else "minmax_diff"
    when = "after balancing" if after else "before balancing"
    return Finding(
        STEP,
        "map.seqlen_imbalance",
        scale(r, th.seqlen_ratio, 0.5, 0.35, 0.6),
        f"Tokens per DP rank differ by {fmt_pct(r)} of the mean {when}",
        [
            f"global_seqlen/{keys} over global_seqlen/mean = {r:.3f}, {view.steps_text()}",
            f"the rank with the most tokens holds the others {fmt_pct(wait)} of the update",
        ]
        + ([f"trainer.balance_batch = {bb[1]}"] if bb else []),
        seqlen_advice(view.facts()),
        {"ratio": r, "wait_frac": wait},
        **setting_worth(
            view,
            ["update_actor", "update_critic"],
            wait,
            "ranks wait for the one with the most tokens: 1 - mean / max tokens of the update",
        ).fields(),
        stage="train",
    )


def _tp_sizes(view: View) -> list[tuple[str, int]]:
    out = []
    for key in (ROLLOUT_TP, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size"):
        hit = view.config(key)
        if hit is not None and (n := view.num(hit[1])) and n > 1:
            out.append((key, int(n)))
    return out


def _marks_finding(marks: list[str]) -> Finding:
    """GPUs the topology record marks: NVLinks down, or across a CPU socket from every NIC."""
    return Finding(
        STEP,
        "map.topology",
        0.5,
        f"{len(marks)} GPU(s) with NVLinks down or across a CPU socket from their NIC",
        marks[:6],
        "NVLinks down: check `nvidia-smi nvlink -s` and the fabric manager, then reset or drain "
        "the node. Across a socket: bind each rank to a GPU on its NIC's NUMA node "
        "(NCCL_IB_HCA order, CUDA_VISIBLE_DEVICES).",
        {"marks": marks},
    )


def map_topology(view: View, th: Thresholds) -> RuleResult:
    """A TP group spans GPUs that are not linked by NVLink (topology SYS/PHB/NODE/PIX/PXB)."""
    topo = view.topology()
    marks = [
        f"{host} GPU{m.gpu}: {m.text}"
        for host, rec in sorted(view.store.node_topology.items())
        for m in topology_marks(rec)
    ]
    if topo is None and not marks:
        return no_data(
            STEP,
            "map.topology",
            "needs the GPU link matrix (the agent's topo record or `nvidia-smi topo -m`); "
            "not collected yet",
        )
    sizes = _tp_sizes(view)
    if marks and (topo is None or not sizes):
        return _marks_finding(marks)
    if not sizes:
        return no_data(
            STEP, "map.topology", NEED_CONFIG + " (needs a tensor_model_parallel_size > 1)"
        )
    topo = topo or {}
    bad: list[str] = []
    for host, matrix in topo.items():
        n = 1 + max((max(i, j) for i, j in matrix), default=-1)
        for key, tp in sizes:
            for start, slow in slow_tp_groups(matrix, n, tp):
                bad.append(
                    f"{host} GPUs {start}-{start + tp - 1} ({key.split('.')[-2]} TP {tp}): {'/'.join(slow)}"
                )
    if not bad:
        if marks:
            return _marks_finding(marks)
        return passed(STEP, "map.topology", "every TP group is NVLink-connected")
    return Finding(
        STEP,
        "map.topology",
        0.6,
        f"{len(bad)} TP group(s) cross PCIe/CPU links instead of NVLink",
        bad[:6] + marks[:3],  # marked GPUs (NVLinks down, far NIC) often explain the groups
        "Keep each tensor-parallel group inside one NVLink domain: lower tensor_model_parallel_size "
        "or fix CUDA_VISIBLE_DEVICES ordering.",
        {"groups": bad},
    )


def map_config_mismatch(view: View, th: Thresholds) -> RuleResult:
    """n_gpus_per_node x nnodes differs from the GPUs seen, or TP does not divide the GPUs."""
    per = view.config("trainer.n_gpus_per_node")
    nodes = view.config("trainer.nnodes")
    if per is None:
        return no_data(STEP, "map.config_mismatch", NEED_CONFIG)
    n_per = int(view.num(per[1]) or 0)
    n_nodes = int(view.num(nodes[1]) or 1) if nodes else 1
    want = n_per * n_nodes
    pools = view.flavour().pools  # a standalone rollout (or reward) pool has GPUs of its own
    want = max(want, pools.total or 0)
    seen = view.store.gpu_count()
    problems = []
    if seen and want != seen:
        how = f"trainer.n_gpus_per_node x trainer.nnodes = {n_per} x {n_nodes}"
        if pools.rollout or pools.reward:
            how = f"{pools.text()} ({how} + the other pools)"
        problems.append(f"{how} = {want}, GPUs seen = {seen}")
    tp = view.config(ROLLOUT_TP)
    if tp is not None and (t := view.num(tp[1])) and want and want % int(t):
        problems.append(f"{ROLLOUT_TP} = {int(t)} does not divide {want} GPUs")
    if not problems:
        return passed(
            STEP,
            "map.config_mismatch",
            f"{want} {view.facts().accelerator}s configured" + (f", {seen} seen" if seen else ""),
        )
    return Finding(
        STEP,
        "map.config_mismatch",
        0.6,
        "Config and hardware disagree: " + problems[0],
        problems
        + (["GPUs seen: hosts monitored by verl-top (all of the job's nodes?)"] if seen else []),
        "Set trainer.n_gpus_per_node / trainer.nnodes to the GPUs the job really has and a "
        "rollout tensor_model_parallel_size that divides them.",
        {"configured": want, "seen": seen},
    )


RULES: list[Rule] = [
    map_imbalance,
    map_unused_gpu,
    map_rollout_replicas,
    map_seqlen_imbalance,
    map_topology,
    map_config_mismatch,
]
__all__ = ["RULES", "GpuEntry", "median"]
