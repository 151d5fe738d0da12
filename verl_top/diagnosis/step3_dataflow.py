"""Step 3 — dataflow: which stage of the RL step eats the time?"""

from __future__ import annotations

from verl_top.diagnosis import advice
from verl_top.diagnosis.efficiency import achievable_mfu
from verl_top.diagnosis.findings import Finding, Rule, RuleResult, no_data, passed, scale
from verl_top.diagnosis.guards import mode_guard
from verl_top.diagnosis.readable import mfu as mfu_text
from verl_top.diagnosis.readable import number, seconds
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.diagnosis.view import View, fmt_pct, mean, median
from verl_top.diagnosis.worth import (
    Worth,
    rollout_worth,
    stage_worth,
    train_worth,
    unmeasured,
)

STEP = 3


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
    keep = set(names).__contains__  # one filter for every GPU: the view shares its spans
    acts = [m for g in view.gpus() if (m := view.gpu_phase_mean(g, "activity", keep)) is not None]
    where = "during the rollout (stage bands)"
    if not acts and share >= 0.8:
        acts = [m for g in view.gpus() if (m := view.gpu_mean(g, "activity")) is not None]
        where = f"over the {view.window_text} (rollout is {fmt_pct(share)} of each step)"
    cores = [
        c for h in view.hosts() if h.gpus and (c := view.host_mean(h, "cpu_max_core")) is not None
    ]
    return mean(acts), (max(cores) if cores else None), where


def _runner_up(view: View, role: str) -> float:
    """The largest median share of the other stage roles."""
    others = ("rollout", "train", "logprob", "driver", "reward", "unknown", "sync")
    return max(
        (h[0] for r in others if r != role and (h := view.median_role_share(r)) is not None),
        default=0.0,
    )


def flow_rollout_bound(view: View, th: Thresholds) -> RuleResult:
    """Rollout (gen, or a timer whose name says rollout) above rollout_frac of the step.

    When the GPU idles through the rollout while one CPU core is pinned, the rollout is
    launch-bound: that is evidence for this finding (not a separate host stall), and the advice
    follows the rollout engine in use and the job's own rollout settings (advice.py).
    """
    if (guard := mode_guard(view, STEP, "flow.rollout_bound")) is not None:
        return guard  # an async trainer's timing_s/gen is a wait, not generation
    hit = view.median_role_share("rollout")
    if hit is None:
        return no_data(STEP, "flow.rollout_bound", view.need_steps())
    share, _, names = hit
    unknown = _unknown_roles(view)
    label = _stage_names_text(names, unknown)
    runner_up = _runner_up(view, "rollout")
    leads = share >= th.rollout_lead_frac and share >= th.lead_margin * runner_up
    if share <= th.rollout_frac and not leads:
        return passed(STEP, "flow.rollout_bound", f"{label} {fmt_pct(share)} of step")
    facts = view.facts()
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
        f"rollout engine: {facts.engine} (actor_rollout_ref.rollout.name)"
        if facts.engine
        else "rollout engine unknown (no actor_rollout_ref.rollout.name in the config read)"
    )
    if facts.rollout_tp and facts.engine != "hf":
        replicas = f" ({facts.replicas} replicas)" if facts.replicas else ""
        ev.append(f"rollout TP = {facts.rollout_tp}{replicas}")
    if facts.enforce_eager is True and facts.engine != "hf":
        ev.append(f"rollout.enforce_eager = True: {facts.graphs} off")
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
    title = f"Rollout ({', '.join(names)}) takes {fmt_pct(share)} of the step"
    if launch_bound:
        title += f"; GPU {act:.0f} % busy, one CPU core pinned: launch-bound"
    return Finding(
        STEP,
        "flow.rollout_bound",
        sev,
        title,
        ev,
        advice.rollout_advice(facts, act, launch_bound),
        {
            "share": share,
            "stages": names,
            "engine": facts.engine,
            "gpu_activity_pct": act,
            "busiest_core_pct": core,
            "launch_bound": launch_bound,
        },
        **rollout_worth(view, names, act, th).fields(),
        stage="rollout",
    )


def _mfu_words(mfus: dict[str, float | None]) -> str:
    """'MFU 7 %' or 'MFU 7 % (actor), 8.2 % (critic)' for the roles verl estimated."""
    known = {r: m for r, m in mfus.items() if m is not None}
    if len(known) == 1:
        return f"MFU {mfu_text(next(iter(known.values())))}"
    return "MFU " + ", ".join(f"{mfu_text(m)} ({r})" for r, m in known.items())


def flow_train_bound(view: View, th: Thresholds) -> RuleResult:
    """update_actor (+ update_critic) above train_frac of the step with low MFU, or above
    train_lead_frac as the largest stage at an MFU below mfu_low or not estimated."""
    hit = view.median_share("update_actor", "update_critic")
    if hit is None:
        return no_data(STEP, "flow.train_bound", view.need_steps())
    share, _ = hit
    worth, mfus = train_worth(view, th)
    known = [m for m in mfus.values() if m is not None]
    low = bool(known) and min(known) < th.mfu_low
    largest = share >= _runner_up(view, "train")
    lead = largest and share >= th.train_lead_frac and (low or not known)
    if share <= th.train_frac and not lead:
        return passed(STEP, "flow.train_bound", f"update {fmt_pct(share)} of step")
    if known and not low:
        return passed(
            STEP,
            "flow.train_bound",
            f"update {fmt_pct(share)} of step but {_mfu_words(mfus)} is fine",
        )
    facts = view.facts()
    sev = scale(share, th.train_lead_frac, 0.9, 0.45, 0.8)
    ev = [f"update_actor + update_critic {fmt_pct(share)} of step, {view.steps_text()}"]
    if share <= th.train_frac:
        ev.append(
            f"the largest stage, at an MFU below {mfu_text(th.mfu_low)}"
            if known
            else "the largest stage, at an MFU verl did not estimate"
        )
    if not known:
        sev = round(sev * 0.85, 3)
        ev.append(
            "MFU not estimated (perf/mfu/actor absent or 0: older verl or a GPU/model verl has "
            "no FLOPs figure for): efficiency unknown"
        )
    else:
        ev.append(f"{_mfu_words(mfus)} (< {mfu_text(th.mfu_low)})")
        ev.append(achievable_mfu(facts, view.device_names()).basis)
    ev += _train_settings(facts)
    critic_heavy = (view.median_seconds("update_critic") or 0) > (
        view.median_seconds("update_actor") or 0
    )
    return Finding(
        STEP,
        "flow.train_bound",
        sev,
        f"Training update takes {fmt_pct(share)} of the step"
        + (f" at {_mfu_words(mfus)}" if known else ""),
        ev,
        advice.train_advice(facts, critic_heavy),
        {"share": share, "mfu": mfus.get("actor"), "mfu_critic": mfus.get("critic")},
        **worth.fields(),
        stage="train",
    )


def _train_settings(facts) -> list[str]:  # noqa: ANN001 - JobFacts
    """The job's settings that shape the update, as evidence lines."""
    out = []
    if facts.dynamic_bsz is not None:
        out.append(f"actor.use_dynamic_bsz = {facts.dynamic_bsz}")
    if facts.micro_batch is not None and not facts.dynamic_bsz:
        out.append(f"actor.ppo_micro_batch_size_per_gpu = {number(facts.micro_batch)}")
    if facts.offload:
        out.append(
            "offload on: "
            + ", ".join(k.rsplit(".", 2)[-2] + "." + k.rsplit(".", 1)[-1] for k in facts.offload)
        )
    return out


def flow_driver_bound(view: View, th: Thresholds) -> RuleResult:
    """adv or reward (driver side) above driver_frac of the step while GPUs idle."""
    shares = {s: h[0] for s in ("reward", "adv") if (h := view.median_share(s))}
    if not shares:
        return no_data(STEP, "flow.driver_bound", view.need_steps())
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
        advice.driver_advice(view.facts(), stage),
        {"stage": stage, "share": share, "gpu_activity_pct": act},
        **stage_worth(
            view, [stage], 1.0, f"all of {stage}, were it fully overlapped with GPU work"
        ).fields(),
        stage="driver",
    )


def _logprob_worth(view: View, th: Thresholds) -> Worth:
    """old_log_prob + ref at verl's forward MFU (perf/mfu/actor_infer, new engine workers)."""
    infer = view.median_metric("perf/mfu/actor_infer")
    if infer is not None and 0 < infer[1] <= 1:
        bound = achievable_mfu(view.facts(), view.device_names())
        frac = 1 - infer[1] / bound.value
        basis = f"forward passes at MFU {mfu_text(infer[1])}; {bound.basis}"
    else:
        frac, basis = unmeasured(th, "forward-pass efficiency", "no perf/mfu/actor_infer")
    return stage_worth(view, ["old_log_prob", "ref"], frac, basis)


def flow_logprob_slow(view: View, th: Thresholds) -> RuleResult:
    """old_log_prob + ref above logprob_frac of the step."""
    hit = view.median_share("old_log_prob", "ref")
    if hit is None:
        return no_data(STEP, "flow.logprob_slow", view.need_steps())
    share, _ = hit
    if share <= th.logprob_frac:
        return passed(STEP, "flow.logprob_slow", f"old_log_prob + ref {fmt_pct(share)} of step")
    return Finding(
        STEP,
        "flow.logprob_slow",
        scale(share, th.logprob_frac, 0.6, 0.4, 0.75),
        f"Log-prob passes (old_log_prob + ref) take {fmt_pct(share)} of the step",
        [f"timing_s/old_log_prob + timing_s/ref {fmt_pct(share)} of step, {view.steps_text()}"],
        advice.logprob_advice(view.facts()),
        {"share": share},
        **_logprob_worth(view, th).fields(),
        stage="logprob",
    )


def _host_state(view: View, h) -> tuple | None:
    """(name, cpu %, iowait %, busiest core %, GPU activity %) means over the window."""
    cpu = view.host_mean(h, "cpu_pct")
    io = view.host_mean(h, "iowait_pct")
    core = view.host_mean(h, "cpu_max_core")
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
        return no_data(STEP, "flow.periodic", view.need_steps())
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
            f"timing_s/{st} {seconds(c)} {src}: {fmt_pct(a)} of a {seconds(core)} step"
            for st, c, _, src, a in parts
        ],
        advice.periodic_advice(view.facts(), [p[0] for p in parts]),
        {"share": total, "parts": {p[0]: p[4] for p in parts}},
        **Worth(
            total * core, total * core, core, "their whole amortized time, were they never run"
        ).fields(),
        stage="periodic",
    )


RULES: list[Rule] = [
    flow_rollout_bound,
    flow_train_bound,
    flow_driver_bound,
    flow_logprob_slow,
    flow_host_stall,
    flow_periodic,
]
