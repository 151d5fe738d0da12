"""The one table of diagnosis thresholds, with units and the reason for each default.

Defaults come from ``docs/diagnosis.md`` (which cites /design/diagnosis.md, NVIDIA's DCGM
guidance and verl users' issues). ``Thresholds.from_mapping`` builds a table from a config
file's mapping and names the bad key when one is wrong.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def _t(default: float, unit: str, why: str) -> Any:
    """A threshold field: its default plus the unit and reason kept as metadata."""
    return field(default=default, metadata={"unit": unit, "why": why})


@dataclass(frozen=True)
class Thresholds:
    """Tunable limits used by the diagnosis rules (see THRESHOLD_DOCS for each one's reason)."""

    # -- engine ---------------------------------------------------------------------------
    window_s: float = _t(120.0, "s", "data-time window the GPU/host rules average over")
    recent_steps: float = _t(5, "steps", "verl steps (outliers excluded) the stage rules use")
    floor: float = _t(0.3, "severity", "below this no finding can be the bottleneck")
    phase_min_steps: float = _t(5, "steps", "a phase of the run has at least this many steps")
    phase_max: float = _t(3, "phases", "at most this many phases are told apart")
    phase_change_frac: float = _t(
        0.2, "fraction", "phases differ when step time or response length moves this much…"
    )
    phase_share_points: float = _t(0.1, "fraction of step", "…or a stage's share this much")
    phase_noise_frac: float = _t(
        0.05, "fraction", "step-to-step jitter below this share of the median is noise"
    )
    phase_noise_share: float = _t(0.02, "fraction of step", "…and of a stage's share")
    material_frac: float = _t(
        0.1,
        "fraction of step",
        "healthy only while no finding could save more than this share of the step",
    )
    unknown_save_frac: float = _t(
        0.5,
        "fraction of stage",
        "share of a stage counted as recoverable when its efficiency is not measured",
    )
    hysteresis_s: float = _t(
        30.0, "s", "a challenger replaces the lead after leading for this much data time"
    )
    # -- step 1 ---------------------------------------------------------------------------
    idle_pct: float = _t(50.0, "%", "DCGM: SM active < 0.5 likely indicates ineffective use")
    idle_severe_pct: float = _t(20.0, "%", "diagnosis.md: severe below 20 %")
    misleading_util_pct: float = _t(90.0, "%", "NVML util this high looks 'busy' to users")
    misleading_sm_pct: float = _t(50.0, "%", "…but GPM SM util below this is ineffective work")
    misleading_tensor_pct: float = _t(
        15.0,
        "%",
        "…or tensor util below this; 15 not 10 so the real H200 decode capture (13 %) is caught",
    )
    throttle_frac: float = _t(0.2, "fraction", "clock-event reasons set for > 20 % of the window")
    tput_drop_ratio: float = _t(0.7, "ratio", "last steps' tokens/s below 70 % of the run median")
    tput_last_steps: float = _t(3, "steps", "how many latest steps make 'the last steps'")
    tput_min_steps: float = _t(6, "steps", "steps needed before a run median means anything")
    stall_factor: float = _t(3.0, "x median step", "no new step for 3x the median step time")
    stall_max_s: float = _t(600.0, "s", "…or for 10 minutes")
    stall_idle_pct: float = _t(5.0, "%", "GPUs at ~0 % while stalled (hang)")
    stall_spin_pct: float = _t(95.0, "%", "GPUs pinned at ~100 % while stalled (NCCL spin)")
    hang_factor: float = _t(
        3.0, "x p95", "a method running 3x its own p95 (this job's history) is overrunning"
    )
    hang_min_s: float = _t(20.0, "s", "…and for at least 20 s: short stages jitter")
    hang_min_history: float = _t(
        3, "runs", "durations of a method needed before its p95 means anything"
    )
    hang_quiet_s: float = _t(
        10.0, "s", "window in which an overrunning method's GPUs must show no real work"
    )
    hang_busy_pct: float = _t(
        30.0, "%", "a GPU above this SM activity is computing: a long stage, not a hang"
    )
    # -- step 2 ---------------------------------------------------------------------------
    busbw_min_bytes: float = _t(1 << 30, "B", "use busbw at >= 1 GiB messages only")
    busbw_ratio: float = _t(0.6, "ratio", "busbw below 60 % of the link's expected value")
    nvlink_allreduce_gbs: float = _t(480.0, "GB/s", "8xH100/H200 NVLS all_reduce busbw")
    expect_busbw_gbs: float = _t(
        0.0, "GB/s", "intra-node busbw you know your nodes reach (0: derive from topology)"
    )
    expect_inter_busbw_gbs: float = _t(
        0.0, "GB/s", "cross-node busbw you know your network reaches (0: derive from NICs)"
    )
    ib_nic_gbs: float = _t(46.0, "GB/s", "one 400 Gb/s NDR NIC (46-48 GB/s measured)")
    weight_update_frac: float = _t(0.1, "fraction of step", "weight sync > 10 % of the step")
    sync_wait_idle_pct: float = _t(
        10.0, "%", "a node counts as waiting when all its GPUs are below"
    )
    sync_wait_busy_pct: float = _t(50.0, "%", "…while another node's mean is above this")
    sync_wait_frac: float = _t(0.15, "fraction", "share of the window a node spends waiting")
    sync_wait_episodes: float = _t(2, "episodes", "'repeatedly': separate waiting episodes")
    # -- step 3 ---------------------------------------------------------------------------
    rollout_frac: float = _t(
        0.5, "fraction of step", "rollout > half of the step: it is the stage to speed up"
    )
    long_tail_ratio: float = _t(2.0, "x mean", "agent_loop generate_sequences max > 2x mean")
    clip_ratio: float = _t(0.1, "fraction", "response_length/clip_ratio > 0.1 (truncation)")
    tail_length_r: float = _t(
        0.7,
        "correlation",
        "no per-sample timings: generation time follows response_length/max at least this well",
    )
    tail_mean_flat: float = _t(
        0.15, "fraction", "…while response_length/mean moves less than this over the steps"
    )
    rollout_lead_frac: float = _t(
        0.45, "fraction of step", "…or rollout > 45 % and the largest stage by lead_margin"
    )
    lead_margin: float = _t(1.5, "x", "…at least 1.5x the next stage role (update, log-prob, ...)")
    long_tail_gen_frac: float = _t(
        0.3, "fraction of step", "a generation tail matters only when rollout is > 30 % of step"
    )
    train_frac: float = _t(0.5, "fraction of step", "update_actor (+critic) > 50 % of step")
    train_lead_frac: float = _t(
        0.45,
        "fraction of step",
        "…or > 45 %, the largest stage, at an MFU below mfu_low or not estimated",
    )
    mfu_low: float = _t(0.15, "MFU", "perf/mfu/actor below 0.15 on a supported model")
    driver_frac: float = _t(0.05, "fraction of step", "adv or reward > 5 % of the step")
    logprob_frac: float = _t(0.3, "fraction of step", "old_log_prob + ref > 30 % of the step")
    host_cpu_pct: float = _t(90.0, "%", "host CPU saturated")
    host_iowait_pct: float = _t(20.0, "%", "host waiting on storage")
    host_core_pct: float = _t(
        90.0, "%", "one CPU core pinned: a single-threaded host loop (driver, reward, dataloader)"
    )
    periodic_frac: float = _t(0.1, "fraction of step", "testing/save_checkpoint amortized > 10 %")
    rollout_queue_min: float = _t(1.0, "requests", "rollout server: mean waiting requests >= 1")
    rollout_queue_ratio: float = _t(
        0.5, "waiting/running", "…and waiting >= half of running: requests queue for a slot"
    )
    kv_cache_pct: float = _t(90.0, "%", "vLLM/SGLang KV cache in use above this: no room left")
    preempt_per_min: float = _t(1.0, "per min", "preempted requests: the KV cache ran out")
    # -- step 3, async trainers (diagnosis/step3_async.py) ---------------------------------
    async_wait_frac: float = _t(
        0.2, "fraction of step", "the trainer waits for samples > 20 % of the step: rollout short"
    )
    async_idle_frac: float = _t(
        0.2, "fraction", "the rollout side idles > 20 % while the trainer waits < 20 %"
    )
    async_move_min_frac: float = _t(
        0.05, "fraction of step", "a GPU split that saves < 5 % of the step is not worth a move"
    )
    idle_disagree: float = _t(
        0.05, "fraction", "verl's idle ratio and verl-top's reading differ by more: say so"
    )
    # -- step 4 ---------------------------------------------------------------------------
    imbalance_points: float = _t(30.0, "points", "activity spread (max-min) across one role")
    node_ratio: float = _t(0.6, "x cluster mean", "a node's mean below 0.6x the cluster mean")
    busy_pct: float = _t(50.0, "%", "a GPU counts as busy above this activity")
    replicas_ratio: float = _t(0.5, "ratio", "busy GPUs during gen below half the expected")
    seqlen_ratio: float = _t(0.1, "ratio", "global_seqlen/minmax_diff / mean > 0.1")
    straggler_window_s: float = _t(
        6.0, "s", "recent window for straggler signals (clocks, throttle, host, NIC, gaps)"
    )
    straggler_clock_ratio: float = _t(
        0.9, "x peers' median", "a throttled GPU's SM clock below 90 % of its busy peers'"
    )
    straggler_activity_ratio: float = _t(
        0.75,
        "x peers' median",
        "a node whose host stands out (iowait, CPU) lags when its GPUs work below 0.75x the "
        "other nodes' while they compute",
    )
    nic_rate_ratio: float = _t(
        0.5, "x peers' median", "a node's network rate below half the other nodes' median"
    )
    flap_gap_s: float = _t(3.0, "s", "a host silent this long (3 agent ticks) dropped out")
    flap_gaps: float = _t(2, "gaps", "'flapping': dropped out this often in the window")
    # -- step 5 ---------------------------------------------------------------------------
    micro_batch_min: float = _t(
        2,
        "samples",
        "ppo_micro_batch_size_per_gpu <= 2 is tiny GEMMs (kept for old settings files; the rule uses tokens)",
    )
    micro_batch_tokens_min: float = _t(
        4096, "tokens", "fewer tokens per micro batch than this make small, launch-bound GEMMs"
    )
    cost_frac_min: float = _t(
        0.1, "fraction of step", "a setting whose stage is below this share costs little"
    )
    token_budget_factor: float = _t(2.0, "x (prompt+response)", "verl perf tuning: >= 2x")
    offload_headroom: float = _t(0.3, "fraction", "offload needless when > 30 % memory is free")
    kv_low: float = _t(0.4, "fraction", "gpu_memory_utilization below this with preemptions")
    kv_high: float = _t(0.9, "fraction", "gpu_memory_utilization above this risks OOM")
    batched_tokens_min: float = _t(8192, "tokens", "verl best practice: >= max(8192, p+r)")
    mem_reserved_frac: float = _t(0.95, "fraction", "reserved memory > 95 % of device: OOM risk")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Thresholds:
        """A table with ``values`` overriding the defaults; ValueError names a bad key."""
        known = {f.name for f in dataclasses.fields(cls)}
        clean: dict[str, float] = {}
        for key, value in values.items():
            if key in RETIRED:
                continue  # accepted so old config files still load; no longer used
            if key not in known:
                raise ValueError(f"unknown threshold {key!r}")
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"threshold {key!r} must be a number, got {value!r}")
            if value < 0:
                raise ValueError(f"threshold {key!r} must not be negative, got {value!r}")
            clean[key] = float(value)
        return cls(**clean)


# Thresholds of earlier releases that config files may still set (ignored).
RETIRED = frozenset({"hysteresis_margin", "hysteresis_evals"})

THRESHOLD_DOCS: dict[str, tuple[float, str, str]] = {
    f.name: (float(f.default), f.metadata["unit"], f.metadata["why"])  # type: ignore[arg-type]
    for f in dataclasses.fields(Thresholds)
}
