"""Step 3 — dataflow: which stage of the RL step eats the time?"""

from __future__ import annotations

from verl_top.diagnosis.findings import Finding, Rule, RuleResult, no_data, passed, scale
from verl_top.diagnosis.guards import mode_guard
from verl_top.diagnosis.readable import seconds
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.diagnosis.view import View, fmt_pct, mean, median, timing
from verl_top.verl.stages import fmt_mfu

STEP = 3
NEED_STEPS = "needs verl steps: pass --verl-log PATH (console log or file-logger JSONL)"


ENGINE_ADVICE = {
    "hf": (
        "The HF rollout (rollout.name=hf) runs transformers generate: one Python-launched step "
        "per token, no CUDA graphs, no continuous batching, so a small batch leaves the GPU "
        "waiting on one CPU core. Switch actor_rollout_ref.rollout.name to vllm or sglang; while "
        "on hf, more samples per step (data.train_batch_size x rollout.n) give each launch more "
        "work. (enforce_eager and gpu_memory_utilization do not apply to hf.)"
    ),
    "vllm": (
        "Speed up vLLM generation: smaller actor_rollout_ref.rollout.tensor_model_parallel_size "
        "(more replicas), raise rollout.max_num_seqs / max_num_batched_tokens and "
        "rollout.gpu_memory_utilization (KV cache); keep rollout.enforce_eager=False (CUDA graphs)."
    ),
    "sglang": (
        "Speed up SGLang generation: smaller actor_rollout_ref.rollout.tensor_model_parallel_size "
        "(more replicas), raise rollout.gpu_memory_utilization (KV cache) and max_num_seqs; keep "
        "rollout.enforce_eager=False (CUDA graphs)."
    ),
}
# Ascend (vllm-ascend, SGLang on NPU): the same knobs, graph mode instead of CUDA graphs.
NPU_ROLLOUT_ADVICE = (
    "Speed up generation on the NPUs: smaller actor_rollout_ref.rollout.tensor_model_parallel_size "
    "(more replicas), raise rollout.max_num_seqs / max_num_batched_tokens and "
    "rollout.gpu_memory_utilization (KV cache); keep rollout.enforce_eager=False (graph mode)."
)
GENERIC_ROLLOUT_ADVICE = (
    "Speed up generation: smaller actor_rollout_ref.rollout.tensor_model_parallel_size (more "
    "replicas), raise rollout.max_num_seqs / max_num_batched_tokens and "
    "rollout.gpu_memory_utilization (KV cache)."
)


def _stage_names_text(names: list[str], unknown: dict[str, str]) -> str:
    """``timing_s/gen`` or ``timing_s/my_rollout (rollout by name)``."""
    return " + ".join(
        f"timing_s/{n}" + (" (rollout by name: not in verl's catalogue)" if n in unknown else "")
        for n in names
    )


def _unknown_roles(view: View) -> dict[str, str]:
    out: dict[str, str] = {}
    for s in view.recent_steps():
        out.update(s.unknown)
    return out


def _rollout_gpu_state(
    view: View, names: list[str], share: float
) -> tuple[float | None, float | None, str]:
    """(GPU activity %, busiest CPU core %, where) while the rollout ran.

    From the stage bands when the steps have arrival times; else, when the rollout is most of
    every step, the window means stand for it (said so in ``where``)."""
    keep = set(names)
    acts = [
        m
        for g in view.gpus()
        if (m := mean(view.gpu_phase_points(g, "activity", lambda p: p in keep))) is not None
    ]
    where = "during the rollout (stage bands)"
    if not acts and share >= 0.8:
        acts = [m for g in view.gpus() if (m := view.gpu_mean(g, "activity")) is not None]
        where = f"over the {view.window_text} (rollout is {fmt_pct(share)} of each step)"
    cores = [
        c
        for h in view.hosts()
        if h.gpus and (c := mean([v for _, v in view.host_values(h, "cpu_max_core")])) is not None
    ]
    return mean(acts), (max(cores) if cores else None), where


def flow_rollout_bound(view: View, th: Thresholds) -> RuleResult:
    """Rollout (gen, or a timer whose name says rollout) above rollout_frac of the step.

    When the GPU idles through the rollout while one CPU core is pinned, the rollout is
    launch-bound: that is evidence for this finding (not a separate host stall), and the advice
    follows the rollout engine in use (actor_rollout_ref.rollout.name).
    """
    if (guard := mode_guard(view, STEP, "flow.rollout_bound")) is not None:
        return guard  # an async trainer's timing_s/gen is a wait, not generation
    hit = view.median_role_share("rollout")
    if hit is None:
        return no_data(STEP, "flow.rollout_bound", NEED_STEPS)
    share, _, names = hit
    unknown = _unknown_roles(view)
    label = _stage_names_text(names, unknown)
    runner_up = max(
        (
            h[0]
            for r in ("train", "logprob", "driver", "reward", "unknown", "sync")
            if (h := view.median_role_share(r)) is not None
        ),
        default=0.0,
    )
    leads = share >= th.rollout_lead_frac and share >= th.lead_margin * runner_up
    if share <= th.rollout_frac and not leads:
        return passed(STEP, "flow.rollout_bound", f"{label} {fmt_pct(share)} of step")
    engine = view.rollout_engine()
    tp = view.config("actor_rollout_ref.rollout.tensor_model_parallel_size")
    sev = scale(share, th.rollout_frac, 0.95, 0.45, 0.8)
    ev = [f"{label} {fmt_pct(share)} of the step (without testing/checkpoint), {view.steps_text()}"]
    if share <= th.rollout_frac:
        ev.append(
            f"the largest stage: {share / runner_up:.1f}x the next one"
            if runner_up
            else "the only timed stage of its size"
        )
    sev = max(sev, 0.45) if leads else sev
    ev.append(
        f"rollout engine: {engine} (actor_rollout_ref.rollout.name)"
        if engine
        else "rollout engine unknown (no actor_rollout_ref.rollout.name in the config read)"
    )
    if tp and engine != "hf":
        ev.append(f"rollout TP = {tp[1]}")
    act, core, where = _rollout_gpu_state(view, names, share)
    launch_bound = (
        act is not None and act < th.idle_pct and core is not None and core >= th.host_core_pct
    )
    if act is not None:
        ev.append(f"GPU activity {act:.0f} % {where}")
    if launch_bound:
        ev.append(
            f"busiest CPU core {core:.0f} % meanwhile: the rollout is launch-bound "
            "(one host thread feeds the GPU), not short of data"
        )
        sev = max(sev, scale(th.idle_pct - (act or 0), 0, th.idle_pct, 0.8, 0.93))
    gen_s = view.median_seconds(*names)
    step_s = view.median_step_s()
    if act is not None and gen_s is not None:
        save, basis = gen_s * (1 - act / 100), f"the GPU was busy {act:.0f} % of the rollout"
    else:
        save, basis = gen_s, "the rollout time itself"
    title = f"Rollout ({', '.join(names)}) takes {fmt_pct(share)} of the step"
    if launch_bound:
        title += f"; GPU {act:.0f} % busy, one CPU core pinned: launch-bound"
    return Finding(
        STEP,
        "flow.rollout_bound",
        sev,
        title,
        ev,
        NPU_ROLLOUT_ADVICE
        if view.on_npu() and engine != "hf"
        else ENGINE_ADVICE.get(engine or "", GENERIC_ROLLOUT_ADVICE),
        {
            "share": share,
            "stages": names,
            "engine": engine,
            "gpu_activity_pct": act,
            "busiest_core_pct": core,
            "launch_bound": launch_bound,
        },
        cost_s=gen_s,
        save_s=save,
        step_s=step_s,
        save_basis=basis,
    )


def _per_sample(s) -> tuple[float, float, str] | None:  # noqa: ANN001 - a diagnosis StepView
    """(slowest, mean, source) of one step's per-sample generation times, when logged."""
    mx = timing(s.metrics, "agent_loop/generate_sequences/max")
    mn = timing(s.metrics, "agent_loop/generate_sequences/mean")
    if mx is not None and mn:
        return mx, mn, "agent_loop/generate_sequences"
    mx = timing(s.metrics, "generation_timing/max")
    mn = timing(s.metrics, "generate_sequences")
    if mx is not None and mn:
        return mx, mn, "generation_timing/max vs generate_sequences (mean over ranks)"
    return None


def flow_long_tail(view: View, th: Thresholds) -> RuleResult:
    """The slowest sample holds the rollout up: per-sample generation times (max far above
    the mean) while generation is a material share of the step.

    ``response_length/clip_ratio`` alone measures no tail: it is reported, at a severity that
    cannot be the bottleneck, as a length setting.
    """
    if (guard := mode_guard(view, STEP, "flow.long_tail")) is not None:
        return guard  # async trainers overlap or cut the tail: async.balance judges the wait
    gen = view.median_role_share("rollout")
    samples = [(s, hit) for s in view.recent_steps() if (hit := _per_sample(s)) is not None]
    clips = [
        float(c)
        for s in view.recent_steps()
        if (c := s.metrics.get("response_length/clip_ratio")) is not None and c == c
    ]
    clip = median(clips)
    if gen is None and not samples and clip is None:
        return no_data(
            STEP,
            "flow.long_tail",
            "needs per-sample generation timings (timing_s/agent_loop/*, generation_timing/*) "
            "or response_length/clip_ratio: " + NEED_STEPS,
        )
    share = gen[0] if gen else None
    if samples and (share is None or share >= th.long_tail_gen_frac):
        ratio = median(mx / mn for _, (mx, mn, _) in samples) or 0.0
        tail = median(mx - mn for _, (mx, mn, _) in samples) or 0.0
        src = samples[-1][1][2]
        if ratio > th.long_tail_ratio:
            ev = [
                f"{src}: slowest {ratio:.1f}x the mean (> {th.long_tail_ratio:.0f}x), "
                f"{view.steps_text()}",
                f"the slowest sample ran {seconds(tail)} past the mean sample (median per step)",
            ]
            if share is not None:
                ev.append(f"rollout {fmt_pct(share)} of the step")
            if clip is not None:
                ev.append(f"response_length/clip_ratio = {clip:.2f}")
            sev = scale(ratio, th.long_tail_ratio, 5.0, 0.45, 0.8)
            gen_s = view.median_seconds(*gen[2]) if gen else None
            if share is not None and share > th.rollout_frac and gen_s and tail >= 0.5 * gen_s:
                # The rollout dominates and half of it is the tail: the tail is the verdict
                # about that stage (flow.rollout_bound is its context, not a rival).
                sev = max(sev, scale(share, th.rollout_frac, 0.95, 0.45, 0.8) + 0.02)
                ev.append(f"the tail is {fmt_pct(tail / gen_s)} of the rollout time")
            return Finding(
                STEP,
                "flow.long_tail",
                sev,
                f"Rollout long tail: slowest sample {ratio:.1f}x the mean",
                ev,
                "Cut the tail: actor_rollout_ref.rollout.over_sample_rate, partial/async rollout "
                "(one-step-off, fully-async); if many responses are clipped, review "
                "data.max_response_length.",
                {"ratio": ratio, "tail_s": tail, "clip_ratio": clip, "gen_share": share},
                cost_s=tail,
                save_s=tail,
                step_s=view.median_step_s(),
                save_basis="time the slowest sample ran after the mean one finished",
            )
        return passed(
            STEP, "flow.long_tail", f"{src}: slowest {ratio:.1f}x the mean, {view.steps_text()}"
        )
    if share is not None and share < th.long_tail_gen_frac:
        return passed(
            STEP,
            "flow.long_tail",
            f"rollout {fmt_pct(share)} of the step: a generation tail cannot cost much",
        )
    if clip is not None and clip > th.clip_ratio:
        return Finding(
            STEP,
            "flow.long_tail",
            0.2,  # a setting, not a measured tail: never the bottleneck on its own
            f"{fmt_pct(clip)} of responses hit max_response_length (a length setting; "
            "no per-sample timings to measure a tail)",
            [
                f"response_length/clip_ratio = {clip:.2f} (> {th.clip_ratio:.2f}), "
                f"{view.steps_text()}",
                "no timing_s/agent_loop/* or generation_timing/* in the log: the tail itself "
                "is not measured",
            ]
            + ([f"rollout {fmt_pct(share)} of the step"] if share is not None else []),
            "If the answers need more room, raise data.max_response_length (costs generation "
            "time); if clipping is fine for the task, nothing to do.",
            {"clip_ratio": clip, "gen_share": share},
        )
    return passed(
        STEP,
        "flow.long_tail",
        "no per-sample generation timings"
        + (f"; clip ratio {clip:.2f}" if clip is not None else ""),
    )


def flow_train_bound(view: View, th: Thresholds) -> RuleResult:
    """update_actor (+ update_critic) above train_frac of the step with low MFU."""
    hit = view.median_share("update_actor", "update_critic")
    if hit is None:
        return no_data(STEP, "flow.train_bound", NEED_STEPS)
    share, _ = hit
    mfu = view.median_mfu()
    if share <= th.train_frac:
        return passed(STEP, "flow.train_bound", f"update {fmt_pct(share)} of step")
    if mfu is not None and mfu[1] >= th.mfu_low:
        return passed(
            STEP,
            "flow.train_bound",
            f"update {fmt_pct(share)} of step but MFU {fmt_mfu(mfu[1])} is fine",
        )
    sev = scale(share, th.train_frac, 0.9, 0.45, 0.8)
    ev = [f"update_actor + update_critic {fmt_pct(share)} of step, {view.steps_text()}"]
    if mfu is None:
        sev = round(sev * 0.85, 3)
        ev.append(
            "MFU not estimated (perf/mfu/actor absent or 0: older verl or a GPU/model verl has "
            "no FLOPs figure for): efficiency unknown"
        )
    else:
        ev.append(f"{mfu[0]} = {fmt_mfu(mfu[1])} (< {th.mfu_low})")
    update_s = view.median_seconds("update_actor", "update_critic")
    save = update_s * (1 - mfu[1]) if update_s is not None and mfu else update_s
    return Finding(
        STEP,
        "flow.train_bound",
        sev,
        f"Training update takes {fmt_pct(share)} of the step"
        + (f" at MFU {fmt_mfu(mfu[1])}" if mfu else ""),
        ev,
        "Make the update efficient: actor.use_dynamic_bsz=True with a larger ppo_max_token_len_per_gpu, "
        "larger ppo_micro_batch_size_per_gpu, param/optimizer offload off if memory allows.",
        {"share": share, "mfu": mfu[1] if mfu else None},
        cost_s=update_s,
        save_s=save,
        step_s=view.median_step_s(),
        save_basis=(
            f"the update at MFU 1.0 instead of {fmt_mfu(mfu[1])}"
            if mfu
            else "the update time itself (MFU not estimated)"
        ),
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
        cost_s=(cost := view.median_seconds(stage)),
        save_s=cost,
        step_s=view.median_step_s(),
        save_basis=f"all of {stage}, were it fully overlapped with GPU work",
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
        cost_s=(cost := view.median_seconds("old_log_prob", "ref")),
        save_s=cost,
        step_s=view.median_step_s(),
        save_basis="both forward passes' time (larger batches cannot remove more)",
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
    # A host without GPU samples (no GPU, or only its CPU sampled) says nothing about stalls.
    rows = [r for r in rows if r[4] is not None]
    if not rows:
        return no_data(STEP, "flow.host_stall", "needs GPU samples next to the host samples")
    bad = [
        (r, cause)
        for r in rows
        if r[4] < th.idle_pct and (cause := _host_cause(th, r[1], r[2], r[3])) is not None
    ]
    if not bad:
        return passed(
            STEP, "flow.host_stall", f"no host saturated while its GPUs idle ({len(rows)} hosts)"
        )
    (name, cpu, io, core, act), cause = min(bad, key=lambda b: b[0][4] or 0)
    owner = _dominant_stage(view, th)
    if owner is not None:
        # The step's own timings put the time in one stage: the idle GPU and the busy host are
        # that stage's symptoms, judged by its rule, not a second verdict with other advice.
        role, share, names = owner
        return passed(
            STEP,
            "flow.host_stall",
            f"{name}: {cause} while its GPUs run at {act or 0:.0f} %, but {', '.join(names)} "
            f"takes {fmt_pct(share)} of every step: part of that stage "
            f"({ROLE_RULES.get(role, 'its stage rule')})",
        )
    step_s = view.median_step_s()
    idle_s = step_s * (1 - (act or 0) / 100) if step_s else None
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
        cost_s=idle_s,
        save_s=idle_s,
        step_s=step_s,
        save_basis="the step's GPU-idle time",
    )


ROLE_RULES = {
    "rollout": "flow.rollout_bound",
    "train": "flow.train_bound",
    "logprob": "flow.logprob_slow",
    "driver": "flow.driver_bound",
    "reward": "flow.driver_bound",
}


def _dominant_stage(view: View, th: Thresholds) -> tuple[str, float, list[str]] | None:
    """(role, share, stages) of the role that takes more than rollout_frac of every step."""
    best = None
    for role in ("rollout", "train", "logprob", "driver", "reward", "unknown"):
        hit = view.median_role_share(role)
        if hit is not None and hit[0] > th.rollout_frac and (best is None or hit[0] > best[1]):
            best = (role, hit[0], hit[2])
    return best


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
        cost_s=total * core,
        save_s=total * core,
        step_s=core,
        save_basis="their whole amortized time, were they never run",
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
