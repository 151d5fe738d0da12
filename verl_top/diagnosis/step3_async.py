"""Step 3 for verl's async trainers: who waits for whom, and the weight sync between pools.

In the async trainer modes (``verl_top.verl.flavour``: V1 colocate_async and separate_async,
one-step-off, fully async) ``timing_s/gen`` is the trainer's wait for finished samples, not the
rollout: the question is not which stage is largest but which side waits for which. The rules
here read the mode's own keys (``verl_top.verl.async_stats``), GPU activity per pool when the
nodes are monitored, and verl's own idle ratios, and say when verl's ratio and the timers or
the GPUs disagree.

- ``flow.async_balance`` (step 3): the trainer starved for samples, or the rollout side idle (at the
  staleness or queue cap in fully async), and how many GPUs moved from one side to the other
  balance them, from the measured GPU-seconds each side spends per step; in colocate_async the
  GPUs take turns, so the wait is the rollout's time on them; in one-step-off, how much of the
  generation hides behind training.
- ``sync.weight_push`` (step 2): the weight push between separate pools
  (``update_weights``, ``sync_rollout_weights``, the doubled ``timing_s/timing_s/param_sync``),
  its rate against the link pane 2 knows.

``verl_top.diagnosis.guards.mode_guard`` keeps the synchronous stage rules off an async wait.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from verl_top.diagnosis import guards
from verl_top.diagnosis.findings import (
    Finding,
    Rule,
    RuleResult,
    no_data,
    passed,
    scale,
)
from verl_top.diagnosis.readable import seconds, seconds_pair
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.diagnosis.view import View, fmt_pct, mean, median
from verl_top.verl.async_stats import AsyncStats
from verl_top.verl.flavour import VerlFlavour

STEP = 3
SYNC_STEP = 2
BALANCE = guards.BALANCE
WEIGHT_SYNC = guards.WEIGHT_SYNC
ROLLOUT_TP = "actor_rollout_ref.rollout.tensor_model_parallel_size"
MODEL_PATH = "actor_rollout_ref.model.path"
BYTES_PER_PARAM = 2  # bf16 weights: what verl's checkpoint engines send
# "Qwen2.5-7B-Instruct" -> 7, "Qwen3-30B-A3B" -> 30 (an MoE sends all its weights).
_PARAMS_RE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s*[bB](?![a-zA-Z])")
NEED_MODE = (
    "needs the trainer mode: the config verl prints at start (trainer.v1.trainer_mode, "
    "async_training) or the line prefixes ((TaskRunnerV1 pid=N), (FullyAsyncTrainer pid=N))"
)
POOL_KEYS = {
    "separate_async": "actor_rollout_ref.rollout.n_gpus_per_node x actor_rollout_ref.rollout.nnodes",
    "one_step_off": "rollout.n_gpus_per_node x rollout.nnodes",
    "fully_async": "rollout.n_gpus_per_node x rollout.nnodes",
}
TRAINER_POOL = "trainer.n_gpus_per_node x trainer.nnodes"


def _dev(view: View) -> str:
    """What the accelerators are called in evidence: NPU on Ascend, else GPU."""
    return "NPU" if view.on_npu() else "GPU"


@dataclass(frozen=True)
class Medians:
    """Medians over the recent steps of the numbers that say who waited."""

    steps: int
    step_s: float
    wait_s: float
    sync_s: float | None
    sync_key: str
    generate_s: float | None
    train_s: float
    trainer_idle: float
    trainer_idle_verl: float | None
    rollouter_idle: float | None
    rollouter_idle_verl: float | None
    rollouter_active_s: float | None

    @classmethod
    def of(cls, stats: list[AsyncStats]) -> Medians | None:
        """None when no step has both its wait and its step time."""
        timed = [s for s in stats if s.step_s and s.wait_s is not None]
        if not timed:
            return None

        def med(values: list[float | None]) -> float | None:
            return median(v for v in values if v is not None)

        return cls(
            steps=len(timed),
            step_s=med([s.step_s for s in timed]) or 0.0,
            wait_s=med([s.wait_s for s in timed]) or 0.0,
            sync_s=med([s.sync_s for s in timed]),
            sync_key=next((s.sync_key for s in reversed(timed) if s.sync_key), ""),
            generate_s=med([s.generate_s for s in timed]),
            train_s=med([s.train_s for s in timed]) or 0.0,
            trainer_idle=med([s.trainer_idle for s in timed]) or 0.0,
            trainer_idle_verl=med([s.trainer_idle_verl for s in timed]),
            rollouter_idle=med([s.rollouter_idle for s in timed]),
            rollouter_idle_verl=med([s.rollouter_idle_verl for s in timed]),
            rollouter_active_s=med([s.rollouter_active_s for s in timed]),
        )


def recent_medians(view: View) -> Medians | None:
    """The recent steps' async numbers (fully async: both lines of a version, merged)."""
    return Medians.of([AsyncStats.from_metrics(s.metrics) for s in view.recent_steps()])


@dataclass(frozen=True)
class Split:
    """A split of the GPUs between the trainer and the rollout and the step it would give."""

    trainer: int
    rollout: int
    step_s: float


def best_split(
    train_gpu_s: float, rollout_gpu_s: float, total: int, granularity: int, sync_s: float
) -> Split | None:
    """The split of ``total`` GPUs (the rollout side in whole replicas of ``granularity``
    GPUs, each side at least one) that makes the step shortest, assuming each side's
    GPU-seconds per step stay what they are (linear scaling)."""
    best: Split | None = None
    for rollout in range(granularity, total, granularity):
        trainer = total - rollout
        step = max(train_gpu_s / trainer, rollout_gpu_s / rollout) + sync_s
        if best is None or step < best.step_s - 1e-9:
            best = Split(trainer, rollout, step)
    return best


def _granularity(view: View) -> int:
    hit = view.config(ROLLOUT_TP)
    tp = view.num(hit[1]) if hit is not None else None
    return int(tp) if tp and tp >= 1 else 1


def _pool_activity(view: View) -> dict[str, float]:
    """Mean activity of each pool's GPUs over the window, for the pools that have any."""
    out = {}
    for pool, gpus in view.pool_gpus().items():
        acts = [m for g in gpus if (m := view.gpu_mean(g, "activity")) is not None]
        if acts and pool != "unknown":
            out[pool] = mean(acts) or 0.0
    return out


def _rollout_gpu_s(
    fl: VerlFlavour, m: Medians, starved: bool, rollout_act: float | None
) -> tuple[float | None, str]:
    """The rollout side's GPU-seconds per step and how they were measured."""
    g = fl.pools.rollout or 0
    if fl.trainer_mode == "fully_async" and m.rollouter_active_s is not None:
        return m.rollouter_active_s * g, "fully_async/rollouter/active_time"
    if fl.trainer_mode == "one_step_off" and m.generate_s is not None:
        return m.generate_s * g, "timing_s/generate_async"
    if rollout_act is not None:
        return m.step_s * g * rollout_act / 100, "the rollout GPUs' measured activity"
    if starved:
        return m.step_s * g, "the whole step (the trainer waits on the rollout, so it is busy)"
    return None, ""


def _split_text(view: View, fl: VerlFlavour, split: Split, now: float) -> str:
    dev = _dev(view)
    t, r = fl.pools.trainer or 0, fl.pools.rollout or 0
    moved = split.rollout - r
    new, old = seconds_pair(split.step_s, now)
    where = "to the rollout" if moved > 0 else "to the trainer"
    return (
        f"move {abs(moved)} {dev}s {where}: {split.trainer} trainer + {split.rollout} rollout "
        f"{dev}s (now {t} + {r}) would take ~{new} per step instead of {old}"
    )


def _idle_checks(view: View, th: Thresholds, m: Medians, act: dict[str, float]) -> list[str]:
    """Evidence comparing verl's own idle ratios with the timers and with the GPUs."""
    out = []
    dev = _dev(view)
    if m.trainer_idle_verl is not None:
        gap = abs(m.trainer_idle_verl - m.trainer_idle)
        verdict = "they disagree" if gap > th.idle_disagree else "they agree"
        out.append(
            f"verl's fully_async/trainer/idle_ratio {fmt_pct(m.trainer_idle_verl)}; the timers "
            f"give {fmt_pct(m.trainer_idle)} (timing_s/gen / timing_s/step): {verdict}"
        )
    if m.rollouter_idle_verl is not None:
        text = f"verl's fully_async/rollouter/idle_ratio {fmt_pct(m.rollouter_idle_verl)}"
        busy = act.get("rollout")
        if busy is not None:
            gpu_idle = 1 - busy / 100
            if abs(gpu_idle - m.rollouter_idle_verl) > max(th.idle_disagree, 0.2):
                text += (
                    f", but the rollout {dev}s were {busy:.0f} % busy: they disagree (verl counts "
                    "only the time the rollouter paused at the staleness or queue cap, not a "
                    "slow or half-idle rollout)"
                )
            else:
                text += f"; the rollout {dev}s were {busy:.0f} % busy: they agree"
        out.append(text)
    return out


def _colocated(view: View, th: Thresholds, fl: VerlFlavour, m: Medians) -> RuleResult:
    """colocate_async: the replicas sleep while the trainer trains, so the wait is the
    rollout's turn on the same GPUs."""
    share = m.wait_s / m.step_s if m.step_s else 0.0
    wait, step = seconds_pair(m.wait_s, m.step_s)
    ev = [
        f"timing_s/gen (the trainer's wait for samples) {wait} = {fmt_pct(share)} of "
        f"the {step} step, {view.steps_text()}",
        "colocate_async: the rollout replicas sleep while the trainer trains and resume after "
        "update_weights, so the two take turns on the same GPUs; partial rollouts carry the "
        "unfinished samples over (no wait for the slowest one), nothing overlaps",
    ]
    if share < th.async_wait_frac:
        return passed(STEP, BALANCE, f"{fl.mode_name}: trainer waits {fmt_pct(share)} of the step")
    bands = [
        v for g in view.gpus() for v in view.gpu_phase_points(g, "activity", lambda p: p == "wait")
    ]
    act = mean(bands)
    if act is not None:
        save = m.wait_s * (1 - act / 100)
        basis = f"the wait's idle {_dev(view)} time ({act:.0f} % busy meanwhile)"
        ev.append(f"{_dev(view)} activity during the wait: {act:.0f} % ({len(bands)} samples)")
    else:
        save, basis = m.wait_s, "the wait itself (activity during it not measured: an upper bound)"
    return Finding(
        STEP,
        BALANCE,
        scale(share, th.async_wait_frac, 0.7, 0.45, 0.8),
        f"Trainer waits {fmt_pct(share)} of each step for samples (colocate_async: the rollout "
        "runs only then)",
        ev,
        "The rollout and the trainer take turns on the same GPUs. To overlap them, give the "
        "rollout a pool of its own: trainer.v1.trainer_mode=separate_async with "
        "actor_rollout_ref.rollout.nnodes / n_gpus_per_node (size the split with "
        f"{BALANCE} once it runs); fewer samples per step (data.train_batch_size x "
        "rollout.n) shorten each turn.",
        {"mode": fl.trainer_mode, "wait_share": share, "wait_s": m.wait_s},
        cost_s=m.wait_s,
        save_s=save,
        step_s=m.step_s,
        save_basis=basis,
    )


def _rollout_idle(fl: VerlFlavour, m: Medians, act: dict[str, float]) -> tuple[float | None, str]:
    """The rollout side's idle share and how it was read."""
    if fl.trainer_mode == "fully_async" and m.rollouter_idle is not None:
        return m.rollouter_idle, "fully_async/rollouter (1 - active_time / version_time)"
    if fl.trainer_mode == "one_step_off" and m.generate_s is not None:
        window = m.step_s - (m.sync_s or 0.0)  # no generation while the weights move
        if window > 0:
            return max(0.0, 1 - m.generate_s / window), (
                "1 - timing_s/generate_async / (timing_s/step - the weight sync)"
            )
    if "rollout" in act:
        return 1 - act["rollout"] / 100, "the rollout GPUs' measured activity"
    return None, ""


def _advice(fl: VerlFlavour, starved: bool, split_text: str) -> str:
    t_pool, r_pool = TRAINER_POOL, POOL_KEYS.get(fl.trainer_mode or "", "the rollout pool")
    if starved:
        text = (
            f"The rollout side cannot keep the trainer fed: give it more GPUs ({r_pool}) and "
            f"the trainer fewer ({t_pool})"
        )
    else:
        text = (
            f"The trainer is the slow side and the rollout waits on it: give the trainer more "
            f"GPUs ({t_pool}) and the rollout fewer ({r_pool})"
        )
    text += f" — {split_text}." if split_text else "."
    if fl.trainer_mode == "fully_async" and not starved:
        text += (
            " Or allow more off-policy samples before the rollouter pauses "
            "(async_training.staleness_threshold), at some cost to freshness."
        )
    if fl.trainer_mode == "fully_async":
        text += " verl's fully-async README gives the same rule: high idle on one side means moving GPUs to the other."
    return text


def _separate(view: View, th: Thresholds, fl: VerlFlavour, m: Medians) -> RuleResult:
    """Separate pools: the trainer starved, or the rollout side idle, and the split that
    balances them."""
    act = _pool_activity(view)
    dev = _dev(view)
    r_idle, r_how = _rollout_idle(fl, m, act)
    wait, step = seconds_pair(m.wait_s, m.step_s)
    ev = [
        f"trainer waited {wait} of each {step} step for samples "
        f"(timing_s/gen) = {fmt_pct(m.trainer_idle)}, {view.steps_text()}"
    ]
    if fl.trainer_mode == "fully_async":
        ev[0] += " (a fully-async step line is one weight version: its timers are summed)"
    if r_idle is not None:
        ev.append(f"rollout side idle {fmt_pct(r_idle)} ({r_how})")
    if fl.trainer_mode == "one_step_off" and m.generate_s:
        overlap = max(0.0, 1 - m.wait_s / m.generate_s)
        ev.append(
            f"one-step-off overlap: {fmt_pct(overlap)} of the {seconds(m.generate_s)} generation "
            "(timing_s/generate_async, outside the step) ran behind the previous step's training"
        )
    if act:
        ev.append(
            ", ".join(f"{pool} {dev}s {v:.0f} % busy" for pool, v in sorted(act.items()))
            + f" ({view.window_text})"
        )
    ev += _idle_checks(view, th, m, act)
    starved = m.trainer_idle >= th.async_wait_frac
    idle = not starved and r_idle is not None and r_idle >= th.async_idle_frac
    if not starved and not idle:
        return passed(
            STEP,
            BALANCE,
            f"{fl.mode_name}: trainer waits {fmt_pct(m.trainer_idle)}"
            + (f", rollout idle {fmt_pct(r_idle)}" if r_idle is not None else "")
            + ": balanced",
        )
    split, split_text, cost, basis = _what_if(view, th, fl, m, starved, act)
    save = cost
    if split is None and cost is None:
        save = m.wait_s if starved else None
        basis = "the trainer's wait itself (pool sizes unknown: no split computed)"
    if starved:
        cost = m.wait_s  # what the problem costs: the trainer's wait; the split recovers `save`
    if split_text:
        ev.append(split_text)
    share = m.trainer_idle if starved else (r_idle or 0.0)
    side = "rollout" if starved else "trainer"
    title = (
        f"Trainer starved: waits {fmt_pct(m.trainer_idle)} of each step for samples"
        if starved
        else f"Rollout side idle {fmt_pct(r_idle or 0.0)} while the trainer is "
        f"{fmt_pct(1 - m.trainer_idle)} busy"
        + (" (paused at the staleness or queue cap)" if fl.trainer_mode == "fully_async" else "")
    )
    return Finding(
        STEP,
        BALANCE,
        scale(share, th.async_wait_frac, 0.7, 0.45, 0.85),
        title,
        ev,
        _advice(fl, starved, split_text),
        {
            "mode": fl.trainer_mode,
            "slow_side": side,
            "trainer_idle": m.trainer_idle,
            "rollout_idle": r_idle,
            "trainer_idle_verl": m.trainer_idle_verl,
            "rollouter_idle_verl": m.rollouter_idle_verl,
            "split": None
            if split is None
            else {"trainer": split.trainer, "rollout": split.rollout},
        },
        cost_s=cost,
        save_s=save,
        step_s=m.step_s,
        save_basis=basis,
    )


def _what_if(
    view: View, th: Thresholds, fl: VerlFlavour, m: Medians, starved: bool, act: dict[str, float]
) -> tuple[Split | None, str, float | None, str]:
    """(best split, its sentence, seconds it saves per step, basis); an empty sentence and no
    split when the pools are unknown or no split saves enough."""
    t, r = fl.pools.trainer, fl.pools.rollout
    if not t or not r:
        return None, "", None, ""
    rollout_gpu_s, how = _rollout_gpu_s(fl, m, starved, act.get("rollout"))
    if rollout_gpu_s is None:
        return None, "", None, ""
    train_gpu_s = m.train_s * t
    split = best_split(train_gpu_s, rollout_gpu_s, t + r, _granularity(view), m.sync_s or 0.0)
    if split is None or split.rollout == r:
        return None, "", None, ""
    save = m.step_s - split.step_s
    if save < th.async_move_min_frac * m.step_s:
        return None, "", None, ""
    dev = _dev(view)
    measured = (
        f"measured per step: trainer {seconds(m.train_s)} x {t} {dev}s = {train_gpu_s:.0f} "
        f"{dev}-s, rollout {rollout_gpu_s:.0f} {dev}-s ({how})"
    )
    basis = (
        f"each side's measured {dev}-seconds per step spread over the best split, the rollout "
        f"in whole replicas of TP {_granularity(view)} (linear scaling: an upper bound)"
    )
    return split, _split_text(view, fl, split, m.step_s) + "; " + measured, save, basis


def async_balance(view: View, th: Thresholds) -> RuleResult:
    """Who waits for whom in an async trainer: the trainer starved for samples, or the rollout
    side idle, from the mode's own keys, GPU activity per pool and verl's idle ratios."""
    fl = view.flavour()
    if fl.trainer_mode is None:
        return (
            no_data(STEP, BALANCE, NEED_MODE)
            if view.recent_steps()
            else no_data(STEP, BALANCE, view.need_steps())
        )
    if not fl.is_async:
        return passed(
            STEP,
            BALANCE,
            f"{fl.mode_name}: synchronous, timing_s/gen is the rollout (judged by the stage rules)",
        )
    m = recent_medians(view)
    if m is None:
        return no_data(
            STEP, BALANCE, f"{fl.mode_name}: no step with both timing_s/gen and timing_s/step"
        )
    if fl.trainer_mode == "colocate_async":
        return _colocated(view, th, fl, m)
    return _separate(view, th, fl, m)


def model_params_b(view: View) -> tuple[float, str] | None:
    """(billions of parameters, model path) from the model's name, e.g. Qwen2.5-7B -> 7."""
    hit = view.config(MODEL_PATH)
    if hit is None:
        return None
    name = str(hit[1]).rstrip("/").rsplit("/", 1)[-1]
    match = _PARAMS_RE.search(name)
    if match is None:
        return None
    value = float(match.group(1))
    return (value, name) if 0 < value < 10_000 else None


def sync_link(view: View, th: Thresholds) -> tuple[float, str, bool]:
    """(GB/s, what it is, assumed) of the link the weights cross between pools: the best
    multi-node probe pane 2 ran, else one 400 Gb/s NIC (assumed)."""
    probes = [
        p.busbw_max_gbs
        for p in view.store.probes
        if p.ok and len(p.hosts) > 1 and p.busbw_max_gbs and math.isfinite(p.busbw_max_gbs)
    ]
    if probes:
        return max(probes), "the multi-node NCCL probe's busbw (pane 2)", False
    return th.ib_nic_gbs, "one 400 Gb/s NIC (assumed: no multi-node probe was run)", True


def async_weight_sync(view: View, th: Thresholds) -> RuleResult:
    """The weight push from the trainer pool to the rollout pool (separate pools): its share
    of the step and its rate against the link between the pools."""
    fl = view.flavour()
    if fl.trainer_mode is None:
        return no_data(SYNC_STEP, WEIGHT_SYNC, NEED_MODE)
    if not fl.separate_pools:
        return passed(
            SYNC_STEP,
            WEIGHT_SYNC,
            f"{fl.mode_name}: no separate rollout pool (sync.weight_update judges the sync)",
        )
    m = recent_medians(view)
    if m is None or m.sync_s is None:
        return no_data(
            SYNC_STEP,
            WEIGHT_SYNC,
            f"{fl.mode_name}: no weight-sync timer (timing_s/update_weights, "
            "sync_rollout_weights, timing_s/timing_s/param_sync) in the recent steps",
        )
    share = m.sync_s / m.step_s if m.step_s else 0.0
    sync, step = seconds_pair(m.sync_s, m.step_s)
    key = m.sync_key
    size = model_params_b(view)
    link, link_what, assumed = sync_link(view, th)
    ev = [f"{key} {sync} = {fmt_pct(share)} of the {step} step, {view.steps_text()}"]
    if key == "timing_s/sync_rollout_weights":
        ev.append("it contains timing_s/update_weights (counted once)")
    if key == "timing_s/timing_s/param_sync":
        ev.append("the doubled prefix is verl's: the timer is named timing_s/param_sync")
    floor_s = None
    if size is not None:
        gb = size[0] * BYTES_PER_PARAM  # 1e9 params x 2 bytes = GB
        rate = gb / m.sync_s
        floor_s = gb / link
        ev.append(
            f"{size[1]}: ~{gb:.0f} GB of bf16 weights in {sync} = {rate:.2f} GB/s, "
            f"{fmt_pct(rate / link)} of {link:.0f} GB/s ({link_what})"
        )
    else:
        ev.append("model size unknown (no size in actor_rollout_ref.model.path): rate not computed")
    if share <= th.weight_update_frac:
        return passed(SYNC_STEP, WEIGHT_SYNC, "; ".join(ev[:1] + ev[-1:]))
    save = max(0.0, m.sync_s - floor_s) if floor_s is not None else m.sync_s
    basis = (
        f"the sync at {link:.0f} GB/s ({'assumed ' if assumed else ''}link) instead of its rate"
        if floor_s is not None
        else "the sync time itself (model size unknown: no link bound)"
    )
    advice = (
        "Speed up the weight push between the pools: "
        "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl over RDMA (check the NCCL "
        "transport: NCCL_DEBUG=INFO must say IB, not Socket; NCCL_IB_HCA), larger "
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"
    )
    if fl.trainer_mode == "fully_async":
        advice += "; or sync less often: async_training.trigger_parameter_sync_step"
    elif fl.trainer_mode == "separate_async":
        advice += "; or sync less often: trainer.v1.separate_async.parameter_sync_step"
    return Finding(
        SYNC_STEP,
        WEIGHT_SYNC,
        scale(share, th.weight_update_frac, 0.5, 0.45, 0.85),
        f"Weight sync between the pools takes {fmt_pct(share)} of the step ({key})",
        ev,
        advice + ".",
        {"mode": fl.trainer_mode, "key": key, "share": share, "sync_s": m.sync_s},
        cost_s=m.sync_s,
        save_s=save,
        step_s=m.step_s,
        save_basis=basis,
    )


RULES: list[Rule] = [async_balance, async_weight_sync]
