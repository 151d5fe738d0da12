"""Step 3 — dataflow: which stage of the RL step eats the time?"""

from __future__ import annotations

from verl_top.diagnosis.findings import Finding, Rule, RuleResult, no_data, passed, scale
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.diagnosis.view import View, fmt_pct, mean, median, timing

STEP = 3
NEED_STEPS = "needs verl steps: pass --verl-log PATH (console log or file-logger JSONL)"


def flow_rollout_bound(view: View, th: Thresholds) -> RuleResult:
    """Rollout generation (gen) above rollout_frac of the step."""
    hit = view.median_share("gen")
    if hit is None:
        return no_data(STEP, "flow.rollout_bound", NEED_STEPS)
    share, _ = hit
    if share <= th.rollout_frac:
        return passed(STEP, "flow.rollout_bound", f"gen {fmt_pct(share)} of step")
    tp = view.config("actor_rollout_ref.rollout.tensor_model_parallel_size")
    return Finding(
        STEP,
        "flow.rollout_bound",
        scale(share, th.rollout_frac, 0.95, 0.45, 0.8),
        f"Rollout (gen) takes {fmt_pct(share)} of the step",
        [f"timing_s/gen {fmt_pct(share)} of timing_s/step, {view.steps_text()}"]
        + ([f"rollout TP = {tp[1]}"] if tp else []),
        "Speed up generation: smaller actor_rollout_ref.rollout.tensor_model_parallel_size (more replicas), "
        "raise rollout.max_num_seqs / max_num_batched_tokens and rollout.gpu_memory_utilization (KV cache).",
        {"share": share},
    )


def flow_long_tail(view: View, th: Thresholds) -> RuleResult:
    """Slowest rollout request far above the mean, or many responses truncated."""
    ratios, clips = [], []
    for s in view.recent_steps():
        mx = timing(s.metrics, "agent_loop/generate_sequences/max")
        mn = timing(s.metrics, "agent_loop/generate_sequences/mean")
        if mx is not None and mn:
            ratios.append(mx / mn)
        if (c := s.metrics.get("response_length/clip_ratio")) is not None:
            clips.append(float(c))
    if not ratios and not clips:
        return no_data(
            STEP,
            "flow.long_tail",
            "needs timing_s/agent_loop/* or response_length/clip_ratio: " + NEED_STEPS,
        )
    ratio, clip = median(ratios), median(clips)
    long = ratio is not None and ratio > th.long_tail_ratio
    clipped = clip is not None and clip > th.clip_ratio
    if not (long or clipped):
        return passed(
            STEP, "flow.long_tail", f"max/mean {ratio or 0:.1f}x, clip ratio {clip or 0:.2f}"
        )
    ev = [f"{view.steps_text()}"]
    sev = 0.0
    if long and ratio is not None:
        ev.append(
            f"agent_loop/generate_sequences max/mean = {ratio:.1f}x (> {th.long_tail_ratio:.0f}x)"
        )
        sev = scale(ratio, th.long_tail_ratio, 5.0, 0.45, 0.8)
    if clipped and clip is not None:
        ev.append(f"response_length/clip_ratio = {clip:.2f} (> {th.clip_ratio:.2f})")
        sev = max(sev, scale(clip, th.clip_ratio, 0.4, 0.4, 0.7))
    title = (
        f"Rollout long tail: slowest request {ratio:.1f}x the mean"
        if long and ratio is not None
        else f"{fmt_pct(clip or 0)} of responses hit max_response_length"
    )
    return Finding(
        STEP,
        "flow.long_tail",
        sev,
        title,
        ev,
        "Cut the tail: actor_rollout_ref.rollout.over_sample_rate, partial/async rollout "
        "(one-step-off, fully-async); if clipped, review data.max_response_length.",
        {"ratio": ratio, "clip_ratio": clip},
    )


def flow_train_bound(view: View, th: Thresholds) -> RuleResult:
    """update_actor (+ update_critic) above train_frac of the step with low MFU."""
    hit = view.median_share("update_actor", "update_critic")
    if hit is None:
        return no_data(STEP, "flow.train_bound", NEED_STEPS)
    share, _ = hit
    mfu = view.median_metric("perf/mfu/actor", "mfu/actor")
    if share <= th.train_frac:
        return passed(STEP, "flow.train_bound", f"update {fmt_pct(share)} of step")
    if mfu is not None and mfu[1] >= th.mfu_low:
        return passed(
            STEP,
            "flow.train_bound",
            f"update {fmt_pct(share)} of step but MFU {mfu[1]:.2f} is fine",
        )
    sev = scale(share, th.train_frac, 0.9, 0.45, 0.8)
    ev = [f"update_actor + update_critic {fmt_pct(share)} of step, {view.steps_text()}"]
    if mfu is None:
        sev = round(sev * 0.85, 3)
        ev.append("perf/mfu/actor not logged (older verl or unsupported model): efficiency unknown")
    else:
        ev.append(f"{mfu[0]} = {mfu[1]:.3f} (< {th.mfu_low})")
    return Finding(
        STEP,
        "flow.train_bound",
        sev,
        f"Training update takes {fmt_pct(share)} of the step"
        + (f" at MFU {mfu[1]:.2f}" if mfu else ""),
        ev,
        "Make the update efficient: actor.use_dynamic_bsz=True with a larger ppo_max_token_len_per_gpu, "
        "larger ppo_micro_batch_size_per_gpu, param/optimizer offload off if memory allows.",
        {"share": share, "mfu": mfu[1] if mfu else None},
    )


def flow_driver_bound(view: View, th: Thresholds) -> RuleResult:
    """adv or reward (driver side) above driver_frac of the step while GPUs idle."""
    shares = {s: h[0] for s in ("reward", "adv") if (h := view.median_share(s))}
    if not shares:
        return no_data(STEP, "flow.driver_bound", NEED_STEPS)
    stage = max(shares, key=shares.__getitem__)
    share = shares[stage]
    if share <= th.driver_frac:
        return passed(
            STEP, "flow.driver_bound", ", ".join(f"{k} {fmt_pct(v)}" for k, v in shares.items())
        )
    during = [
        v
        for g in view.store.iter_gpus()
        for v in view.gpu_phase_points(g, "activity", lambda p: p in ("reward", "adv"))
    ]
    act = mean(during)
    ev = [f"timing_s/{stage} {fmt_pct(share)} of step, {view.steps_text()}"]
    if act is None:
        sev = scale(share, th.driver_frac, 0.3, 0.35, 0.6)
        ev.append("GPU activity during reward/adv unknown (no GPU samples in those bands)")
    elif act < th.idle_pct:
        sev = scale(share, th.driver_frac, 0.3, 0.5, 0.85)
        ev.append(f"GPU activity during {stage}: {act:.0f} % mean ({len(during)} samples)")
    else:
        return passed(
            STEP,
            "flow.driver_bound",
            f"{stage} {fmt_pct(share)} but GPUs busy ({act:.0f} %) meanwhile",
        )
    return Finding(
        STEP,
        "flow.driver_bound",
        sev,
        f"Driver-side {stage} takes {fmt_pct(share)} of the step while GPUs wait",
        ev,
        "Overlap or offload CPU work: reward_model.launch_reward_fn_async=True or the reward loop; "
        "keep advantage computation light on the driver.",
        {"stage": stage, "share": share, "gpu_activity_pct": act},
    )


def flow_logprob_slow(view: View, th: Thresholds) -> RuleResult:
    """old_log_prob + ref above logprob_frac of the step."""
    hit = view.median_share("old_log_prob", "ref")
    if hit is None:
        return no_data(STEP, "flow.logprob_slow", NEED_STEPS)
    share, _ = hit
    if share <= th.logprob_frac:
        return passed(STEP, "flow.logprob_slow", f"old_log_prob + ref {fmt_pct(share)} of step")
    return Finding(
        STEP,
        "flow.logprob_slow",
        scale(share, th.logprob_frac, 0.6, 0.4, 0.75),
        f"Log-prob passes (old_log_prob + ref) take {fmt_pct(share)} of the step",
        [f"timing_s/old_log_prob + timing_s/ref {fmt_pct(share)} of step, {view.steps_text()}"],
        "Raise actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu and "
        "ref.log_prob_micro_batch_size_per_gpu (forward-only: ~2x the train micro batch) or "
        "log_prob_use_dynamic_bsz=True.",
        {"share": share},
    )


def _host_state(view: View, h) -> tuple | None:
    """(name, cpu %, iowait %, busiest core %, GPU activity %) means over the window."""
    cpu = mean([v for _, v in view.host_values(h, "cpu_pct")])
    io = mean([v for _, v in view.host_values(h, "iowait_pct")])
    core = mean([v for _, v in view.host_values(h, "cpu_max_core")])
    if cpu is None and io is None:
        return None
    act = mean([m for g in h.gpus.values() if (m := view.gpu_mean(g, "activity")) is not None])
    return h.name, cpu, io, core, act


def _host_cause(th: Thresholds, cpu, io, core) -> str | None:
    if (cpu or 0) > th.host_cpu_pct:
        return f"host CPU {cpu:.0f} %"
    if (io or 0) > th.host_iowait_pct:
        return f"iowait {io:.0f} %"
    if (core or 0) >= th.host_core_pct:
        return f"one CPU core pinned at {core:.0f} % (single-threaded host loop)"
    return None


def flow_host_stall(view: View, th: Thresholds) -> RuleResult:
    """Host CPU saturated, iowait high or one core pinned while that host's GPUs are idle."""
    rows = [r for h in view.hosts() if (r := _host_state(view, h)) is not None]
    if not rows:
        return no_data(STEP, "flow.host_stall", "needs host samples (CPU, iowait) from the nodes")
    bad = [
        (r, cause)
        for r in rows
        if r[4] is not None
        and r[4] < th.idle_pct
        and (cause := _host_cause(th, r[1], r[2], r[3])) is not None
    ]
    if not bad:
        return passed(
            STEP, "flow.host_stall", f"no host saturated while its GPUs idle ({len(rows)} hosts)"
        )
    (name, cpu, io, core, act), cause = min(bad, key=lambda b: b[0][4] or 0)
    return Finding(
        STEP,
        "flow.host_stall",
        scale(th.idle_pct - (act or 0), 0, th.idle_pct, 0.75, 0.92),
        f"{name}: {cause} while its GPUs run at {act or 0:.0f} %",
        [
            f"{name}: CPU {cpu or 0:.0f} %, busiest core {core or 0:.0f} %, iowait {io or 0:.0f} % "
            f"(means), {view.window_text}",
            f"{name}: GPU activity {act or 0:.0f} % mean, {view.window_text}",
            f"{len(bad)} of {len(rows)} hosts affected",
        ],
        "The host starves the GPUs: more dataloader workers (data.dataloader_num_workers), faster "
        "storage/local cache for data and checkpoints, fewer CPU-heavy reward processes on GPU "
        "nodes; a pinned core while GPUs wait points at driver-side work "
        "(reward_model.launch_reward_fn_async, advantage computation).",
        {
            "host": name,
            "cpu_pct": cpu,
            "iowait_pct": io,
            "busiest_core_pct": core,
            "gpu_activity_pct": act,
            "hosts": len(bad),
        },
    )


def _frequency(view: View, stage: str, key: str) -> tuple[float, str] | None:
    hit = view.config(key)
    if hit is not None and (f := view.num(hit[1])) and f > 0:
        return f, f"{key}={int(f)}"
    at = [s.step for s in view.steps() if s.stage_times.get(stage)]
    if len(at) >= 2:
        gap = median(b - a for a, b in zip(at, at[1:], strict=False))
        if gap:
            return float(gap), f"every {gap:.0f} steps (observed)"
    return None


def flow_periodic(view: View, th: Thresholds) -> RuleResult:
    """testing / save_checkpoint cost amortized over their frequency above periodic_frac."""
    steps = view.steps()
    core = median(s.step_time_core for s in steps if not s.is_outlier and s.step_time_core)
    if not steps or not core:
        return no_data(STEP, "flow.periodic", NEED_STEPS)
    parts = []
    for stage, key in (("testing", "trainer.test_freq"), ("save_checkpoint", "trainer.save_freq")):
        cost = median(s.stage_times[stage] for s in steps if s.stage_times.get(stage))
        if not cost:
            continue
        freq = _frequency(view, stage, key)
        if freq is None:
            continue
        parts.append((stage, cost, freq[0], freq[1], cost / freq[0] / core))
    if not parts:
        return passed(
            STEP,
            "flow.periodic",
            "no testing/save_checkpoint seen twice and no test_freq/save_freq in config",
        )
    total = sum(p[4] for p in parts)
    if total <= th.periodic_frac:
        return passed(
            STEP, "flow.periodic", f"testing/save_checkpoint amortized {fmt_pct(total)} of a step"
        )
    return Finding(
        STEP,
        "flow.periodic",
        scale(total, th.periodic_frac, 0.5, 0.35, 0.7),
        f"Validation/checkpoints cost {fmt_pct(total)} of training time amortized",
        [
            f"timing_s/{st} {c:.0f} s {src}: {fmt_pct(a)} of a {core:.0f} s step"
            for st, c, _, src, a in parts
        ],
        "Run them less often: raise trainer.test_freq / trainer.save_freq (or faster checkpoint storage).",
        {"share": total, "parts": {p[0]: p[4] for p in parts}},
    )


RULES: list[Rule] = [
    flow_rollout_bound,
    flow_long_tail,
    flow_train_bound,
    flow_driver_bound,
    flow_logprob_slow,
    flow_host_stall,
    flow_periodic,
]
