"""Step 1 — throughput and GPU utilization: is there a problem, and how bad?"""

from __future__ import annotations

from verl_top.diagnosis.advice import tput_drop_advice, util_misleading_advice
from verl_top.diagnosis.findings import Check, Finding, Rule, RuleResult, no_data, passed, scale
from verl_top.diagnosis.hang import hang_found
from verl_top.diagnosis.readable import seconds, times
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.diagnosis.view import View, fmt_pct, mean, median
from verl_top.model import clock_reason_names

STEP = 1
NEED_GPU = "needs GPU samples: monitor the nodes (--hosts / local) or --replay a recording"


def _activity_source(view: View) -> str:
    return "GPM SM util" if view.has_column("sm_util") else "NVML util"


def gpu_idle(view: View, th: Thresholds) -> RuleResult:
    """GPUs whose activity (GPM SM util, else NVML util) averages below idle_pct."""
    gpus = view.gpus()
    if not gpus:
        return no_data(STEP, "gpu.idle", NEED_GPU)
    means = {view.gpu_name(g): m for g in gpus if (m := view.gpu_mean(g, "activity")) is not None}
    src = _activity_source(view)
    idle = {k: v for k, v in means.items() if v < th.idle_pct}
    cluster = mean(list(means.values())) or 0.0
    if not idle:
        return passed(
            STEP,
            "gpu.idle",
            f"all {len(means)} GPUs >= {th.idle_pct:.0f} % {src} (cluster {cluster:.0f} %)",
        )
    per_node: dict[str, int] = {}
    for name in idle:
        node = name.rsplit(":", 1)[0]
        per_node[node] = per_node.get(node, 0) + 1
    worst = mean(list(idle.values())) or 0.0
    frac = len(idle) / len(means)
    depth = scale(worst, th.idle_pct, th.idle_severe_pct, 0.35, 0.7)
    sev = round(depth * (0.5 + 0.5 * frac), 3)
    lowest = min(idle, key=idle.__getitem__)
    return Finding(
        STEP,
        "gpu.idle",
        max(sev, 0.2),
        f"{len(idle)} of {len(means)} GPUs idle: mean {src} {worst:.0f} % (< {th.idle_pct:.0f} %)",
        [
            f"{src} of idle GPUs {worst:.0f} % mean, {view.window_text}",
            f"cluster mean {cluster:.0f} % over {len(means)} GPUs, {view.window_text}",
            "idle GPUs per node: " + ", ".join(f"{n} {c}" for n, c in sorted(per_node.items())),
            f"lowest {lowest} at {idle[lowest]:.0f} %",
        ],
        "Find why the GPUs wait: steps 2-4 (communication, dataflow stage, placement) name the cause.",
        {
            "idle_gpus": len(idle),
            "gpus": len(means),
            "idle_mean_pct": worst,
            "cluster_pct": cluster,
            "per_node": per_node,
        },
    )


def _outside_gen(phase: str | None) -> bool:
    return phase != "gen"  # decode is memory-bound by nature


def gpu_util_misleading(view: View, th: Thresholds) -> RuleResult:
    """NVML util looks busy while GPM SM or tensor util shows little real work, outside gen."""
    if not (view.has_column("sm_util") or view.has_column("tensor_util")):
        return no_data(
            STEP, "gpu.util_misleading", "needs GPM SM/tensor util (Hopper+ GPU, agent with pynvml)"
        )
    phase_known = bool(view.stage_bands())
    flagged: list[tuple[str, float, float, float]] = []
    seen = 0
    keep = _outside_gen  # one filter object for every GPU: the view shares its spans
    for g in view.gpus():
        util = view.gpu_phase_mean(g, "util_gpu", keep)
        if util is None:
            continue
        busy = util >= th.misleading_util_pct
        sm = view.gpu_phase_mean(g, "sm_util", keep)
        # Below the util bar a GPU only counts as seen when GPM was read: its tensor util
        # decides nothing once its SM util says so (a third of the rule's reading saved).
        tensor = view.gpu_phase_mean(g, "tensor_util", keep) if busy or sm is None else None
        if sm is None and tensor is None:
            continue
        seen += 1
        low_sm = sm is not None and sm < th.misleading_sm_pct
        low_tensor = tensor is not None and tensor < th.misleading_tensor_pct
        if busy and (low_sm or low_tensor):
            flagged.append(
                (
                    view.gpu_name(g),
                    util,
                    sm if sm is not None else -1,
                    tensor if tensor is not None else -1,
                )
            )
    if not seen:
        return no_data(
            STEP, "gpu.util_misleading", "no GPM samples outside rollout (gen) in the window"
        )
    if not flagged:
        return passed(
            STEP, "gpu.util_misleading", f"NVML util matches GPM SM/tensor util on {seen} GPUs"
        )
    util = mean([f[1] for f in flagged]) or 0
    sm = mean([f[2] for f in flagged if f[2] >= 0])
    tensor = mean([f[3] for f in flagged if f[3] >= 0])
    where = (
        "outside gen (from verl stage bands)"
        if phase_known
        else "phase unknown (no verl steps): all samples"
    )
    parts = [f"NVML util {util:.0f} %"]
    if sm is not None:
        parts.append(f"GPM SM util {sm:.0f} %")
    if tensor is not None:
        parts.append(f"tensor util {tensor:.0f} %")
    return Finding(
        STEP,
        "gpu.util_misleading",
        round(0.45 + 0.15 * len(flagged) / seen, 3),
        f"GPUs look busy but do little math: {', '.join(parts)} on {len(flagged)} GPUs",
        [
            f"{', '.join(parts)} (means), {view.window_text}, {where}",
            f"{len(flagged)} of {seen} GPUs affected",
        ],
        util_misleading_advice(view.facts()),
        {
            "gpus": len(flagged),
            "util_pct": util,
            "sm_pct": sm,
            "tensor_pct": tensor,
            "phase_known": phase_known,
        },
    )


def gpu_throttle(view: View, th: Thresholds) -> RuleResult:
    """Clock-event reasons show power/thermal/HW slowdown for more than throttle_frac of the window."""
    fracs: dict[str, float] = {}
    reasons: set[str] = set()
    for g in view.gpus():
        frac = view.gpu_mean(g, "throttled")
        if frac is not None:
            fracs[view.gpu_name(g)] = frac
            mask = 0
            for bits in view.gpu_distinct(g, "clock_reasons"):  # OR: each mask once
                mask |= int(bits)
            reasons.update(n for n in clock_reason_names(mask) if n not in ("idle", "app_clocks"))
    if not fracs:
        return no_data(STEP, "gpu.throttle", "needs NVML clock-event reasons in the GPU samples")
    bad = {k: v for k, v in fracs.items() if v > th.throttle_frac}
    if not bad:
        return passed(
            STEP,
            "gpu.throttle",
            f"throttled <= {fmt_pct(th.throttle_frac)} of the window on {len(fracs)} GPUs",
        )
    worst = max(bad.values())
    return Finding(
        STEP,
        "gpu.throttle",
        scale(worst, th.throttle_frac, 1.0, 0.35, 0.65),
        f"{len(bad)} of {len(fracs)} GPUs throttled up to {fmt_pct(worst)} of the time ({', '.join(sorted(reasons)) or 'slowdown'})",
        [
            f"throttled share of samples: max {fmt_pct(worst)}, {view.window_text}",
            f"reasons: {', '.join(sorted(reasons)) or 'n/a'}",
        ],
        "Power cap or heat slows the clocks: check cooling, power limit (nvidia-smi -pl) and that the node is not oversubscribed.",
        {"gpus": len(bad), "max_frac": worst, "reasons": sorted(reasons)},
    )


def tput_drop(view: View, th: Thresholds) -> RuleResult:
    """verl tokens/s of the last steps below tput_drop_ratio of the run median."""
    steps = [s for s in view.steps() if not s.is_outlier]
    if len(steps) < th.tput_min_steps:
        return no_data(
            STEP,
            "tput.drop",
            view.need_steps(f">= {th.tput_min_steps:.0f} verl steps (have {len(steps)})"),
        )
    if all(s.throughput is not None for s in steps):
        vals, what = [s.throughput or 0.0 for s in steps], "perf/throughput (tokens/s/GPU)"
    elif all(s.step_time_core for s in steps):
        vals, what = (
            [3600.0 / (s.step_time_core or 1) for s in steps],
            "steps/h (no perf/throughput logged)",
        )
    else:
        return no_data(STEP, "tput.drop", "steps lack perf/throughput and step time")
    n = int(th.tput_last_steps)
    med = median(vals) or 0.0
    last = mean(vals[-n:]) or 0.0
    ratio = last / med if med else 1.0
    if ratio >= th.tput_drop_ratio:
        return passed(
            STEP, "tput.drop", f"last {n} steps at {fmt_pct(ratio)} of the run median {what}"
        )
    return Finding(
        STEP,
        "tput.drop",
        scale(ratio, th.tput_drop_ratio, 0.3, 0.4, 0.75),
        f"Throughput fell to {fmt_pct(ratio)} of the run median ({last:.0f} vs {med:.0f} {what})",
        [
            f"{what}: last {n} steps mean {last:.1f}, steps {steps[-n].step}-{steps[-1].step}",
            f"run median {med:.1f} over {len(steps)} steps (testing/save_checkpoint steps excluded)",
        ],
        tput_drop_advice(view.facts()),
        {"ratio": ratio, "last": last, "median": med, "metric": what},
    )


def job_stalled(view: View, th: Thresholds) -> RuleResult:
    """No new verl step for stall_factor x the median step time (or stall_max_s)."""
    steps = view.steps()
    if len(steps) < 2:
        return no_data(STEP, "job.stalled", view.need_steps(">= 2 verl steps"))
    med = median(s.step_time for s in steps if s.step_time) or median(
        b.t - a.t for a, b in zip(steps, steps[1:], strict=False)
    )
    if not med:
        return no_data(STEP, "job.stalled", "no step time in the verl steps")
    if not steps[-1].t:
        # Steps read from a finished log given with a replay carry no arrival time.
        return no_data(STEP, "job.stalled", "the verl steps have no arrival times (finished log)")
    gap = view.now - steps[-1].t
    limit = min(th.stall_factor * med, th.stall_max_s)
    if gap <= limit:
        return passed(STEP, "job.stalled", f"last step {seconds(gap)} ago (limit {seconds(limit)})")
    total = view.num(hit[1]) if (hit := view.config("trainer.total_training_steps")) else None
    if total and steps[-1].step >= total:
        # The run reached its last step (seen on the real H200 job: watched after it ended,
        # "no step for 38 s" was a finished job, not a stalled one).
        return passed(
            STEP,
            "job.stalled",
            f"the run finished: step {steps[-1].step} of trainer.total_training_steps={total:g}, "
            f"{seconds(gap)} ago",
        )
    if hang_found(view, th):
        # The process lists name the stuck process: job.hang says it, with its cost.
        return passed(
            STEP, "job.stalled", f"no step for {seconds(gap)}: job.hang names the process"
        )
    last = steps[-1].t
    acts = [v for g in view.store.iter_gpus() for v in view.gpu_values(g, "activity", last)]
    utils = [v for g in view.store.iter_gpus() for v in view.gpu_values(g, "util_gpu", last)]
    act, util = mean(acts), mean(utils)
    if act is None:
        sev, state = 0.6, "GPU activity unknown"
    elif act < th.stall_idle_pct:
        sev, state = 0.95, f"GPUs idle ({act:.0f} % activity since the last step)"
    elif util is not None and util > th.stall_spin_pct and act < th.idle_pct:
        sev, state = 0.95, f"GPUs pinned at {util:.0f} % NVML util but {act:.0f} % SM (NCCL spin)"
    else:
        sev, state = 0.5, f"GPUs still working ({act:.0f} % activity): maybe one very long step"
    return Finding(
        STEP,
        "job.stalled",
        sev,
        f"No verl step for {seconds(gap)}, {times(gap / med)} the median step; {state}",
        [
            f"last step {steps[-1].step} logged {seconds(gap)} before the newest data",
            f"median step time {seconds(med)} over {len(steps)} steps; limit {seconds(limit)}",
            state,
        ],
        "Likely a hang: look for NCCL watchdog lines (step 2), check the straggler rank; "
        "actor_rollout_ref.nccl_timeout only delays the error.",
        {"gap_s": gap, "median_step_s": med, "activity_pct": act, "util_pct": util},
    )


RULES: list[Rule] = [gpu_idle, gpu_util_misleading, gpu_throttle, tput_drop, job_stalled]
__all__ = ["RULES", "Check"]
